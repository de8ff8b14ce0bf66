#!/bin/bash
# One device call on two GPUs of one host (seventeenth session, about 6 minutes on two H200s), at the new default
# block: whether the two devices should decode more of the inputs, the host's cores being what they share.
# 49152² zstd in and out on devices 0,1: share (4 decode slots a device), share with 8, and on, two runs each,
# alternating; then on device 0 alone: share and share with 8.  Run from the project's root with carry [".whl"],
# kind nvidia-h200-x2 (or -h100-x2), after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_slots.sh
. "$(dirname "$0")/session_common.sh" x2-slots
# what summary prints of each run
FIELDS="mode slots wall_s per_worker.busy_seconds device_decoded_bytes host_decoded_bytes"
for devices in 0,1 0; do
    modes=share,on
    [ "$devices" = 0 ] && modes=share
    timeout 290 python3 $S "$OUT/x2-slots-devices${devices/,/}.json" --size ${SIZE:-49152} --chunk ${CHUNK:-4096} \
        --devices "$devices" --codec zstd --repeats 2 --modes "$modes" --slots 8 --slots-mode share \
        --inputs "$inputs/zstd" 2>&1 | summary "$devices" $FIELDS
done
ls -la "$OUT"     # what the call leaves for the records

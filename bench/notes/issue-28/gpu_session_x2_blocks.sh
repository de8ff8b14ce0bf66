#!/bin/bash
# One device call on two GPUs of one host (seventeenth session, about 5 minutes on two H200s): the 2-GPU target at
# the GPU blocks' new default (8192 x 8192 x 4096, `auto` here) against 4096-cube blocks, 49152² zstd in and out
# under share, on devices 0,1 and then on device 0 alone, two runs each, alternating.  Run from the project's root
# with carry [".whl"], kind nvidia-h200-x2 (or -h100-x2), after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_blocks.sh
. "$(dirname "$0")/session_common.sh" x2-blocks
# what summary prints of each run
FIELDS="mode block wall_s per_worker.busy_seconds device_decoded_bytes host_decoded_bytes"
for devices in 0,1 0; do
    timeout 280 python3 $S "$OUT/x2-blocks-devices${devices/,/}.json" --size ${SIZE:-49152} --chunk 4096 \
        --devices "$devices" --codec zstd --repeats 2 --modes share --blocks "${BLOCKS:-auto,4096}" \
        --inputs "$inputs/zstd" 2>&1 | summary "$devices" $FIELDS
done
ls -la "$OUT"     # what the call leaves for the records

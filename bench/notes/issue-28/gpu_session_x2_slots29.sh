#!/bin/bash
# Prepared in the twenty-ninth session (one device call on two GPUs of one host, about 4 minutes on two H200s): more
# decode slots a device on two GPUs.  There (49152² zstd `on`) a worker decodes 14.5 GB in the 1.6 s its readers
# are busy, 9 GB/s, against 5.8 GB/s on one GPU; 12, 16 or 20 readers a worker ran the same, so something they share
# binds, and the 4 decode calls at once a device (each about 70 ms of host wall) are one.  Each cluster runs `on` at
# the default (4 slots) twice, then 8 and 4 slots alternating, three times (a scratch kept per count: the first 8
# grows its buffers); on devices 0,1 then on 0.  Run from the project's root with carry [".whl"], kind nvidia-h200-x2,
# after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_slots29.sh
. "$(dirname "$0")/session_common.sh" x2-slots29
SIZE=${SIZE:-49152}
FIELDS="mode slots wall_s per_worker.busy_seconds per_worker.kernel_seconds first_gemm_start last_gemm_stop"
for devices in 0,1 0; do
    timeout 280 python3 $S "$OUT/x2-slots-devices${devices/,/}.json" --size "$SIZE" --chunk 4096 \
        --devices "$devices" --codec zstd --repeats ${REPEATS:-3} --modes on --slots ${SLOTS:-8,4} --gemm-tasks 1 \
        --inputs "$inputs/zstd" 2>&1 | summary "devices $devices" $FIELDS
done
ls -la "$OUT"

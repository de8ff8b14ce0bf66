#!/bin/bash
# Prepared for the session after the twenty-seventh (one device call on two GPUs of one host, about 8 minutes on two
# H200s): two GPUs against one since the decode slots' buffers are made as large as their names have been (fb5cc19:
# on one H200, 32768² went from 1.14-1.25× raw to 1.11×).  The target: two GPUs at least 1.8× one (1.45× in the
# twenty-third session; raw's own scaling then 1.68×).  SIZE² zstd in and out (49152 unless set), gemm-tasks 1, MODES
# (on unless set) on devices 0,1 then on device 0 alone, two runs each; raw chunks in and out on 0,1 and on 0 (the
# raw peer's own scaling).  Run from the project's root with carry [".whl"], kind nvidia-h200-x2, after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_28.sh
. "$(dirname "$0")/session_common.sh" x2-28
SIZE=${SIZE:-49152}
FIELDS="mode gemm_tasks_setting wall_s per_worker.busy_seconds per_worker.kernel_seconds device_decoded_bytes"
for devices in 0,1 0; do
    timeout 330 python3 $S "$OUT/x2-zstd-devices${devices/,/}.json" --size "$SIZE" --chunk ${CHUNK:-4096} \
        --devices "$devices" --codec zstd --repeats 2 --modes "${MODES:-on}" --gemm-tasks 1 \
        --inputs "$inputs/zstd" 2>&1 | summary "zstd $devices" $FIELDS
done
raw_scaling $FIELDS
ls -la "$OUT"     # what the call leaves for the records

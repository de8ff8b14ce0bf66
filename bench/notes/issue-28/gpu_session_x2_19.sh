#!/bin/bash
# One device call on two GPUs of one host (nineteenth session, about 7 minutes on two H200s): the 2-GPU target at
# the new read-threads default (three quarters of each device's share of the cores: 12 a worker on 32 cores).
# 49152² zstd in and out under share on devices 0,1 (gemm-tasks 1 and 2, two runs each, alternating), then on
# device 0 alone (gemm-tasks 1, two runs); then raw chunks in and out on 0,1 and on 0 (two runs each), the raw
# peer's own scaling.  Run from the project's root with carry [".whl"], kind nvidia-h200-x2 (or -h100-x2), after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_19.sh
. "$(dirname "$0")/session_common.sh" x2-19
SIZE=${SIZE:-49152}
FIELDS="mode gemm_tasks_setting wall_s per_worker.busy_seconds device_decoded_bytes host_decoded_bytes gemm_gap_seconds"
for devices in 0,1 0; do
    tasks=1,2
    [ "$devices" = 0 ] && tasks=1
    timeout 290 python3 $S "$OUT/x2-share-devices${devices/,/}.json" --size "$SIZE" --chunk ${CHUNK:-4096} \
        --devices "$devices" --codec zstd --repeats 2 --modes share --gemm-tasks $tasks \
        --inputs "$inputs/zstd" 2>&1 | summary "share $devices" $FIELDS
done
raw_scaling $FIELDS
ls -la "$OUT"     # what the call leaves for the records

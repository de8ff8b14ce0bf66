#!/bin/bash
# Prepared for the session after the twenty-second (one device call on two GPUs of one host, about 8 minutes on two
# H200s): with the frames planned on the device (616372f), `on` was faster than `share` on one H200 in both calls
# that timed them (32768², means: 1.585 and 1.69 s against 1.68 and 1.77), so `auto` could be `on` for zstd's
# inputs; what the 2-GPU case
# says decides it (the thirteenth session, with the plans on the host, had share far ahead there: 3.4 s against
# 4.1).  49152² zstd in and out, gemm-tasks 1, share and on alternating on devices 0,1 (two runs each), then on
# device 0 alone; raw chunks in and out on 0,1 and on 0 (the raw peer's own scaling).  Run from the project's root
# with carry [".whl"], kind nvidia-h200-x2 (or -h100-x2), after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_22.sh
. "$(dirname "$0")/session_common.sh" x2-22
SIZE=${SIZE:-49152}
FIELDS="mode gemm_tasks_setting wall_s per_worker.busy_seconds device_decoded_bytes host_decoded_bytes gemm_gap_seconds"
for devices in 0,1 0; do
    timeout 330 python3 $S "$OUT/x2-zstd-devices${devices/,/}.json" --size "$SIZE" --chunk ${CHUNK:-4096} \
        --devices "$devices" --codec zstd --repeats 2 --modes share,on --gemm-tasks 1 \
        --inputs "$inputs/zstd" 2>&1 | summary "zstd $devices" $FIELDS
done
raw_scaling $FIELDS
ls -la "$OUT"     # what the call leaves for the records

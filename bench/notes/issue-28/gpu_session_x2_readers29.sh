#!/bin/bash
# Prepared in the twenty-ninth session (one device call on two GPUs of one host, about 5 minutes on two H200s): more
# reader threads a worker on two GPUs.  There (32 cores, 49152² zstd `on`) each worker's 12 readers are busy from
# the first read to the last (1.6 s), half of it blocked (waiting for a shared decode call: 8 of their 18
# thread-seconds), while the GEMMs wait 0.7 s a worker; the host has one NUMA node and copies a tmpfs file at 2.7 GB/s
# a thread (8 threads 22 GB/s, 16 threads 37).  DGEMM_READ_THREADS 12 (the default there), 16 and 20 on devices 0,1,
# 16 on device 0 alone, then 12 on 0,1 again; two runs each.  Run from the project's root with carry [".whl"], kind
# nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_readers29.sh
. "$(dirname "$0")/session_common.sh" x2-readers29
SIZE=${SIZE:-49152}
FIELDS="mode wall_s per_worker.busy_seconds per_worker.kernel_seconds first_gemm_start last_gemm_stop"
n=0
for run in 12:0,1 16:0,1 20:0,1 16:0 12:0,1; do
    n=$((n + 1))
    readers=${run%%:*} devices=${run#*:}
    DGEMM_READ_THREADS=$readers timeout 200 python3 $S "$OUT/x2-$n-readers$readers-devices${devices/,/}.json" \
        --size "$SIZE" --chunk 4096 --devices "$devices" --codec zstd --repeats 2 --modes on --gemm-tasks 1 \
        --inputs "$inputs/zstd" 2>&1 | summary "readers $readers devices $devices" $FIELDS
done
ls -la "$OUT"

#!/bin/bash
# Prepared in the twenty-ninth session for the next (one device call on two GPUs of one host, about 6 minutes on two
# H200s): gemm-tasks 2 against 1 under `on` and with raw chunks, on two GPUs and on one.  The twenty-ninth session's
# timelines (49152²) found 8-20 ms between one product's last GEMM and the next one's first: its download (raw) or
# the encoder's copy (`on`), Dask's start of the next task, the product's set-up.  At gemm-tasks 1 that is 0.65-0.76
# s of a run on one H200 and 0.23-0.35 s a worker on two; gemm-tasks 2 lets the next product in once the unpadding is
# enqueued (dgemm.opencl.turn).  It was last timed under share (nineteenth session: no faster there; raw 9 % faster).
# And blocks of 4096 × 8192 × 4096 (M, N, K) beside the default 8192 × 8192 × 4096 under `on`: GEMM launches half
# as long, so that a decode call's kernels, each waiting for the launch before it to end, get through sooner (two
# GPUs are bound by the decode rate beside the GEMMs: NOTES, twenty-ninth session), for twice the products (and
# their boundaries).
# 49152² (SIZE), zstd `on` (each block, gemm-tasks 1 and 2) then raw (gemm-tasks 1 and 2), alternating, two runs each,
# on devices 0,1 then 0.  Run from the project's root with carry [".whl"], kind nvidia-h200-x2, after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_tasks30.sh
. "$(dirname "$0")/session_common.sh" tasks30
SIZE=${SIZE:-49152}
FIELDS="mode block gemm_tasks_setting wall_s per_worker.busy_seconds per_worker.kernel_seconds gemm_gap_seconds"
for devices in 0,1 0; do
    timeout 240 python3 $S "$OUT/tasks-zstd-devices${devices/,/}.json" --size "$SIZE" --chunk 4096 \
        --devices "$devices" --codec zstd --repeats 2 --modes on --gemm-tasks 1,2 --blocks auto,4096x8192x4096 \
        --inputs "$inputs/zstd" 2>&1 | summary "zstd $devices" $FIELDS
    timeout 150 python3 $S "$OUT/tasks-raw-devices${devices/,/}.json" --size "$SIZE" --chunk 4096 \
        --devices "$devices" --codec none --out-codec none --repeats 2 --modes off --gemm-tasks 1,2 \
        --inputs "$inputs/raw" 2>&1 | summary "raw $devices" $FIELDS
done
ls -la "$OUT"

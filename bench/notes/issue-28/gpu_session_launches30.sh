#!/bin/bash
# The thirtieth session's second device call (two GPUs of one host, about 7 minutes on two H200s): each k step's
# GEMM cut into 1, 2 or 4 launches (the `gemm-launches` setting, dgemm.opencl.launches).  The twenty-ninth session's
# timeline of `on` on two GPUs showed each device decoder's kernel ending with the GEMM launch beside which it
# started (5.6 ms): a decode call's ten or so kernels, one after another, each wait out a launch.  First the launches'
# GPU tests (the wgmma and DMMA kernels reading their tiles from the launch's offset, checked against numpy), then
# 49152² zstd `on` with 1, 2 and 4 launches alternating (two runs each) on devices 0,1 and on 0, then raw chunks on
# 0 with 1 and 4 (what cutting costs the GEMMs alone).  Ran at 3d31a93 (measured no faster; the change is kept as
# x-launches30.patch, against a0aa404: `git apply` it first).  Run from the project's root with carry [".whl"], kind
# nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_launches30.sh
. "$(dirname "$0")/session_common.sh" launches30
SIZE=${SIZE:-49152}
FIELDS="mode gemm_launches wall_s per_worker.busy_seconds per_worker.kernel_seconds first_gemm_start last_gemm_stop"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_launches.py 2>&1 | tail -4
for devices in 0,1 0; do
    timeout 330 python3 $S "$OUT/launches-zstd-devices${devices/,/}.json" --size "$SIZE" --chunk 4096 \
        --devices "$devices" --codec zstd --repeats 2 --modes on --launches ${LAUNCHES:-1,2,4} \
        --inputs "$inputs/zstd" 2>&1 | summary "zstd $devices" $FIELDS
done
timeout 150 python3 $S "$OUT/launches-raw-devices0.json" --size "$SIZE" --chunk 4096 --devices 0 --codec none \
    --out-codec none --repeats 2 --modes off --launches 1,4 --inputs "$inputs/raw" 2>&1 | summary "raw 0" $FIELDS
ls -la "$OUT"

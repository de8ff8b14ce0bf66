#!/bin/bash
# NOTES.md, "Issue 16, third session (stop 16)", the shipped defaults' table: every path through
# `dgemm bench kernel` (cuBLAS in the same run, four sizes), then the GPU tests (tensor-core accuracy against
# numpy and the FMA kernel, the engine on the device).  On the GPU machine, from the project root:
#   source .whl/gpu-env.sh && bash bench/notes/issue-16-third-session/shipped_defaults.sh COMMIT
# Records go to $OUT.
set -u
: "${OUT:?set OUT to the folder for the records}"
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
export DGEMM_COMMIT=$1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
echo "=== dgemm bench kernel (fma, tf32, 3xtf32; dmma, fma float64) beside cuBLAS"
timeout 330 python3 -m dgemm bench kernel --dtypes float32,float64 --sizes 8192,16384,10000,10240 --out "$OUT" 2>&1 \
  | grep -v Warning | tail -30
echo "=== the GPU tests"
timeout 230 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engine.py tests/test_api.py tests/test_benchmarks.py \
  tests/test_device.py 2>&1 | tail -6
ls "$OUT"

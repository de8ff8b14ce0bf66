#!/bin/bash
# On the GPU machine (device tool), from the project root: the wgmma kernel on its own and through
# dgemm (engine test, dgemm bench kernel with cuBLAS beside it).  Usage: bash bench/gpu_wgmma.sh COMMIT
set -u
export PYTHONPATH=/tmp/site:$PWD DGEMM_COMMIT=$1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "=== wgmma_bench: the kernel alone (ROUND 0: operands rounded where staged)"
timeout 150 python3 bench/wgmma_bench.py --out "$OUT" --variants '[{"ROUND": 0}]' 2>&1 | grep -v Warning | tail -6
echo "=== the engine's tensor-core test (tf32 through wgmma, 4 transposes, odd sizes, alpha/beta)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -k "tensor_core or layout" tests/test_device.py 2>&1 | tail -4
echo "=== dgemm bench kernel float32 (fma, tf32 = wgmma, 3xtf32; cuBLAS in the same run)"
timeout 240 python3 -m dgemm bench kernel --dtypes float32 --sizes 8192,16384,10000,10240 --out "$OUT" 2>&1 | tail -22
ls "$OUT"

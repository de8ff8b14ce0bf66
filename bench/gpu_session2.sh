#!/usr/bin/env bash
# Kernel search around the current winners (stored in the user database), then the kernel
# benchmark with the database's choice against cuBLAS and numpy.
# Usage there: source .whl/gpu-env.sh && bash bench/gpu_session2.sh "$OUT" SEED_JSON DTYPES BUDGET
set -u
out=$1; seed=$2; dtypes=${3:-float32}; budget=${4:-150}
export PYTHONUNBUFFERED=1 DGEMM_TUNING_DB=/tmp/dgemm-tuning.json
timeout 330 python3 bench/gpu_kernels.py "$out" --dtypes "$dtypes" --budget "$budget" --top 2 --store \
  --shapes 8192x8192x8192,16384x16384x16384 --seed-from "$seed" 2>&1 | grep -v '^\[float' | tail -8
timeout 240 python3 -m dgemm bench kernel --out "$out" 2>&1 | tail -22
cp /tmp/dgemm-tuning.json "$out/user-tuning.json"

#!/usr/bin/env bash
# Validation on the GPU machine: GPU-marked tests, the float64 demo (DMMA through the cluster),
# and the kernel benchmark with the database's choices.
# Usage there: source .whl/gpu-env.sh && bash bench/gpu_final.sh "$OUT"
set -u
out=$1
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -8
timeout 150 python3 -m dgemm demo --dtype float64 --size 16384 --json "$out/demo-float64.json" 2>&1 | tail -6
timeout 220 python3 -m dgemm bench kernel --out "$out" --reps 3 2>&1 | tail -18

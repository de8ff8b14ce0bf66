#!/usr/bin/env bash
# One GPU-machine call: devices, the demo, the GPU-marked tests, then the kernel tuning run.
# Usage there: source .whl/gpu-env.sh && bash bench/gpu_session.sh "$OUT" [tune budget per dtype]
set -u
out=$1; budget=${2:-100}
export PYTHONUNBUFFERED=1
python3 -m dgemm devices > "$out/devices.txt" 2>&1; tail -25 "$out/devices.txt"
timeout 240 python3 -m dgemm demo --json "$out/demo.json" 2>&1 | tail -12
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -6
timeout 330 python3 bench/gpu_kernels.py "$out" --budget "$budget" --top 3 \
  --seed-from bench/results/2026-11-22-h100-kernels-tune1.json 2>&1 | grep -v '^\[float' | tail -16

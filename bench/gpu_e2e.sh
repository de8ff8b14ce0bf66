#!/bin/bash
# On the GPU machine (device tool): dgemm bench e2e runs, records to $OUT.
# Usage: bench/gpu_e2e.sh COMMIT "ARGS1" ["ARGS2" ...]   (each ARGS: one e2e run's options; 9 minutes at most each)
# e.g. bench/gpu_e2e.sh abc1234 "--size 65536 --dtype float32 --devices gpu --gpus 1,2,4"
set -u
export DGEMM_COMMIT=$1; shift
echo "host: $(nproc) cores; $(free -g | awk '/Mem:/{print $2}') GiB; /dev/shm $(df -h /dev/shm | awk 'NR==2{print $2}')"
nvidia-smi --query-gpu=index,name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
for args in "$@"; do
  echo "=== dgemm bench e2e $args"
  # shellcheck disable=SC2086
  timeout 540 python3 -m dgemm bench e2e --store /dev/shm --no-peers --uncompressed --kernel-size 16384 \
    --out "$OUT" $args 2>&1 | grep -v "^\s*$" | tail -60
  rm -rf /dev/shm/dgemm-e2e-*
done
ls -la "$OUT"

#!/bin/bash
# Issue 15 on nvidia-h200-x2: the host cache with staggered workers (1 and 2 GPUs), 2 GPUs without it,
# and S3 through remote.py (moto on loopback).  Usage: bash bench/gpu_issue15.sh COMMIT [SIZE] [S3SIZE]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=/tmp/site:$here DGEMM_COMMIT=$1
size=${2:-49152}; s3size=${3:-16384}
cd "$here"
echo "host: $(nproc) cores; $(free -g | awk '/Mem:/{print $2}') GiB"
for hc in ${HOST_CACHE-auto off}; do
  gpus=1,2; [ $hc = off ] && gpus=2
  echo "--- host-cache $hc, gpus $gpus"
  DGEMM_HOST_CACHE=$hc timeout 270 python3 -m dgemm bench e2e --size $size --chunks 4096 --codec default \
    --devices gpu --gpus $gpus --no-peers --kernel-size 16384 --store /tmp/d16 --out "$OUT" 2>&1 | grep -v "^\s*$" | tee "$OUT/e2e-$hc.log" | tail -22
  rm -rf /tmp/d16/dgemm-e2e-*
done
if [ "$s3size" != 0 ]; then
  echo "--- s3 $s3size"
  timeout 200 python3 -m dgemm bench e2e --kernel-size 16384 --out "$OUT" --size $s3size --chunks 4096 \
    --codec default --store s3://bench/x --no-peers --gpus 1 2>&1 | grep -v "^\s*$" | tee "$OUT/e2e-s3.log" | tail -22
fi
ls "$OUT"

#!/bin/bash
# NOTES.md, "Issue 15 — the users' case at full speed", "Second session (stop 15)": on two GPUs of one host
# (nvidia-h200-x2), the host cache with staggered workers (1 and 2 GPUs), 2 GPUs without it, and S3 through
# remote.py (moto on loopback).  On the GPU machine, from the project root:
#   source .whl/gpu-env.sh && bash bench/notes/issue-15-second-session/hostcache_and_s3.sh COMMIT [SIZE] [S3SIZE]
# Records and logs go to $OUT; the inputs to $STORE (default: a new temporary folder, removed at the end).
# HOST_CACHE="auto off" (the default) names the host-cache settings to run; S3SIZE 0 skips the S3 run.
set -u
: "${OUT:?set OUT to the folder for the records}"
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
export DGEMM_COMMIT=$1
size=${2:-49152}; s3size=${3:-16384}
store=${STORE:-$(mktemp -d)}
echo "host: $(nproc) cores; $(free -g | awk '/Mem:/{print $2}') GiB; inputs in $store"
for hc in ${HOST_CACHE-auto off}; do
  gpus=1,2; [ "$hc" = off ] && gpus=2
  echo "--- host-cache $hc, gpus $gpus"
  DGEMM_HOST_CACHE=$hc timeout 270 python3 -m dgemm bench e2e --size "$size" --chunks 4096 --codec default \
    --devices gpu --gpus $gpus --no-peers --kernel-size 16384 --store "$store" --out "$OUT" 2>&1 \
    | grep -v "^\s*$" | tee "$OUT/e2e-$hc.log" | tail -22
  rm -rf "$store"/dgemm-e2e-*
done
[ -z "${STORE:-}" ] && rm -rf "$store"
if [ "$s3size" != 0 ]; then
  echo "--- s3 $s3size"
  timeout 200 python3 -m dgemm bench e2e --kernel-size 16384 --out "$OUT" --size "$s3size" --chunks 4096 \
    --codec default --store s3://bench/x --no-peers --gpus 1 2>&1 | grep -v "^\s*$" | tee "$OUT/e2e-s3.log" | tail -22
fi
ls "$OUT"

#!/bin/bash
# dgemm bench e2e runs on a GPU machine, one after another, records to $OUT: each run without the peers, C
# uncompressed, the kernel timed at 16384 (add options to change that), its inputs in $STORE (default
# /dev/shm, memory-backed) and removed after it.  On the GPU machine, from the project root:
#   source .whl/gpu-env.sh && bash bench/gpu_e2e.sh COMMIT "ARGS1" ["ARGS2" ...]
# each ARGS one run's options (9 minutes at most each), e.g.
#   bash bench/gpu_e2e.sh abc1234 "--size 65536 --dtype float32 --devices gpu --gpus 1,2,4"
set -u
: "${OUT:?set OUT to the folder for the records}"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export DGEMM_COMMIT=$1; shift
store=${STORE:-/dev/shm}
echo "host: $(nproc) cores; $(free -g | awk '/Mem:/{print $2}') GiB; $store $(df -h "$store" | awk 'NR==2{print $2}')"
nvidia-smi --query-gpu=index,name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
for args in "$@"; do
  echo "=== dgemm bench e2e $args"
  # shellcheck disable=SC2086
  timeout 540 python3 -m dgemm bench e2e --store "$store" --no-peers --uncompressed --kernel-size 16384 \
    --out "$OUT" $args 2>&1 | grep -v "^\s*$" | tail -60
  rm -rf "$store"/dgemm-e2e-*
done
ls -la "$OUT"

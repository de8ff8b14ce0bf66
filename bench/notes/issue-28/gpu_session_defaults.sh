#!/bin/bash
# One device call on one GPU (about 6 minutes on an H100) for two defaults the thirteenth session left open:
# 1. gemm-tasks 2 on GPUs: 32768² zstd in and out under `auto` (share on a GPU), gemm-tasks 1 and 2 alternating,
#    4 times, then raw chunks the same way (share was faster with 2 in every call since 249a8ea; raw was mixed);
# 2. Blosc-LZ4 inputs (Zarr v2's default) under share, against off and on, zstd C: whether `auto` should share
#    Blosc inputs too (dgemm.opencl.codecs.AUTO_CODECS, then AUTO_SHARE_CODECS), 3 times.
# Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_defaults.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
S=bench/notes/issue-28/device_codecs_onoff.py
inputs=$(mktemp -d /dev/shm/dgemm-defaults-inputs-XXXX)
trap 'rm -rf "$inputs"' EXIT
python3 $S "$OUT/auto-zstd-32768-gemm-tasks.json" --size 32768 --codec zstd --devices gpu --repeats 4 \
    --modes auto --gemm-tasks 1,2 --inputs "$inputs/zstd"
rm -rf "$inputs/zstd"
python3 $S "$OUT/raw-32768-gemm-tasks.json" --size 32768 --codec none --out-codec none --devices gpu --repeats 4 \
    --modes off --gemm-tasks 1,2 --inputs "$inputs/raw"
rm -rf "$inputs/raw"
python3 $S "$OUT/share-lz4-32768.json" --size 32768 --codec lz4 --out-codec zstd --devices gpu --repeats 3 \
    --modes share,off,on --gemm-tasks 2 --inputs "$inputs/lz4"

#!/bin/bash
# One device call on one GPU (about 7 minutes on an H100) after the prefix blocks' Huffman literals go straight to
# the output (no copy kernel for them): run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_direct.sh
# 1. the decode kernels, levels 3 and 1, 4 chunks of 64 MiB a call, and 16 chunks a call at level 3;
# 2. 32768² float32 zstd in and out, device-codecs off and on, alternating, then raw chunks in and out;
# 3. the GPU-marked tests (the kernel changed).
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."
D=bench/notes/issue-28/zstd_decode.py
python3 $D --out "$OUT/dec" --levels 3,1 --data normal --repeats 3 --threads 1,8
python3 $D --out "$OUT/dec16" --levels 3 --chunks 16 --data normal --repeats 2 --threads 1
for d in dec dec16; do for f in "$OUT/$d"/*.json; do mv "$f" "$OUT/$d/decode.json"; done; done
. bench/notes/issue-28/e2e_32768.sh
e2e_32768 off,on 3 2

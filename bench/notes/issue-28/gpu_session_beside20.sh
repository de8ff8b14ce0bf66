#!/bin/bash
# Prepared for the twentieth session (one device call on one GPU, about 8 minutes).  Here, first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=main v1=755c8a3,DGEMM_X_HUF_BLOCKS=8 \
#         v2=755c8a3,DGEMM_X_HUF_BLOCKS=8,DGEMM_X_SLOTS=8
# (755c8a3 is the local branch x-huf-blocks: zstd_decode's ZSTD_HUF_BLOCKS and the decode slots from the
# environment, an experiment never merged).  Then on the device, with carry [".whl", ".ab"], after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_beside20.sh
# 1. beside_gemm.py: what the device decode costs the GEMMs beside it per decoded GB, by Huffman layout
#    (blocks a work-group 1, 4, 8), queue priority and decoding threads (1 and 4: the decode slots);
# 2. the three versions under share, two rounds of a cluster each, alternating (32768² zstd in and out);
# 3. raw chunks in and out on the same machine.
# Records: beside.json, raw-32768.json and ab.tar (the six A/B records).
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
[ -f .ab/versions ] || { echo "prepare .ab first (see the header)"; exit 2; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
DGEMM_COMMIT=$(cat .ab/checkout) timeout 200 python3 bench/notes/issue-28/beside_gemm.py "$OUT/beside.json" \
    --seconds 1.2 --variants 1,4,8 --threads 1,4 --priority high,normal 2>&1 | grep -v '^{"huf' | tail -3
python3 bench/notes/issue-28/beside_gemm.py "$OUT/beside.json" --summary
ROUNDS=2 OUT="$OUT" bash bench/notes/issue-28/gpu_session_ab.sh session

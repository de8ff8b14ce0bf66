#!/bin/bash
# One device call on one GPU (about 7 minutes on an H100) after the Huffman kernel's groups of 8 blocks
# (issue 28, eighth session): run from the project's root after `source .whl/gpu-env.sh`,
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_huffman.sh     (the records go to "$OUT")
# 1. the decode kernels, 4 chunks of 64 MiB of normal float32 a call at levels 3 and 1, the Huffman work-group
#    of 32 lanes (8 blocks, the default), 16 (4 blocks) and 4 (one block: the old work-group's useful lanes);
#    and a random walk (sequences in most blocks) at level 3;
# 2. 32768² float32, A and B numcodecs Zstd(3), C ZstdCodec(3), device-codecs off and on, alternating, then raw
#    chunks in and out (the issue's end-to-end target: on within 15 % of raw);
# 3. the GPU-marked tests (the kernel changed).
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
python3 bench/notes/issue-28/zstd_decode.py --out "$OUT/dec-normal" --levels 3,1 --data normal --repeats 3 \
    --threads 1,8 --huf-variants 1:32,1:16,1:4
python3 bench/notes/issue-28/zstd_decode.py --out "$OUT/dec-walk" --levels 3 --data walk --repeats 2 --threads 1
. bench/notes/issue-28/e2e_32768.sh
e2e_32768 off,on 3 3

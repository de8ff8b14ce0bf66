#!/bin/bash
# Device calls on one GPU (each about 3 minutes on an H100) for the Huffman kernel's readers 3 and 4 (a block's
# streams decoded in step by one work-item, several blocks a work-group; reader 4 refills without branches;
# issue 28, ninth session): run from the project's root after `source .whl/gpu-env.sh`,
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_ilp.sh [VARIANTS [CHUNKS]]
# the decode kernels, CHUNKS (default 4) chunks of 64 MiB of normal float32 a call, level 3, for each Huffman
# variant READER:LANES:LOCAL:FAST:ILP:BLOCKS (zstd_decode.py --huf-variants; each checked byte for byte).
# Calls made: 72a00ec (reader 3: 1:0:1:1,3:0:1:1:1:1,3:0:1:1:2:1,...), bc27ed5 and 8995e08 (reader 4), 9a21319
# (reader 5: 1:0:1:1,4:0:1:1:1:1,5:0:1:1:1:1,5:0:1:1:2:1,5:0:1:1:1:2,5:0:1:1:4:1 at 4 chunks, three at 16).
# Readers 3 and 4 are gone from the kernel since (aa4c9a4); reader 5 stayed, as the default.
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
V=${1:-1:0:1:1,5:0:1:1:1:1,5:0:1:1:2:1,5:0:1:1:1:2}
C=${2:-4}
python3 bench/notes/issue-28/zstd_decode.py --out "$OUT/dec" --chunks "$C" --levels 3 --data normal --repeats 3 \
    --threads 1 --huf-variants "$V"
for f in "$OUT"/dec/zstd_decode-*.json; do mv "$f" "$OUT/dec/decode-$C.json"; done

#!/bin/bash
# One device call on one GPU (about 6 minutes on an H100) after the Huffman kernel's reader 3 (streams of a
# block decoded in step by one work-item, several blocks a work-group; issue 28, ninth session): run from the
# project's root after `source .whl/gpu-env.sh`,
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_ilp.sh     (the records go to "$OUT")
# 1. the decode kernels, 4 chunks of 64 MiB of normal float32 a call, level 3: reader 1 (the default) against
#    reader 3 with 1, 2 or 4 streams a work-item and 1, 2 or 4 blocks a work-group (each checked byte for byte);
# 2. the same at level 1 and with 16 chunks a call, for reader 1 and three of reader 3's shapes.
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
D=bench/notes/issue-28/zstd_decode.py
python3 $D --out "$OUT/dec-l3" --levels 3 --data normal --repeats 3 --threads 1 \
    --huf-variants 1:0:1:1,3:0:1:1:1:1,3:0:1:1:2:1,3:0:1:1:2:2,3:0:1:1:2:4,3:0:1:1:4:1,3:0:1:1:4:2,3:0:1:1:4:4,3:0:1:1:1:4
python3 $D --out "$OUT/dec-l1" --levels 1 --data normal --repeats 3 --threads 1 \
    --huf-variants 1:0:1:1,3:0:1:1:2:2,3:0:1:1:2:4,3:0:1:1:4:4
python3 $D --out "$OUT/dec-16" --chunks 16 --levels 3 --data normal --repeats 3 --threads 1 \
    --huf-variants 1:0:1:1,3:0:1:1:2:2,3:0:1:1:2:4,3:0:1:1:4:4

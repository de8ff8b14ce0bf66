#!/bin/bash
# One device call on one GPU (about 5 minutes on an H100): the wide parser's default since its sixth form (64 lanes,
# phase 2's groups made by the first copying lane) around its batch, long-copy threshold and lanes, against the
# token table before it, each checked bit for bit against numcodecs first; the GPU-marked tests at the default;
# then the Blosc tests on the machine's PoCL CPU device (issue 28, tenth session).
# Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_lz4_wide7.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
python3 bench/notes/issue-28/blosc_decode.py "$OUT/blosc-wide7.json" --no-host --repeats 3 \
    --cases normal-shuffle-5,walk-shuffle-5,normal-shuffle-1 \
    --variants table:32 table:64:parse=2,group=32 table:64:parse=2,group=32,long=16 \
    table:64:parse=2,group=32,long=64 table:64:parse=2,group=32,batch=32 table:64:parse=2,group=32,batch=128 \
    table:96:parse=2,group=64 table:128:parse=2,group=32
python3 dev/gpu_tests.py --out "$OUT/t" > "$OUT/gpu_tests.log" 2>&1
tail -n 2 "$OUT/gpu_tests.log"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_blosc_device.py > "$OUT/tests.log" 2>&1
tail -n 3 "$OUT/tests.log"

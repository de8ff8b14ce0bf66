#!/bin/bash
# One device call on one GPU (about 4 minutes on an H100): Blosc-LZ4's wide parser, sixth form (phase 2's groups
# made in phase 1 of their own batch, by LZ4_GROUP_LANE, beside the next batch's walk; the walk through one local
# pointer with one exit a token) by lanes and grouping lane, against the token table before it, each checked bit for
# bit against numcodecs first; then through CUDA and the profiler; then the Blosc tests on the machine's PoCL CPU
# device (issue 28, tenth session).
# Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_lz4_wide6.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
python3 bench/notes/issue-28/blosc_decode.py "$OUT/blosc-wide6.json" --no-host --repeats 3 \
    --cases normal-shuffle-5,walk-shuffle-5,normal-shuffle-1 \
    --variants table:32 table:64:parse=2 table:64:parse=2,group=32 table:96:parse=2,copy_from=64,group=32 \
    table:96:parse=2 table:32:parse=2
L=bench/notes/issue-28/lz4_in_cuda.py
python3 $L --param LZ4_PARSE=2 --param LZ4_WG=64 > "$OUT/lz4-wide6-in-cuda.jsonl"
ncu --clock-control none -k regex:lz4_streams -c 2 --set full --import-source yes -o "$OUT/lz4u" \
    python3 $L --reps 1 --param LZ4_PARSE=2 --param LZ4_WG=64 > "$OUT/ncu-wide6.log" 2>&1
ncu --import "$OUT/lz4u.ncu-rep" --page source --csv --print-source sass --launch-skip 1 --launch-count 1 \
    > "$OUT/lz4u-sass.csv" 2>&1
rm -f "$OUT/lz4u.ncu-rep"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_blosc_device.py > "$OUT/tests.log" 2>&1
tail -n 3 "$OUT/tests.log"

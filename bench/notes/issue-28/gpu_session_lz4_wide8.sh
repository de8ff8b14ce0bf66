#!/bin/bash
# One device call on one GPU (about 3 minutes on an H100): the wide parser's walk two tokens a turn (the loop's own
# instructions once for both) at the default (64 lanes, groups by the first copying lane) and at 32 lanes, against
# the token table before it, each checked bit for bit against numcodecs first; then through CUDA and the profiler;
# then the Blosc tests on the machine's PoCL CPU device (issue 28, tenth session).
# Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_lz4_wide8.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
python3 bench/notes/issue-28/blosc_decode.py "$OUT/blosc-wide8.json" --no-host --repeats 3 \
    --cases normal-shuffle-5,walk-shuffle-5,normal-shuffle-1 \
    --variants table:32 table:64:parse=2,group=32 table:32:parse=2 table:96:parse=2,group=64
L=bench/notes/issue-28/lz4_in_cuda.py
python3 $L --param LZ4_PARSE=2 --param LZ4_WG=64 --param LZ4_GROUP_LANE=32 > "$OUT/lz4-wide8-in-cuda.jsonl"
ncu --clock-control none -k regex:lz4_streams -c 2 --set full --import-source yes -o "$OUT/lz4r" \
    python3 $L --reps 1 --param LZ4_PARSE=2 --param LZ4_WG=64 --param LZ4_GROUP_LANE=32 > "$OUT/ncu-wide8.log" 2>&1
ncu --import "$OUT/lz4r.ncu-rep" --page source --csv --print-source sass --launch-skip 1 --launch-count 1 \
    > "$OUT/lz4r-sass.csv" 2>&1
rm -f "$OUT/lz4r.ncu-rep"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_blosc_device.py > "$OUT/tests.log" 2>&1
tail -n 3 "$OUT/tests.log"

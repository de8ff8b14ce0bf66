#!/bin/bash
# One device call on one GPU (about 5 minutes on an H100): the lean parser's second step (one local address for
# a sequence's table entries, the loop left only by a sequence that ends the stream or breaks a rule, its three
# loads from one address, the frames' buffer padded by 16 bytes for them) against the tuned build before the
# lean parser (token table, 32 lanes), each checked bit for bit against numcodecs first; then through CUDA and
# the profiler; then the Blosc tests and the lean parser's mutations on the machine's PoCL CPU device (issue 28,
# tenth session).  Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_lz4_lean2.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
python3 bench/notes/issue-28/blosc_decode.py "$OUT/blosc-lean2.json" --no-host --repeats 3 \
    --cases normal-shuffle-5,walk-shuffle-5,normal-shuffle-1 \
    --variants table:32 table:32:parse=1 table:64:parse=1
L=bench/notes/issue-28/lz4_in_cuda.py
python3 $L --param LZ4_PARSE=1 > "$OUT/lz4-lean2-in-cuda.jsonl"
ncu --clock-control none -k regex:lz4_streams -c 2 --set full --import-source yes -o "$OUT/lz4m" \
    python3 $L --reps 1 --param LZ4_PARSE=1 > "$OUT/ncu-lean2.log" 2>&1
ncu --import "$OUT/lz4m.ncu-rep" --page source --csv --print-source sass --launch-skip 1 --launch-count 1 \
    > "$OUT/lz4m-sass.csv" 2>&1
rm -f "$OUT/lz4m.ncu-rep"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_blosc_device.py > "$OUT/tests.log" 2>&1
tail -n 3 "$OUT/tests.log"
timeout 150 python3 dev/mutations.py --no-baseline --timeout 120 --out "$OUT/mutations.json" \
    lz4-lean-offset-zero lz4-lean-input-end lz4-lean-match-end lz4-lean-next-token lz4-lean-slow-next \
    lz4-table-independent-too-soon > "$OUT/mutations.log" 2>&1
tail -n 8 "$OUT/mutations.log"

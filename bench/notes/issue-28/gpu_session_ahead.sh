#!/bin/bash
# One device call on one GPU (about 3 minutes on an H100): the Huffman kernel's reader 5 with its window's next
# word loaded one refill ahead (the default) against two (ZSTD_HUF_AHEAD=2): the profiler found a third of the
# default's stalls on the first shift after a refill, waiting for that word (issue 28, ninth session).  Run
# from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_ahead.sh
# the decode kernels at 4 and 16 chunks of 64 MiB (level 3), then both builds through CUDA and the profiler.
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
V=5:0:1:1:1:1:1,5:0:1:1:1:1:2
for C in 4 16; do
    python3 bench/notes/issue-28/zstd_decode.py --out "$OUT/dec$C" --chunks $C --levels 3 --data normal --repeats 3 \
        --threads 1 --huf-variants $V
    for f in "$OUT"/dec$C/zstd_decode-*.json; do mv "$f" "$OUT/dec$C/decode.json"; done
done
H=bench/notes/issue-28/huffman_in_cuda.py
python3 $H --variants 5:0:1:1:1:1:2 > "$OUT/huffman-in-cuda.jsonl"
ncu --clock-control none -k regex:huf_streams -c 4 --set full --import-source yes -o "$OUT/huf" \
    python3 $H --reps 1 --variants 5:0:1:1:1:1:2 > "$OUT/ncu.log" 2>&1
ncu --import "$OUT/huf.ncu-rep" --page source --csv --print-source sass --launch-skip 3 --launch-count 1 \
    > "$OUT/huf-sass-ahead2.csv" 2>&1
rm -f "$OUT/huf.ncu-rep"

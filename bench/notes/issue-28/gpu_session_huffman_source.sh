#!/bin/bash
# One device call on one GPU (about 3 minutes on an H100): the Huffman kernel through CUDA and NVIDIA's profiler,
# reader 1 (the default) against reader 4 with one stream a work-item and with two (issue 28, ninth session),
# with the profiler's per-instruction stall samples (the source page, SASS), to find which instructions wait.
# Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_huffman_source.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."
H=bench/notes/issue-28/huffman_in_cuda.py
V=4:0:1:1:1:1,4:0:1:1:2:1
python3 $H --variants $V > "$OUT/huffman-in-cuda.jsonl"
ncu --clock-control none -k regex:huf_streams -c 6 --set full --import-source yes -o "$OUT/huf" \
    python3 $H --reps 1 --variants $V > "$OUT/ncu.log" 2>&1
ncu --import "$OUT/huf.ncu-rep" --page raw --csv > "$OUT/huf-raw.csv" 2>&1
for k in 0 2 4; do
    ncu --import "$OUT/huf.ncu-rep" --page source --csv --print-source sass --launch-skip $k --launch-count 1 \
        > "$OUT/huf-sass-$k.csv" 2>&1
done
rm -f "$OUT/huf.ncu-rep"

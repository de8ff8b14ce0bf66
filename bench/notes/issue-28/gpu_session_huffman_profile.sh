#!/bin/bash
# One device call on one GPU (about 4 minutes on an H100): the Huffman kernel through CUDA and NVIDIA's profiler,
# reader 1 (the default: quads from global memory, double-buffered) against reader 3 (words staged in local
# memory in rounds), then both through dgemm's decode call.  Run from the project's root after
# `source .whl/gpu-env.sh`:   OUT=/some/folder bash bench/notes/issue-28/gpu_session_huffman_profile.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."
H=bench/notes/issue-28/huffman_in_cuda.py
python3 $H --variants 3:0:1,0:0:1,1:4:1,3:4:1 > "$OUT/huffman-in-cuda.jsonl"
ncu --clock-control none -k regex:huf_streams -c 4 --set full -o "$OUT/huf" python3 $H --reps 1 --variants 3:0:1 \
    > "$OUT/ncu.log" 2>&1
ncu --import "$OUT/huf.ncu-rep" --page details > "$OUT/huf-details.txt" 2>&1
ncu --import "$OUT/huf.ncu-rep" --page raw --csv > "$OUT/huf-raw.csv" 2>&1
rm -f "$OUT/huf.ncu-rep"
python3 bench/notes/issue-28/zstd_decode.py --out "$OUT/dec" --levels 3,1 --data normal --repeats 3 --threads 1,8 \
    --huf-variants 1:0:1,3:0:1
for f in "$OUT"/dec/*.json; do mv "$f" "$OUT/dec/decode.json"; done

#!/bin/bash
# One device call on one GPU (about 2 minutes on an H100): the Blosc-LZ4 stream kernel (its tuned build) through
# CUDA and NVIDIA's profiler, with each instruction's stall samples (issue 28, ninth session: the kernel had never
# been profiled).  Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_lz4_profile.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
L=bench/notes/issue-28/lz4_in_cuda.py
python3 $L > "$OUT/lz4-in-cuda.jsonl"
ncu --clock-control none -k regex:lz4_streams -c 2 --set full --import-source yes -o "$OUT/lz4" \
    python3 $L --reps 1 > "$OUT/ncu.log" 2>&1
ncu --import "$OUT/lz4.ncu-rep" --page raw --csv > "$OUT/lz4-raw.csv" 2>&1
ncu --import "$OUT/lz4.ncu-rep" --page source --csv --print-source sass --launch-skip 1 --launch-count 1 \
    > "$OUT/lz4-sass.csv" 2>&1
rm -f "$OUT/lz4.ncu-rep"

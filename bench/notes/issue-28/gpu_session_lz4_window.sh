#!/bin/bash
# One device call on one GPU (about 5 minutes on an H100), made at f74ef3e (LZ4_WINDOW was removed after it, slower
# than the build without it; results/2026-11-27-nvidia-h100-blosc-lz4-window-f74ef3e.json): Blosc-LZ4's stream kernel with its parser
# reading through 16 bytes held in registers (LZ4_WINDOW 1, a13b9c4) against the tuned build (token table, 32
# lanes), each checked bit for bit against numcodecs first, on normal and random-walk float32 at clevel 5 and on
# normal at clevel 1 (issue 28: the profiler found 83 % of the kernel's stalls on its one-lane parse).  Run from
# the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_lz4_window.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
python3 bench/notes/issue-28/blosc_decode.py "$OUT/blosc-window.json" --no-host --repeats 3 \
    --cases normal-shuffle-5,walk-shuffle-5,normal-shuffle-1 \
    --variants table:32 table:32:window=1 table:64:window=1 table:32:window=1,batch=128
# then the window build through CUDA and the profiler, each instruction's stall samples (as gpu_session_lz4_profile.sh)
L=bench/notes/issue-28/lz4_in_cuda.py
python3 $L --param LZ4_WINDOW=1 > "$OUT/lz4-window-in-cuda.jsonl"
ncu --clock-control none -k regex:lz4_streams -c 2 --set full --import-source yes -o "$OUT/lz4w" \
    python3 $L --reps 1 --param LZ4_WINDOW=1 > "$OUT/ncu-window.log" 2>&1
ncu --import "$OUT/lz4w.ncu-rep" --page raw --csv > "$OUT/lz4w-raw.csv" 2>&1
ncu --import "$OUT/lz4w.ncu-rep" --page source --csv --print-source sass --launch-skip 1 --launch-count 1 \
    > "$OUT/lz4w-sass.csv" 2>&1
rm -f "$OUT/lz4w.ncu-rep"

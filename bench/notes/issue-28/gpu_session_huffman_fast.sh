#!/bin/bash
# One device call on one GPU (about 7 minutes on an H100) after the Huffman kernel's unchecked symbols (reader 1
# decodes without checks while 48 bits or more are left): run from the project's root after
# `source .whl/gpu-env.sh`:   OUT=/some/folder bash bench/notes/issue-28/gpu_session_huffman_fast.sh
# 1. the decode kernels with ZSTD_HUF_FAST 1 (the default) and 0 (every symbol checked), levels 3 and 1;
# 2. the Huffman kernel through CUDA and NVIDIA's profiler (both builds);
# 3. 32768² float32 zstd in and out, device-codecs off and on, alternating, then raw chunks in and out;
# 4. the GPU-marked tests (the kernel changed).
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."
python3 bench/notes/issue-28/zstd_decode.py --out "$OUT/dec" --levels 3,1 --data normal --repeats 3 --threads 1,8 \
    --huf-variants 1:0:1:1,1:0:1:0
for f in "$OUT"/dec/*.json; do mv "$f" "$OUT/dec/decode.json"; done
H=bench/notes/issue-28/huffman_in_cuda.py
python3 $H --variants 1:0:1:0 > "$OUT/huffman-in-cuda.jsonl"
ncu --clock-control none -k regex:huf_streams -c 2 --set full -o "$OUT/huf" python3 $H --reps 1 > "$OUT/ncu.log" 2>&1
ncu --import "$OUT/huf.ncu-rep" --page raw --csv > "$OUT/huf-raw.csv" 2>&1
rm -f "$OUT/huf.ncu-rep"
. bench/notes/issue-28/e2e_32768.sh
e2e_32768 off,on 3 2

#!/bin/bash
# Two device calls on one GPU (about 5 minutes each on an H100) after the Huffman kernel's reader 5 became the
# default (issue 28, ninth session): run from the project's root after `source .whl/gpu-env.sh`,
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_reader5.sh decode|e2e
# decode: the decode kernels, 4 chunks of 64 MiB of normal float32 a call at levels 3 and 1 (reader 5, then
#         reader 1, the default before), 16 chunks at level 3; the Huffman kernel through CUDA and NVIDIA's
#         profiler (per-instruction stall samples); the engine alone, 32768² zstd, device-codecs off and on,
#         and raw chunks;
# e2e:    32768² float32 zstd in and out through the cluster, off and on alternating, then raw; the GPU-marked
#         tests.
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
D=bench/notes/issue-28/zstd_decode.py
case "${1:?decode or e2e}" in
decode)
    python3 $D --out "$OUT/dec4" --levels 3,1 --data normal --repeats 3 --threads 1,8 --huf-variants 5:0:1:1:1:1,1:0:1:1
    python3 $D --out "$OUT/dec16" --chunks 16 --levels 3 --data normal --repeats 3 --threads 1 \
        --huf-variants 5:0:1:1:1:1,1:0:1:1
    for k in 4 16; do for f in "$OUT"/dec$k/zstd_decode-*.json; do mv "$f" "$OUT/dec$k/decode.json"; done; done
    H=bench/notes/issue-28/huffman_in_cuda.py
    python3 $H > "$OUT/huffman-in-cuda.jsonl"
    ncu --clock-control none -k regex:huf_streams -c 2 --set full --import-source yes -o "$OUT/huf" \
        python3 $H --reps 1 > "$OUT/ncu.log" 2>&1
    ncu --import "$OUT/huf.ncu-rep" --page raw --csv > "$OUT/huf-raw.csv" 2>&1
    ncu --import "$OUT/huf.ncu-rep" --page source --csv --print-source sass --launch-skip 1 --launch-count 1 \
        > "$OUT/huf-sass.csv" 2>&1
    rm -f "$OUT/huf.ncu-rep"
    E=bench/notes/issue-27/engine_alone.py
    python3 $E "$OUT/engine-alone-zstd-32768.json" --size 32768 --chunks 4096 --codec zstd --rounds 2 --threads 1 \
        --device-codecs off,on
    python3 $E "$OUT/engine-alone-raw-32768.json" --size 32768 --chunks 4096 --codec none --rounds 2 --threads 1
    ;;
e2e)
    . bench/notes/issue-28/e2e_32768.sh
    e2e_32768 off,on 3 2
    ;;
esac

#!/bin/bash
# One device call on one GPU (about 5 minutes on an H100) for the question the twelfth session left: what the
# device decoders' kernels take beside the GEMMs against alone.  With device-codecs on a 32768² product's
# busy time had 1.0 s of "other" (raw: 0.08) while the decode kernels alone take 0.14 s for its 8.6 GB; if
# the GEMM kernels (every SM) slow the decodes that the next GEMMs wait for, the cure is in the order of the
# work (the decodes far ahead, or in phases), not in the host.  Run from the project's root after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_overlap.sh
# 1. the decode kernels alone: 1 and 4 chunks of 64 MiB of normal float32 a call at level 3 (the engine decodes
#    one chunk a call), 1 and 8 reader threads;
# 2. the engine alone (no Dask), 32768² zstd, device-codecs off and on, 1 and 2 threads, 2 rounds: the GEMMs'
#    gaps, and the decoders' commands' summed seconds by kind beside the GEMMs (decoder_s);
# 3. the same with raw chunks.
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
D=bench/notes/issue-28/zstd_decode.py
for k in 1 4; do
    python3 $D --out "$OUT/dec$k" --chunks $k --levels 3 --data normal --repeats 3 --threads 1,8
    for f in "$OUT"/dec$k/zstd_decode-*.json; do mv "$f" "$OUT/dec$k/decode.json"; done
done
E=bench/notes/issue-27/engine_alone.py
python3 $E "$OUT/engine-alone-zstd-32768.json" --size 32768 --chunks 4096 --codec zstd --rounds 2 --threads 1,2 \
    --device-codecs off,on
python3 $E "$OUT/engine-alone-raw-32768.json" --size 32768 --chunks 4096 --codec none --rounds 2 --threads 1,2

#!/bin/bash
# Prepared for the twenty-first session (one device call on one GPU, about 8 minutes): reader 6, each Huffman
# stream split among work-items that resynchronize (zstd_decode.cl), against reader 5 (a stream a work-item).
# Here, first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=4dd1cfb v1=2836618 v2=22e9999
# (4dd1cfb: reader 5, the default before; 2836618: reader 6 at 8 work-items a stream; 22e9999, the local branch
# x-split16: at 16, never merged).  Then on the device, with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_split21.sh [kernels]
# (kernels: steps 1 and 2 only, on this checkout's dgemm)
# 1. zstd_decode.py: the decode kernels alone, 4 chunks of 64 MiB a call, levels 3 and 1, reader 5 and reader 6
#    at 4, 8, 16 and 32 work-items a stream (each variant's first call checked against libzstd's bytes);
# 2. beside_gemm.py: what the decode costs the GEMMs beside it per decoded GB, reader 5 and reader 6 at 8, 16, 32;
# 3. the three versions under share, two rounds of a cluster each, alternating (32768² zstd in and out), then raw
#    chunks in and out on the same machine.
# Records: decode.json (zstd_decode.py's), beside.json, raw-32768.json and ab.tar (the six A/B records).
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
[ -f .ab/versions ] || [ "${1:-}" = kernels ] || { echo "prepare .ab first (see the header)"; exit 2; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
export DGEMM_COMMIT=$(cat .ab/checkout 2>/dev/null || git rev-parse --short HEAD)
timeout 150 python3 bench/notes/issue-28/zstd_decode.py --out "$OUT/decode" --chunks 4 --levels 3,1 --repeats 5 \
    --threads 1 --huf-variants 5:0:1:1:1:1:1,6:16,6:32,6:64,6:128 > /dev/null 2>&1
for f in "$OUT"/decode/*.json; do cp "$f" "$OUT/decode.json"; done     # (a name with '+' does not come back)
python3 -c "
import glob, json
for f in glob.glob('$OUT/decode/*.json'):
    for k, v in json.load(open(f))['runs'].items():
        print('decode', k, 'huffman', v['per_kernel_gbps'].get('huffman'), 'kernels', v.get('kernel_gbps'),
              'wall', v.get('wall_gbps'), 'correct', v.get('correct'))"
timeout 150 python3 bench/notes/issue-28/beside_gemm.py "$OUT/beside.json" --seconds 1.2 --variants 1,s8,s16,s32 \
    --threads 1,4 --priority normal 2>&1 | grep -v '^{"huf' | tail -3
python3 bench/notes/issue-28/beside_gemm.py "$OUT/beside.json" --summary
[ "${1:-}" = kernels ] || ROUNDS=2 OUT="$OUT" bash bench/notes/issue-28/gpu_session_ab.sh session

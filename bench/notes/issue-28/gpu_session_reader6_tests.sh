#!/bin/bash
# Prepared for the session after the twenty-first (one device call on one GPU, about 3 minutes): reader 6 (each
# Huffman stream split among work-items, the default since the twenty-first session) checked on the GPU itself,
# where its work-items run at once (its rounds of re-reads share local memory and barriers, which PoCL's
# work-items in turn cannot show), and timed again after its read loops were bounded (31838ea, not timed).
# From the project's root, with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_reader6_tests.sh
# 1. the zstd decode tests with DGEMM_TEST_ANY_DEVICE=gpu and DGEMM_FUZZ_ROUNDS=300 (the corrupt frames' search
#    longer), recorded as junit counts: zstd-on-gpu.xml, zstd-on-gpu.log;
# 2. zstd_decode.py: the decode kernels alone, reader 5 and reader 6 at 16 work-items a stream, levels 3 and 1,
#    4 chunks of 64 MiB a call (each variant's first call checked against libzstd's bytes): decode.json.
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
DGEMM_TEST_ANY_DEVICE=gpu DGEMM_FUZZ_ROUNDS=${FUZZ_ROUNDS:-300} timeout 300 python3 -m pytest -q -p no:cacheprovider \
    --junitxml "$OUT/zstd-on-gpu.xml" tests/test_zstd_decode_device.py > "$OUT/zstd-on-gpu.log" 2>&1
tail -3 "$OUT/zstd-on-gpu.log"
timeout 150 python3 bench/notes/issue-28/zstd_decode.py --out "$OUT/decode" --chunks 4 --levels 3,1 --repeats 5 \
    --threads 1 --huf-variants 5:0:1:1:1:1:1,6:64 > /dev/null 2>&1
for f in "$OUT"/decode/*.json; do cp "$f" "$OUT/decode.json"; done     # (a name with '+' does not come back)
python3 -c "
import json
for k, v in json.load(open('$OUT/decode.json'))['runs'].items():
    print('decode', k, 'huffman', v['per_kernel_gbps'].get('huffman'), 'kernels', v.get('kernel_gbps'),
          'correct', v.get('correct'))"

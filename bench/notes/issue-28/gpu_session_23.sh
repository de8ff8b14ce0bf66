#!/bin/bash
# The twenty-third session's call on one GPU (about 7 minutes on one H200, 16 cores): the decode slots' new reserve
# (dgemm.worker.decoding.call_bytes, 3804f02) checked on the GPU (the plan's 64 lanes a frame, where PoCL runs
# one), then end to end on the same machine with it: 49152² and 32768² zstd in and out under share and on, two
# runs each, alternating, and raw chunks in and out three times each (gemm-tasks 1).  Run from the project's root
# with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_23.sh
. "$(dirname "$0")/session_common.sh" s23
DGEMM_TEST_ANY_DEVICE=gpu timeout 200 python3 -m pytest -p no:cacheprovider -q tests/test_decoding.py \
    -k "holds_no_more or counts_the_whole or slots_room" 2>&1 | tail -3
FIELDS="mode wall_s per_worker.busy_seconds busy_read_seconds busy_transfer_seconds busy_other_seconds device_decoded_bytes"
for size in 49152 32768; do
    timeout 240 python3 $S "$OUT/s23-zstd-$size.json" --size $size --chunk 4096 --devices gpu --codec zstd \
        --repeats 2 --modes share,on --gemm-tasks 1 --inputs "$inputs/zstd-$size" 2>&1 | summary "zstd $size" $FIELDS
    rm -rf "$inputs/zstd-$size"
    timeout 150 python3 $S "$OUT/s23-raw-$size.json" --size $size --chunk 4096 --devices gpu --codec none \
        --out-codec none --repeats 3 --modes off --gemm-tasks 1 --inputs "$inputs/raw-$size" 2>&1 | summary "raw $size" $FIELDS
    rm -rf "$inputs/raw-$size"
done
ls -la "$OUT"     # what the call leaves for the records

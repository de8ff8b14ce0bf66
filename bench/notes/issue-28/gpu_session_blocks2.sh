#!/bin/bash
# One device call on one GPU (seventeenth session, about 5 minutes), after gpu_session_blocks.sh found share at
# 8192-row blocks 1.72-1.81 s against 2.24-2.37 at 4096 (raw 1.36-1.37 either way): a script's first product on a
# new cluster at each block size (zstd share, raw), then, on one cluster, share, on and off with gemm-tasks 1 and 2
# and share with 8 and 16 decode slots at 8192x8192x4096, and raw at auto, 8192x8192x4096 and 8192.
# Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_blocks2.sh
. "$(dirname "$0")/session_common.sh" blocks
# what summary prints of each run
FIELDS="mode block first slots gemm_tasks_setting wall_s device_decoded_bytes"
BIG=${BIG:-8192x8192x4096}
for b in auto "$BIG"; do
    timeout 120 python3 $S "$OUT/first-zstd-$b.json" $GEO --codec zstd --repeats 2 --modes share --blocks "$b" \
        --no-warmup --inputs "$inputs/zstd" 2>&1 | summary first-zstd $FIELDS
done
timeout 200 python3 $S "$OUT/sweep-zstd.json" $GEO --codec zstd --repeats 2 --modes share,on,off --gemm-tasks 1,2 \
    --blocks "$BIG" --slots 8,16 --slots-mode share --inputs "$inputs/zstd" 2>&1 | summary zstd $FIELDS
for b in auto "$BIG"; do
    timeout 60 python3 $S "$OUT/first-raw-$b.json" $GEO --codec none --out-codec none --repeats 1 --modes off \
        --blocks "$b" --no-warmup --inputs "$inputs/raw" 2>&1 | summary first-raw $FIELDS
done
timeout 120 python3 $S "$OUT/raw.json" $GEO --codec none --out-codec none --repeats 2 --modes off \
    --blocks "auto,$BIG,8192" --inputs "$inputs/raw" 2>&1 | summary raw $FIELDS
ls -la "$OUT"     # what the call leaves for the records

#!/bin/bash
# One device call on one GPU (seventeenth session's last, about 4 minutes): end to end at HEAD with the GPU blocks'
# new default (dgemm's own choice, `auto`): a script's first product on a fresh cluster (zstd in and out, then raw),
# then two rounds of a cluster each for zstd share and raw, gemm-tasks 1 and 2, two runs each.
# Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_final17.sh
. "$(dirname "$0")/session_common.sh" final
# what summary prints of each run
FIELDS="mode block first gemm_tasks_setting wall_s device_decoded_bytes host_decoded_bytes"
timeout 100 python3 $S "$OUT/first-zstd.json" $GEO --codec zstd --repeats 2 --modes share --no-warmup \
    --inputs "$inputs/zstd" 2>&1 | summary first-zstd $FIELDS
timeout 80 python3 $S "$OUT/first-raw.json" $GEO --codec none --out-codec none --repeats 2 --modes off --no-warmup \
    --inputs "$inputs/raw" 2>&1 | summary first-raw $FIELDS
for round in 1 2; do
    timeout 100 python3 $S "$OUT/zstd-r$round.json" $GEO --codec zstd --repeats 2 --modes share --gemm-tasks 1,2 \
        --inputs "$inputs/zstd" 2>&1 | summary "zstd-r$round" $FIELDS
    timeout 80 python3 $S "$OUT/raw-r$round.json" $GEO --codec none --out-codec none --repeats 2 --modes off \
        --gemm-tasks 1,2 --inputs "$inputs/raw" 2>&1 | summary "raw-r$round" $FIELDS
done
ls -la "$OUT"     # what the call leaves for the records

#!/bin/bash
# The nineteenth session's last call on one GPU (about 5 minutes): end to end at the new read-threads default,
# same machine, more runs than an A/B gives each: 32768² zstd in and out under share with gemm-tasks 1 and 2,
# three runs each, alternating; raw chunks in and out, gemm-tasks 1 and 2, three runs each; then the timelines
# (timeline.py) of share and raw at gemm-tasks 1: whether the readers are busy while the products wait.  Run from
# the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_final19.sh
. "$(dirname "$0")/session_common.sh" final19
FIELDS="mode gemm_tasks_setting wall_s per_worker.busy_seconds busy_read_seconds busy_other_seconds gemm_gap_seconds device_decoded_bytes"
timeout 200 python3 $S "$OUT/final19-zstd.json" $GEO --codec zstd --repeats 3 --modes share --gemm-tasks 1,2 \
    --inputs "$inputs/zstd" 2>&1 | summary zstd $FIELDS
timeout 150 python3 $S "$OUT/final19-raw.json" $GEO --codec none --out-codec none --repeats 3 --modes off \
    --gemm-tasks 1,2 --inputs "$inputs/raw" 2>&1 | summary raw $FIELDS
TFIELDS="mode wall_s gemm_s wait_s first_gemm last_read_end last_gemm_end device_taken device_declined gil_wait_ms"
T=bench/notes/issue-28/timeline.py
timeout 150 python3 $T "$OUT/timeline19-zstd.json" $GEO --codec zstd --modes share --repeats 2 \
    --inputs "$inputs/zstd" 2>&1 | summary tl-zstd $TFIELDS
timeout 100 python3 $T "$OUT/timeline19-raw.json" $GEO --codec none --modes off --repeats 1 \
    --inputs "$inputs/raw" 2>&1 | summary tl-raw $TFIELDS
ls -la "$OUT"     # what the call leaves for the records

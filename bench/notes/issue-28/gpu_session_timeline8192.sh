#!/bin/bash
# One device call on one GPU (seventeenth session, about 4 minutes): the timelines (timeline.py) at the GPU blocks'
# new default (8192 x 8192 x 4096): 32768² zstd in and out under share and on, two runs each after the warm-up,
# then raw.  Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_timeline8192.sh
. "$(dirname "$0")/session_common.sh" timeline
# what summary prints of each run
FIELDS="mode wall_s gemm_s wait_s first_gemm last_read_end last_gemm_end device_taken device_declined gil_wait_ms"
T=bench/notes/issue-28/timeline.py
timeout 240 python3 $T "$OUT/timeline-zstd.json" $GEO --codec zstd --modes share,on --repeats 2 \
    --inputs "$inputs/zstd" 2>&1 | summary zstd $FIELDS
timeout 120 python3 $T "$OUT/timeline-raw.json" $GEO --codec none --modes off --repeats 2 \
    --inputs "$inputs/raw" 2>&1 | summary raw $FIELDS
ls -la "$OUT"     # what the call leaves for the records

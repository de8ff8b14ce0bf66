#!/bin/bash
# The thirtieth session's last device call (two GPUs of one host, about 6 minutes on two H200s): fewer decode slots a
# device, and calls of more blocks.  Neither shorter GEMM launches (x-launches30.patch) nor 8 slots (twenty-ninth
# session) made two GPUs faster: a worker's decode calls, about 1.8 blocks each, bound its reads.  Fewer slots make
# the blocks that queue behind them share fewer, larger calls (decoding.BATCH: at most 4 blocks, or 8 with `2x8`).
# 49152² zstd `on`, the default twice then 4, 2, 2x8 and 3 slots alternating (two rounds) on devices 0,1; 4 and 2 on
# device 0; then the timeline of `on` on devices 0,1 (one run; its commands now with the plan kernel's, each with its
# thread) and calls.py's summary of it.  Run from the project's root with carry [".whl"], kind nvidia-h200-x2, after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_slots30.sh
. "$(dirname "$0")/session_common.sh" x2-slots30
SIZE=${SIZE:-49152}
FIELDS="mode slots wall_s per_worker.busy_seconds per_worker.kernel_seconds first_gemm_start last_gemm_stop"
for devices in 0,1 0; do
    [ "$devices" = 0 ] && slots=4,2 || slots=4,2,2x8,3
    timeout 240 python3 $S "$OUT/x2-slots30-devices${devices/,/}.json" --size "$SIZE" --chunk 4096 \
        --devices "$devices" --codec zstd --repeats 2 --modes on --slots $slots --gemm-tasks 1 \
        --inputs "$inputs/zstd" 2>&1 | summary "devices $devices" $FIELDS
done
timeout 150 python3 bench/notes/issue-28/timeline.py "$OUT/timeline-x2-on.json" --size "$SIZE" --chunk 4096 \
    --devices 0,1 --codec zstd --modes on --repeats 1 --bin 0.05 --inputs "$inputs/zstd" 2>&1 | grep -v '^{"mode"' \
    | tail -5
python3 bench/notes/issue-28/calls.py "$OUT/timeline-x2-on.json" 2>&1 | tail -8
python3 bench/notes/issue-28/calls.py "$OUT/timeline-x2-on.json" --until 0.7 2>&1 | tail -4
ls -la "$OUT"

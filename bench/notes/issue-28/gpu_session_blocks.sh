#!/bin/bash
# One device call on one GPU (seventeenth session, about 5 minutes): whether larger block products close share's gap
# to raw.  The timelines showed each 4096² product's host work between its GEMMs (15 ms a product after the reads,
# 45 while they run) leaving the GPU idle 45-90 % of the time, with no product waiting for its inputs.
# 32768² zstd share and raw, block auto (4096), 8192x8192x4096 and 8192, two runs each, alternating; then the
# timelines (timeline.py: schedstat, gil_wait_ms) of share and off at auto and share at 8192x8192x4096, and raw.
# Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_blocks.sh
. "$(dirname "$0")/session_common.sh" blocks
# what summary prints of each run
FIELDS="mode block gemm_tasks_setting gemm_tasks wall_s"
T=bench/notes/issue-28/timeline.py
BLOCKS=${BLOCKS:-auto,8192x8192x4096,8192}
timeout 240 python3 $S "$OUT/blocks-zstd.json" --size ${SIZE:-32768} --chunk ${CHUNK:-4096} --codec zstd --devices ${DEVICES:-gpu} --repeats 2 --modes share \
    --blocks "$BLOCKS" --inputs "$inputs/zstd" 2>&1 | summary zstd $FIELDS
timeout 150 python3 $S "$OUT/blocks-raw.json" --size ${SIZE:-32768} --chunk ${CHUNK:-4096} --codec none --out-codec none --devices ${DEVICES:-gpu} --repeats 2 \
    --modes off --blocks "$BLOCKS" --inputs "$inputs/raw" 2>&1 | summary raw $FIELDS
timeout 90 python3 $T "$OUT/timeline-zstd-auto.json" --size ${SIZE:-32768} --chunk ${CHUNK:-4096} --devices ${DEVICES:-gpu} --codec zstd --modes share,off \
    --inputs "$inputs/zstd" 2>&1 | summary timeline-zstd $FIELDS
timeout 60 python3 $T "$OUT/timeline-zstd-8192x8192x4096.json" --size ${SIZE:-32768} --chunk ${CHUNK:-4096} --devices ${DEVICES:-gpu} --codec zstd --modes share \
    --block 8192x8192x4096 --inputs "$inputs/zstd" 2>&1 | summary timeline-zstd $FIELDS
timeout 60 python3 $T "$OUT/timeline-raw-auto.json" --size ${SIZE:-32768} --chunk ${CHUNK:-4096} --devices ${DEVICES:-gpu} --codec none --modes off \
    --inputs "$inputs/raw" 2>&1 | summary timeline-raw $FIELDS
ls -la "$OUT"     # what the call leaves for the records

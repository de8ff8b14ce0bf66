#!/bin/bash
# Prepared in the twenty-ninth session (one device call on two GPUs of one host, about 4 minutes on two H200s): where
# the two-GPU run's time goes.  Two H200s ran 49152² `on` in 2.10 s against 3.58 on one (1.70×; the target 1.8×),
# raw 2.03 against 3.29 (1.62×): each GPU's products wait about 0.5 s for inputs on both paths.  The timeline of
# `on` (two runs) and of raw (one run) on devices 0,1, in 0.05 s bins, per worker.  Run from the project's root with
# carry [".whl"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_timeline29.sh
. "$(dirname "$0")/session_common.sh" x2-timeline29
SIZE=${SIZE:-49152}
T=bench/notes/issue-28/timeline.py
timeout 260 python3 $T "$OUT/timeline-x2-on.json" --size "$SIZE" --chunk 4096 --devices 0,1 --codec zstd \
    --modes on --repeats 2 --bin 0.05 --inputs "$inputs/zstd" 2>&1 | grep -v '^{"mode"' | tail -200
timeout 200 python3 $T "$OUT/timeline-x2-raw.json" --size "$SIZE" --chunk 4096 --devices 0,1 --codec none \
    --modes off --repeats 1 --bin 0.05 --inputs "$inputs/raw" 2>&1 | grep -v '^{"mode"' | tail -100
ls -la "$OUT"

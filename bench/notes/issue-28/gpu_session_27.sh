#!/bin/bash
# Prepared for the session after the twenty-sixth (one device call on one GPU, about 4 minutes).  1. arena_probe.py:
# are a large buffer's sub-buffers on the device (the twenty-sixth session's arenas ran the decode commands 60 times
# slower, with no more of the device's memory in use)?  2. gpu_session_26b.sh: main's timeline of `on` at 32768²
# with the decode slots' new buffers and releases timed (and, where .ab/v1 is prepared, the slots' buffers kept
# between runs).  Run from the project's root with carry [".whl"] (and ".ab"), after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_27.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."
timeout 120 python3 bench/notes/issue-28/arena_probe.py --out "$OUT/arena-probe.json" 2>&1 | tail -7
OUT="$OUT" bash bench/notes/issue-28/gpu_session_26b.sh 2>&1 | tail -12

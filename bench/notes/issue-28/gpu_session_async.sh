#!/bin/bash
# One device call on one GPU (about 6 minutes on an H100) after C's device encode left the GEMMs' path (encoder
# threads, dgemm.worker.encoding) and the read-ahead grew to 64 blocks: an A/B in one call of the versions
# prepared here (`gpu_session_ab.sh prepare v0=<before> v1=<async encode> v2=<read-ahead 64>`), 32768² zstd in and
# out under share, gemm-tasks 1 and 2, then raw chunks with gemm-tasks 1 and 2, then the last version's timeline
# (timeline.py, share, gemm-tasks 1).  Run from the project's root with carry [".whl", ".ab"], after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_async.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
MODES=share GEMM_TASKS=1,2 ROUNDS=${ROUNDS:-1} SIZE=32768 bash bench/notes/issue-28/gpu_session_ab.sh run
REPEATS=2 SIZE=32768 bash bench/notes/issue-28/gpu_session_ab.sh raw
last=$(tail -1 .ab/versions | cut -d' ' -f1)
PYTHONPATH=$PWD/.ab/$last${PYTHONPATH:+:$PYTHONPATH} python3 bench/notes/issue-28/timeline.py "$OUT/timeline-$last.json" \
    --size 32768 --codec zstd --modes share --gemm-tasks 1 2>&1 | grep '^{"mode"'

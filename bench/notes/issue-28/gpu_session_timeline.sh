#!/bin/bash
# One device call on one GPU (about 3 minutes on an H100): the timeline of 32768² products (timeline.py), zstd in
# and out under share and off, then raw chunks, gemm-tasks 1, in 0.1 s bins: whether the readers are busy or idle
# while the products wait for their inputs.  Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_timeline.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
T=bench/notes/issue-28/timeline.py
python3 $T "$OUT/timeline-zstd-32768.json" --size 32768 --codec zstd --modes share,off --repeats ${REPEATS:-1} \
    ${EXTRA:-} 2>&1 | grep -v "Warning\|warn(\|self\.\|lambda:"
python3 $T "$OUT/timeline-raw-32768.json" --size 32768 --codec none --modes off --repeats 1 \
    ${EXTRA:-} 2>&1 | grep -v "Warning\|warn(\|self\.\|lambda:"

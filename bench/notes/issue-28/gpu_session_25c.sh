#!/bin/bash
# The twenty-fifth session's third call (one H100; 32768² took about 5 minutes, 49152² about 5 more without its raw runs,
# which the 10-minute limit cut: SIZES=49152 ROUNDS=1 fits): gpu_session_25b.sh's A/B (main before against
# blocks whose chunks are copied into place sharing decode calls) on an H100, where issue 28's targets are set:
# `on` at 32768² (ABBA, two runs a cluster), then at 49152² (ABBA), each with raw chunks in and out beside (two runs,
# gemm-tasks 1).  Each size's records go to a folder of their own.  Prepare here as gpu_session_25b.sh says, then
# run from the project's root with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_25c.sh
# (SIZES=49152 ROUNDS=1 with .ab prepared with v1 alone: the fourth call, raw at 49152² beside v1 on one machine)
set -u
: "${OUT:?set OUT to the folder for the records}"
here=$(dirname "$0")
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for size in ${SIZES:-32768 49152}; do
    echo "== $size"; mkdir -p "$OUT/s$size"
    OUT=$OUT/s$size SIZE=$size MODES=on ROUNDS=${ROUNDS:-2} REPEATS=2 RAW_TASKS=1 bash "$here/gpu_session_ab.sh" session \
        | grep -v '^total\|^d\|^-'
done

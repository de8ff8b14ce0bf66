#!/bin/bash
# The twenty-seventh session's fourth call (one GPU, about 6 minutes): the decode and encode slots' buffers made as
# large as their names have been (fb5cc19), again against the main before it, after its first A/B (call 3: 8 % faster
# in 3 runs of 4).  First the scratch tests on the GPU itself, then the A/B prepared here with
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=ca90851 v1=fb5cc19
# `on` at 32768² zstd in and out, ABBA, raw beside.  Run from the project's root with carry [".whl", ".ab"], after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_27c.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."
DGEMM_TEST_ANY_DEVICE=gpu timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_scratch.py 2>&1 | tail -2
OUT="$OUT" MODES=${MODES:-on} ROUNDS=${ROUNDS:-2} REPEATS=2 RAW_TASKS=1 CLUSTER_TIMEOUT=150 \
    bash bench/notes/issue-28/gpu_session_ab.sh session 2>&1 | tail -14

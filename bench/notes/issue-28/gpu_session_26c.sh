#!/bin/bash
# The twenty-sixth session's third call (one GPU, about 6 minutes): the decode and encode slots' buffers carved from
# one arena a slot (dgemm.opencl.scratch), against main.  First the tests that carve them on the GPU itself
# (sub-buffers through NVIDIA's driver: the scratch, the shared decode calls with and without the arena), then an
# A/B of the versions prepared (`gpu_session_ab.sh prepare v0=MAIN v1=ARENA` here), `on` at 32768² zstd in and out,
# ABBA, raw beside.  Run from the project's root with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_26c.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."
DGEMM_TEST_ANY_DEVICE=gpu timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_scratch.py \
    tests/test_decoding.py -k "scratch or arena or copied or queued_behind or slot" 2>&1 | tail -3
OUT="$OUT" MODES=${MODES:-on} ROUNDS=${ROUNDS:-2} REPEATS=2 RAW_TASKS=1 CLUSTER_TIMEOUT=150 \
    bash bench/notes/issue-28/gpu_session_ab.sh session 2>&1 | tail -14

#!/bin/bash
# Prepared for the session after the twenty-sixth, its second call (one GPU, about 8 minutes): an A/B of main, the
# decode slots' grown-out buffers kept to the product's end (x-retire26.patch) and, as the ceiling, the slots'
# buffers kept between runs (x-scratch26.patch, DGEMM_X_SCRATCH_KEEP: not shippable), `on` at 32768² zstd in and out,
# ABBA, raw beside.  Here, first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=main v1=main+bench/notes/issue-28/x-retire26.patch \
#         v2=main+bench/notes/issue-28/x-scratch26.patch,DGEMM_X_SCRATCH_KEEP=1
# then on the device, with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_27b.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."
OUT="$OUT" MODES=${MODES:-on} ROUNDS=${ROUNDS:-2} REPEATS=2 RAW_TASKS=1 CLUSTER_TIMEOUT=${CLUSTER_TIMEOUT:-180} \
    bash bench/notes/issue-28/gpu_session_ab.sh session 2>&1 | tail -16

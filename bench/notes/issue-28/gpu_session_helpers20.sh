#!/bin/bash
# Prepared for the twentieth session (one device call on one GPU, about 8 minutes): the fill.  After a run's first two
# products, share and raw take the same time a product (0.060 against 0.056 s, timelines of the nineteenth session);
# the whole gap is the first two (0.55-0.60 s against 0.29), where 12 readers decode the first 24 blocks and 4 of the
# host's 16 cores idle.  So a host-decoded block's chunks are also given to helper threads there.  Here, first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=main v1=SHA,DGEMM_X_READ_HELPERS=4 \
#         v2=SHA,DGEMM_X_READ_HELPERS=4,DGEMM_X_HELPERS_IDLE=1 v3=SHA,DGEMM_X_READ_HELPERS=8,DGEMM_X_HELPERS_IDLE=1
# (SHA: the local branch x-read-helpers, an experiment never merged: at most N helper threads at once in the worker,
# with HELPERS_IDLE only while the device's last GEMM has run).  Then on the device, with carry [".whl", ".ab"], after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_helpers20.sh
# Four versions under share, three rounds of a cluster each, alternating (32768² zstd in and out), then raw chunks in
# and out on the same machine.  Records: ab.tar (the twelve A/B records), raw-32768.json.
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
[ -f .ab/versions ] || { echo "prepare .ab first (see the header)"; exit 2; }
OUT="$OUT" bash bench/notes/issue-28/gpu_session_ab.sh session

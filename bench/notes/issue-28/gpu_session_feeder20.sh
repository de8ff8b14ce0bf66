#!/bin/bash
# Prepared for the twentieth session (one device call on one GPU, about 8 minutes): share's device blocks through one
# feeder thread a device.  The device path's host part runs 13.7 GB/s from one thread and 14-17 from four to eight
# (Python's lock; beside_gemm.py, call 6), so here the readers only read a block's frames into their staging and hand
# them to one thread that plans and enqueues calls of up to 4 blocks, while fewer than N blocks wait for it; the other
# blocks are decoded on the host.  Here, first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=main v1=SHA,DGEMM_X_FEEDER=4,DGEMM_X_LEADERS=1 \
#         v2=SHA,DGEMM_X_FEEDER=8,DGEMM_X_LEADERS=1 v3=SHA,DGEMM_X_FEEDER=16,DGEMM_X_LEADERS=1
# (SHA: the local branch x-feeder, 63f28c6, an experiment never merged).  Then on the device, with carry [".whl", ".ab"],
# after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_feeder20.sh
# Four versions under share, three rounds of a cluster each, alternating (32768² zstd in and out), then raw chunks in
# and out on the same machine.  Records: ab.tar (the twelve A/B records), raw-32768.json.
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
[ -f .ab/versions ] || { echo "prepare .ab first (see the header)"; exit 2; }
OUT="$OUT" bash bench/notes/issue-28/gpu_session_ab.sh session

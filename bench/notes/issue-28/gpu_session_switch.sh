#!/bin/bash
# One device call on one GPU (seventeenth session, about 5 minutes): an A/B of the device workers' switch interval
# at the new default block (8192 x 8192 x 4096).  timeline.py found the device path's host steps blocked 85-90 % of
# their time (a frame's plan 32-43 ms, of it 4 ms on a CPU; the decode's enqueueing 51-78 ms, 8-12 on a CPU): numpy
# and OpenCL calls give Python's lock up and wait for it again behind the worker's other threads.  Versions
# prepared here: `gpu_session_ab.sh prepare v0=HEAD v1=HEAD,DGEMM_SWITCH_INTERVAL=0.0005
# v2=HEAD,DGEMM_SWITCH_INTERVAL=0.0002`; 32768² zstd in and out under share and on, two rounds, then raw.
# Run from the project's root with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_switch.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
MODES=${MODES:-share,on} GEMM_TASKS=1 ROUNDS=${ROUNDS:-2} SIZE=${SIZE:-32768} bash bench/notes/issue-28/gpu_session_ab.sh run
REPEATS=2 SIZE=${SIZE:-32768} bash bench/notes/issue-28/gpu_session_ab.sh raw

#!/bin/bash
# One device call on one GPU (about 6 minutes on an H100) for share's reader that queues for the device while it
# has no GEMM to run (dgemm.worker.decoding._to_host, Device.computing): an A/B in one call of the versions before
# and after (prepared here with `gpu_session_ab.sh prepare v0=<before> v1=<after>`), 32768² zstd in and out under
# share, gemm-tasks 1 and 2, 2 rounds of 2 runs each, then raw chunks in and out with gemm-tasks 1 and 2, 3 runs
# each, on the same machine: the issue's ratio.  Run from the project's root with carry [".whl", ".ab"], after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_idle.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
MODES=share GEMM_TASKS=1,2 ROUNDS=2 SIZE=32768 bash bench/notes/issue-28/gpu_session_ab.sh run
REPEATS=3 SIZE=32768 bash bench/notes/issue-28/gpu_session_ab.sh raw

#!/bin/bash
# One device call on two GPUs of one host (about 6 minutes on two H200s), prepared for the sixteenth session:
# whether share's blocks that both device workers read, sent to each one's device decoders instead of the host's
# readers (the experiment 1ca91c6: `decoding.through`), bring two GPUs nearer the 1.8× target.  At 980eb67 the
# host and the devices decoded 29 GB for 49152²'s 19.3 GB of inputs (each worker reads all of B), 23 of them on
# the host's 32 cores, which the two workers share; 1.41-1.58× one GPU.  An A/B in one call of the versions
# prepared here (`gpu_session_ab.sh prepare v0=HEAD v1=<HEAD with 1ca91c6 cherry-picked>`): 49152² zstd in and
# out under share on devices 0,1, two rounds, then on device 0 alone (where nothing is shared: the change does
# nothing there, and the ratio's baseline).  Run from the project's root with carry [".whl", ".ab"], kind
# nvidia-h200-x2 (or -h100-x2), after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_shared.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
OUT=$OUT/devices01 DEVICES=0,1 MODES=share GEMM_TASKS=1 ROUNDS=${ROUNDS01:-2} SIZE=49152 bash bench/notes/issue-28/gpu_session_ab.sh run
OUT=$OUT/devices0 DEVICES=0 MODES=share GEMM_TASKS=1 ROUNDS=1 SIZE=49152 bash bench/notes/issue-28/gpu_session_ab.sh run

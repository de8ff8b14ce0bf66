#!/bin/bash
# One device call on one GPU (about 5 minutes on an H200), prepared for the sixteenth session: whether launching the
# engine's and the codecs' kernels without Python's lock (nogil.Kernel, the experiment 363f215) shortens a share
# run.  The fifteenth session's py-spy (results/2026-11-27-nvidia-h200-pyspy-share-32768-ae78b9a.json) found the
# lock held inside kernel launches and fills once releases and markers let it go.  An A/B in one call of the
# versions prepared here (`gpu_session_ab.sh prepare v0=HEAD v1=<HEAD with 363f215 cherry-picked>`), 32768² zstd
# in and out under share, gemm-tasks 1 and 2; then each version's timeline (timeline.py: the device path's
# phases, the codec programs' launch locks, every device command); then raw.  Run from the project's root with
# carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_kernels.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
MODES=share GEMM_TASKS=1,2 ROUNDS=${ROUNDS:-1} SIZE=32768 bash bench/notes/issue-28/gpu_session_ab.sh run
inputs=$(mktemp -d /dev/shm/dgemm-kernels-inputs-XXXX)
trap 'rm -rf "$inputs"' EXIT
while read -r v sha; do
    PYTHONPATH=$PWD/.ab/$v${PYTHONPATH:+:$PYTHONPATH} DGEMM_COMMIT=$sha python3 bench/notes/issue-28/timeline.py \
        "$OUT/timeline-$v.json" --size 32768 --codec zstd --modes share --gemm-tasks 1 --inputs "$inputs/zstd" 2>&1 \
        | grep '^{"mode"' | cut -c1-600
done < .ab/versions
REPEATS=2 SIZE=32768 bash bench/notes/issue-28/gpu_session_ab.sh raw

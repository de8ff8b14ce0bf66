#!/bin/bash
# One device call on one GPU (about 5 minutes on an H100), prepared for the fifteenth session: whether the GIL's
# hand-overs slow the product loop while the inputs are read (the fourteenth session's timelines: 9 ms between
# tasks and 10 ms after a product's last GEMM then, 3 and 2 after).  An A/B in one call of the versions prepared
# here (`gpu_session_ab.sh prepare v0=HEAD v1=<HEAD with a device worker's switch interval at 0.5 ms>`, as
# b2c97e0 had it), 32768² zstd in and out under share, gemm-tasks 1 and 2, then each version's timeline
# (timeline.py: the event loop's lag, the device path's phases), then raw.  Run from the project's root with
# carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_gil.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
MODES=share GEMM_TASKS=1,2 ROUNDS=${ROUNDS:-1} SIZE=32768 bash bench/notes/issue-28/gpu_session_ab.sh run
inputs=$(mktemp -d /dev/shm/dgemm-gil-inputs-XXXX)
trap 'rm -rf "$inputs"' EXIT
while read -r v sha; do
    PYTHONPATH=$PWD/.ab/$v${PYTHONPATH:+:$PYTHONPATH} DGEMM_COMMIT=$sha python3 bench/notes/issue-28/timeline.py \
        "$OUT/timeline-$v.json" --size 32768 --codec zstd --modes share --gemm-tasks 1 --inputs "$inputs/zstd" 2>&1 \
        | grep '^{"mode"'
done < .ab/versions
REPEATS=2 SIZE=32768 bash bench/notes/issue-28/gpu_session_ab.sh raw

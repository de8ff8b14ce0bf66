#!/bin/bash
# Prepared for the session after the twenty-third (one device call on one GPU, about 7 minutes): decode first, then
# multiply.  The twenty-third session's timelines of `on` show the decode kernels slowed beside the GEMMs and the
# GEMMs slowed by them (bench/NOTES.md, "Issue 28, twenty-third session"); the local branch x-decode-first23 has a
# product's first GEMM wait until every block it and the next products asked for is decoded on the device
# (DGEMM_X_DECODE_FIRST=1).  Here first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=main v1=x-decode-first23,DGEMM_X_DECODE_FIRST=1
# then on the device, with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_decodefirst24.sh
# It runs the A/B (32768² zstd in and out under on and share, two rounds in ABBA order, raw three times), then the
# timeline of v1 under on (its GEMMs' share of each 0.1 s bin against the twenty-third session's 0.3-0.6).
# On two GPUs (kind nvidia-h200-x2): SIZE=49152 DEVICES=0,1 (the A/B and raw at that size on both; the timeline
# stays 32768² on the first GPU).
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."
[ -f .ab/v1.env ] || { echo "prepare .ab first (see the head of this script)"; exit 2; }
OUT=$OUT MODES=on,share ROUNDS=2 REPEATS=3 RAW_TASKS=1 bash bench/notes/issue-28/gpu_session_ab.sh session
inputs=$(mktemp -d /dev/shm/dgemm-df-XXXX)
trap 'rm -rf "$inputs"' EXIT
env $(cat .ab/v1.env) PYTHONPATH=$PWD/.ab/v1${PYTHONPATH:+:$PYTHONPATH} DGEMM_COMMIT=$(awk '$1 == "v1" {print $2}' .ab/versions) \
    timeout 200 python3 bench/notes/issue-28/timeline.py "$OUT/timeline-decodefirst.json" --size 32768 --chunk 4096 \
    --devices gpu --codec zstd --modes on --repeats 2 --inputs "$inputs/zstd" 2>&1 | grep -v '^{' | tail -5
ls -la "$OUT"     # what the call leaves for the records

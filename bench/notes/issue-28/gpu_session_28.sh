#!/bin/bash
# Prepared for the session after the twenty-seventh (one device call on one GPU, about 9 minutes; an H100 80 GB where
# lent, the machine the targets are set on).  1. The A/B of main before the slots' sizes (ca90851) and this checkout's
# version at 32768², ABBA, raw beside (on H200s: 1.14-1.25× raw before, 1.11-1.12× after).  2. This checkout's
# timeline of `on` at 49152² (1.16× raw on an H200: 0.43 s more between the first and last GEMM, `busy_other` 0.26 s
# against raw's 0.07, 0.11 s more after the last GEMM), with each release's bytes (`release_of`).  Here, first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=ca90851 v1=HEAD
# then on the device, with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_28.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."
OUT="$OUT" MODES=on ROUNDS=2 REPEATS=2 RAW_TASKS=1 CLUSTER_TIMEOUT=${CLUSTER_TIMEOUT:-240} \
    bash bench/notes/issue-28/gpu_session_ab.sh session 2>&1 | tail -14
inputs=$(mktemp -d /dev/shm/dgemm-s28-XXXX)
trap 'rm -rf "$inputs"' EXIT
timeout 240 python3 bench/notes/issue-28/timeline.py "$OUT/timeline-49152.json" --size 49152 --chunk 4096 \
    --devices gpu --codec zstd --modes on --repeats 2 --inputs "$inputs/zstd" 2>&1 | grep -v '^{' | tail -2
ls -la "$OUT"

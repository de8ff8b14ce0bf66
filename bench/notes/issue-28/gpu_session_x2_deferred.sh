#!/bin/bash
# One device call on two GPUs of one host (about 6 minutes on two H200s) after device decodes were deferred:
# 49152² float32, zstd in and out, device-codecs on and off on both GPUs and on one (the issue's 2-GPU target:
# on, 2 GPUs >= 1.8x one).  Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_deferred.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."
mkdir -p "$OUT"
INPUTS=$(mktemp -d /dev/shm/dgemm-x2-inputs-XXXX)
trap 'rm -rf "$INPUTS"' EXIT
for devices in 0,1 0; do
  python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/onoff-zstd-49152-${devices/,/}.json" --size 49152 \
      --codec zstd --devices "$devices" --repeats 1 --modes on,off --inputs "$INPUTS/zstd"
done

#!/bin/bash
# One device call on two GPUs of one host (about 7 minutes) at the twelfth session's HEAD (reader 5, the encoder's
# kept buffers, the hand-over before the encode): 49152² float32, zstd in and out, device-codecs on and off on
# both GPUs, then on one (the issue's 2-GPU target: on, 2 GPUs >= 1.8x one; last measured at d9ddd1e).  Run from
# the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_kept.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."
mkdir -p "$OUT"
INPUTS=$(mktemp -d /dev/shm/dgemm-x2-inputs-XXXX)
trap 'rm -rf "$INPUTS"' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader
for devices in 0,1 0; do
  python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/onoff-zstd-49152-devices${devices/,/}.json" --size 49152 \
      --codec zstd --devices "$devices" --repeats 2 --modes on,off --inputs "$INPUTS/zstd" 2>&1 | grep '^{"mode"' \
      | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); print('$devices', r['mode'], r['wall_s'], r['per_worker']['busy_seconds'], flush=True)"
done

#!/bin/bash
# One device call on two GPUs of one host (seventeenth session, about 6 minutes on two H200s), at the new default
# block: whether the two devices should decode more of the inputs, the host's cores being what they share.
# 49152² zstd in and out on devices 0,1: share (4 decode slots a device), share with 8, and on, two runs each,
# alternating; then on device 0 alone: share and share with 8.  Run from the project's root with carry [".whl"],
# kind nvidia-h200-x2 (or -h100-x2), after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_slots.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
inputs=$(mktemp -d /dev/shm/dgemm-x2-slots-XXXX)
trap 'rm -rf "$inputs"' EXIT
S=bench/notes/issue-28/device_codecs_onoff.py
for devices in 0,1 0; do
    modes=share,on
    [ "$devices" = 0 ] && modes=share
    timeout 290 python3 $S "$OUT/x2-slots-devices${devices/,/}.json" --size ${SIZE:-49152} --chunk ${CHUNK:-4096} \
        --devices "$devices" --codec zstd --repeats 2 --modes "$modes" --slots 8 --slots-mode share \
        --inputs "$inputs/zstd" 2>&1 | grep '^{"mode"\|"check"' | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if 'mode' not in r:
        print('$devices', 'check', r['check'].get('passed'), flush=True); continue
    print('$devices', r['mode'], 'slots', r.get('slots'), r['wall_s'], 'busy', r['per_worker']['busy_seconds'],
          'dev', r.get('device_decoded_bytes'), 'host', r.get('host_decoded_bytes'), flush=True)"
done

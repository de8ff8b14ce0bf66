#!/bin/bash
# One device call on two GPUs of one host (seventeenth session, about 5 minutes on two H200s): the 2-GPU target at
# the GPU blocks' new default (8192 x 8192 x 4096, `auto` here) against 4096-cube blocks, 49152² zstd in and out
# under share, on devices 0,1 and then on device 0 alone, two runs each, alternating.  Run from the project's root
# with carry [".whl"], kind nvidia-h200-x2 (or -h100-x2), after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_blocks.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
inputs=$(mktemp -d /dev/shm/dgemm-x2-blocks-XXXX)
trap 'rm -rf "$inputs"' EXIT
S=bench/notes/issue-28/device_codecs_onoff.py
for devices in 0,1 0; do
    timeout 280 python3 $S "$OUT/x2-blocks-devices${devices/,/}.json" --size ${SIZE:-49152} --chunk 4096 \
        --devices "$devices" --codec zstd --repeats 2 --modes share --blocks "${BLOCKS:-auto,4096}" \
        --inputs "$inputs/zstd" 2>&1 | grep '^{"mode"\|"check"' | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if 'mode' not in r:
        print('$devices', 'check', r['check'].get('passed'), flush=True); continue
    print('$devices', r['mode'], r.get('block'), r['wall_s'], 'busy', r['per_worker']['busy_seconds'],
          'dev', r.get('device_decoded_bytes'), 'host', r.get('host_decoded_bytes'), flush=True)"
done

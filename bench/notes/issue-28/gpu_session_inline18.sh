#!/bin/bash
# One device call on one GPU (eighteenth session, about 4 minutes): `queue-priority: inline` at the default block.
# NVIDIA's OpenCL offers no queue priorities, so under share and on a device decode's kernels wait beside the GEMMs
# (17-27 GB/s there against 63-91 alone) and the product that needs the block waits for them: share's products
# spent 0.13-0.17 s in `other` and 0.05-0.07 s more in `transfer` than raw's (gpu_session_ab.sh, this session).
# `inline` puts them between two GEMMs on the GEMMs' own queue; the sixth session measured it at 4096 blocks only
# (20 % slower under on).  32768² zstd in and out, share and on, two runs each, clusters alternating on / inline,
# two rounds; raw beside.  Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_inline18.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
inputs=$(mktemp -d /dev/shm/dgemm-inline18-XXXX)
trap 'rm -rf "$inputs"' EXIT
S=bench/notes/issue-28/device_codecs_onoff.py
GEO="--size ${SIZE:-32768} --chunk ${CHUNK:-4096} --devices ${DEVICES:-gpu}"
summary() {
    grep '^{"mode"\|"check"' | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if 'mode' not in r:
        c = r['check']; print('$1', r.get('queue_priority'), 'check', c.get('passed') if isinstance(c, dict) else c, flush=True); continue
    print('$1', r['queue_priority'], r['mode'], r['wall_s'], 'busy', round(r['busy_seconds'], 2), 'other',
          round(r['busy_other_seconds'], 2), 'transfer', round(r['busy_transfer_seconds'], 2), 'read',
          round(r['busy_read_seconds'], 2), 'dev', r.get('device_decoded_bytes'), flush=True)"
}
timeout 300 python3 $S "$OUT/inline-zstd.json" $GEO --codec zstd --repeats 2 --modes share,on --priorities on,inline \
    --rounds 2 --inputs "$inputs/zstd" 2>&1 | summary zstd
timeout 80 python3 $S "$OUT/inline-raw.json" $GEO --codec none --out-codec none --repeats 2 --modes off \
    --inputs "$inputs/raw" 2>&1 | summary raw

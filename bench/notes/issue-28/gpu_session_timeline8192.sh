#!/bin/bash
# One device call on one GPU (seventeenth session, about 4 minutes): the timelines (timeline.py) at the GPU blocks'
# new default (8192 x 8192 x 4096): 32768² zstd in and out under share and on, two runs each after the warm-up,
# then raw.  Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_timeline8192.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
inputs=$(mktemp -d /dev/shm/dgemm-timeline-XXXX)
trap 'rm -rf "$inputs"' EXIT
T=bench/notes/issue-28/timeline.py
GEO="--size ${SIZE:-32768} --chunk ${CHUNK:-4096} --devices ${DEVICES:-gpu}"
summary() {
    grep '^{"mode"\|"check"' | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if 'mode' not in r:
        print('$1', 'check', r['check'], flush=True); continue
    print('$1', r['mode'], r['wall_s'], 'gemm', r['gemm_s'], 'wait', r['wait_s'], 'first_gemm', r['first_gemm'],
          'last_read_end', r['last_read_end'], 'last_gemm_end', r['last_gemm_end'], 'taken', r['device_taken'],
          'declined', r['device_declined'], 'gil', r.get('gil_wait_ms'), flush=True)"
}
timeout 240 python3 $T "$OUT/timeline-zstd.json" $GEO --codec zstd --modes share,on --repeats 2 \
    --inputs "$inputs/zstd" 2>&1 | summary zstd
timeout 120 python3 $T "$OUT/timeline-raw.json" $GEO --codec none --modes off --repeats 2 \
    --inputs "$inputs/raw" 2>&1 | summary raw

#!/bin/bash
# One device call on one GPU (seventeenth session, about 5 minutes), after gpu_session_blocks.sh found share at
# 8192-row blocks 1.72-1.81 s against 2.24-2.37 at 4096 (raw 1.36-1.37 either way): a script's first product on a
# new cluster at each block size (zstd share, raw), then, on one cluster, share, on and off with gemm-tasks 1 and 2
# and share with 8 and 16 decode slots at 8192x8192x4096, and raw at auto, 8192x8192x4096 and 8192.
# Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_blocks2.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
inputs=$(mktemp -d /dev/shm/dgemm-blocks-XXXX)
trap 'rm -rf "$inputs"' EXIT
S=bench/notes/issue-28/device_codecs_onoff.py
BIG=${BIG:-8192x8192x4096}
GEO="--size ${SIZE:-32768} --chunk ${CHUNK:-4096} --devices ${DEVICES:-gpu}"
summary() {
    grep '^{"mode"\|"check"' | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if 'check' in r and 'mode' not in r:
        c = r['check']; print('$1', 'check', c.get('passed') if isinstance(c, dict) else c, flush=True); continue
    print('$1', r['mode'], r.get('block'), 'first' if r.get('first') else '', 'slots', r.get('slots'), 'tasks',
          r.get('gemm_tasks_setting'), r['wall_s'], 'dev', r.get('device_decoded_bytes'), flush=True)"
}
for b in auto "$BIG"; do
    timeout 120 python3 $S "$OUT/first-zstd-$b.json" $GEO --codec zstd --repeats 2 --modes share --blocks "$b" \
        --no-warmup --inputs "$inputs/zstd" 2>&1 | summary first-zstd
done
timeout 200 python3 $S "$OUT/sweep-zstd.json" $GEO --codec zstd --repeats 2 --modes share,on,off --gemm-tasks 1,2 \
    --blocks "$BIG" --slots 8,16 --slots-mode share --inputs "$inputs/zstd" 2>&1 | summary zstd
for b in auto "$BIG"; do
    timeout 60 python3 $S "$OUT/first-raw-$b.json" $GEO --codec none --out-codec none --repeats 1 --modes off \
        --blocks "$b" --no-warmup --inputs "$inputs/raw" 2>&1 | summary first-raw
done
timeout 120 python3 $S "$OUT/raw.json" $GEO --codec none --out-codec none --repeats 2 --modes off \
    --blocks "auto,$BIG,8192" --inputs "$inputs/raw" 2>&1 | summary raw

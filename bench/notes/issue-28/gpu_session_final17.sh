#!/bin/bash
# One device call on one GPU (seventeenth session's last, about 4 minutes): end to end at HEAD with the GPU blocks'
# new default (dgemm's own choice, `auto`): a script's first product on a fresh cluster (zstd in and out, then raw),
# then two rounds of a cluster each for zstd share and raw, gemm-tasks 1 and 2, two runs each.
# Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_final17.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
inputs=$(mktemp -d /dev/shm/dgemm-final-XXXX)
trap 'rm -rf "$inputs"' EXIT
S=bench/notes/issue-28/device_codecs_onoff.py
GEO="--size ${SIZE:-32768} --chunk ${CHUNK:-4096} --devices ${DEVICES:-gpu}"
summary() {
    grep '^{"mode"\|"check"' | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if 'mode' not in r:
        c = r['check']; print('$1', 'check', c.get('passed') if isinstance(c, dict) else c, flush=True); continue
    print('$1', r['mode'], r.get('block'), 'first' if r.get('first') else '', 'tasks', r.get('gemm_tasks_setting'),
          r['wall_s'], 'dev', r.get('device_decoded_bytes'), 'host', r.get('host_decoded_bytes'), flush=True)"
}
timeout 100 python3 $S "$OUT/first-zstd.json" $GEO --codec zstd --repeats 2 --modes share --no-warmup \
    --inputs "$inputs/zstd" 2>&1 | summary first-zstd
timeout 80 python3 $S "$OUT/first-raw.json" $GEO --codec none --out-codec none --repeats 2 --modes off --no-warmup \
    --inputs "$inputs/raw" 2>&1 | summary first-raw
for round in 1 2; do
    timeout 100 python3 $S "$OUT/zstd-r$round.json" $GEO --codec zstd --repeats 2 --modes share --gemm-tasks 1,2 \
        --inputs "$inputs/zstd" 2>&1 | summary "zstd-r$round"
    timeout 80 python3 $S "$OUT/raw-r$round.json" $GEO --codec none --out-codec none --repeats 2 --modes off \
        --gemm-tasks 1,2 --inputs "$inputs/raw" 2>&1 | summary "raw-r$round"
done

#!/bin/bash
# Prepared for the twentieth session (one device call on one GPU, about 7 minutes): the idle decode slots
# (scratch.IDLE_SLOTS: under share a reader may take one of more slots while the device runs no GEMM).  Here, first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=a4a7c56 v1=9940e9d v2=9940e9d,DGEMM_X_IDLE_SLOTS=8
# (a4a7c56: before them; 9940e9d is the local branch x-idle-slots: IDLE_SLOTS from the environment, 4 by default,
# an experiment never merged).  Then on the device, with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_idle20.sh
# It runs the three versions under share, three rounds of a cluster each, alternating (32768² zstd in and out), raw
# chunks in and out on the same machine, and the checkout's timeline under share (timeline.py: whether the fill
# got shorter).  Records: ab.tar (the nine A/B records), raw-32768.json, timeline20-zstd.json.
. "$(dirname "$0")/session_common.sh" idle20
[ -f .ab/versions ] || { echo "prepare .ab first (see the header)"; exit 2; }
OUT="$OUT" bash bench/notes/issue-28/gpu_session_ab.sh session
TFIELDS="mode wall_s gemm_s wait_s first_gemm last_read_end last_gemm_end device_taken device_declined"
DGEMM_COMMIT=$(cat .ab/checkout) timeout 150 python3 bench/notes/issue-28/timeline.py "$OUT/timeline20-zstd.json" \
    $GEO --codec zstd --modes share --repeats 2 --inputs "$inputs/zstd" 2>&1 | summary tl-zstd $TFIELDS
python3 -c "
import json
for r in json.load(open('$OUT/timeline20-zstd.json'))['runs']:
    print('run', r['wall_s'], ' '.join('%.1f:%.2f/%.1f' % (b['t'], b['gemm'], b['device_reads']) for b in r['bins'][:8]))"
ls -la "$OUT"

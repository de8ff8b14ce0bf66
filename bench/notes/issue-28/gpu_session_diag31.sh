#!/bin/bash
# The thirty-first session's third device call (two GPUs of one host, about 6 minutes on two H200s), after every wait
# of the decode, encode and GEMM paths went through `nogil` (4-5 % faster on two GPUs and on one; two GPUs still 1.72×
# one): where a worker's time goes now.  49152² zstd `on`: the timeline on devices 0,1 and on device 0 (one run each,
# 0.05 s bins) with calls.py's summary of each (a decode call's host steps on two GPUs against one: what contention
# adds), then gpu_session_x2_gil30.sh (py-spy: the lock's holders, then every thread's state).  Everything comes back
# in one tar.  Run from the project's root with carry [".whl"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_diag31.sh
. "$(dirname "$0")/session_common.sh" diag31
export INPUTS=$inputs SIZE=${SIZE:-49152}
for devices in ${DEVICE_SETS:-0,1 0}; do     # (DEVICE_SETS=cpu: a check on PoCL)
    rec="$OUT/timeline-on-devices${devices/,/}.json"
    timeout 150 python3 bench/notes/issue-28/timeline.py "$rec" --size "$SIZE" --chunk 4096 --devices "$devices" \
        --codec zstd --modes on --repeats 1 --bin 0.05 --inputs "$inputs/zstd" 2>&1 | grep -v '^{"mode"' | tail -3
    echo "calls, devices $devices:"
    python3 bench/notes/issue-28/calls.py "$rec" 2>&1 | tail -8
    python3 bench/notes/issue-28/calls.py "$rec" --until 0.7 2>&1 | tail -4
done
OUT="$OUT/gil" bash bench/notes/issue-28/gpu_session_x2_gil30.sh 2>&1 | tail -6
python3 -c "
import json
d = json.load(open('$OUT/gil/x2-spy-summary.json'))
for k, p in d['profiles'].items():
    print(k, p['samples'], dict(list(p['threads'].items())[:8]))
    print(k, dict(list(p['frames'].items())[:14]))
    print(k, p['readers'])" 2>&1 | cut -c1-1500
(cd "$OUT" && tar -cf diag31.tar --exclude=diag31.tar . && find . -type f ! -name diag31.tar -delete)
ls -la "$OUT"

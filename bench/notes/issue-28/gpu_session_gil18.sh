#!/bin/bash
# One device call on one GPU (eighteenth session, about 3 minutes): how busy Python's lock is in a worker while
# products run, and who holds it.  gpu_session_spy18.sh (py-spy with native stacks, which pauses the process) found
# the readers waiting to take the lock back for about a third of their time, most after the device path's numpy
# steps (each op over more than 500 elements lets the lock go, and taking it back waits for whoever runs Python).
# Here py-spy samples only the thread that holds the lock (`--gil`, 200 a second, without pausing), attached to the
# cluster after its first timed product, for 8 s of the runs that follow: 32768² zstd in and out, share, then on,
# then raw in and out (off), each a cluster of its own.  The share of samples against 200 a second is the lock's
# load.  Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_gil18.sh
. "$(dirname "$0")/session_common.sh" gil18
spy=$(python3 -c 'import os; print(os.path.join(os.path.dirname(os.path.dirname(__import__("pyopencl").__file__)), "bin", "py-spy"))')
for what in share on raw; do
    if [ $what = raw ]; then args="--codec none --out-codec none --modes off"; else args="--codec zstd --modes $what"; fi
    log="$OUT/gil-$what.log"
    PYTHONUNBUFFERED=1 timeout 150 python3 $S "$OUT/gil-$what.json" $GEO $args --repeats 6 --inputs "$inputs/$what" \
        > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q '^{"mode"' "$log" && break; sleep 0.2; done
    t0=$(date +%s.%N)
    timeout 30 "$spy" record --pid $pid --subprocesses --gil --nonblocking --threads -r 200 --duration 8 -f raw \
        -o "$OUT/gil-$what.txt" > "$OUT/gil-$what.spy" 2>&1
    echo "$what sampled from $t0 to $(date +%s.%N)" >> "$OUT/gil-$what.spy"
    wait $pid
    grep '^{"mode"' "$log" | python3 -c "
import json, sys
print('$what', [json.loads(l)['wall_s'] for l in sys.stdin])"
    tail -3 "$OUT/gil-$what.spy"
done
cat "$OUT"/gil-*.spy > "$OUT/gil-spy.txt"; rm -f "$OUT"/gil-*.spy "$OUT"/gil-*.log
gzip -f "$OUT"/gil-*.txt; ls -la "$OUT"

#!/bin/bash
# Prepared in the thirtieth session for the next (one device call on two GPUs of one host, about 5 minutes on two
# H200s; run the shared prepare.sh with py-spy here first, so that .whl holds py-spy): who holds Python's lock in a
# worker on two GPUs, and what its readers wait for.  There a worker's 12 readers are busy from its first read to its
# last (0.16 s a block), and its decode calls' Python steps (the frames' plans, the call's tables) take five to six
# times their CPU time with no thread waiting for a CPU; neither the slots, the switch interval, the reader count
# nor shorter GEMM launches changed the run (NOTES, thirtieth session).  49152² zstd `on` on devices 0,1: py-spy
# attached to the cluster after its first timed run, first sampling the lock's holder (`--gil`, 200 a second, 8 s,
# without pausing the workers), then, in a second cluster, every thread with native frames (`--idle --native`, 50 a
# second, 6 s: the readers' states, each pause slowing the run), then spy_summary.py over both.  Run from the
# project's root with carry [".whl"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_gil30.sh
. "$(dirname "$0")/session_common.sh" x2-gil30
SIZE=${SIZE:-49152}
for kind in gil idle; do
    flags="--idle --native -r 50 --duration 6"
    [ $kind = gil ] && flags="--gil --nonblocking -r 200 --duration 8"
    log="$OUT/x2-$kind.log"
    PYTHONUNBUFFERED=1 timeout 240 python3 $S "$OUT/x2-$kind.json" --size "$SIZE" --chunk ${CHUNK:-4096} \
        --devices ${DEVICES:-0,1} --codec zstd --modes on --repeats 5 --inputs "$inputs/zstd" > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 1200); do grep -q '^{"mode"' "$log" && break; sleep 0.2; done
    timeout 30 "$SPY" record --pid $pid --subprocesses --threads $flags -f raw -o "$OUT/x2-$kind.txt" \
        > "$OUT/x2-$kind.spy" 2>&1
    wait $pid
    grep '^{"mode"' "$log" | python3 -c "
import json, sys
print('$kind', [json.loads(l)['wall_s'] for l in sys.stdin])"
    tail -2 "$OUT/x2-$kind.spy"
done
python3 bench/notes/issue-28/spy_summary.py "$OUT/x2-spy-summary.json" \
    --what "py-spy of the workers (devices ${DEVICES:-0,1}), ${SIZE}² zstd on: --gil, then --idle --native" \
    gil="$OUT/x2-gil.txt" idle="$OUT/x2-idle.txt" 2>&1 | cut -c1-400
gzip -f "$OUT"/x2-*.txt
ls -la "$OUT"

#!/bin/bash
# Prepared for the thirty-third session's first device call (two GPUs of one host, about 6 minutes on two H200s):
# where two workers' inputs lose their rate.  Two processes uploading alone reach 26 GB/s on two H200s' host; the
# runs deliver 15-19 (x2_floor.py, thirty-second session).  The same two-process probe (upload_paths_probe.py
# --start-at: a process per GPU, 12 threads each, whole-block staging as dgemm's readers) alone, beside C's traffic
# (`down`: 256 MiB downloads into page-locked memory written to new files, DOWN GB/s a process, a worker's share on
# two H200s), beside a compute kernel on each device (`gemm`), and beside both; two rounds.  Then the timelines of
# 49152² zstd `on` on devices 0,1 and on device 0 (one run each), with products.py on each: when each product's
# inputs were in, and the holds before its unpadding with its deferred decode checks timed (timeline.py's `check`).
# Everything comes back in one tar.  Carry [".whl"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_33a.sh
. "$(dirname "$0")/session_common.sh" call33a
for round in 1 2; do
    at=$(python3 -c 'import time; print(time.time() + 30)')     # (each process writes its files, builds its kernel)
    n=0
    for d in ${PROBE_DEVICES:-0 1}; do     # (PROBE_DEVICES="0 0": a check on PoCL's one device)
        n=$((n + 1))
        timeout 200 python3 bench/notes/issue-28/upload_paths_probe.py "$OUT/upload-beside-r$round-process$n.json" \
            --devices "$d" --threads ${THREADS:-12} --paths staged --mib ${MIB:-128} --seconds 1.5 --start-at "$at" \
            --beside none,down,gemm,down+gemm --down-gb-s ${DOWN:-2.3} ${BURN:+--burn $BURN} &
    done
    wait
done
python3 bench/notes/issue-28/twoprocs.py "$OUT" upload-beside
SIZE=${SIZE:-49152}
for devices in ${DEVICE_SETS:-0,1 0}; do     # (DEVICE_SETS=cpu: a check on PoCL)
    rec="$OUT/timeline-on-devices${devices/,/}.json"
    timeout 150 python3 bench/notes/issue-28/timeline.py "$rec" --size "$SIZE" --chunk 4096 --devices "$devices" \
        --codec zstd --modes on --repeats 1 --bin 0.05 --inputs "$inputs/zstd" 2>&1 | grep -v '^{"mode"' | tail -3
    python3 bench/notes/issue-28/products.py "$rec" --out "$OUT/products-devices${devices/,/}.json" | grep '"worker"'
done
(cd "$OUT" && tar -cf call33a.tar --exclude=call33a.tar . && find . -type f ! -name call33a.tar -delete)
ls -la "$OUT"

#!/bin/bash
# Prepared for the thirty-third session's first device call (two GPUs of one host, about 4 minutes on two H200s):
# where two workers' inputs lose their rate.  Two processes uploading alone reach 26 GB/s on two H200s' host; the
# runs deliver 15-19 (x2_floor.py, thirty-second session).  The same two-process probe (upload_paths_probe.py
# --start-at: a process per GPU, 12 threads each, whole-block staging as dgemm's readers) alone, beside C's traffic
# (`down`: 256 MiB downloads into page-locked memory written to new files, DOWN GB/s a process, a worker's share on
# two H200s), beside a compute kernel on each device (`gemm`), and beside both; two rounds.  Carry [".whl"], kind
# nvidia-h200-x2, after `source .whl/gpu-env.sh`:
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
python3 - "$OUT" <<'PY'
import glob, json, sys
for r in sorted({p.split("-r")[1][0] for p in glob.glob(sys.argv[1] + "/upload-beside-r*")}):
    rows = [json.load(open(p))["rows"] for p in sorted(glob.glob(f"{sys.argv[1]}/upload-beside-r{r}-process*.json"))]
    for parts in zip(*rows):
        print("round", r, parts[0]["path"], "beside", parts[0]["beside"], ":",
              "+".join(str(x["gb_s"]) for x in parts), "=", round(sum(x["gb_s"] for x in parts), 2), "GB/s up;",
              "down", round(sum(x["down_gb_s"] for x in parts), 2), "GB/s; launches/s",
              round(sum(x["gemm_launches_s"] for x in parts), 1), "checked", all(x["checked"] for x in parts))
PY
ls -la "$OUT"

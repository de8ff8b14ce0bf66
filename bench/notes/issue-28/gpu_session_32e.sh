#!/bin/bash
# The thirty-second session's fifth device call (two GPUs of one host, about 2 minutes): the host's file-to-device
# rate as dgemm's two workers meet it, a process per device with 12 reader threads each, both at once
# (upload_paths_probe.py --start-at): whole-block page-locked staging filled by `preadv` (dgemm's readers) against
# 4 and 8 MiB pieces used in turn (a piece's upload overlapping the next piece's read).  The thirty-second
# session's floor for two GPUs' 1.8x needs about 94 blocks (12.6 GB) a second a worker.  Carry [".whl"], kind
# nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_32e.sh
. "$(dirname "$0")/session_common.sh" call32e
PATHS=${PATHS:-staged,pieces4,pieces8}
for round in 1 2; do
    at=$(python3 -c 'import time; print(time.time() + 25)')     # (each process writes its 12 files first)
    n=0
    for d in ${PROBE_DEVICES:-0 1}; do     # (PROBE_DEVICES="0 0": a check on PoCL's one device)
        n=$((n + 1))
        timeout 150 python3 bench/notes/issue-28/upload_paths_probe.py "$OUT/upload-twoprocs-r$round-process$n.json" \
            --devices "$d" --threads ${THREADS:-12} --paths "$PATHS" --mib ${MIB:-128} --seconds 1.5 --start-at "$at" &
    done
    wait
done
python3 bench/notes/issue-28/twoprocs.py "$OUT" upload-twoprocs
ls -la "$OUT"

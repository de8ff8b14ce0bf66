#!/bin/bash
# The thirty-second session's first device call (two GPUs of one host, about 9 minutes on two H200s): chunk files
# uploaded through whole-block page-locked staging (dgemm's path) against N-MiB pieces of it used in turn
# (upload_paths_probe.py `piecesN`: whether staging that stays in the CPU's cache lifts the host's file-to-device
# ceiling, 29 GB/s over both GPUs, which two GPUs' reads meet), then the A/B prepared in .ab/
# (gpu_session_ab_x2.sh: x-cbwait31.patch against HEAD on two GPUs and on one).  Everything in one tar.
#     here:   bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=HEAD v1=HEAD+bench/notes/issue-28/x-cbwait31.patch
#     device: carry [".whl", ".ab"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#             OUT=/some/folder bash bench/notes/issue-28/gpu_session_32a.sh
. "$(dirname "$0")/session_common.sh" call32a
PATHS=${PATHS:-staged,pieces1,pieces2,pieces4,pieces8}
timeout 120 python3 bench/notes/issue-28/upload_paths_probe.py "$OUT/upload-pieces-devices01.json" \
    --devices ${PROBE_DEVICES:-0,1} --threads ${THREADS:-12,24} --paths "$PATHS" --mib ${MIB:-128} --seconds 1.5
timeout 60 python3 bench/notes/issue-28/upload_paths_probe.py "$OUT/upload-pieces-devices0.json" \
    --devices 0 --threads 12 --paths "$PATHS" --mib ${MIB:-128} --seconds 1.5
INPUTS=$inputs bash bench/notes/issue-28/gpu_session_ab_x2.sh
ls -la "$OUT"

#!/bin/bash
# The thirty-first session's fourth device call (two GPUs of one host, about 4 minutes on two H200s): chunk files
# uploaded three ways (upload_paths_probe.py: through page-locked staging as dgemm does, straight from the file's
# mmap, and from a USE_HOST_PTR buffer over it; 1, 2, 12 and 24 threads over both devices), then, since the decode
# path's waits now poll for their events (`nogil.wait`: each poll takes Python's lock back), the workers' switch
# interval again on two GPUs (default 5 ms, 1 and 0.2 ms; the thirtieth session found no change with the driver's
# own waits).  49152² zstd `on`, three runs each.  Run from the project's root with carry [".whl"], kind
# nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_probe31.sh
. "$(dirname "$0")/session_common.sh" probe31
SIZE=${SIZE:-49152}
timeout 150 python3 bench/notes/issue-28/upload_paths_probe.py "$OUT/upload-paths.json" --devices ${DEVICES:-0,1} \
    --threads ${THREADS:-1,2,12,24} --mib ${MIB:-128}
FIELDS="mode switch_interval wall_s per_worker.busy_seconds first_gemm_start last_gemm_stop"
timeout 300 python3 $S "$OUT/x2-switch31-devices01.json" --size "$SIZE" --chunk 4096 --devices ${DEVICES:-0,1} \
    --codec zstd --repeats 3 --modes on --switch default,0.001,0.0002 --inputs "$inputs/zstd" 2>&1 \
    | summary "devices 0,1" $FIELDS
ls -la "$OUT"

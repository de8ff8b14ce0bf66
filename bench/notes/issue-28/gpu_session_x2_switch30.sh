#!/bin/bash
# The thirtieth session's last device call (two GPUs of one host, about 5 minutes on two H200s): the workers' switch
# interval on two GPUs.  There a worker's 12 readers are busy from its first read to its last, a block costing each
# 0.16 s; its decode calls spend 43-102 ms before their kernels are launched, and their Python steps (the frames'
# plans, the call's tables) run at a fifth to a sixth of their CPU time while no thread waits for a CPU (the
# timeline of gpu_session_x2_slots30.sh).  Python's lock, taken back after every numpy step or OpenCL call, waits up
# to the switch interval (5 ms) behind a thread running Python.  On one H200 at 32768² 0.5 and 0.2 ms were no faster
# (seventeenth session).  49152² zstd `on` with each worker's own interval (5 ms), 0.5 ms and 1 ms alternating (three
# rounds) on devices 0,1, then 5 and 0.5 ms on device 0 (two rounds).  Run from the project's root with carry
# [".whl"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2_switch30.sh
. "$(dirname "$0")/session_common.sh" x2-switch30
SIZE=${SIZE:-49152}
FIELDS="mode switch_interval wall_s per_worker.busy_seconds per_worker.kernel_seconds first_gemm_start last_gemm_stop"
timeout 300 python3 $S "$OUT/x2-switch30-devices01.json" --size "$SIZE" --chunk 4096 --devices 0,1 --codec zstd \
    --repeats 3 --modes on --switch default,0.0005,0.001 --inputs "$inputs/zstd" 2>&1 | summary "devices 0,1" $FIELDS
timeout 150 python3 $S "$OUT/x2-switch30-devices0.json" --size "$SIZE" --chunk 4096 --devices 0 --codec zstd \
    --repeats 2 --modes on --switch default,0.0005 --inputs "$inputs/zstd" 2>&1 | summary "devices 0" $FIELDS
ls -la "$OUT"

#!/bin/bash
# The thirty-second session's third device call (two GPUs of one host, about 5 minutes on two H200s): whether one
# process for both devices (`worker-process: host`) still costs what the seventh session measured (raw 3.40 s against
# 2.50 with a process per device), now that the device decodes the chunks and the hot paths' waits are outside the
# driver.  Reading A once per host (216 block reads a host against 144) needs both devices in one process.
# 49152² zstd `on`, a cluster per layout, alternating over ROUNDS rounds, two runs each.  Run from the project's root
# with carry [".whl"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_32c.sh
. "$(dirname "$0")/session_common.sh" call32c
SIZE=${SIZE:-49152}
FIELDS="mode worker_process wall_s per_worker.busy_seconds first_gemm_start last_gemm_stop last_store_stop"
timeout 500 python3 $S "$OUT/x2-worker-process-32.json" --size "$SIZE" --chunk 4096 --devices ${DEVICES:-0,1} \
    --codec zstd --repeats 2 --modes ${MODES:-on} --worker-process device,host --rounds ${ROUNDS:-2} \
    --inputs "$inputs/zstd" 2>&1 | summary "devices 0,1" $FIELDS
ls -la "$OUT"

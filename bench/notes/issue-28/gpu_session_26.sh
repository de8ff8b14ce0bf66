#!/bin/bash
# Prepared for the session after the twenty-fifth (one device call on one GPU, about 3 minutes): where a decode call's
# 83-89 ms under `on` go.  The twenty-fifth session's timeline split off the device plan (32-35 ms) and the tables
# (14-23); about 30 ms were left.  timeline.py now also times the frames' host plans, the slot's buffers taken
# (`scratch_take`), and each of a call's copies (`call_copy`: the tables' uploads; `call_copy_blocking`: the device
# plan's reads).  32768² zstd in and out under on, two runs, gemm-tasks 1.  Run from the project's root with carry
# [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_26.sh
. "$(dirname "$0")/session_common.sh" s26
T=bench/notes/issue-28/timeline.py
timeout 200 python3 $T "$OUT/timeline-on-32768.json" --size 32768 --chunk 4096 --devices gpu --codec zstd --modes on \
    --repeats 2 --inputs "$inputs/zstd" 2>&1 | grep -v '^{' | tail -2
python3 - "$OUT/timeline-on-32768.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    print(r["mode"], r["wall_s"], {k: r.get(k) for k in ("reads_device", "packed", "lead_or_wait", "batch_call",
                                                         "decode_call", "decode_enqueue", "devplan", "frame_plan",
                                                         "call_tables", "host_plans", "scratch_take", "call_copy",
                                                         "call_copy_blocking", "execute_launch", "slot_last",
                                                         "launch_locks", "batch_sizes")})
PY
ls -la "$OUT"

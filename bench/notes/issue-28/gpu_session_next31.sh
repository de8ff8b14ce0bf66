#!/bin/bash
# Prepared in the thirtieth session for the next one's first device call (two GPUs of one host, about 8 minutes on two
# H200s), on inputs made once: the host's memory copy rate by threads (membw_probe.py), gpu_session_x2_gil30.sh
# (py-spy on both workers under `on`: the lock's holders, then every thread's state), then an A/B of the checkout
# against x-nogilplan30.patch (two rounds, ABBA, `on` on devices 0,1, 49152²).  Here first: the shared prepare.sh
# with py-spy (so that .whl holds it), and
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=HEAD v1=HEAD+bench/notes/issue-28/x-nogilplan30.patch
# Then run from the project's root with carry [".whl", ".ab"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_next31.sh
. "$(dirname "$0")/session_common.sh" next31
export INPUTS=$inputs SIZE=${SIZE:-49152}
timeout 90 python3 bench/notes/issue-28/membw_probe.py "$OUT/membw.json" --threads ${MEMBW_THREADS:-1,8,16,24,32}
OUT="$OUT/gil" bash bench/notes/issue-28/gpu_session_x2_gil30.sh 2>&1 | tail -12
OUT="$OUT/ab" DEVICES=${DEVICES:-0,1} MODES=on ROUNDS=${ROUNDS:-2} CLUSTER_TIMEOUT=200 \
    bash bench/notes/issue-28/gpu_session_ab.sh run 2>&1 | grep -v '__init__'
ls -la "$OUT" "$OUT"/*

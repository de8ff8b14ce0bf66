#!/bin/bash
# An A/B of the versions prepared in .ab/ (gpu_session_ab.sh prepare) on two GPUs of one host and on one, on inputs
# made once (about 7 minutes on two H200s for two versions): 49152² zstd `on` (MODES) on devices 0,1, ROUNDS rounds
# (2; ABBA), then on device 0, one round; then, where SPY_VERSION names a version (SPY_VERSION=v1),
# gpu_session_x2_gil30.sh on that version (py-spy: the lock's holders, then every thread's state).  Everything comes
# back in one tar (a call returns 8 files at most).  The thirty-first session prepared it for x-cbwait31.patch:
#     here:   bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=HEAD v1=HEAD+bench/notes/issue-28/x-cbwait31.patch
#     device: carry [".whl", ".ab"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh` (for SPY_VERSION, the
#             shared prepare.sh with py-spy here first):
#             OUT=/some/folder SPY_VERSION=v1 bash bench/notes/issue-28/gpu_session_ab_x2.sh
. "$(dirname "$0")/session_common.sh" ab-x2
export INPUTS=$inputs SIZE=${SIZE:-49152}
ab_sets     # (DEVICE_SETS=cpu: a check on PoCL)
if [ -n "${SPY_VERSION:-}" ]; then     # (not SPY: session_common.sh sets it, py-spy's path)
    PYTHONPATH=$PWD/.ab/$SPY_VERSION${PYTHONPATH:+:$PYTHONPATH} OUT="$OUT/gil" \
        bash bench/notes/issue-28/gpu_session_x2_gil30.sh 2>&1 | tail -4
fi
(cd "$OUT" && tar -cf ab-x2.tar --exclude=ab-x2.tar . && find . -type f ! -name ab-x2.tar -delete)
ls -la "$OUT"

#!/bin/bash
# The thirty-third session's fourth call (two GPUs of one host, about 6 minutes on two H200s): the decode call's small
# copies through page-locked memory.  Call 3's timeline: the plan kernel's end was seen 5-6 ms later at the median
# (27-37 ms after 0.7 s), and its rows' read-back waited 7-9 ms to start there; read into page-locked memory, the
# read-back ran at once.  The A/B prepared in .ab/ (v0 main; v1 +x-pinnedplan33b.patch: the plan's table up and
# rows back through a slot's page-locked arrays; v2 +x-pinnedplan33c.patch: the call's tables up that way too) on
# devices 0,1 (two rounds, ABBA) and 0 (one round); then the timeline of the version TL_VERSION names (v2) on 0,1
# with products.py on it.  Everything comes back in one tar.
#     here: bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=HEAD \
#               v1=HEAD+bench/notes/issue-28/x-pinnedplan33b.patch v2=HEAD+bench/notes/issue-28/x-pinnedplan33c.patch
#     device: carry [".whl", ".ab"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#             OUT=/some/folder bash bench/notes/issue-28/gpu_session_33c.sh
. "$(dirname "$0")/session_common.sh" call33c
export INPUTS=$inputs SIZE=${SIZE:-49152}
MODES=on ab_sets     # (DEVICE_SETS=cpu TL_DEVICES=cpu: a check on PoCL)
v=${TL_VERSION:-v2}
PYTHONPATH=$PWD/.ab/$v${PYTHONPATH:+:$PYTHONPATH} timeout 150 python3 bench/notes/issue-28/timeline.py \
    "$OUT/timeline-$v.json" --size "$SIZE" --chunk 4096 --devices ${TL_DEVICES:-0,1} --codec zstd --modes on \
    --repeats 1 --bin 0.05 --inputs "$inputs/zstd" 2>&1 | grep -v '^{"mode"' | tail -2
python3 bench/notes/issue-28/products.py "$OUT/timeline-$v.json" --out "$OUT/products-$v.json" | grep '"worker"'
(cd "$OUT" && tar -cf call33c.tar --exclude=call33c.tar . && find . -type f ! -name call33c.tar -delete)
ls -la "$OUT"

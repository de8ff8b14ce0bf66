#!/bin/bash
# The thirty-third session's third call (two GPUs of one host, about 7 minutes on two H200s): where a decode call's
# device plan waits.  From the plan kernel's end to the first frame's plan 11 ms passed at the median, 41-56 ms after
# 0.7 s (call 2's timeline).  The timeline of 49152² zstd `on` on devices 0,1 with the plan's read-back timed
# (then by a wrapper in timeline.py; since cfd1d66 the read is among the call's commands, calls.py splits at it),
# products.py on it; then the A/B prepared in .ab/ (v0 main, v1 +x-pinnedplan33.patch: the rows read into page-locked
# memory) on devices 0,1 (two rounds, ABBA) and 0 (one); then v1's timeline on 0,1.  Everything comes back in one tar.
#     here: bash bench/notes/issue-28/gpu_session_ab.sh prepare \
#               v0=HEAD v1=HEAD+bench/notes/issue-28/x-pinnedplan33.patch
#     device: carry [".whl", ".ab"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#             OUT=/some/folder bash bench/notes/issue-28/gpu_session_33b.sh
. "$(dirname "$0")/session_common.sh" call33b
export INPUTS=$inputs SIZE=${SIZE:-49152}
timeline() {    # VERSION ("" for the working tree), the record's name
    PYTHONPATH=${1:+$PWD/.ab/$1}${PYTHONPATH:+:$PYTHONPATH} timeout 150 python3 bench/notes/issue-28/timeline.py \
        "$OUT/$2.json" --size "$SIZE" --chunk 4096 --devices ${TL_DEVICES:-0,1} --codec zstd --modes on --repeats 1 \
        --bin 0.05 --inputs "$inputs/zstd" 2>&1 | grep -v '^{"mode"' | tail -2
    python3 bench/notes/issue-28/products.py "$OUT/$2.json" --out "$OUT/products-$2.json" | grep '"worker"'
}
timeline "" timeline-main
MODES=on ab_sets     # (DEVICE_SETS=cpu TL_DEVICES=cpu: a check on PoCL)
timeline v1 timeline-v1
(cd "$OUT" && tar -cf call33b.tar --exclude=call33b.tar . && find . -type f ! -name call33b.tar -delete)
ls -la "$OUT"

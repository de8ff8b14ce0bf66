#!/bin/bash
# The thirty-first session's second device call (two GPUs of one host, about 7 minutes on two H200s): the first call's
# A/B had x-nogilplan30.patch (the plan's rows read back by `nogil.copied`, waited by `nogil.wait`) 6 % faster on two
# GPUs.  Here the same, beside x-nogilall31.patch: every wait and blocking read on the decode, encode and GEMM paths
# made by `nogil` (the encoder's two blocking reads wait behind the block's last GEMMs and hold NVIDIA's driver lock
# meanwhile), on two GPUs (two rounds, ABBA) and one (one round): 49152² zstd `on`.  The records come back as one tar.
# Here first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=HEAD v1=HEAD+bench/notes/issue-28/x-nogilplan30.patch \
#         v2=HEAD+bench/notes/issue-28/x-nogilall31.patch
# Then run from the project's root with carry [".whl", ".ab"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_nogil31.sh
. "$(dirname "$0")/session_common.sh" nogil31
export INPUTS=$inputs SIZE=${SIZE:-49152}
for devices in 0,1 0; do
    rounds=2
    [ $devices = 0 ] && rounds=1
    OUT="$OUT/ab$devices" DEVICES=$devices MODES=on ROUNDS=$rounds CLUSTER_TIMEOUT=200 \
        bash bench/notes/issue-28/gpu_session_ab.sh run 2>&1 | grep -v '__init__'
done
(cd "$OUT" && tar -cf nogil31.tar ab* && rm -rf ab*)
ls -la "$OUT"

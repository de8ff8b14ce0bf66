#!/bin/bash
# One device call on one GPU (eighteenth session, about 4 minutes): `queue-priority: inline` at the default block.
# NVIDIA's OpenCL offers no queue priorities, so under share and on a device decode's kernels wait beside the GEMMs
# (17-27 GB/s there against 63-91 alone) and the product that needs the block waits for them: share's products
# spent 0.13-0.17 s in `other` and 0.05-0.07 s more in `transfer` than raw's (gpu_session_ab.sh, this session).
# `inline` puts them between two GEMMs on the GEMMs' own queue; the sixth session measured it at 4096 blocks only
# (20 % slower under on).  32768² zstd in and out, share and on, two runs each, clusters alternating on / inline,
# two rounds; raw beside (its limit raised from 80 s to 150 after the call, where raw printed nothing).
# Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_inline18.sh
. "$(dirname "$0")/session_common.sh" inline18
# what summary prints of each run
FIELDS="queue_priority mode wall_s busy_seconds busy_other_seconds busy_transfer_seconds busy_read_seconds device_decoded_bytes"
timeout 300 python3 $S "$OUT/inline-zstd.json" $GEO --codec zstd --repeats 2 --modes share,on --priorities on,inline \
    --rounds 2 --inputs "$inputs/zstd" 2>&1 | summary zstd $FIELDS
timeout 150 python3 $S "$OUT/inline-raw.json" $GEO --codec none --out-codec none --repeats 2 --modes off \
    --inputs "$inputs/raw" 2>&1 | summary raw $FIELDS
ls -la "$OUT"     # what the call leaves for the records

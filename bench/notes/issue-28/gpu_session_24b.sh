#!/bin/bash
# The twenty-fourth session's third call (one H100, 80 GB, 16 cores; about 6 minutes): 49152² zstd in and out under
# on and share after the decode slots' calls kept to a quarter of the device's memory share (68f0ce1), two runs
# each, and raw chunks in and out twice (gemm-tasks 1).  The second call's `on` decoded the inputs 2.25 times over
# (43.5 GB) and took 5.8-5.9 s against share's 4.2.  Run from the project's root with carry [".whl"], after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_24b.sh
. "$(dirname "$0")/session_common.sh" s24b
FIELDS="mode wall_s per_worker.busy_seconds busy_read_seconds busy_transfer_seconds busy_other_seconds device_decoded_bytes"
timeout 300 python3 $S "$OUT/s24b-zstd-49152.json" --size 49152 --chunk 4096 --devices gpu --codec zstd \
    --repeats 2 --modes on,share --gemm-tasks 1 --inputs "$inputs/zstd" 2>&1 | summary "zstd 49152" $FIELDS
rm -rf "$inputs/zstd"
timeout 240 python3 $S "$OUT/s24b-raw-49152.json" --size 49152 --chunk 4096 --devices gpu --codec none \
    --out-codec none --repeats 2 --modes off --gemm-tasks 1 --inputs "$inputs/raw" 2>&1 | summary "raw 49152" $FIELDS
ls -la "$OUT"     # what the call leaves for the records

#!/bin/bash
# The twenty-fourth session's second call (one H100, 80 GB, 16 cores; about 7 minutes).
# 1. Whether NVIDIA's OpenCL driver honours a queue priority it does not list: beside_gemm.py --try-priority asks
#    for high-priority decode queues (cl_khr_priority_hints' property) and times the decode and the GEMMs beside
#    each other, high against normal (if the driver refuses, the rows say queue_priority_used false).
# 2. The decode slots' new reserve (twenty-third session: up to 48.6 GiB under on for 256 MiB blocks) on an 80 GB
#    card end to end: 49152² zstd in and out under MODES (share,on), two runs each, and raw chunks RAW_REPEATS (3)
#    times.  (In call 2 the raw runs had 150 s and ran past it; they have 240 now.)  ONLY=e2e: step 2 alone
#    (gpu_session_24b.sh, the third call).
# Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_24.sh
. "$(dirname "$0")/session_common.sh" "${NAME:-s24}"
if [ "${ONLY:-}" != e2e ]; then
    timeout 150 python3 bench/notes/issue-28/beside_gemm.py "$OUT/s24-priority.json" --try-priority --seconds 1.5 \
        --threads 1,4 --variants s8 --priority high,normal 2>&1 | grep -v '^{' | tail -4
    python3 bench/notes/issue-28/beside_gemm.py "$OUT/s24-priority.json" --summary 2>&1 | tail -6
fi
FIELDS="mode wall_s per_worker.busy_seconds busy_read_seconds busy_transfer_seconds busy_other_seconds device_decoded_bytes"
timeout 300 python3 $S "$OUT/${NAME:-s24}-zstd-49152.json" --size 49152 --chunk 4096 --devices gpu --codec zstd \
    --repeats 2 --modes "${MODES:-share,on}" --gemm-tasks 1 --inputs "$inputs/zstd" 2>&1 | summary "zstd 49152" $FIELDS
rm -rf "$inputs/zstd"
timeout 240 python3 $S "$OUT/${NAME:-s24}-raw-49152.json" --size 49152 --chunk 4096 --devices gpu --codec none \
    --out-codec none --repeats "${RAW_REPEATS:-3}" --modes off --gemm-tasks 1 --inputs "$inputs/raw" 2>&1 \
    | summary "raw 49152" $FIELDS
ls -la "$OUT"     # what the call leaves for the records

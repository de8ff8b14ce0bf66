#!/bin/bash
# Prepared for the session after the twenty-fourth (one device call on one GPU, about 4 minutes): where a read
# under `on` spends the 0.05 s that is neither its staging read nor the device's kernels (the twenty-fourth
# session's call 1).  timeline.py now also times, per block, the frames' plans from their headers (`batchable`),
# the wait for a decode call's leader or its own lead (`lead_or_wait`: a slot, then the call) and the shared call
# itself (`batch_call`, on the leader's thread).  32768² zstd in and out under on (two runs), then raw chunks once,
# gemm-tasks 1.  Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_25.sh
. "$(dirname "$0")/session_common.sh" s25
T=bench/notes/issue-28/timeline.py
timeout 200 python3 $T "$OUT/timeline-on-32768.json" --size 32768 --chunk 4096 --devices gpu --codec zstd --modes on \
    --repeats 2 --inputs "$inputs/zstd" 2>&1 | grep -v '^{' | tail -3
rm -rf "$inputs/zstd"
timeout 150 python3 $T "$OUT/timeline-raw-32768.json" --size 32768 --chunk 4096 --devices gpu --codec none \
    --modes off --repeats 1 --inputs "$inputs/raw" 2>&1 | grep -v '^{' | tail -3
python3 - "$OUT/timeline-on-32768.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    print(r["mode"], r["wall_s"], {k: r.get(k) for k in ("reads_device", "packed", "batchable", "lead_or_wait",
                                                         "batch_call", "decode_call", "decode_enqueue")})
PY
ls -la "$OUT"     # what the call leaves for the records

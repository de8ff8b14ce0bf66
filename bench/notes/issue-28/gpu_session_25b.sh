#!/bin/bash
# The twenty-fifth session's second call (one GPU, about 8 minutes): main before it (v0) against blocks whose chunks
# are copied into place sharing decode calls too (v1, HEAD), `on` at 32768² zstd in and out, ABBA, raw beside; then
# the timeline of HEAD's `on` (two runs) with the calls' inner steps timed (devplan, call_tables, execute_launch,
# slot_last) and the blocks each shared call took.  Prepare here:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=<main before> v1=HEAD
# then run from the project's root with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_25b.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
here=$(dirname "$0")
OUT=$OUT MODES=on ROUNDS=2 REPEATS=2 RAW_TASKS=1 bash "$here/gpu_session_ab.sh" session
. "$here/session_common.sh" s25b
T=bench/notes/issue-28/timeline.py
timeout 200 python3 $T "$OUT/timeline-on-32768.json" --size 32768 --chunk 4096 --devices gpu --codec zstd --modes on \
    --repeats 2 --inputs "$inputs/zstd" 2>&1 | grep -v '^{' | tail -2
python3 - "$OUT/timeline-on-32768.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    print(r["mode"], r["wall_s"], {k: r.get(k) for k in ("reads_device", "packed", "lead_or_wait", "batch_call",
                                                         "decode_call", "decode_enqueue", "devplan", "frame_plan",
                                                         "call_tables", "execute_launch", "slot_last", "batch_sizes")})
PY
ls -la "$OUT"

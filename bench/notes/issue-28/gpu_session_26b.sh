#!/bin/bash
# The twenty-sixth session's second timeline (one device call on one GPU, about 3 minutes): do a decode slot's new
# buffers bind `on`?  Each product starts with empty slots (Device.trim gives their buffers back at a run's end), so
# each slot allocates its 30-odd buffers again and grows them as larger calls come; the timeline of gpu_session_26.sh
# had 105 buffer takes of more than 1 ms in a run (0.6 s) and 200 slow uploads.  Two clusters, 32768² zstd in and out
# under on, two runs each: this checkout, then the A/B folder's version VERSION (.ab/VERSION, with its variables:
# v1 keeps the slots' buffers between runs, the ceiling of any fix).  Run from the project's root with carry
# [".whl", ".ab"], after `source .whl/gpu-env.sh` and `gpu_session_ab.sh prepare v0=main v1=80fddac,DGEMM_X_SCRATCH_KEEP=1`
# (80fddac: x-scratch26.patch on 0722db2; without .ab/VERSION, main's timeline alone):
#     OUT=/some/folder VERSION=v1 bash bench/notes/issue-28/gpu_session_26b.sh
. "$(dirname "$0")/session_common.sh" s26b
T=bench/notes/issue-28/timeline.py
v=${VERSION:-v1}
timeout 150 python3 $T "$OUT/timeline-main.json" --size 32768 --chunk 4096 --devices gpu --codec zstd --modes on \
    --repeats 2 --inputs "$inputs/zstd" 2>&1 | grep -v '^{' | tail -1
[ -d ".ab/$v" ] && env $(cat ".ab/$v.env" 2>/dev/null) PYTHONPATH=$PWD/.ab/$v${PYTHONPATH:+:$PYTHONPATH} \
    DGEMM_COMMIT=$(awk -v v="$v" '$1 == v {print $2}' .ab/versions) \
    timeout 150 python3 $T "$OUT/timeline-$v.json" --size 32768 --chunk 4096 --devices gpu --codec zstd --modes on \
    --repeats 2 --inputs "$inputs/zstd" 2>&1 | grep -v '^{' | tail -1
for f in "$OUT"/timeline-*.json; do
    python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["runs"]:
    log = r["log"]
    def spans(k):
        w = sorted(x[3] - x[2] for x in log if x[0] == k)
        return f"{k} n={len(w)} sum={sum(w):.3f} >1ms={sum(1 for x in w if x > 1e-3)}"
    print(d["meta"]["commit"], r["mode"], r["wall_s"], "first_gemm", r["first_gemm"], "last_read_end", r["last_read_end"],
          "calls", r["batch_sizes"], "enqueue", r["decode_enqueue"], *(spans(k) for k in
          ("scratch_take", "alloc", "release", "call_copy", "call_copy_blocking")), r.get("check", {}).get("passed"))
PY
done
ls -la "$OUT"

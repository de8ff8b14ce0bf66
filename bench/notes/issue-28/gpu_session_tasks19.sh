#!/bin/bash
# The nineteenth session's second call (one GPU, about 6 minutes): the new read-threads default (three quarters
# of the cores: 12 on 16) against 16 readers, under share and on, each with gemm-tasks 1 and 2, two rounds of a
# cluster each, alternating; then raw chunks in and out (gemm-tasks 1 and 2).  Each run's record now has the gaps
# between a worker's GEMM tasks (gemm_gap_seconds).  Here, first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=HEAD v1=HEAD,DGEMM_READ_THREADS=16
# then on the device, with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_tasks19.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
[ -f .ab/versions ] || { echo "prepare .ab first (see the header)"; exit 2; }
OUT=$OUT MODES=share,on ROUNDS=2 GEMM_TASKS=1,2 bash bench/notes/issue-28/gpu_session_ab.sh run 2>&1 | grep -v '__init__'
OUT=$OUT REPEATS=2 bash bench/notes/issue-28/gpu_session_ab.sh raw 2>&1 | grep '^raw'
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    for r in json.load(open(f))["runs"]:
        print(f.split("/")[-1], r["mode"], r["gemm_tasks_setting"], r["wall_s"], "gaps", r.get("gemm_gap_seconds"),
              r.get("gemm_gap_longest"), "busy", r["per_worker"]["busy_seconds"], "read", round(r["busy_read_seconds"], 3),
              "other", round(r["busy_other_seconds"], 3), "dev GB", round(r["device_decoded_bytes"] / 1e9, 2))
PY

#!/bin/bash
# Prepared for the nineteenth session (one device call on one GPU, about 8 minutes): the first two of bench/NOTES.md's
# "Next (issue 28)" after the eighteenth session.  Here, first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=main v1=main,DGEMM_READ_THREADS=12 \
#         v2=5d42838,DGEMM_X_PLAN_CACHE=1
# (5d42838 is the local branch x-plan-cache: each chunk's device-decode plan kept by its name across runs, an
# experiment never merged).  Then on the device, with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_next19.sh
# It runs the three versions under share and on, two rounds of a cluster each, alternating (6 records), then raw
# chunks with 16 and 12 reader threads (2 records): 8 files, what a call brings back at most.
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
[ -f .ab/versions ] || { echo "prepare .ab first (see the header)"; exit 2; }
OUT=$OUT MODES=share,on ROUNDS=2 bash bench/notes/issue-28/gpu_session_ab.sh run 2>&1 | grep -v '__init__'
for rt in 16 12; do
    DGEMM_READ_THREADS=$rt OUT=$OUT REPEATS=2 bash bench/notes/issue-28/gpu_session_ab.sh raw 2>&1 | grep '^raw' \
        | sed "s/^/read_threads=$rt /"
    mv "$OUT/raw-${SIZE:-32768}.json" "$OUT/raw-${SIZE:-32768}-rt$rt.json"
done
ls -la "$OUT"

#!/bin/bash
# A/B of dgemm versions in one device call, each in clusters of its own, alternating, on the same inputs: what a
# change did end to end, apart from the machine (across machines `off` moves by 0.2-0.6 s at 32768²).
#   here:   bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=52c1b94 v2=HEAD   (git archive into .ab/, ignored)
#           (v3=HEAD,DGEMM_READ_THREADS=24: that version runs with these variables set, comma-separated;
#           v4=main+bench/notes/issue-28/x-retire26.patch: main with that patch's dgemm/ applied)
#   device: run with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#           OUT=/some/folder SIZE=32768 DEVICES=gpu MODES=on,off ROUNDS=2 bash bench/notes/issue-28/gpu_session_ab.sh run
#           (`raw`: raw chunks in and out beside them, gemm-tasks 1 and 2, REPEATS runs each; `session`: `run`
#           under share, three rounds, then `raw`, the A/B records tarred into ab.tar)
# Rounds alternate the versions' order (ABBA), so that a drift over the call (runs slowing one after another) cancels.
# Each version's package is imported from .ab/NAME, put before the rest of PYTHONPATH (gpu-env.sh's, which has the
# checkout's root), and the script that times them is this checkout's device_codecs_onoff.py.  The twelfth session's records:
# results/2026-11-27-nvidia-h100-ab-kept-handover-32768-43a8855.json, ...-h200-x2-ab-kept-handover-49152-538a02f.json.
set -u
cd "$(dirname "$0")/../../.."
case "${1:?prepare or run}" in
prepare)
    shift
    rm -rf .ab
    for spec in "$@"; do
        v=${spec%%=*} rest=${spec#*=}
        version=${rest%%,*}; sha=$version patch=
        case "$sha" in *+*) patch=${sha#*+} sha=${sha%%+*} ;; esac     # SHA+FILE: that version with a patch applied
        mkdir -p ".ab/$v" && git archive "$sha" dgemm | tar -x -C ".ab/$v"
        if [ -n "$patch" ]; then
            git apply --directory=".ab/$v" --include="*/dgemm/*" --include="dgemm/*" -p1 "$patch" 2>/dev/null \
                || { echo "$patch does not apply to $sha"; exit 1; }
        fi
        if [ "$rest" != "$version" ]; then echo "${rest#*,}" | tr , '\n' > ".ab/$v.env"; fi
        echo "$v $(git rev-parse --short "$sha")${patch:++$(basename "$patch")}" >> .ab/versions
    done
    git rev-parse --short HEAD > .ab/checkout     # what `raw` runs (the device's copy of .git may be stale)
    cat .ab/versions
    ;;
run)
    : "${OUT:?set OUT to the folder for the records}"
    mkdir -p "$OUT"
    if [ -n "${INPUTS:-}" ]; then inputs=$INPUTS; else    # (INPUTS: another script's folder of inputs, kept)
        inputs=$(mktemp -d /dev/shm/dgemm-ab-XXXX)
        trap 'rm -rf "$inputs"' EXIT
    fi
    for round in $(seq "${ROUNDS:-2}"); do
        while read -r v sha; do
            (cd bench && PYTHONPATH=$PWD/../.ab/$v${PYTHONPATH:+:$PYTHONPATH} python3 -c "import dgemm; print('$v', dgemm.__file__)")
            # (CLUSTER_TIMEOUT: a version that hangs costs that, not the call; the twenty-sixth session's v2 hung 8 minutes)
            env $(cat ".ab/$v.env" 2>/dev/null) PYTHONPATH=$PWD/.ab/$v${PYTHONPATH:+:$PYTHONPATH} DGEMM_COMMIT=$sha \
                timeout "${CLUSTER_TIMEOUT:-300}" python3 bench/notes/issue-28/device_codecs_onoff.py \
                "$OUT/ab-$v-r$round.json" --size "${SIZE:-32768}" --codec zstd --devices "${DEVICES:-gpu}" --repeats 2 \
                --modes "${MODES:-on,off}" --gemm-tasks "${GEMM_TASKS:-1}" --inputs "$inputs/zstd" 2>&1 \
                | grep '^{"mode"' | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print('$v', '$round', r['mode'], r['gemm_tasks_setting'], r['wall_s'], r['per_worker']['busy_seconds'], flush=True)"
        done < <(if [ $((round % 2)) = 0 ]; then tac .ab/versions; else cat .ab/versions; fi)  # ABBA: drift cancels
    done
    ;;
raw)    # raw chunks in and out beside the A/B, on the same machine: SIZE², gemm-tasks RAW_TASKS (1,2), REPEATS runs each
    : "${OUT:?set OUT to the folder for the records}"
    mkdir -p "$OUT"
    inputs=$(mktemp -d /dev/shm/dgemm-raw-XXXX)
    trap 'rm -rf "$inputs"' EXIT
    DGEMM_COMMIT=$(cat .ab/checkout 2>/dev/null) \
        python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/raw-${SIZE:-32768}.json" --size "${SIZE:-32768}" \
        --codec none --out-codec none --devices "${DEVICES:-gpu}" --repeats "${REPEATS:-2}" --modes off \
        --gemm-tasks "${RAW_TASKS:-1,2}" --inputs "$inputs/raw" | grep '^{"mode"' | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print('raw', r['gemm_tasks_setting'], r['wall_s'], r['per_worker']['busy_seconds'], flush=True)"
    ;;
session)    # what the twentieth session's A/B calls ran: `run` (MODES=share, ROUNDS=3 unless set), `raw` (REPEATS=2),
            # then the A/B records tarred into ab.tar (a call brings back 8 files at most)
    : "${OUT:?set OUT to the folder for the records}"
    OUT=$OUT MODES=${MODES:-share} ROUNDS=${ROUNDS:-3} bash bench/notes/issue-28/gpu_session_ab.sh run 2>&1 | grep -v '__init__'
    OUT=$OUT REPEATS=${REPEATS:-2} bash bench/notes/issue-28/gpu_session_ab.sh raw 2>&1 | grep '^raw'
    (cd "$OUT" && tar -cf ab.tar ab-*.json && rm -f ab-*.json)
    ls -la "$OUT"
    ;;
esac

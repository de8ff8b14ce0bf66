# Sourced by issue 28's session scripts from the seventeenth session on (`. "$(dirname "$0")/session_common.sh" NAME`):
# checks OUT, goes to the project's root, makes a folder for the inputs in /dev/shm (removed on exit; INPUTS set: that
# folder, kept), sets S (the end-to-end script, device_codecs_onoff.py) and GEO (its --size, --chunk and --devices from
# SIZE, CHUNK and DEVICES), and defines `summary LABEL FIELD...`, which prints each run's record line that
# device_codecs_onoff.py writes as LABEL and the fields named (a float rounded to 3 places; `a.b` is field b of field
# a), and each cluster's float64 check; `raw_scaling FIELD...`, raw chunks in and out at SIZE on devices 0,1 then 0
# (two runs each: the raw peer's own scaling, beside a 2-GPU call's zstd runs); and `ab_sets`, the A/B of the
# versions prepared in .ab/ on each device set (thirty-third session).
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."     # the project's root, wherever the script is run from
if [ -n "${INPUTS:-}" ]; then      # a folder of inputs another script made (and removes): reused, kept
    inputs=$INPUTS
else
    inputs=$(mktemp -d "/dev/shm/dgemm-${1:-session}-XXXX")
    trap 'rm -rf "$inputs"' EXIT
fi
S=bench/notes/issue-28/device_codecs_onoff.py
# py-spy where gpu-env.sh installs it (beside pyopencl's package: the shared prepare.sh with py-spy), else on PATH
SPY=$(python3 -c 'import os, pyopencl; print(os.path.join(os.path.dirname(os.path.dirname(pyopencl.__file__)),
                  "bin", "py-spy"))' 2>/dev/null)
[ -x "${SPY:-}" ] || SPY=$(command -v py-spy || true)
GEO="--size ${SIZE:-32768} --chunk ${CHUNK:-4096} --devices ${DEVICES:-gpu}"

summary() {
    local label=$1
    shift
    grep '^{"mode"\|"check"' | python3 -c "
import json, sys
label, fields = sys.argv[1], sys.argv[2:]
for line in sys.stdin:
    r = json.loads(line)
    if 'mode' not in r:
        c = r['check']
        print(label, r.get('queue_priority', ''), 'check', c.get('passed') if isinstance(c, dict) else c, flush=True)
        continue
    out = []
    for f in fields:
        v = r
        for part in f.split('.'):
            v = v.get(part) if isinstance(v, dict) else None
        out += [f, round(v, 3) if isinstance(v, float) else v]
    print(label, *out, flush=True)" "$label" "$@"
}

raw_scaling() {
    local devices
    for devices in 0,1 0; do
        timeout 200 python3 $S "$OUT/x2-raw-devices${devices/,/}.json" --size "$SIZE" --chunk ${CHUNK:-4096} \
            --devices "$devices" --codec none --out-codec none --repeats 2 --modes off \
            --inputs "$inputs/raw" 2>&1 | summary "raw $devices" "$@"
    done
}

ab_sets() {     # the A/B of the versions prepared in .ab/ (gpu_session_ab.sh run, on INPUTS) on each device set of
    local devices rounds    # DEVICE_SETS (0,1 then 0): ROUNDS rounds (2), one on device 0; records in OUT/abDEVICES
    for devices in ${DEVICE_SETS:-0,1 0}; do     # (DEVICE_SETS=cpu: a check on PoCL)
        rounds=${ROUNDS:-2}
        [ "$devices" = 0 ] && rounds=1
        OUT="$OUT/ab${devices/,/}" DEVICES=$devices MODES=${MODES:-on} ROUNDS=$rounds CLUSTER_TIMEOUT=200 \
            bash bench/notes/issue-28/gpu_session_ab.sh run 2>&1 | grep -v '__init__'
    done
}

#!/bin/bash
# The twenty-sixth session's fourth call (one GPU, about 4 minutes): why the decode slots' arenas (a3554f8) ran `on`
# at 32768² in 39-47 s against main's 1.4, with the GEMM kernels' time unchanged and the device's other commands
# (the decode kernels, the uploads) 60 times slower.  If the arenas take the device past its memory, NVIDIA's driver
# may place buffers in host memory rather than fail.  The device's memory in use is sampled every 0.2 s
# (nvidia-smi) while the versions prepared here run once each (`gpu_session_ab.sh prepare v0=3797d6d v1=a3554f8
# v2=da32a35,DGEMM_X_ARENA_SCALE=0.5 v3=da32a35,DGEMM_X_ARENA_SCALE=0.25`: arenas of the model's size, half, a
# quarter), each cluster cut at 60 s.  Run from the project's root with carry [".whl", ".ab"], after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_26d.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."
mkdir -p "$OUT"
nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 200 > "$OUT/smi.csv" &
smi=$!
OUT="$OUT" MODES=on ROUNDS=1 CLUSTER_TIMEOUT=60 bash bench/notes/issue-28/gpu_session_ab.sh run 2>&1 \
    | grep -v __init__ | while read -r line; do echo "$(date +%H:%M:%S.%N | cut -c1-12) $line"; done
kill $smi
python3 - "$OUT/smi.csv" <<'PY'
import sys
rows = [line.split(", ") for line in open(sys.argv[1]) if line.strip()]
peak = max(int(r[1]) for r in rows)
print("samples", len(rows), "peak MiB", peak, "of", rows[0][2])
for r in rows[::25]:
    print(r[0].split()[-1][:12], r[1])
PY
ls -la "$OUT"

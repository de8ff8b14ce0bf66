#!/bin/bash
# One device call on one GPU (eighteenth session, about 4 minutes): where a reader thread's time goes under share
# and on at the default block, blocked waits included.  gpu_session_slots18.sh found that a block the device
# decodes costs a reader about as long as a host decode (0.2-0.3 s, 60 ms of it on a CPU), so that moving blocks to
# the device (8 or 12 decode slots) left the reads as long.  First the host's zstd decode by thread count alone
# (decode_scaling.py), then 32768² zstd in and out under `py-spy record --idle --native` (every thread's stack,
# waiting or not, native frames too: Python's lock, the driver's, dgemm's own), share three runs, then on three
# runs, each in a cluster of its own.  Run from the project's root with carry [".whl"], after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_spy18.sh
. "$(dirname "$0")/session_common.sh" spy18
# what summary prints of each run
FIELDS="mode wall_s read_seconds device_decoded_bytes host_decoded_bytes"
spy=$(python3 -c 'import os; print(os.path.join(os.path.dirname(os.path.dirname(__import__("pyopencl").__file__)), "bin", "py-spy"))')
[ -n "${SKIP_SCALING:-}" ] || timeout 60 python3 bench/notes/issue-28/decode_scaling.py "$OUT/decode-scaling.json" --threads 1,4,8,16
timeout 100 python3 $S "$OUT/plain.json" $GEO --codec zstd --repeats 1 --modes share --inputs "$inputs/zstd" 2>&1 \
    | summary plain $FIELDS
# (--native pauses the process for each sample: py-spy cannot unwind native stacks without; 25 a second)
for mode in share on; do
    timeout 150 "$spy" record --idle --native --threads --subprocesses -r 25 -f raw -o "$OUT/spy-$mode.txt" \
        -- python3 $S "$OUT/spy-$mode.json" $GEO --codec zstd --repeats 3 --modes $mode --inputs "$inputs/zstd" 2>&1 \
        | tee "$OUT/spy-$mode.log" | summary "spy-$mode" $FIELDS
done
gzip -f "$OUT"/spy-*.txt; ls -la "$OUT"

#!/bin/bash
# One device call on one GPU (eighteenth session, about 8 minutes): what the host is (lscpu), a script's first
# product at the new default block against 4096 (gpu_session_first17.sh), then, at the default block, 32768² zstd in
# and out: share with 4, 8 and 12 decode slots (each count a fresh scratch, alternating), on with 4, 8 and 16, and raw
# beside them, two rounds.  Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_slots18.sh
. "$(dirname "$0")/session_common.sh" slots
# what summary prints of each run
FIELDS="mode slots gemm_tasks_setting wall_s first_gemm_start last_gemm_stop read_seconds device_decoded_bytes host_decoded_bytes"
lscpu > "$OUT/lscpu.txt" 2>&1; grep -i "^CPU(s)\|Thread(s) per core\|Core(s) per\|Socket\|Model name\|NUMA node(s)\|MHz" "$OUT/lscpu.txt"
python3 -c "import dgemm, pyopencl, distributed, zarr, numcodecs" # the machine's first imports, before any timing
OUT=$OUT bash bench/notes/issue-28/gpu_session_first17.sh
for round in 1 2; do
    timeout 150 python3 $S "$OUT/share-slots-r$round.json" $GEO --codec zstd --repeats 2 --modes share \
        --slots 4,8,12 --slots-mode share --inputs "$inputs/zstd" 2>&1 | summary "share-r$round" $FIELDS
    timeout 80 python3 $S "$OUT/raw-r$round.json" $GEO --codec none --out-codec none --repeats 2 --modes off \
        --inputs "$inputs/raw" 2>&1 | summary "raw-r$round" $FIELDS
done
timeout 120 python3 $S "$OUT/on-slots.json" $GEO --codec zstd --repeats 1 --modes share --slots 4,8,16 \
    --slots-mode on --inputs "$inputs/zstd" 2>&1 | summary "on" $FIELDS
ls -la "$OUT"     # what the call leaves for the records

#!/bin/bash
# One device call on one GPU (seventeenth session, about 4 minutes): a script's first product on a fresh cluster at
# the GPU blocks' new default (`auto`) against 4096 (the old default), alternating: raw chunks twice each, then zstd
# in and out once each (gpu_session_final17.sh found the first raw product 5.5 s at HEAD, where the sixteenth
# session's first had been 2.9 s at 4096 on another machine).  Run from the project's root with carry [".whl"],
# after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_first17.sh
# (Each run's limit was 60 s until the eighteenth session, where two of six runs hit it and left no figure: 120 now.)
. "$(dirname "$0")/session_common.sh" first
# what summary prints of each run
FIELDS="mode block first wall_s first_gemm_start read_seconds"
for what in raw raw zstd; do
    for b in auto 4096; do
        if [ $what = raw ]; then codec="--codec none --out-codec none --modes off"; else codec="--codec zstd --modes share"; fi
        timeout 120 python3 $S "$OUT/first-$what-$b-$RANDOM.json" $GEO $codec --repeats 1 --no-warmup --blocks "$b" \
            --inputs "$inputs/$what" 2>&1 | summary "first-$what" $FIELDS
    done
done
ls -la "$OUT"     # what the call leaves for the records

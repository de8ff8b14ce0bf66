#!/bin/bash
# The twenty-eighth session's last call (one GPU): an A/B of two versions prepared in .ab/ (here:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=SHA v1=SHA
# ), each run twice with zstd in and out under `on` and twice with raw chunks in and out, every cluster its own,
# in ABBA order over two rounds, so that a change that touches the raw path too (the blocks' source buffers kept:
# dgemm.opencl.spares) is measured against its own raw peer.  SIZE² (49152 unless set), gemm-tasks 1.  On the
# device, with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_28c.sh
. "$(dirname "$0")/session_common.sh" s28c
SIZE=${SIZE:-49152}

one() {     # VERSION KIND ROUND: a cluster of VERSION on KIND (zstd or raw) chunks, REPEATS runs (2)
    local v=$1 kind=$2 r=$3 sha args
    sha=$(awk -v v="$v" '$1 == v {print $2}' .ab/versions)
    if [ "$kind" = zstd ]; then args="--codec zstd --modes on"; else args="--codec none --out-codec none --modes off"; fi
    PYTHONPATH=$PWD/.ab/$v${PYTHONPATH:+:$PYTHONPATH} DGEMM_COMMIT=$sha timeout "${CLUSTER_TIMEOUT:-200}" \
        python3 $S "$OUT/ab-$kind-$v-r$r.json" --size "$SIZE" --chunk 4096 --devices gpu --repeats "${REPEATS:-2}" \
        $args --gemm-tasks 1 --inputs "$inputs/$kind" 2>&1 | summary "$v $kind r$r" wall_s per_worker.busy_seconds
}
for r in 1 2; do
    if [ "$r" = 1 ]; then a=v0 b=v1; else a=v1 b=v0; fi
    one $a zstd $r; one $b zstd $r; one $b raw $r; one $a raw $r
done
(cd "$OUT" && tar -cf ab.tar ab-*.json && rm -f ab-*.json)
ls -la "$OUT"

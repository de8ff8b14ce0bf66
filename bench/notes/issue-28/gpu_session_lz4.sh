#!/bin/bash
# One device call on one GPU (2 to 5 minutes on an H100) for one step of Blosc-LZ4's parser (issue 28, tenth session):
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_lz4.sh STEP
# Run from anywhere after `source .whl/gpu-env.sh`.  Each step times blosc_decode.py's variants (each checked bit
# for bit against numcodecs first) on normal and random-walk float32 at clevel 5 and normal float32 at clevel 1;
# puts the step's build through CUDA and NVIDIA's profiler (per-instruction stall samples; lz4_in_cuda.py checks its
# planes against the OpenCL launch's) and keeps its PTX (its SASS can then be read without a GPU: ptxas, nvdisasm); runs the GPU-marked tests where the step asks; runs the Blosc tests and the
# step's mutations on the machine's PoCL CPU device.  A step ran at its commit (its record,
# results/2026-11-27-nvidia-h100-blosc-lz4-STEP-COMMIT.json, names it); lean and lean2 time LZ4_PARSE 1, removed
# since (slower than 2), so they run only at their commits.
#   lean   the lean parser (LZ4_PARSE 1) against the token table before it, 32 and 64 lanes, batches of 64 and 128
#   lean2  its second step (one local address a sequence, three loads from one address)
#   wide   the wide parser (LZ4_PARSE 2), first form: lane 0 walks, every lane reads a sequence, lane 0 the rules
#   wide2  second form: a scan for the output positions, every lane applies the rules, the first stop by atomic_min
#   wide3  third form: the walk takes a common token in 32-bit arithmetic
#   wide4  fourth form: the walk loads the next common token before testing this one
#   wide5  fifth form: lane 0 walks the next batch while the copying lanes (a warp apart from 64 lanes) copy this one
#   wide6  sixth form: phase 2's groups made in phase 1 by LZ4_GROUP_LANE
#   wide7  a sweep around the default (batch, long-copy threshold, lanes) and the GPU-marked tests
#   wide8  the walk two tokens a turn
set -u
: "${OUT:?set OUT to the folder for the records}"
step=${1:?name the step: lean, lean2, wide, wide2 ... wide8}
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
profile="LZ4_PARSE=2"
mutations=""
gpu_tests=0
case $step in
  lean) variants="table:32 table:32:parse=1 table:64:parse=1 table:32:parse=1,batch=128 table:64:parse=1,batch=128"
        profile="LZ4_PARSE=1"
        mutations="lz4-lean-offset-zero lz4-lean-last-missed lz4-lean-match-end lz4-lean-next-token lz4-lean-slow-next
                   lz4-table-independent-too-soon" ;;
  lean2) variants="table:32 table:32:parse=1 table:64:parse=1"
         profile="LZ4_PARSE=1"
         mutations="lz4-lean-offset-zero lz4-lean-input-end lz4-lean-match-end lz4-lean-next-token lz4-lean-slow-next
                    lz4-table-independent-too-soon" ;;
  wide|wide2) variants="table:32 table:32:parse=1 table:32:parse=2 table:32:parse=2,batch=128 table:32:parse=2,batch=32
                        table:64:parse=2,copy_from=0"
              mutations="lz4-wide-flags-unread lz4-wide-no-cap lz4-wide-matchlen-ignored lz4-wide-next-batch" ;;
  wide3) variants="table:32 table:32:parse=1 table:32:parse=2 table:32:parse=2,batch=32 table:64:parse=2,copy_from=0
                   table:64:parse=2,copy_from=0,batch=32 table:128:parse=2,copy_from=0"
         mutations="lz4-wide-walk-extra-length lz4-wide-next-batch lz4-wide-scan-offset lz4-wide-flags-unread" ;;
  wide4) variants="table:32 table:32:parse=1 table:32:parse=2 table:64:parse=2,copy_from=0
                   table:64:parse=2,copy_from=0,batch=128 table:32:parse=2,batch=128" ;;
  wide5) variants="table:32 table:32:parse=2 table:64:parse=2 table:64:parse=2,copy_from=0 table:128:parse=2
                   table:64:parse=2,batch=128 table:64:parse=2,batch=32"
         profile="LZ4_PARSE=2 LZ4_WG=64" ;;
  wide6) variants="table:32 table:64:parse=2 table:64:parse=2,group=32 table:96:parse=2,copy_from=64,group=32
                   table:96:parse=2 table:32:parse=2"
         profile="LZ4_PARSE=2 LZ4_WG=64" ;;
  wide7) variants="table:32 table:64:parse=2,group=32 table:64:parse=2,group=32,long=16 table:64:parse=2,group=32,long=64
                   table:64:parse=2,group=32,batch=32 table:64:parse=2,group=32,batch=128 table:96:parse=2,group=64
                   table:128:parse=2,group=32"
         profile=""
         gpu_tests=1 ;;
  wide8) variants="table:32 table:64:parse=2,group=32 table:32:parse=2 table:96:parse=2,group=64"
         profile="LZ4_PARSE=2 LZ4_WG=64 LZ4_GROUP_LANE=32" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086  # (the lists are word-split on purpose)
python3 bench/notes/issue-28/blosc_decode.py "$OUT/blosc-$step.json" --no-host --repeats 3 \
    --cases normal-shuffle-5,walk-shuffle-5,normal-shuffle-1 --variants $variants
if [ -n "$profile" ]; then
    L=bench/notes/issue-28/lz4_in_cuda.py
    params=$(for p in $profile; do printf -- '--param %s ' "$p"; done)
    python3 $L $params --save-ptx "$OUT/lz4-$step.ptx" > "$OUT/lz4-$step-in-cuda.jsonl"
    ncu --clock-control none -k regex:lz4_streams -c 2 --set full --import-source yes -o "$OUT/lz4-$step" \
        python3 $L --reps 1 $params > "$OUT/ncu-$step.log" 2>&1
    ncu --import "$OUT/lz4-$step.ncu-rep" --page source --csv --print-source sass --launch-skip 1 --launch-count 1 \
        > "$OUT/lz4-$step-sass.csv" 2>&1
    rm -f "$OUT/lz4-$step.ncu-rep"
fi
if [ "$gpu_tests" = 1 ]; then
    python3 dev/gpu_tests.py --out "$OUT/t" > "$OUT/gpu_tests.log" 2>&1
    tail -n 2 "$OUT/gpu_tests.log"
fi
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_blosc_device.py > "$OUT/tests.log" 2>&1
tail -n 3 "$OUT/tests.log"
if [ -n "$mutations" ]; then
    timeout 240 python3 dev/mutations.py --no-baseline --timeout 60 --out "$OUT/mutations.json" $mutations \
        > "$OUT/mutations.log" 2>&1
    tail -n 8 "$OUT/mutations.log"
fi

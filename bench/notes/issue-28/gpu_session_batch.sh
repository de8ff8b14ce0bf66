#!/bin/bash
# One device call on one GPU (about 5 minutes on an H100) after zstd blocks queued behind busy decode slots came
# to share one call (dgemm.worker.decoding.BATCH): the engine alone with device-codecs on and off, 1 and 2 threads
# (the decoders' commands by kind: their summed seconds and their numbers, one huffman kernel a call, so the calls
# made), then end to end, 32768² zstd in and out, share / on / off with gemm-tasks 2 (C's encode on its own
# queue beside the next product), 3 times, and raw with gemm-tasks 1 and 2 twice: the issue's ratio, same call.
# Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_batch.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
E=bench/notes/issue-27/engine_alone.py
python3 $E "$OUT/engine-alone-zstd-32768.json" --size 32768 --chunks 4096 --codec zstd --rounds 1 --threads 1,2 \
    --device-codecs on,off
S=bench/notes/issue-28/device_codecs_onoff.py
inputs=$(mktemp -d /dev/shm/dgemm-batch-inputs-XXXX)
trap 'rm -rf "$inputs"' EXIT
python3 $S "$OUT/e2e-zstd-32768.json" --size 32768 --codec zstd --devices gpu --repeats 3 \
    --modes share,on,off --gemm-tasks 2 --inputs "$inputs/zstd"
rm -rf "$inputs/zstd"
python3 $S "$OUT/raw-32768.json" --size 32768 --codec none --out-codec none --devices gpu --repeats 2 \
    --modes off --gemm-tasks 1,2 --inputs "$inputs/raw"

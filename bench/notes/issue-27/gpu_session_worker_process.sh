#!/bin/bash
# Two GPUs of one host (nvidia-h100-x2 / nvidia-h200-x2), issue 27: `worker-process` device against host, one
# device call (about 6 minutes):
#     OUT=/some/folder bash bench/notes/issue-27/gpu_session_worker_process.sh  (the records go to "$OUT")
# 49152² float32, A and B numcodecs Zstd(3), C ZstdCodec(3): on devices 0,1 a cluster with a process per device
# and one with a process for both, twice in turn, each timed with device-codecs off and encode; then device 0
# alone (the speed-up's base).  Then raw chunks in and out, the same way.  Each record has the bytes decoded on
# the host and those shared (host_cache_bytes_*), each worker's busy time, the fill and the drain; each cluster's
# last C is checked against float64.  Inputs are written once (in /dev/shm) and reused.
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
INPUTS=$(mktemp -d /dev/shm/dgemm-wp-inputs-XXXX)
trap 'rm -rf "$INPUTS"' EXIT
RUN=bench/notes/issue-28/device_codecs_onoff.py
python3 $RUN "$OUT/wp-zstd-49152-gpus01.json" --size 49152 --codec zstd --devices 0,1 --repeats 1 \
    --modes off,encode --worker-process device,host --rounds 2 --inputs "$INPUTS/zstd"
python3 $RUN "$OUT/wp-zstd-49152-gpu0.json" --size 49152 --codec zstd --devices 0 --repeats 2 \
    --modes off,encode --inputs "$INPUTS/zstd"
rm -rf "$INPUTS/zstd"
python3 $RUN "$OUT/wp-raw-49152-gpus01.json" --size 49152 --codec none --out-codec none --devices 0,1 \
    --repeats 1 --modes off --worker-process device,host --rounds 2 --inputs "$INPUTS/raw"
python3 $RUN "$OUT/wp-raw-49152-gpu0.json" --size 49152 --codec none --out-codec none --devices 0 \
    --repeats 2 --modes off --inputs "$INPUTS/raw"

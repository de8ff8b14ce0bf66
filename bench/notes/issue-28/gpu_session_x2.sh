#!/bin/bash
# Two GPUs of one host (nvidia-h100-x2 / nvidia-h200-x2), issues 27 and 28, in one device call (about 9 minutes):
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_x2.sh  (the records go to "$OUT")
# 49152² float32, A and B numcodecs Zstd(3), C ZstdCodec(3), then raw chunks in and out: device-codecs off and on
# on devices 0,1 and on device 0 alone (the speed-ups), queue-priority on; each run with each worker's busy and
# kernel seconds (issue 27: each GPU's busy time within 10 % of the other's), the fill and the drain.  Then the
# zstd case on both GPUs with the host cache on (only the blocks both workers read go through it), and the
# host's two readers alone (no device) with the cache off, on for every block, and on for the shared ones.
# Each input pair is written once (in /dev/shm) and reused; each cluster's last C is checked against float64.
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
INPUTS=$(mktemp -d /dev/shm/dgemm-x2-inputs-XXXX)
trap 'rm -rf "$INPUTS"' EXIT
for devices in 0,1 0; do
  python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/onoff-zstd-49152-$devices.json" --size 49152 \
      --codec zstd --devices "$devices" --repeats 1 --modes off,on --inputs "$INPUTS/zstd"
done
DGEMM_HOST_CACHE=on python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/hostcache-zstd-49152-0,1.json" \
    --size 49152 --codec zstd --devices 0,1 --repeats 2 --modes off --inputs "$INPUTS/zstd"
rm -rf "$INPUTS/zstd"
for devices in 0,1 0; do
  python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/raw-49152-$devices.json" --size 49152 \
      --codec none --out-codec none --devices "$devices" --repeats 1 --modes off --inputs "$INPUTS/raw"
done
rm -rf "$INPUTS/raw"
python3 bench/notes/issue-27/hostcache_readers.py "$OUT/readers" --size 32768 --chunks 4096 --rounds 2

#!/bin/bash
# One device call on one GPU (about 6 minutes on an H100): where end to end's time over raw goes, input side
# against output side (the thirteenth session's question). 32768² float32, each in one cluster, alternating:
#   zin-rawout:  zstd inputs, raw C: device-codecs off / on / share, gemm-tasks 1 and 2 (the decode's cost alone);
#   rawin-zout:  raw inputs, zstd C: off (the store tasks encode on the host) / encode (the device), 1 and 2;
#   raw:         raw inputs, raw C, 1 and 2 (the reference).
# Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_split.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
S=bench/notes/issue-28/device_codecs_onoff.py
inputs=$(mktemp -d /dev/shm/dgemm-split-inputs-XXXX)
trap 'rm -rf "$inputs"' EXIT
python3 $S "$OUT/zin-rawout-32768.json" --size 32768 --codec zstd --out-codec none --devices gpu --repeats 2 \
    --modes off,on,share --gemm-tasks 1,2 --inputs "$inputs/zstd"
rm -rf "$inputs/zstd"
python3 $S "$OUT/rawin-zout-32768.json" --size 32768 --codec none --out-codec zstd --devices gpu --repeats 2 \
    --modes off,encode --gemm-tasks 1,2 --inputs "$inputs/raw"
python3 $S "$OUT/raw-32768.json" --size 32768 --codec none --out-codec none --devices gpu --repeats 2 \
    --modes off --gemm-tasks 1,2 --inputs "$inputs/raw"

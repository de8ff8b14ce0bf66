#!/bin/bash
# The measurements the sessions without device time left for the next one (issues 27 and 28), in one device
# call on one GPU (about 8 minutes on an H100): run from the project's root after `source .whl/gpu-env.sh`,
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session.sh     (the records go to "$OUT")
# 1. whether the driver offers cl_khr_priority_hints (queue-priority on has an effect only where it does; the
#    public clinfo reports of NVIDIA's OpenCL, CUDA 11.0 to 13.0, list none);
# 2. 32768² float32, A and B numcodecs Zstd(3), C ZstdCodec(3): device-codecs off and on, queue-priority on, off
#    and inline (a cluster each), 2 repeats: wall, fill, drain (the last blocks' encode, now on helper threads),
#    busy split;
# 3. the same with raw chunks in and out (the floor's other side);
# 4. a script's first call, phase by phase in every process (the fork server's preload, the worker's start, the
#    dashboard now off the product's path), 16384² zstd.
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
python3 - > "$OUT/extensions.txt" <<'PY'
import pyopencl as cl
for p in cl.get_platforms():
    for d in p.get_devices():
        print(d.name, "|", d.version, "|", d.driver_version, "|", " ".join(sorted(d.extensions.split())))
PY
INPUTS=$(mktemp -d /dev/shm/dgemm-inputs-XXXX)
trap 'rm -rf "$INPUTS"' EXIT
python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/onoff-zstd-32768.json" --size 32768 --codec zstd \
    --devices gpu --repeats 2 --modes off,on --priorities on,off,inline --inputs "$INPUTS/zstd"
rm -rf "$INPUTS/zstd"
python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/raw-32768.json" --size 32768 --codec none \
    --out-codec none --devices gpu --repeats 1 --modes off --priorities on,off,inline --inputs "$INPUTS/raw"
rm -rf "$INPUTS/raw"
python3 -m dgemm bench e2e --size 16384 --codec default --first-call --no-peers --store /dev/shm --out "$OUT"

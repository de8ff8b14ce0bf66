#!/bin/bash
# Two device calls on one GPU (about 3 and 5 minutes on an H100) after the engine lets the next product in before
# its result's download or device encode is enqueued, and decode_zstd enqueues every upload before its kernels
# (NVIDIA's OpenCL returns from enqueuing a copy only once what it waits for has run: enqueue_waits.py; issue 28,
# ninth session): run from the project's root after `source .whl/gpu-env.sh`,
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_handoff.sh engine|e2e
# engine: the engine alone, 32768² zstd, device-codecs off and on, and raw chunks (the GEMMs' gaps);
# e2e:    32768² float32 zstd in and out through the cluster, off and on alternating, then raw; the GPU tests.
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
case "${1:?engine or e2e}" in
engine)
    E=bench/notes/issue-27/engine_alone.py
    python3 $E "$OUT/engine-alone-zstd-32768.json" --size 32768 --chunks 4096 --codec zstd --rounds 2 --threads 1 \
        --device-codecs off,on
    python3 $E "$OUT/engine-alone-raw-32768.json" --size 32768 --chunks 4096 --codec none --rounds 2 --threads 1
    ;;
e2e)
    . bench/notes/issue-28/e2e_32768.sh
    e2e_32768 off,on 3 2
    ;;
esac

#!/bin/bash
# One device call on one GPU (about 8 minutes on an H100) after device decodes were deferred (the product takes
# its block once the decode is enqueued; the padding and the GEMM wait by events): run from the project's root
# after `source .whl/gpu-env.sh`:   OUT=/some/folder bash bench/notes/issue-28/gpu_session_deferred.sh
# 1. the engine alone, 32768² zstd: device-codecs off, on (deferred) and on-wait (each decode waited for on the
#    host, as before), and raw: the GEMMs' gaps with and without the device running something of the run;
# 2. 32768² float32 zstd in and out through the cluster, off / on / on-wait alternating, then raw;
# 3. the GPU-marked tests.
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."
E=bench/notes/issue-27/engine_alone.py
python3 $E "$OUT/engine-alone-zstd-32768.json" --size 32768 --chunks 4096 --codec zstd --rounds 2 --threads 1 \
    --device-codecs off,on,on-wait
python3 $E "$OUT/engine-alone-raw-32768.json" --size 32768 --chunks 4096 --codec none --rounds 2 --threads 1
. bench/notes/issue-28/e2e_32768.sh
e2e_32768 off,on,on-wait 2 2

#!/bin/bash
# Device calls for `device-codecs: share` (the twelfth session's: a reader that finds every decode slot of its
# device busy decodes its block on the host instead of waiting), timed against off and on in the same cluster,
# alternating, with the workers' split of decoded bytes (device_decoded_bytes, host_decoded_bytes) per run.
# Run from the project's root after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_share.sh one|x2
# one: one GPU (about 5 minutes on an H100): 32768² float32, zstd in and out, off / on / share 3 times, each
#      with gemm-tasks 1 and 2 (C's device encode beside the next product's GEMMs), share with 2, 8 and 16
#      decode slots (4 by default), then raw
#      twice (the issue's end-to-end target: within 15 % of raw);
# x2:  two GPUs of one host (about 7 minutes): 49152², share / on / off (MODES, comma separated) on both GPUs,
#      then on one (the issue's 2-GPU target: >= 1.8x one).
# Prediction: share at or below the faster of off and on (the host's readers and the device's decoders add up:
# 16 cores decode 11.7 GB/s, four slots beside the GEMMs a few GB/s), C encoded on the device as under on.
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
S=bench/notes/issue-28/device_codecs_onoff.py
inputs=$(mktemp -d /dev/shm/dgemm-share-inputs-XXXX)
trap 'rm -rf "$inputs"' EXIT
case "${1:?one or x2}" in
one)
    python3 $S "$OUT/share-zstd-32768.json" --size 32768 --codec zstd --devices gpu --repeats 3 \
        --modes off,on,share --gemm-tasks 1,2 --slots 2,8,16 --slots-mode share --inputs "$inputs/zstd"
    rm -rf "$inputs/zstd"
    python3 $S "$OUT/raw-32768.json" --size 32768 --codec none --out-codec none --devices gpu --repeats 2 \
        --modes off --inputs "$inputs/raw"
    ;;
x2)
    for devices in 0,1 0; do
        python3 $S "$OUT/share-zstd-49152-devices${devices/,/}.json" --size 49152 --codec zstd \
            --devices "$devices" --repeats 2 --modes "${MODES:-share,on,off}" --inputs "$inputs/zstd"
    done
    ;;
esac

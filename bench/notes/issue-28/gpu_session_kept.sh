#!/bin/bash
# Two device calls on one GPU (about 5 minutes each on an H100) for the eleventh session's work (issue 28): run
# from the project's root after `source .whl/gpu-env.sh`,
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_kept.sh codecs|e2e
# codecs: the codec tests on the GPU itself (DGEMM_TEST_ANY_DEVICE=gpu: Blosc-LZ4 with every lz4.cl variant and
#         the tuned one, the random LZ4 streams and zstd's corrupt frames DGEMM_FUZZ_ROUNDS long, zstd decode and
#         encode), recorded as junit counts: lanes that really run at once, which the CI's PoCL runs in turn;
#         then Blosc-LZ4's tuned kernel with each unshuffle (LZ4_UNSHUFFLE 0, the default; 1; 2, four elements
#         a work-item), each checked against numcodecs first;
# e2e:    32768² float32, zstd in and out, device-codecs off and on alternating 3 times, each with gemm-tasks 1
#         and 2 (a second product's GEMMs beside the first's encode), then raw twice each way, with the encoder's
#         buffers now kept from one C block to the next (Device.encode_scratch); the GPU-marked tests.
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
case "${1:?codecs or e2e}" in
codecs)
    DGEMM_TEST_ANY_DEVICE=gpu DGEMM_FUZZ_ROUNDS=${FUZZ_ROUNDS:-300} timeout 300 python3 -m pytest -q \
        -p no:cacheprovider --junitxml "$OUT/codecs-on-gpu.xml" tests/test_blosc_device.py \
        tests/test_zstd_decode_device.py tests/test_zstd_encode_device.py > "$OUT/codecs-on-gpu.log" 2>&1
    tail -3 "$OUT/codecs-on-gpu.log"
    python3 bench/notes/issue-28/blosc_decode.py "$OUT/blosc-unshuffle.json" --no-host --repeats 3 \
        --cases normal-shuffle-5,walk-shuffle-5,normal-shuffle-1 --variants table:64:parse=2,group=32 \
        table:64:parse=2,group=32,unshuffle=1 table:64:parse=2,group=32,unshuffle=2
    ;;
e2e)
    inputs=$(mktemp -d /dev/shm/dgemm-inputs-XXXX)
    python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/onoff-zstd-32768.json" --size 32768 --codec zstd \
        --devices gpu --repeats 3 --modes off,on --gemm-tasks 1,2 --inputs "$inputs/zstd"
    rm -rf "$inputs/zstd"
    python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/raw-32768.json" --size 32768 --codec none \
        --out-codec none --devices gpu --repeats 2 --modes off --gemm-tasks 1,2 --inputs "$inputs/raw"
    rm -rf "$inputs"
    python3 dev/gpu_tests.py --out "$OUT"
    ;;
esac

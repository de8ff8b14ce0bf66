#!/bin/bash
# The end-to-end part of this session's device calls, sourced by them (OUT set):
#     e2e_32768 MODES REPEATS RAW_REPEATS
# 32768² float32 on one GPU: A and B numcodecs Zstd(3), C ZstdCodec(3), the device-codecs MODES alternating
# REPEATS times (device_codecs_onoff.py), then raw chunks in and out RAW_REPEATS times; then the GPU-marked tests.
cd "$(dirname "$0")/../../.."     # the project's root (sourced by a script beside this one)

e2e_32768() {
  local modes=$1 repeats=$2 raw_repeats=$3 inputs
  inputs=$(mktemp -d /dev/shm/dgemm-inputs-XXXX)
  python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/onoff-zstd-32768.json" --size 32768 --codec zstd \
      --devices gpu --repeats "$repeats" --modes "$modes" --inputs "$inputs/zstd"
  rm -rf "$inputs/zstd"
  python3 bench/notes/issue-28/device_codecs_onoff.py "$OUT/raw-32768.json" --size 32768 --codec none \
      --out-codec none --devices gpu --repeats "$raw_repeats" --modes off --inputs "$inputs/raw"
  rm -rf "$inputs"
  python3 dev/gpu_tests.py --out "$OUT"
}

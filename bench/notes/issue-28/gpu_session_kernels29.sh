#!/bin/bash
# Prepared in the twenty-ninth session (one device call on one GPU, about 3 minutes): the kernels made by name
# (ef941d8; GPU workers had logged pyopencl's RepeatedKernelRetrieval for the padding kernels the wgmma kernels share)
# checked on the GPU: the device and PTX-cache tests there with that warning an error, then 32768² zstd `on` and raw
# end to end, two runs each, counting the warnings in the workers' output.  Run from the project's root with carry
# [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_kernels29.sh
. "$(dirname "$0")/session_common.sh" kernels29
DGEMM_TEST_ANY_DEVICE=gpu timeout 150 python3 -m pytest -q -p no:cacheprovider -W error::pyopencl.RepeatedKernelRetrieval \
    tests/test_device.py tests/test_ptx_cache.py 2>&1 | tail -4
FIELDS="mode wall_s per_worker.busy_seconds per_worker.kernel_seconds"
timeout 150 python3 $S "$OUT/e2e-on-32768.json" --size 32768 --chunk 4096 --devices gpu --codec zstd --repeats 2 \
    --modes on --inputs "$inputs/zstd" > "$OUT/e2e-on.log" 2>&1
summary "zstd on" $FIELDS < "$OUT/e2e-on.log"
timeout 120 python3 $S "$OUT/e2e-raw-32768.json" --size 32768 --chunk 4096 --devices gpu --codec none \
    --out-codec none --repeats 2 --modes off --inputs "$inputs/raw" > "$OUT/e2e-raw.log" 2>&1
summary "raw" $FIELDS < "$OUT/e2e-raw.log"
echo "RepeatedKernelRetrieval warnings: $(cat "$OUT"/e2e-*.log | grep -c RepeatedKernelRetrieval)"
ls -la "$OUT"

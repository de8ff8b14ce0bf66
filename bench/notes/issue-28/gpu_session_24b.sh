#!/bin/bash
# The twenty-fourth session's third call (one H100, 80 GB, 16 cores; about 6 minutes): 49152² zstd in and out under
# on and share after the decode slots' calls kept to a quarter of the device's memory share (68f0ce1), two runs
# each, and raw chunks in and out twice (gemm-tasks 1): gpu_session_24.sh's second step.  The second call's `on`
# decoded the inputs 2.25 times over (43.5 GB) and took 5.8-5.9 s against share's 4.2.  Run from the project's
# root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_24b.sh
: "${OUT:?set OUT to the folder for the records}"
OUT="$OUT" NAME=s24b ONLY=e2e MODES=on,share RAW_REPEATS=2 exec bash "$(dirname "$0")/gpu_session_24.sh"

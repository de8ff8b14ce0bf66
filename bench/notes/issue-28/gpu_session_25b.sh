#!/bin/bash
# The twenty-fifth session's second call (one GPU, about 8 minutes): main before it (v0) against blocks whose chunks
# are copied into place sharing decode calls too (v1, HEAD), `on` at 32768² zstd in and out, ABBA, raw beside; then
# the timeline of HEAD's `on` (two runs) with the calls' inner steps timed (devplan, call_tables, execute_launch,
# slot_last) and the blocks each shared call took (now gpu_session_26.sh's, which times more).  Prepare here:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=<main before> v1=HEAD
# then run from the project's root with carry [".whl", ".ab"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_25b.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
here=$(dirname "$0")
OUT=$OUT MODES=on ROUNDS=2 REPEATS=2 RAW_TASKS=1 bash "$here/gpu_session_ab.sh" session
OUT="$OUT" bash "$here/gpu_session_26.sh"     # (the timeline step, with the timers added since)

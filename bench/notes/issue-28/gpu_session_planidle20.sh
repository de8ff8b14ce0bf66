#!/bin/bash
# Prepared for the twentieth session (one device call on one GPU, about 8 minutes): is the frame plan (Python's lock)
# what makes more device decodes at once slower?  Plans kept (no plan made in a timed run) with and without the idle
# decode slots.  Here, first:
#     bash bench/notes/issue-28/gpu_session_ab.sh prepare v0=a4a7c56 v1=057bada,DGEMM_X_PLAN_CACHE=1 \
#         v2=057bada,DGEMM_X_PLAN_CACHE=1,DGEMM_X_IDLE_SLOTS=0 v3=057bada,DGEMM_X_PLAN_CACHE=1,DGEMM_X_IDLE_SLOTS=8
# (057bada is the local branch x-idle-plan: the idle slots from the environment, 4 by default, and each chunk's plan
# kept by its name; an experiment never merged).  Then on the device, with carry [".whl", ".ab"], after
# `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_planidle20.sh
# Four versions under share, three rounds of a cluster each, alternating (32768² zstd in and out), then raw chunks in
# and out on the same machine.  Records: ab.tar (the twelve A/B records), raw-32768.json.
set -u
: "${OUT:?set OUT to the folder for the records}"
cd "$(dirname "$0")/../../.."     # the project's root, wherever this is run from
[ -f .ab/versions ] || { echo "prepare .ab first (see the header)"; exit 2; }
OUT="$OUT" bash bench/notes/issue-28/gpu_session_ab.sh session

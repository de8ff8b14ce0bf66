#!/bin/bash
# The thirty-second session's fourth device call (two GPUs of one host, about 2 minutes): chunk files to the device
# through page-locked staging filled by `preadv` (dgemm's readers) against the file's mmap copied into it
# (upload_paths_probe.py `mapped`, `mapped-lazy`): whether the readers' copy out of the page cache, 4.7 GB/s a thread
# against numpy's 11 GB/s memory copy on this host, lifts the host's file-to-device ceiling two GPUs' reads meet.
# Run from the project's root with carry [".whl"], kind nvidia-h200-x2, after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_32d.sh
. "$(dirname "$0")/session_common.sh" call32d
PATHS=${PATHS:-staged,mapped,mapped-lazy}
for round in 1 2; do
    timeout 150 python3 bench/notes/issue-28/upload_paths_probe.py "$OUT/upload-mapped-devices01-r$round.json" \
        --devices ${PROBE_DEVICES:-0,1} --threads ${THREADS:-1,12,24} --paths "$PATHS" --mib ${MIB:-128} --seconds 1.5
done
timeout 60 python3 bench/notes/issue-28/upload_paths_probe.py "$OUT/upload-mapped-devices0.json" \
    --devices 0 --threads 12 --paths "$PATHS" --mib ${MIB:-128} --seconds 1.5
ls -la "$OUT"

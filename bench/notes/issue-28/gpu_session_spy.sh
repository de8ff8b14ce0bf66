#!/bin/bash
# One device call on one GPU (about 3 minutes on an H200): where the worker process's threads spend a product while
# the inputs are read, sampled by py-spy (its wheel listed in bench/gpu-extras.txt).  The fifteenth session's
# timeline showed an encode's host steps taking 50-150 ms each against 1-2 ms alone, every device command
# waiting under 1 ms on the device: the question is which threads hold Python's lock meanwhile.  32768² zstd in
# and out under share, gemm-tasks 1 (timeline.py), three times on the same inputs: the first writes them; the
# second under `py-spy record --gil` (the threads holding the lock), the third under plain `py-spy record`
# (the threads on a CPU); both sample every process (--subprocesses), with thread ids, without stopping them.
# Run from the project's root with carry [".whl"], after `source .whl/gpu-env.sh`:
#     OUT=/some/folder bash bench/notes/issue-28/gpu_session_spy.sh
set -u
: "${OUT:?set OUT to the folder for the records}"
mkdir -p "$OUT"
cd "$(dirname "$0")"     # timeline.py imports the scripts beside it
spy=$(python3 -c 'import sysconfig, os; print(os.path.join(os.path.dirname(os.path.dirname(__import__("pyopencl").__file__)), "bin", "py-spy"))')
inputs=$(mktemp -d /dev/shm/dgemm-spy-inputs-XXXX)
trap 'rm -rf "$inputs"' EXIT
run() {
    python3 timeline.py "$OUT/timeline-$1.json" --size 32768 --codec zstd --modes share --gemm-tasks 1 \
        --inputs "$inputs/zstd" 2>&1 | grep '^{"mode"' | cut -c1-400
}
run plain
cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null
"$spy" record --gil --nonblocking --threads --subprocesses -r 200 -f raw -o "$OUT/spy-gil.txt" -- \
    bash -c "$(declare -f run); inputs=$inputs OUT=$OUT run gil" 2>&1 | tail -5
"$spy" record --nonblocking --threads --subprocesses -r 200 -f raw -o "$OUT/spy-cpu.txt" -- \
    bash -c "$(declare -f run); inputs=$inputs OUT=$OUT run cpu" 2>&1 | tail -5

#!/bin/bash
# NOTES.md, "Issue 16, third session (stop 16)": kernel variants beside cuBLAS (bench/variants.py), then the
# finished PTX of the float32 default through CUDA (bench/ptx_in_cuda.py, a cross-check of the timing) and
# ncu over one launch of each, at two sizes.  On the GPU machine, from the project root:
#   source .whl/gpu-env.sh && bash bench/notes/issue-16-third-session/variants_and_ncu.sh COMMIT [variant files]
# Records and profiles go to $OUT; SIZES (default 8192,16384) are the variants' sizes.
set -u
: "${OUT:?set OUT to the folder for the records}"
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
export DGEMM_COMMIT=$1
shift
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
echo "=== variants: $*"
timeout 420 python3 bench/variants.py "$@" --sizes "${SIZES:-8192,16384}" --out "$OUT" 2>&1 | grep -E "^(8192|16384|10000|10240|BEST|Traceback)|Error" | cut -c1-220
echo "=== the finished PTX through CUDA (a cross-check of the timing), then ncu over one launch of each"
X='{"MMA": 8, "TSM": 128, "TSN": 128, "TSK": 32, "WARPSM": 2, "WARPSN": 1, "STAGES": 3, "GROUPM": 8, "PROMOTE": 4}'
T='{"MMA": 7, "TSM": 128, "TSN": 256, "TSK": 32, "WARPSM": 2, "WARPSN": 1, "STAGES": 4, "GROUPM": 8}'
for spec in "x 8192" "x 16384" "t 16384"; do
  set -- $spec
  P=$X; [ "$1" = t ] && P=$T
  timeout 100 python3 bench/ptx_in_cuda.py --params "$P" --options=-DFENCES=0 --size "$2" 2>&1 | grep -v Warn | tail -2 | cut -c1-600
  timeout 150 ncu --clock-control none -k regex:gemm --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section WarpStateStats --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
    --metrics sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,gpu__time_duration.sum \
    -o "$OUT/ncu-$1-$2" python3 bench/ptx_in_cuda.py --params "$P" --options=-DFENCES=0 --size "$2" --reps 1 > "$OUT/ncu-$1-$2.log" 2>&1
  echo "ncu $1 $2 rc=$?"; grep -E "==PROF==|==ERROR==|==WARNING==" "$OUT/ncu-$1-$2.log" | head -3
  [ -f "$OUT/ncu-$1-$2.ncu-rep" ] && ncu --import "$OUT/ncu-$1-$2.ncu-rep" --page details > "$OUT/ncu-$1-$2.txt" 2>&1 && \
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|Stall|Registers|Shared Memory" "$OUT/ncu-$1-$2.txt" | head -14
done
ls "$OUT"

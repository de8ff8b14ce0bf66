#!/bin/bash
# On the GPU machine (device tool), from the project root: issue 16's kernel variants beside cuBLAS, and the
# profiler over one launch of the float32 default at two sizes.  Usage: bash bench/gpu_issue16b.sh COMMIT [variant files]
set -u
export PYTHONPATH=/tmp/site:$PWD DGEMM_COMMIT=$1
shift
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
echo "=== variants: $*"
timeout 420 python3 bench/variants.py "$@" --sizes 8192,16384 --out "$OUT" 2>&1 | grep -E "^(8192|16384|BEST|Traceback)|Error" | cut -c1-220
echo "=== ncu: one launch of 3xTF32 (PROMOTE 4) and TF32 (TSN 256), FENCES 2, at 8192 and 16384"
X='{"MMA": 8, "TSM": 128, "TSN": 128, "TSK": 32, "WARPSM": 2, "WARPSN": 1, "STAGES": 3, "GROUPM": 8, "PROMOTE": 4}'
T='{"MMA": 7, "TSM": 128, "TSN": 256, "TSK": 32, "WARPSM": 2, "WARPSN": 1, "STAGES": 4, "GROUPM": 8}'
for spec in "x 8192" "x 16384" "t 8192" "t 16384"; do
  set -- $spec
  P=$X; [ "$1" = t ] && P=$T
  timeout 120 ncu --clock-control none -k regex:gemm_wgmma --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --metrics sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,gpu__time_duration.sum \
    -o "$OUT/ncu-$1-$2" python3 bench/one_launch.py --params "$P" --options=-DFENCES=2 --size $2 > "$OUT/ncu-$1-$2.log" 2>&1
  echo "ncu $1 $2 rc=$?"; tail -3 "$OUT/ncu-$1-$2.log" | cut -c1-300
  [ -f "$OUT/ncu-$1-$2.ncu-rep" ] && ncu --import "$OUT/ncu-$1-$2.ncu-rep" --page details > "$OUT/ncu-$1-$2.txt" 2>&1
done
ls "$OUT"

#!/bin/bash
# NOTES.md, "Issue 16, third session (stop 16)", the row "ncu on the DMMA kernel and on cuBLAS DGEMM": the
# float64 DMMA kernel (the shipped default) and cuBLAS DGEMM under ncu's full set, both through CUDA
# (bench/ptx_in_cuda.py).  On the GPU machine, from the project root:
#   source .whl/gpu-env.sh && bash bench/notes/issue-16-third-session/ncu_dmma_vs_cublas.sh COMMIT
# Profiles and their text go to $OUT.
set -u
: "${OUT:?set OUT to the folder for the records}"
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
export DGEMM_COMMIT=$1
D='{"TSM": 128, "TSN": 64, "TSK": 8, "WIDTH": 2, "PADA": 4, "PADB": 4, "MMA": 3, "WARPSM": 4, "WARPSN": 2}'
timeout 90 python3 bench/ptx_in_cuda.py --params "$D" --dtype float64 --size 8192 2>&1 | grep -E "^\{|Error" | cut -c1-500
timeout 90 python3 bench/ptx_in_cuda.py --params "$D" --dtype float64 --size 8192 --cublas 2>&1 | grep -E "^\{|Error"
for who in dmma cublas; do
  extra=""; [ $who = cublas ] && extra="--cublas"
  timeout 200 ncu --clock-control none -k "regex:gemm|xmma|cutlass|Kernel" --launch-skip 1 --launch-count 1 --set full \
    -o "$OUT/ncu-$who" python3 bench/ptx_in_cuda.py --params "$D" --dtype float64 --size 8192 --reps 2 $extra \
    > "$OUT/ncu-$who.log" 2>&1
  echo "ncu $who rc=$?"; grep -E "==ERROR==|No kernels" "$OUT/ncu-$who.log" | head -3
  [ -f "$OUT/ncu-$who.ncu-rep" ] && ncu --import "$OUT/ncu-$who.ncu-rep" --page details > "$OUT/ncu-$who.txt" 2>&1 && \
    grep -E "^  [a-zA-Z_].*\(|SM Frequency|Duration|Compute \(SM\) Throughput|L2 Hit|Registers Per|Achieved Occupancy|Issue Slots Busy|Stall|Warp Cycles Per Issued|Shared Memory Configuration|Bank" "$OUT/ncu-$who.txt" | head -24
  rm -f "$OUT/ncu-$who.ncu-rep"
done
ls "$OUT"

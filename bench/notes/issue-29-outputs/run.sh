# NOT RUN YET (the session had no device time left): to be run with carry [".whl"] after
#   mkdir .h29base && git archive e6dfdb0 dgemm | tar -x -C .h29base
# Issue 29 on the GPU machine, from the repository root there: the tree before (.h29base: e6dfdb0's dgemm)
# against this one, same inputs in /dev/shm (6144² float32, 512² chunks for the slice; 16384² float32,
# 1024² chunks for out=), raw chunks.
set -u
. .whl/gpu-env.sh >/dev/null
R=$PWD; S=$R/bench/notes/issue-29-outputs/slice_and_chunks.py
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
export DGEMM_PROGRAM_CACHE=/tmp/dgemm-programs
cd /tmp
python3 -c "
from dgemm.benchmarks.inputs import random_zarr
for n, s in (('a', 1), ('b', 2)):
    random_zarr('/dev/shm/s/' + n + '.zarr', (6144, 6144), (512, 512), 'float32', seed=s)
    random_zarr('/dev/shm/o/' + n + '.zarr', (16384, 16384), (1024, 1024), 'float32', seed=s)
" 2>&1 | tail -2
for i in 1 2; do for t in base new; do
  if [ $t = base ]; then P=$R/.h29base:$PYTHONPATH; else P=$PYTHONPATH; fi
  PYTHONPATH=$P timeout 120 python3 $S slice /dev/shm/s 2>&1 | grep -E "RESULT|Error" | tail -2
done; done
for t in base new; do
  if [ $t = base ]; then P=$R/.h29base:$PYTHONPATH; else P=$PYTHONPATH; fi
  PYTHONPATH=$P timeout 200 python3 $S out /dev/shm/o 2>&1 | grep -E "RESULT|Error" | tail -2
done

# Issue 27's first call on the GPU machine: the tree without this work (.base: no PTX cache, no early fork
# server) against the tree with it (.new), same inputs, same machine.  From the repository root there, after
# gpu-env.sh; every Python runs from /tmp so that dgemm comes from .base or .new (PYTHONPATH), never the
# working tree.
set -u
R=$PWD; O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/device.txt; nproc | tee -a $O/device.txt
N="env PYTHONPATH=$R/.new:$PYTHONPATH"; B="env PYTHONPATH=$R/.base:$PYTHONPATH"
export DGEMM_PROGRAM_CACHE=/tmp/dgemm-programs
cd /tmp
echo "== ptx route"; DGEMM_PROGRAM_CACHE=/tmp/ptx-probe timeout 90 $N python3 $R/bench/notes/issue-27-first-call/ptx_timing.py $O/ptx.json 2>&1 | tail -3
echo "== gpu test"; timeout 90 $N python3 -m pytest -q -m gpu -p no:cacheprovider $R/tests/test_ptx_cache.py 2>&1 | tail -3
echo "== e2e new"; timeout 170 $N python3 -m dgemm bench e2e --size 32768 --codec default --first-call --no-peers --store /dev/shm --keep --out $O 2>&1 | tail -30
D=$(ls -d /dev/shm/dgemm-e2e-* | head -1); A=$(ls -d $D/a*.zarr | sort | head -1); Bz=$(ls -d $D/b*.zarr | sort | head -1)
echo "inputs $A $Bz"
for i in 1 2; do for t in base new; do
  if [ $t = base ]; then P=$B; else P=$N; fi
  echo "== firstcall $t $i"
  timeout 45 $P python3 $R/bench/firstcall.py $A $Bz /dev/shm/fc-c.zarr 2>/dev/null | grep FIRSTCALL | tee -a $O/firstcall-$t.jsonl | cut -c1-700
done; done
ls -la /tmp/dgemm-programs

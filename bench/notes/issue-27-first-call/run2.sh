# Issue 27: the e2e benchmark's first call beside its warm run, the tree with this work (.new), one GPU; then
# one more old/new pair of bench/firstcall.py on the same inputs.
set -u
R=$PWD; O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/device.txt; nproc | tee -a $O/device.txt
N="env PYTHONPATH=$R/.new:$PYTHONPATH"; B="env PYTHONPATH=$R/.base:$PYTHONPATH"
export DGEMM_PROGRAM_CACHE=/tmp/dgemm-programs
cd /tmp
date +%T; timeout 265 $N python3 -m dgemm bench e2e --size 32768 --codec default --first-call --no-peers --keep --store /dev/shm --out $O 2>&1 | grep -v "Warning\|self\.\|lambda" | tail -12; date +%T
D=$(ls -d /dev/shm/dgemm-e2e-* | head -1); A=$(ls -d $D/a*.zarr | sort | head -1); Bz=$(ls -d $D/b*.zarr | sort | head -1)
for t in base new; do
  if [ $t = base ]; then P=$B; else P=$N; fi
  echo "== firstcall $t"
  timeout 30 $P python3 $R/bench/firstcall.py $A $Bz /dev/shm/fc-c.zarr 2>/dev/null | grep FIRSTCALL | tee -a $O/firstcall-$t.jsonl | cut -c1-300
done

# Issue 27: the e2e benchmark's first call beside its warm run, the tree with this work (.new), one GPU.
set -u
R=$PWD; O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/device.txt; nproc | tee -a $O/device.txt
export DGEMM_PROGRAM_CACHE=/tmp/dgemm-programs
cd /tmp
date +%T; timeout 320 env PYTHONPATH=$R/.new:$PYTHONPATH python3 -m dgemm bench e2e --size 32768 --codec default --first-call --no-peers --store /dev/shm --out $O 2>&1 | grep -v "Warning\|self\.\|lambda" | tail -30; date +%T

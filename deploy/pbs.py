"""dgemm on a PBS Pro / OpenPBS cluster through dask-jobqueue: one job per GPU node, one dgemm worker per GPU.

As deploy/slurm.py, with PBS's resource request: ``-l select=1:ncpus=C:ngpus=G:mem=M``.  Each job
runs ``dgemm worker``, which starts one Dask worker per GPU of the job (pinned, ``GPU=1``, with the
dgemm plugin); ``processes`` is the GPUs per job so that jobqueue expects those workers::

    python deploy/pbs.py a.zarr b.zarr c.zarr --jobs 2 --gpus-per-node 4 --queue gpu \\
        --account myproject --cores 32 --memory 256GB --walltime 02:00:00

``--dry-run`` prints the job script instead of submitting anything.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # run as a script or loaded by path
from _jobqueue import run  # noqa: E402


def options(gpus_per_node: int = 4, cores: int = 32, memory: str = "256GB", queue: str | None = None,
            account: str | None = None, walltime: str = "02:00:00", prologue: tuple = ()) -> dict:
    """Keyword arguments of :class:`dask_jobqueue.PBSCluster` (and ``PBSJob``) for dgemm."""
    mem = memory.upper().replace("GIB", "GB").replace("GB", "gb")
    return dict(
        cores=cores, memory=memory,
        processes=gpus_per_node,                 # one dgemm worker per GPU, named <job>-<i>
        queue=queue, account=account, walltime=walltime,
        resource_spec=f"select=1:ncpus={cores}:ngpus={gpus_per_node}:mem={mem}",
        worker_command="dgemm worker",           # python -m dgemm worker SCHEDULER --name ... --nthreads ...
        worker_extra_args=["--devices", "gpu"],  # the GPUs PBS gave the job
        job_script_prologue=list(prologue),
        job_name="dgemm",
    )


def main(argv=None) -> None:
    run(__doc__, options, "dask_jobqueue.PBSCluster", "dask_jobqueue.pbs.PBSJob", "queue", argv)


if __name__ == "__main__":
    main()

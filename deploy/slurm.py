"""dgemm on a SLURM cluster through dask-jobqueue: one job per GPU node, one dgemm worker per GPU.

Each job runs ``dgemm worker`` (``python -m dgemm worker SCHEDULER --name ... --nthreads ...
--memory-limit ...``), which starts one Dask worker per GPU SLURM gave the job, each pinned to its
GPU, advertising ``GPU=1`` and carrying the dgemm worker plugin.  ``processes`` is the number of GPUs
per job, so that jobqueue expects exactly the workers ``dgemm worker`` starts (named ``<job>-0``,
``<job>-1``, ...) and splits the job's cores and memory among them.

Run it on the login node, with dgemm and dask-jobqueue installed in an environment the compute
nodes see too (a shared file system)::

    python deploy/slurm.py a.zarr b.zarr c.zarr --jobs 2 --gpus-per-node 4 --partition gpu \\
        --account myproject --cores 32 --memory 256GB --walltime 02:00:00

``--dry-run`` prints the job script instead of submitting anything.  The scheduler runs in this
process; its dashboard (with the dgemm page at /dgemm) is printed at the start.  For TLS, pass
``--security`` with the certificates of deploy/tls/ (see deploy/README.md).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # run as a script or loaded by path
from _jobqueue import run  # noqa: E402


def options(gpus_per_node: int = 4, cores: int = 32, memory: str = "256GB", partition: str | None = None,
            account: str | None = None, walltime: str = "02:00:00", prologue: tuple = (),
            extra_directives: tuple = ()) -> dict:
    """Keyword arguments of :class:`dask_jobqueue.SLURMCluster` (and ``SLURMJob``) for dgemm."""
    return dict(
        cores=cores, memory=memory,
        processes=gpus_per_node,                 # one dgemm worker per GPU, named <job>-<i>
        queue=partition, account=account, walltime=walltime,
        job_extra_directives=[f"--gres=gpu:{gpus_per_node}", *extra_directives],
        worker_command="dgemm worker",           # python -m dgemm worker SCHEDULER --name ... --nthreads ...
        worker_extra_args=["--devices", "gpu"],  # the GPUs SLURM gave the job (CUDA_VISIBLE_DEVICES)
        job_script_prologue=list(prologue),
        job_name="dgemm",
    )


def main(argv=None) -> None:
    run(__doc__, options, "dask_jobqueue.SLURMCluster", "dask_jobqueue.slurm.SLURMJob", "partition", argv)


if __name__ == "__main__":
    main()

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

import argparse


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a"), ap.add_argument("b"), ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=1, help="GPU nodes")
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--cores", type=int, default=32, help="cores per job")
    ap.add_argument("--memory", default="256GB", help="memory per job")
    ap.add_argument("--partition"), ap.add_argument("--account")
    ap.add_argument("--walltime", default="02:00:00")
    ap.add_argument("--prologue", action="append", default=[],
                    help="a line run before the worker, e.g. 'source ~/venvs/dgemm/bin/activate' (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="print the job script and stop")
    args = ap.parse_args(argv)
    kw = options(args.gpus_per_node, args.cores, args.memory, args.partition, args.account, args.walltime,
                 tuple(args.prologue))
    if args.dry_run:
        from dask_jobqueue.slurm import SLURMJob
        print(SLURMJob(scheduler="tcp://SCHEDULER:8786", name="dgemm-0", **kw).job_script())
        return

    import dgemm
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    with SLURMCluster(**kw, scheduler_options={"preload": ["dgemm.dashboard"]}) as cluster, \
            Client(cluster) as client:
        print("dashboard:", cluster.dashboard_link, " dgemm page:", cluster.dashboard_link.rsplit("/", 1)[0] + "/dgemm")
        cluster.scale(jobs=args.jobs)
        client.wait_for_workers(args.jobs * args.gpus_per_node, timeout=3600)
        c = dgemm.matmul(args.a, args.b, out=args.out, client=client, progress=True)
        print(f"\n{args.out}: {c.shape} {c.dtype}")


if __name__ == "__main__":
    main()

"""dgemm on a PBS Pro / OpenPBS cluster through dask-jobqueue: one job per GPU node, one dgemm worker per GPU.

As deploy/slurm.py, with PBS's resource request: ``-l select=1:ncpus=C:ngpus=G:mem=M``.  Each job
runs ``dgemm worker``, which starts one Dask worker per GPU of the job (pinned, ``GPU=1``, with the
dgemm plugin); ``processes`` is the GPUs per job so that jobqueue expects those workers::

    python deploy/pbs.py a.zarr b.zarr c.zarr --jobs 2 --gpus-per-node 4 --queue gpu \\
        --account myproject --cores 32 --memory 256GB --walltime 02:00:00

``--dry-run`` prints the job script instead of submitting anything.
"""
from __future__ import annotations

import argparse


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a"), ap.add_argument("b"), ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=1, help="GPU nodes")
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--cores", type=int, default=32, help="cores per job")
    ap.add_argument("--memory", default="256GB", help="memory per job")
    ap.add_argument("--queue"), ap.add_argument("--account")
    ap.add_argument("--walltime", default="02:00:00")
    ap.add_argument("--prologue", action="append", default=[],
                    help="a line run before the worker, e.g. 'source ~/venvs/dgemm/bin/activate' (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="print the job script and stop")
    args = ap.parse_args(argv)
    kw = options(args.gpus_per_node, args.cores, args.memory, args.queue, args.account, args.walltime,
                 tuple(args.prologue))
    if args.dry_run:
        from dask_jobqueue.pbs import PBSJob
        print(PBSJob(scheduler="tcp://SCHEDULER:8786", name="dgemm-0", **kw).job_script())
        return

    import dgemm
    from dask_jobqueue import PBSCluster
    from distributed import Client

    with PBSCluster(**kw, scheduler_options={"preload": ["dgemm.dashboard"]}) as cluster, \
            Client(cluster) as client:
        print("dashboard:", cluster.dashboard_link, " dgemm page:", cluster.dashboard_link.rsplit("/", 1)[0] + "/dgemm")
        cluster.scale(jobs=args.jobs)
        client.wait_for_workers(args.jobs * args.gpus_per_node, timeout=3600)
        c = dgemm.matmul(args.a, args.b, out=args.out, client=client, progress=True)
        print(f"\n{args.out}: {c.shape} {c.dtype}")


if __name__ == "__main__":
    main()

"""The command line shared by deploy/slurm.py and deploy/pbs.py: parse, build the jobqueue cluster, multiply."""
from __future__ import annotations

import argparse
import importlib


def run(doc: str, options, cluster: str, job: str, queue_flag: str, argv=None) -> None:
    """``cluster``/``job``: dotted names of the jobqueue classes; ``queue_flag``: the batch system's word for a queue."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("a"), ap.add_argument("b"), ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=1, help="GPU nodes")
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--cores", type=int, default=32, help="cores per job")
    ap.add_argument("--memory", default="256GB", help="memory per job")
    ap.add_argument(f"--{queue_flag}", dest="queue"), ap.add_argument("--account")
    ap.add_argument("--walltime", default="02:00:00")
    ap.add_argument("--prologue", action="append", default=[],
                    help="a line run before the worker, e.g. 'source ~/venvs/dgemm/bin/activate' (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="print the job script and stop")
    args = ap.parse_args(argv)
    kw = options(args.gpus_per_node, args.cores, args.memory, args.queue, args.account, args.walltime,
                 tuple(args.prologue))
    if args.dry_run:
        print(_load(job)(scheduler="tcp://SCHEDULER:8786", name="dgemm-0", **kw).job_script())
        return

    import dgemm
    from distributed import Client

    with _load(cluster)(**kw, scheduler_options={"preload": ["dgemm.scheduler"]}) as c, Client(c) as client:
        print("dashboard:", c.dashboard_link, " dgemm page:", c.dashboard_link.rsplit("/", 1)[0] + "/dgemm")
        c.scale(jobs=args.jobs)
        client.wait_for_workers(args.jobs * args.gpus_per_node, timeout=3600)
        out = dgemm.matmul(args.a, args.b, out=args.out, client=client, progress=True)
        print(f"\n{args.out}: {out.shape} {out.dtype}")


def _load(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)

"""``dgemm jobqueue slurm|pbs``: dgemm workers as batch jobs (dask-jobqueue), from the command line.

The recipes of :mod:`dgemm.deploy`: each job runs ``dgemm worker`` (one
worker per GPU of the job); the scheduler runs in this process.  ``--dry-run``
prints a job's script; with A B OUT the command submits the jobs, waits for
their workers, multiplies and cancels the jobs; without, it keeps the cluster
until Ctrl-C (SIGINT) or SIGTERM, for ``dgemm matmul --scheduler ADDRESS``.
"""
from __future__ import annotations

import signal
import threading

import click

from dgemm.cli.common import InputError, cli, user_errors
from dgemm.errors import SubmissionError


@cli.group(name="jobqueue")
def jobqueue_group():
    """dgemm workers as SLURM or PBS jobs (dask-jobqueue): one job per GPU node, one worker per GPU."""


def _recipe_command(name: str, queue_flag: str, queue_help: str, directive: str):
    """The ``dgemm jobqueue NAME`` command of the recipe :mod:`dgemm.deploy.NAME`."""

    def decorate(f):
        for opt in reversed([
            click.argument("a", required=False),
            click.argument("b", required=False),
            click.argument("out", required=False),
            click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
                         help="Jobs (GPU nodes) to submit."),
            click.option("--gpus-per-node", type=click.IntRange(min=1), default=4, show_default=True,
                         help="GPUs per job, one dgemm worker each."),
            click.option("--cores", type=click.IntRange(min=1), default=32, show_default=True,
                         help="Cores per job, shared among its workers."),
            click.option("--memory", default="256GB", show_default=True,
                         help="Memory per job, shared among its workers."),
            click.option(f"--{queue_flag}", "queue", default=None, help=queue_help),
            click.option("--account", default=None, help="Account (project) charged."),
            click.option("--walltime", default="02:00:00", show_default=True, help="Time limit of each job."),
            click.option("--prologue", multiple=True, metavar="LINE",
                         help="A shell line run before the worker, e.g. 'source ~/venvs/dgemm/bin/activate' "
                              "(repeatable)."),
            click.option("--directive", "directives", multiple=True, metavar="OPTION",
                         help=f"One more {directive} option, e.g. --directive=--constraint=a100 (repeatable)."),
            click.option("--devices", default="gpu", show_default=True, metavar="SPEC",
                         help="dgemm worker --devices in each job: gpu, the GPUs the batch system gave it."),
            click.option("--interface", default=None,
                         help="Network interface of the scheduler and the workers, e.g. ib0."),
            click.option("--dry-run", is_flag=True, help="Print a job's script and stop; nothing is submitted."),
            click.option("--scheduler-file", type=click.Path(dir_okay=False), default=None,
                         help="Write the scheduler's address to this file (for dgemm worker and clients)."),
            click.option("--overwrite", is_flag=True, help="Replace an existing OUT."),
            click.option("--timeout", type=click.FloatRange(min=0), default=3600, show_default=True,
                         help="Seconds to wait for every job's workers before multiplying (0: no limit)."),
        ]):
            f = opt(f)
        return jobqueue_group.command(name=name)(click.pass_context(f))

    return decorate


@_recipe_command("slurm", "partition", "SLURM partition (-p).", "#SBATCH")
def slurm_cmd(ctx, **kw):
    """Run dgemm workers as SLURM jobs: print a job's script, multiply A @ B into OUT, or serve until Ctrl-C.

    Each job asks for --gpus-per-node GPUs (#SBATCH --gres=gpu:G) and runs
    `dgemm worker`, one worker per GPU, pinned, GPU=1, with the dgemm plugin;
    the scheduler (with the /dgemm dashboard page) runs in this process.
    With A B OUT: submit --jobs jobs, wait for their workers, compute OUT = A
    @ B, cancel the jobs.  Without: keep the cluster (address printed, and
    written to --scheduler-file) until Ctrl-C or SIGTERM.
    """
    from dgemm.deploy import slurm
    _run(ctx, slurm, **kw)


@_recipe_command("pbs", "queue", "PBS queue (-q).", "#PBS")
def pbs_cmd(ctx, **kw):
    """Run dgemm workers as PBS jobs: print a job's script, multiply A @ B into OUT, or serve until Ctrl-C.

    Each job asks for select=1:ncpus=C:ngpus=G:mem=M and runs `dgemm
    worker`, one worker per GPU, pinned, GPU=1, with the dgemm plugin; the
    scheduler runs in this process.  With A B OUT: submit --jobs jobs, wait
    for their workers, compute OUT = A @ B, delete the jobs.  Without: keep
    the cluster until Ctrl-C or SIGTERM.
    """
    from dgemm.deploy import pbs
    _run(ctx, pbs, **kw)


def _run(ctx, recipe, *, a, b, out, jobs, gpus_per_node, cores, memory, queue, account, walltime, prologue,
         directives, devices, interface, dry_run, scheduler_file, overwrite, timeout):
    from dgemm.deploy import jobqueue

    operands = [x for x in (a, b, out) if x is not None]
    if len(operands) not in (0, 3):
        raise InputError("give A, B and OUT to multiply, or none of them to keep the cluster until Ctrl-C")
    extra = {"interface": interface} if interface else {}
    with user_errors(ctx):
        opts = recipe.options(gpus_per_node, cores, memory, queue, account, walltime, prologue, directives, devices)
        if dry_run:
            script = jobqueue.job_script(recipe.JOB, opts, **extra)
            click.echo(script, nl=not script.endswith("\n"))
            return
        if operands:   # the user's mistakes before any job is queued
            from dgemm.client.request import Request
            Request.check("matmul", a, b, out=out, overwrite=overwrite)
        cluster = jobqueue.start_cluster(recipe.CLUSTER, opts, **extra)
    from distributed import Client

    with cluster, Client(cluster) as client:
        link = cluster.dashboard_link
        click.echo(f"scheduler: {cluster.scheduler_address}")
        click.echo(f"dashboard: {link}")
        click.echo(f"dgemm page: {link.rsplit('/', 1)[0]}/dgemm")
        if scheduler_file:
            client.write_scheduler_file(scheduler_file)
        try:
            jobqueue.submit(cluster, jobs)
        except SubmissionError as e:   # nothing would ever join: say why, now
            raise click.ClickException(str(e)) from None
        click.echo(f"submitted {jobs} job{'s' if jobs > 1 else ''} of {gpus_per_node} GPU worker"
                   f"{'s' if gpus_per_node > 1 else ''} each")
        if not operands:
            click.echo("press Ctrl-C to stop (the jobs are cancelled)")
            _wait_for_a_signal()
            _give_back(cluster, client)
            return
        n = jobs * gpus_per_node
        try:
            client.wait_for_workers(n, timeout=timeout or None)
        except TimeoutError:
            joined = len(client.scheduler_info()["workers"])
            raise click.ClickException(f"{joined} of {n} workers joined within {timeout:g} s; the jobs may still be "
                                       "queued (see the batch system's queue and the jobs' output)") from None
        click.echo(f"{n} workers joined")
        import dgemm
        with user_errors(ctx):
            result = dgemm.matmul(a, b, out=out, client=client, overwrite=overwrite, progress=True)
        click.echo()
        click.echo(f"shape: {' x '.join(map(str, result.shape))} {result.dtype}")
        click.echo(f"written to: {out}")
        _give_back(cluster, client)


def _give_back(cluster, client, timeout: float = 30) -> None:
    """Retire the workers and end their jobs before the scheduler closes, so that they leave cleanly rather
    than lose their scheduler (closing the cluster cancels whatever is left)."""
    import time

    cluster.scale(0)
    deadline = time.monotonic() + timeout
    while client.scheduler_info()["workers"] and time.monotonic() < deadline:
        time.sleep(0.2)


def _wait_for_a_signal() -> None:
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

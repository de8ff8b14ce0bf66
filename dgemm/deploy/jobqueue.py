"""What the SLURM and PBS recipes share: dgemm's worker command in dask-jobqueue's jobs, and the cluster.

:func:`worker_options` gives the keyword arguments of a jobqueue cluster
(and job) that make each job run ``dgemm worker`` with one worker per GPU of
the job; :func:`start_cluster` makes the cluster, its scheduler with dgemm's
plugins and dgemm's ``allowed-failures``; :func:`submit` scales it and
waits until the batch system has taken (or refused) the jobs;
:func:`job_script` shows what would be submitted.  dask-jobqueue is imported
only by :func:`start_cluster`, :func:`job_script` and :func:`load_jobqueue`.
"""
from __future__ import annotations

import importlib
import re
from collections.abc import Sequence

from dgemm.errors import SubmissionError

# Preloaded by the scheduler: the /dgemm dashboard page and block placement from the start.
SCHEDULER_PRELOAD = "dgemm.scheduler"
# How dask-jobqueue runs the worker: ``python -m dgemm worker SCHEDULER --name ... --nthreads ... ...``.
WORKER_COMMAND = "dgemm worker"
JOBQUEUE_MISSING = "dask-jobqueue is not installed: pip install 'dgemm[jobqueue]' (or pip install dask-jobqueue)"


def worker_options(*, gpus_per_node: int, cores: int, memory: str, account: str | None, walltime: str | None,
                   prologue: Sequence[str] = (), devices: str = "gpu") -> dict:
    """Keyword arguments of a dask-jobqueue cluster whose jobs each run one ``dgemm worker``.

    Parameters
    ----------
    gpus_per_node : int
        GPUs each job asks for: ``dgemm worker`` starts one worker per GPU,
        and jobqueue's ``processes`` is set to it so that it expects exactly
        those workers (named ``<job>-0``, ``<job>-1``, ...) and splits the
        job's cores and memory among them.
    cores : int
        Cores per job (at least one per GPU: each worker gets ``cores //
        gpus_per_node`` threads).
    memory : str
        Memory per job, e.g. ``"256GB"``.
    account : str, optional
        The account or project charged.
    walltime : str, optional
        The job's time limit, as the batch system writes it (``"02:00:00"``).
    prologue : sequence of str
        Shell lines run before the worker, e.g. ``"source ~/venvs/dgemm/bin/activate"``.
    devices : str
        The devices each job's ``dgemm worker`` takes (``--devices``):
        ``"gpu"``, every GPU the batch system gave the job (NVIDIA's OpenCL
        driver honours the ``CUDA_VISIBLE_DEVICES`` it sets).

    Raises
    ------
    ValueError
        A count, size or device specification that cannot make a job, naming it.

    >>> kw = worker_options(gpus_per_node=4, cores=32, memory="256GB", account=None, walltime="01:00:00")
    >>> kw["processes"], kw["worker_command"], kw["worker_extra_args"]
    (4, 'dgemm worker', ['--devices', 'gpu'])
    >>> worker_options(gpus_per_node=4, cores=2, memory="8GB", account=None, walltime=None)
    Traceback (most recent call last):
    ...
    ValueError: cores=2 is fewer than gpus_per_node=4: each GPU's worker needs at least one core
    """
    from dask.utils import parse_bytes

    for name, value in (("gpus_per_node", gpus_per_node), ("cores", cores)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    if cores < gpus_per_node:
        raise ValueError(f"cores={cores} is fewer than gpus_per_node={gpus_per_node}: each GPU's worker needs "
                         "at least one core")
    try:
        if parse_bytes(memory) <= 0:
            raise ValueError
    except (ValueError, TypeError):
        raise ValueError(f"memory={memory!r}: expected the job's memory as bytes, like 256GB") from None
    if not isinstance(devices, str) or not devices.strip():
        raise ValueError(f"devices={devices!r}: expected a device specification like gpu (dgemm worker --devices)")
    if isinstance(prologue, str):
        raise TypeError("prologue must be a sequence of shell lines, not one string")
    return dict(
        cores=cores, memory=memory,
        processes=gpus_per_node,                 # one dgemm worker per GPU, named <job>-<i>
        account=account, walltime=walltime,
        worker_command=WORKER_COMMAND,
        worker_extra_args=["--devices", devices],
        job_script_prologue=list(prologue),
        job_name="dgemm",
    )


def pbs_memory(memory: str) -> str:
    """``memory`` in PBS's units (kb, mb, gb, tb: binary), never less than the bytes Dask reads in it.

    Parameters
    ----------
    memory : str
        A size as Dask writes it: a number and a unit, decimal or binary
        (``"256GB"``, ``"1.5 TiB"``, ``"64gb"``).

    Returns
    -------
    str
        A whole number and PBS's unit (``-l mem=``); PBS reads its units as
        binary, so a decimal size becomes a number at least as large.

    Raises
    ------
    ValueError
        ``memory`` is not a number followed by a unit (``"256"``, ``"lots"``).

    >>> pbs_memory("256GB"), pbs_memory("1.5 TiB"), pbs_memory("64gb")
    ('256gb', '1536gb', '64gb')
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b)\s*", str(memory), re.IGNORECASE)
    if not match:
        raise ValueError(f"memory={memory!r}: expected the job's memory like 256GB")
    number, unit = float(match[1]), match[2].lower().replace("i", "")
    units = ["kb", "mb", "gb", "tb"]
    i = units.index(unit)
    while number != int(number) and i > 0:   # PBS takes whole numbers: 1.5tb is 1536gb
        number, i = number * 1024, i - 1
    return f"{int(-(-number // 1))}{units[i]}"


def load_jobqueue(dotted: str):
    """The dask-jobqueue class named ``dotted``, imported only when a recipe needs it.

    Parameters
    ----------
    dotted : str
        Module and class, e.g. ``"dask_jobqueue.SLURMCluster"`` or
        ``"dask_jobqueue.slurm.SLURMJob"``.

    Returns
    -------
    type
        The class.

    Raises
    ------
    ImportError
        dask-jobqueue is not installed; the message says how to install it.
    """
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        raise ImportError(JOBQUEUE_MISSING) from None


def start_cluster(cluster_class: str, options: dict, **kwargs):
    """A dask-jobqueue cluster with ``options``, its scheduler running dgemm's plugins; no job submitted yet.

    Parameters
    ----------
    cluster_class : str
        Dotted name of the jobqueue cluster class.
    options : dict
        From a recipe's ``options()``.
    **kwargs
        More keyword arguments of the cluster class (``interface``,
        ``security``, ``log_directory``, ...); they win over ``options``.
        ``scheduler_options`` keeps dgemm's preload beside the caller's.

    Returns
    -------
    dask_jobqueue.JobQueueCluster
        Of a subclass of ``cluster_class`` whose ``scale`` gives up jobs
        without a worker (queued, or ended: cancelled, preempted) before
        jobs whose workers run, several workers per job too.  Scale it with
        ``cluster.scale(jobs=N)`` (or :func:`submit`) or ``cluster.adapt(...)``.

    The scheduler's ``allowed-failures`` is dgemm's
    (:data:`dgemm.cluster.local.ALLOWED_FAILURES`): a cancelled or preempted
    job's workers count against every GEMM task they held.
    """
    import dask

    from dgemm.cluster.local import ALLOWED_FAILURES

    cls = _giving_up_idle_jobs_first(load_jobqueue(cluster_class))
    scheduler_options = dict(kwargs.pop("scheduler_options", None) or {})
    preload = scheduler_options.get("preload") or []
    preload = [preload] if isinstance(preload, str) else list(preload)
    if SCHEDULER_PRELOAD not in preload:
        preload.append(SCHEDULER_PRELOAD)
    scheduler_options["preload"] = preload
    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):   # read by the Scheduler
        return cls(**{**options, **kwargs}, scheduler_options=scheduler_options)


def _giving_up_idle_jobs_first(cls):
    """A subclass of the jobqueue cluster class ``cls`` whose scaling down gives up jobs without workers first.

    distributed's ``SpecCluster.scale`` gives up the jobs none of whose workers
    joined first, but it looks for a job's own name among the workers', and
    a job of several workers names them ``<job>-0``, ``<job>-1``...: it then
    gives up any job, a running one as soon as one still queued or one
    already ended (``scancel``, preemption), which stays counted as running.
    """
    import math

    class Cluster(cls):
        def scale(self, n=None, jobs=0, memory=None, cores=None):
            group = (getattr(self, "new_spec", None) or {}).get("group")
            if group and memory is None and cores is None:
                wanted = math.ceil(n / len(group)) if n is not None else jobs
                present = {str(w.get("name")) for w in self.scheduler_info.get("workers", {}).values()}
                idle = [name for name in list(self.worker_spec)
                        if not any(f"{name}{suffix}" in present for suffix in group)]
                while len(self.worker_spec) > wanted and idle:
                    del self.worker_spec[idle.pop()]       # the newest first
                return super().scale(jobs=wanted)
            return super().scale(n, jobs=jobs, memory=memory, cores=cores)

    Cluster.__name__, Cluster.__qualname__, Cluster.__doc__ = cls.__name__, cls.__qualname__, cls.__doc__
    Cluster.__module__ = cls.__module__
    return Cluster


def job_script(job_class: str, options: dict, scheduler: str = "tcp://SCHEDULER:8786", name: str = "dgemm-0",
               **kwargs) -> str:
    """The batch script one job of ``options`` would be (nothing is submitted, no scheduler starts).

    Parameters
    ----------
    job_class : str
        Dotted name of the jobqueue job class (``"dask_jobqueue.slurm.SLURMJob"``).
    options : dict
        From a recipe's ``options()``.
    scheduler : str
        The scheduler's address, as the cluster would fill it in.
    name : str
        The job's name; its workers are ``NAME-0``, ``NAME-1``, ...
    **kwargs
        More keyword arguments of the job class (``interface``, ``security``,
        ...), as :func:`start_cluster`'s; they win over ``options``.

    Returns
    -------
    str
        The script, as the batch system would get it.
    """
    return load_jobqueue(job_class)(scheduler=scheduler, name=name, **{**options, **kwargs}).job_script()


def submit(cluster, jobs: int) -> None:
    """``cluster.scale(jobs=jobs)``, returning once the batch system has taken every new job.

    dask-jobqueue submits in the background: a job the batch system refuses
    (an unknown partition, a limit) is only logged there, and whoever waits
    for its workers waits in vain.  This submits in the foreground instead.

    Parameters
    ----------
    cluster : dask_jobqueue.JobQueueCluster
        A cluster of :func:`start_cluster`, not asynchronous.
    jobs : int
        The number of jobs wanted; fewer than now cancels jobs.

    Raises
    ------
    SubmissionError
        The submission command failed: its name, exit status and what it
        wrote on stderr, in one line.  Jobs submitted before it stay queued
        (closing the cluster cancels them).
    """
    correct_state = getattr(cluster, "_correct_state", None)
    if not callable(correct_state) or getattr(cluster, "asynchronous", False):
        # A jobqueue (distributed) without SpecCluster's private pass: submission stays in the background.
        cluster.scale(jobs=jobs)
        return

    async def scale_and_submit():
        # On the cluster's loop, so that the pass awaited here is the one that submits these jobs: the pass
        # scale() schedules for later joins it (or finds nothing left to do).
        cluster.scale(jobs=jobs)
        try:
            await correct_state()
        except RuntimeError as e:
            if _refusal(str(e)) is not None:
                _forget_refused_jobs(cluster, e)
            raise

    try:
        cluster.sync(scale_and_submit)
    except RuntimeError as e:
        refusal = _refusal(str(e))
        if refusal is None:
            raise
        raise SubmissionError(refusal) from None


def _refusal(text: str) -> str | None:
    """One line from dask-jobqueue's error about a failed command (its name, status and stderr), else None."""
    found = re.search(r"Exit code: (-?\d+)\nCommand:\n(\S+).*?\nstdout:\n(.*?)\nstderr:\n(.*)", text, re.DOTALL)
    if not found:
        return None
    status, command, out, err = found.groups()
    said = " ".join((err.strip() or out.strip() or "nothing").split())
    return f"{command} refused the job (exit status {status}): {said}"


def _forget_refused_jobs(cluster, error: BaseException) -> None:
    """Drop the jobs that got no job id from ``cluster``, so that it stays usable and closes cleanly.

    A refused job stays in the cluster's workers as never started, which
    its close refuses (an AssertionError), and in its wanted jobs, which would
    be submitted again at every scale.  Tornado also logs the pass's failure,
    which :func:`submit` reports itself: that one record is dropped.
    """
    import logging

    from distributed.core import Status

    for name, job in list(cluster.workers.items()):
        if getattr(job, "job_id", "") is None and job.status == Status.created:
            job.status = Status.failed
            del cluster.workers[name]
            cluster.worker_spec.pop(name, None)
    logging.getLogger("tornado.application").addFilter(_NotThis(error))


class _NotThis:
    """A logging filter that drops the records of one exception (reported otherwise)."""

    def __init__(self, error: BaseException):
        self.error = error

    def filter(self, record) -> bool:
        return not (record.exc_info and record.exc_info[1] is self.error)

"""What the SLURM and PBS recipes share: dgemm's worker command in dask-jobqueue's jobs, and the cluster.

:func:`worker_options` gives the keyword arguments of a jobqueue cluster
(and job) that make each job run ``dgemm worker`` with one worker per GPU of
the job; :func:`start_cluster` makes the cluster, its scheduler with dgemm's
plugins and dgemm's ``allowed-failures``; :func:`job_script` shows what
would be submitted.  dask-jobqueue is imported only by the last two.
"""
from __future__ import annotations

import importlib
import re
from collections.abc import Sequence

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
    """The dask-jobqueue class named ``dotted`` (``"dask_jobqueue.SLURMCluster"``); ImportError naming the fix."""
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
        Scale it with ``cluster.scale(jobs=N)`` or ``cluster.adapt(...)``.

    The scheduler's ``allowed-failures`` is dgemm's
    (:data:`dgemm.cluster.local.ALLOWED_FAILURES`): a cancelled or preempted
    job's workers count against every GEMM task they held.
    """
    import dask

    from dgemm.cluster.local import ALLOWED_FAILURES

    cls = load_jobqueue(cluster_class)
    scheduler_options = dict(kwargs.pop("scheduler_options", None) or {})
    preload = scheduler_options.get("preload") or []
    preload = [preload] if isinstance(preload, str) else list(preload)
    if SCHEDULER_PRELOAD not in preload:
        preload.append(SCHEDULER_PRELOAD)
    scheduler_options["preload"] = preload
    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):   # read by the Scheduler
        return cls(**{**options, **kwargs}, scheduler_options=scheduler_options)


def job_script(job_class: str, options: dict, scheduler: str = "tcp://SCHEDULER:8786", name: str = "dgemm-0",
               **kwargs) -> str:
    """The batch script one job of ``options`` would be (nothing is submitted, no scheduler starts).

    ``scheduler`` and ``name`` stand for what the cluster fills in; ``kwargs``
    as :func:`start_cluster`'s.
    """
    return load_jobqueue(job_class)(scheduler=scheduler, name=name, **{**options, **kwargs}).job_script()

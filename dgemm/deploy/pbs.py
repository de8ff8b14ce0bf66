"""dgemm on a PBS Pro / OpenPBS cluster through dask-jobqueue: one job per GPU node, one dgemm worker per GPU.

As :mod:`dgemm.deploy.slurm`, with PBS's resource request
(``#PBS -l select=1:ncpus=C:ngpus=G:mem=M``).  Each job runs ``dgemm
worker``, which starts one Dask worker per GPU of the job (pinned, ``GPU=1``,
with the dgemm plugin).  From the command line: ``dgemm jobqueue pbs a.zarr
b.zarr c.zarr --jobs 2 --gpus-per-node 4 --queue gpu`` (``--dry-run`` prints
the job script).
"""
from __future__ import annotations

from collections.abc import Sequence

from dgemm.deploy import jobqueue

CLUSTER = "dask_jobqueue.PBSCluster"
JOB = "dask_jobqueue.pbs.PBSJob"


def options(gpus_per_node: int = 4, cores: int = 32, memory: str = "256GB", queue: str | None = None,
            account: str | None = None, walltime: str | None = "02:00:00", prologue: Sequence[str] = (),
            extra_directives: Sequence[str] = (), devices: str = "gpu") -> dict:
    """Keyword arguments of :class:`dask_jobqueue.PBSCluster` (and ``PBSJob``) for dgemm.

    Parameters
    ----------
    gpus_per_node : int
        GPUs per job (``ngpus=G``), one dgemm worker each.
    cores, memory : int, str
        Per job (``ncpus``, ``mem`` in PBS's binary units), shared among its workers.
    queue, account, walltime : str, optional
        ``-q``, ``-A``, ``-l walltime=``.
    prologue : sequence of str
        Shell lines run before the worker (activate the environment).
    extra_directives : sequence of str
        More ``#PBS`` options, e.g. ``"-l place=excl"``.
    devices : str
        ``dgemm worker --devices``: ``"gpu"``, the GPUs PBS gave the job.

    Returns
    -------
    dict
        For ``PBSCluster(**options(...))``, or :func:`cluster`.

    >>> options(gpus_per_node=2, cores=16, memory="128GB", queue="gpuq")["resource_spec"]
    'select=1:ncpus=16:ngpus=2:mem=128gb'
    """
    if isinstance(extra_directives, str):
        raise TypeError("extra_directives must be a sequence of #PBS options, not one string")
    kw = jobqueue.worker_options(gpus_per_node=gpus_per_node, cores=cores, memory=memory, account=account,
                                 walltime=walltime, prologue=prologue, devices=devices)
    return {**kw, "queue": queue, "job_extra_directives": list(extra_directives),
            "resource_spec": f"select=1:ncpus={cores}:ngpus={gpus_per_node}:mem={jobqueue.pbs_memory(memory)}"}


def cluster(gpus_per_node: int = 4, cores: int = 32, memory: str = "256GB", queue: str | None = None,
            account: str | None = None, walltime: str | None = "02:00:00", prologue: Sequence[str] = (),
            extra_directives: Sequence[str] = (), devices: str = "gpu", **kwargs):
    """A :class:`dask_jobqueue.PBSCluster` of dgemm workers, with dgemm's scheduler plugins; no job yet.

    Parameters
    ----------
    gpus_per_node, cores, memory, queue, account, walltime, prologue, extra_directives, devices
        As :func:`options`.
    **kwargs
        More keyword arguments of ``PBSCluster`` (``interface=``, ``security=``...).

    Returns
    -------
    dask_jobqueue.PBSCluster
        Submit jobs with ``cluster.scale(jobs=N)``; closing the cluster deletes them.
    """
    return jobqueue.start_cluster(CLUSTER, options(gpus_per_node, cores, memory, queue, account, walltime,
                                                   prologue, extra_directives, devices), **kwargs)


def job_script(gpus_per_node: int = 4, cores: int = 32, memory: str = "256GB", queue: str | None = None,
               account: str | None = None, walltime: str | None = "02:00:00", prologue: Sequence[str] = (),
               extra_directives: Sequence[str] = (), devices: str = "gpu", **kwargs) -> str:
    """The ``qsub`` script of one job; nothing is submitted and no scheduler starts.

    Parameters
    ----------
    gpus_per_node, cores, memory, queue, account, walltime, prologue, extra_directives, devices
        As :func:`options`.
    **kwargs
        More keyword arguments of ``PBSJob`` (``scheduler=`` and ``name=``
        default to ``tcp://SCHEDULER:8786`` and ``dgemm-0``).

    Returns
    -------
    str
        The script.
    """
    return jobqueue.job_script(JOB, options(gpus_per_node, cores, memory, queue, account, walltime, prologue,
                                           extra_directives, devices), **kwargs)

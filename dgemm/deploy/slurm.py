"""dgemm on a SLURM cluster through dask-jobqueue: one job per GPU node, one dgemm worker per GPU.

Each job asks for whole GPU nodes' worth of GPUs (``#SBATCH --gres=gpu:G``)
and runs ``dgemm worker``, which starts one Dask worker per GPU SLURM gave
it, pinned, advertising ``GPU=1``, with the dgemm worker plugin.  From
Python::

    import dgemm
    from distributed import Client
    from dgemm.deploy import slurm

    cluster = slurm.cluster(gpus_per_node=4, cores=32, memory="256GB", partition="gpu")
    cluster.scale(jobs=2)
    client = Client(cluster)
    client.wait_for_workers(8)
    dgemm.matmul("a.zarr", "b.zarr", out="c.zarr", client=client)

and from the command line: ``dgemm jobqueue slurm a.zarr b.zarr c.zarr --jobs 2
--gpus-per-node 4 --partition gpu`` (``--dry-run`` prints the job script).
"""
from __future__ import annotations

from collections.abc import Sequence

from dgemm.deploy import jobqueue

CLUSTER = "dask_jobqueue.SLURMCluster"
JOB = "dask_jobqueue.slurm.SLURMJob"


def options(gpus_per_node: int = 4, cores: int = 32, memory: str = "256GB", partition: str | None = None,
            account: str | None = None, walltime: str | None = "02:00:00", prologue: Sequence[str] = (),
            extra_directives: Sequence[str] = (), devices: str = "gpu") -> dict:
    """Keyword arguments of :class:`dask_jobqueue.SLURMCluster` (and ``SLURMJob``) for dgemm.

    Parameters
    ----------
    gpus_per_node : int
        GPUs per job (``--gres=gpu:G``), one dgemm worker each.
    cores, memory : int, str
        Per job (``--cpus-per-task``, ``--mem``), shared among its workers.
    partition, account, walltime : str, optional
        ``-p``, ``-A``, ``-t``.
    prologue : sequence of str
        Shell lines run before the worker (activate the environment).
    extra_directives : sequence of str
        More ``#SBATCH`` options, e.g. ``"--constraint=a100"``.
    devices : str
        ``dgemm worker --devices``: ``"gpu"``, the GPUs SLURM gave the job.

    Returns
    -------
    dict
        For ``SLURMCluster(**options(...))``, or :func:`cluster`.

    >>> kw = options(gpus_per_node=2, cores=16, memory="64GB", partition="gpu", extra_directives=["-C a100"])
    >>> kw["queue"], kw["job_extra_directives"], kw["processes"]
    ('gpu', ['--gres=gpu:2', '-C a100'], 2)
    """
    if isinstance(extra_directives, str):
        raise TypeError("extra_directives must be a sequence of #SBATCH options, not one string")
    kw = jobqueue.worker_options(gpus_per_node=gpus_per_node, cores=cores, memory=memory, account=account,
                                 walltime=walltime, prologue=prologue, devices=devices)
    return {**kw, "queue": partition, "job_extra_directives": [f"--gres=gpu:{gpus_per_node}", *extra_directives]}


def cluster(gpus_per_node: int = 4, cores: int = 32, memory: str = "256GB", partition: str | None = None,
            account: str | None = None, walltime: str | None = "02:00:00", prologue: Sequence[str] = (),
            extra_directives: Sequence[str] = (), devices: str = "gpu", **kwargs):
    """A :class:`dask_jobqueue.SLURMCluster` of dgemm workers, with dgemm's scheduler plugins; no job yet.

    Parameters
    ----------
    gpus_per_node, cores, memory, partition, account, walltime, prologue, extra_directives, devices
        As :func:`options`.
    **kwargs
        More keyword arguments of ``SLURMCluster`` (``interface="ib0"``,
        ``security=``, ``log_directory=``, ``scheduler_options=``...).

    Returns
    -------
    dask_jobqueue.SLURMCluster
        Submit jobs with ``cluster.scale(jobs=N)`` (or ``cluster.adapt(...)``);
        closing the cluster cancels them.
    """
    return jobqueue.start_cluster(CLUSTER, options(gpus_per_node, cores, memory, partition, account, walltime,
                                                   prologue, extra_directives, devices), **kwargs)


def job_script(gpus_per_node: int = 4, cores: int = 32, memory: str = "256GB", partition: str | None = None,
               account: str | None = None, walltime: str | None = "02:00:00", prologue: Sequence[str] = (),
               extra_directives: Sequence[str] = (), devices: str = "gpu", **kwargs) -> str:
    """The ``sbatch`` script of one job; nothing is submitted and no scheduler starts.

    Parameters
    ----------
    gpus_per_node, cores, memory, partition, account, walltime, prologue, extra_directives, devices
        As :func:`options`.
    **kwargs
        More keyword arguments of ``SLURMJob`` (``interface=``, ``scheduler=``
        and ``name=``, which default to ``tcp://SCHEDULER:8786`` and ``dgemm-0``).

    Returns
    -------
    str
        The script.
    """
    return jobqueue.job_script(JOB, options(gpus_per_node, cores, memory, partition, account, walltime, prologue,
                                           extra_directives, devices), **kwargs)

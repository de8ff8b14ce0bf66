"""One device worker of a host: what both launchers give it.

:class:`~dgemm.cluster.local.DeviceCluster` (a local cluster in the
client's process) and :func:`~dgemm.cluster.launch.worker_specs` (behind
``dgemm worker`` and ``dgemm cluster``, the SLURM and Kubernetes path) start
one worker process per device.  :func:`device_worker` says, for the i-th of
the host's n device workers, what that worker gets, so the two cannot drift.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from dgemm import config
from dgemm.opencl.device import reader_share


@dataclass(frozen=True)
class DeviceWorker:
    """What one device worker of a host gets.

    Attributes
    ----------
    device : str
        Its device's ``platform:device`` id.
    name : str or None
        Its worker name; None lets Dask name it by its address.
    env : dict
        Variables of its process: its device, and where several device
        workers share the host, their shares of its cores (PoCL's threads, the
        reader threads) unless those are set already, and the host cache
        (``host-cache`` on where it is ``auto``).
    nthreads : int
        Dask threads: the host's cores shared among its device workers, at
        least 2 (GEMM tasks run one at a time per device; the other threads
        store and reduce blocks).
    memory_limit : int, str or float
        Dask's memory limit: the host's memory shared among its device
        workers, or what the caller asked for.
    """

    device: str
    name: str | None
    env: dict
    nthreads: int
    memory_limit: int | str | float


def device_worker(i: int, devices: Sequence[str], *, name: str | None = None, nthreads: int | None = None,
                  memory_limit: int | str | float | None = "auto", cpus: int | None = None,
                  device_memory_limit: int | str | None = None) -> DeviceWorker:
    """The ``i``-th worker of a host whose device workers use ``devices`` (ids; one may repeat).

    Parameters
    ----------
    i : int
        Which worker: it opens ``devices[i]``.
    devices : sequence of str
        Every device worker's device on this host, in order.
    name : str, optional
        The workers' name: worker ``i`` of several is ``name-i`` (as ``dask
        worker --nworkers`` names them, which dask-jobqueue expects).
    nthreads : int, optional
        Threads per worker (default: this host's cores shared, at least 2).
    memory_limit : str or number, optional
        Per worker; ``"auto"`` or None share this host's memory.
    cpus : int, optional
        This host's cores (default :func:`os.cpu_count`).
    device_memory_limit : int or str, optional
        Caps the device memory the worker plans for (``4GiB`` or bytes): its
        ``device-memory-limit`` setting, set in its environment
        (``DGEMM_DEVICE_MEMORY_LIMIT``) because the worker reads it where it
        runs.  None: the worker's own setting, if any.

    >>> w = device_worker(1, ["0:0", "0:1"], name="job", cpus=16, memory_limit="8GB")
    >>> w.name, w.nthreads, w.memory_limit, w.env[config.environment("device")]
    ('job-1', 8, '8GB', '0:1')
    >>> device_worker(0, ["0:0"], device_memory_limit="4GiB").env["DGEMM_DEVICE_MEMORY_LIMIT"]
    '4294967296'
    >>> "DGEMM_HOST_CACHE" in device_worker(1, ["0:0", "0:1"]).env   # host-cache is off unless set to auto
    False
    """
    from distributed.system import MEMORY_LIMIT

    n = len(devices)
    cpus = cpus or os.cpu_count() or 1
    env = {config.environment("device"): devices[i]}
    # Several device workers on one host share its cores: PoCL must not spawn a thread per core
    # in each, and each reads blocks with its share of reader threads.  Where the user set either,
    # it stays theirs (a worker inherits the environment and, under a nanny, the configuration).
    if n > 1 and "POCL_MAX_PTHREAD_COUNT" not in os.environ:
        env["POCL_MAX_PTHREAD_COUNT"] = str(max(1, cpus // n))
    if n > 1 and config.get("read-threads") is None:
        env[config.environment("read-threads")] = str(reader_share(cpus, n))
    if n > 1 and config.get("host-cache") == "auto":   # they share decoded blocks (dgemm.storage.hostcache)
        env[config.environment("host-cache")] = "on"
    if device_memory_limit not in (None, ""):
        # Parsed here, so that a mistake fails in the launcher rather than in every worker.
        env[config.environment("device-memory-limit")] = str(config.SETTINGS["device-memory-limit"].parse(
            device_memory_limit, "--device-memory-limit"))
    return DeviceWorker(
        device=devices[i],
        name=name if (n == 1 or name in (None, "")) else f"{name}-{i}",
        env=env,
        nthreads=max(2, cpus // n) if nthreads is None else nthreads,
        memory_limit=MEMORY_LIMIT // n if memory_limit in (None, "auto") else memory_limit,
    )


def host_worker(devices: Sequence[str], *, name: str | None = None, nthreads: int | None = None,
                memory_limit: int | str | float | None = "auto", cpus: int | None = None,
                device_memory_limit: int | str | None = None) -> DeviceWorker:
    """The one process of a host whose device workers use ``devices``, under ``worker-process: host``.

    Its worker is :func:`device_worker` 0's (the first device, its threads,
    its name); its environment also names the other devices and their
    workers' names (:data:`dgemm.worker.siblings.ENV`), which its plugin
    starts in the process, each with as many threads.  Its memory limit is
    the whole process's, every worker's share together (each of its
    workers watches the process's memory against it), and the host cache
    stays off where it is ``auto``: the process shares decoded blocks in
    memory (:mod:`dgemm.storage.sharing`).

    >>> w = host_worker(["0:0", "0:1"], name="job", cpus=16, memory_limit="8GB")
    >>> w.name, w.nthreads, w.memory_limit, w.env[config.environment("device")], w.env["DGEMM_SIBLINGS"]
    ('job-0', 8, 16000000000, '0:0', '[["0:1", "job-1"]]')
    >>> host_worker(["0:0"], cpus=4).env.get("DGEMM_SIBLINGS")   # one device: a process as any other
    """
    from distributed.system import MEMORY_LIMIT
    from distributed.worker_memory import parse_memory_limit

    from dgemm.worker import siblings

    n = len(devices)
    workers = [device_worker(i, devices, name=name, nthreads=nthreads, memory_limit=memory_limit, cpus=cpus,
                             device_memory_limit=device_memory_limit) for i in range(n)]
    first = workers[0]
    env = dict(first.env)
    if config.environment("host-cache") in env and config.get("host-cache") == "auto":
        del env[config.environment("host-cache")]
    if n > 1:
        env[siblings.ENV] = siblings.encode([(w.device, w.name if w.name is not None else i)
                                             for i, w in enumerate(workers) if i > 0])
    if memory_limit in (None, "auto"):
        limit = MEMORY_LIMIT
    else:
        import logging

        per = parse_memory_limit(memory_limit, first.nthreads, logger=logging.getLogger(__name__))
        limit = (per or 0) * n    # 0: no limit, as given
    return DeviceWorker(device=first.device, name=first.name, env=env, nthreads=first.nthreads,
                        memory_limit=limit if n > 1 else first.memory_limit)

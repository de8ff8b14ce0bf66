"""Starting device workers on this host: what ``dgemm worker`` and ``dgemm cluster`` run.

As ``dask cuda worker`` does for CUDA, :func:`worker_specs` gives one Dask
worker (under a nanny) per OpenCL device, each pinned to its device through
``DGEMM_DEVICE`` in its environment (what :func:`dgemm.cluster.spec.device_worker`
gives it, as under a :class:`~dgemm.cluster.DeviceCluster`), advertising
``GPU=1`` and carrying the :class:`~dgemm.worker.DgemmPlugin`; under the
``worker-process: host`` setting, one nanny whose process runs a worker per
device (:func:`dgemm.cluster.spec.host_worker`).  :func:`run_workers` runs
them until a signal (SIGINT, SIGTERM) or until they all end.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from dgemm import config
from dgemm.cluster.spec import device_worker, host_worker
from dgemm.opencl.discovery import select_devices

logger = logging.getLogger("dgemm.cluster.launch")


def parse_resources(text: str | None) -> dict:
    """``"GPU=1 MEM=2"`` or ``"A=1,B=2"`` as a dict of floats.

    >>> parse_resources("A=1,B=2.5"), parse_resources(None)
    ({'A': 1.0, 'B': 2.5}, {})
    >>> parse_resources("A")
    Traceback (most recent call last):
    ...
    ValueError: --resources 'A': expected NAME=QUANTITY items
    """
    out = {}
    for item in (text or "").replace(",", " ").split():
        name, eq, qty = item.partition("=")
        try:
            if not eq or not name:
                raise ValueError
            out[name] = float(qty)
        except ValueError:
            raise ValueError(f"--resources {text!r}: expected NAME=QUANTITY items") from None
    return out


def bind_error(host: str | None, port: int) -> OSError | None:
    """Why ``host:port`` cannot be listened on now (another process holds it), else None.

    Binds as the scheduler's TCP listener and its dashboard's HTTP server
    bind (tornado's ``bind_sockets``, with ``SO_REUSEADDR``), then lets go,
    so a port only a closing connection still uses is not called taken.

    >>> import socket
    >>> s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
    >>> bind_error("127.0.0.1", s.getsockname()[1]).errno == __import__("errno").EADDRINUSE
    True
    >>> s.close(); bind_error("127.0.0.1", 0) is None
    True
    """
    from tornado.netutil import bind_sockets

    try:
        sockets = bind_sockets(port, address=host or None)
    except OSError as e:
        return e
    for sock in sockets:
        sock.close()
    return None


def _port(address: str | None, i: int, n: int):
    """The i-th worker's dashboard address: a fixed port p becomes p + i when there are several."""
    if address is None or n == 1:
        return address
    host, _, port = str(address).rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return address
    return f"{host}:{int(port) + i}"


def worker_specs(devices: str | None = None, *, name: str | None = None, nthreads: int | None = None,
                 memory_limit: str | int | float | None = "auto", resources: dict | None = None,
                 dashboard_address: str | None = ":0", device_infos=None,
                 device_memory_limit: str | int | None = None, preload: Sequence[str] = (),
                 dashboard_prefix: str | None = None) -> list[dict]:
    """Keyword arguments of one :class:`distributed.Nanny` per selected device (under ``worker-process:
    host``, one for all of them).

    Parameters
    ----------
    devices : str, optional
        Device specification (:func:`dgemm.opencl.discovery.select_devices`; default
        the ``devices`` setting, ``$DGEMM_DEVICES``, else every GPU, else a
        CPU device).  A device named twice gets two workers.
    name : str, optional
        Worker name; with several devices, worker ``i`` is ``name-i`` (as
        ``dask worker --nworkers`` names them, which dask-jobqueue expects).
    nthreads : int, optional
        Threads per worker (default: this host's cores shared among the
        workers, at least 2: GEMM tasks run one at a time per device, the
        other threads store and reduce blocks).
    memory_limit : str or number
        Per worker; ``"auto"`` shares this host's memory among the workers.
    resources : dict, optional
        More resources per worker; ``GPU=1`` is always there.
    dashboard_address : str, optional
        Each worker's HTTP server (``/metrics``); a fixed port ``p`` becomes
        ``p + i`` for worker ``i``.  None: no HTTP server.
    device_memory_limit : str or int, optional
        Caps the device memory each worker plans for (``4GiB``): its
        ``DGEMM_DEVICE_MEMORY_LIMIT`` (:func:`dgemm.cluster.spec.device_worker`).
    preload : sequence of str
        Modules or ``.py`` files each worker process loads (as ``dask worker --preload``).
    dashboard_prefix : str, optional
        Path prefix of each worker's HTTP server (``/metrics`` becomes
        ``PREFIX/metrics``), e.g. behind a proxy.

    >>> from dgemm.opencl.discovery import DeviceInfo
    >>> d = [DeviceInfo(0, 0, "P", "gpu0", "v", "GPU", 1, 1, 1, 1, True, None, ""),
    ...      DeviceInfo(0, 1, "P", "gpu1", "v", "GPU", 1, 1, 1, 1, True, None, "")]
    >>> specs = worker_specs(None, name="job", nthreads=4, memory_limit="8GB", device_infos=d)
    >>> [(s["name"], s["env"]["DGEMM_DEVICE"], s["resources"], s["nthreads"]) for s in specs]
    [('job-0', '0:0', {'GPU': 1}, 4), ('job-1', '0:1', {'GPU': 1}, 4)]
    """
    from distributed.worker_memory import parse_memory_limit

    from dgemm.worker import DgemmPlugin

    infos = select_devices(devices, device_infos)
    ids = [info.id for info in infos]
    if nthreads is not None and nthreads < 1:
        raise ValueError(f"--nthreads must be at least 1, not {nthreads}")
    if memory_limit not in (None, "auto"):
        try:  # what the worker will do with it, now: a mistake fails here, not in n processes
            parse_memory_limit(memory_limit, nthreads or 1, logger=logger)
        except (ValueError, TypeError):
            raise ValueError(f"--memory-limit {memory_limit!r}: expected bytes like 16GB, a fraction of this "
                             "host's memory like 0.25, 0 (no limit) or auto") from None
    specs = []
    host = config.get("worker-process") == "host" and len(ids) > 1
    for i, info in enumerate(infos[:1] if host else infos):
        if host:   # one process; its worker starts the others (dgemm.worker.siblings)
            w = host_worker(ids, name=name, nthreads=nthreads, memory_limit=memory_limit,
                            device_memory_limit=device_memory_limit)
        else:
            w = device_worker(i, ids, name=name, nthreads=nthreads, memory_limit=memory_limit,
                              device_memory_limit=device_memory_limit)
        extra = {"preload": list(preload)} if preload else {}
        if dashboard_prefix:
            extra["http_prefix"] = "/" + dashboard_prefix.strip("/")
        specs.append({**extra,
            "name": w.name, "env": w.env, "nthreads": w.nthreads, "memory_limit": w.memory_limit,
            "resources": {**(resources or {}), "GPU": 1}, "plugins": {DgemmPlugin()},
            "dashboard": dashboard_address is not None,
            "dashboard_address": _port(dashboard_address, i, len(infos)),
            "device": info,
        })
    return specs


async def run_workers(scheduler: str | None, specs: list[dict], log=None, **common) -> int:
    """Start a nanny per spec and run until a signal or until every worker has ended.

    ``common`` goes to every :class:`distributed.Nanny` (``scheduler_file``,
    ``host``, ``interface``, ``protocol``, ``security``, ``death_timeout``,
    ``local_directory``, ``lifetime``...); ``log`` (default: this module's
    logger) gets a line when a signal comes or a worker fails.  Returns the
    exit status: 0 after a signal or a normal end, 1 when a worker failed.
    """
    log = log or logger.info
    from distributed import Nanny
    from distributed._signals import wait_for_signals

    nannies = [Nanny(scheduler, **{k: v for k, v in spec.items() if k != "device"}, **common) for spec in specs]

    async def started_and_finished():
        await asyncio.gather(*nannies)
        await asyncio.gather(*(nanny.finished() for nanny in nannies))

    signalled = asyncio.create_task(wait_for_signals())
    running = asyncio.create_task(started_and_finished())
    done, _ = await asyncio.wait([signalled, running], return_when=asyncio.FIRST_COMPLETED)
    status = 0
    if running in done and running.exception() is not None:
        log(f"dgemm worker: a worker failed: {type(running.exception()).__name__}: {running.exception()}")
        status = 1
    if signalled in done:
        log(f"dgemm worker: signal {signalled.result()}, closing the workers")
    else:
        signalled.cancel()
    await asyncio.gather(*(nanny.close(timeout=10, reason="dgemm-worker-exit") for nanny in nannies),
                         return_exceptions=True)
    if not running.done():
        running.cancel()
    return status

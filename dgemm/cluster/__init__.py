"""Finding or starting a cluster, and preparing its workers for dgemm.

Without a client, dgemm uses the current distributed client, else starts
(and reuses) a :class:`DeviceCluster`: a local cluster with one worker
process per OpenCL device, each pinned to its device by its environment and
advertising ``GPU=1``.  Given any client, :func:`prepare` registers the
worker plugin and checks that some worker can run GEMM tasks.
"""
from __future__ import annotations

import copy
import logging
import os
import threading

from distributed import Client, LocalCluster

from dgemm.opencl.discovery import ENV_DEVICE, select_devices
from dgemm.tuning.params import KernelParams, lcm_tiles
from dgemm.worker import PLUGIN_NAME, DgemmPlugin, describe_worker

_local: dict = {}
_local_lock = threading.Lock()

# Caps the device memory dgemm plans for on a worker (bytes, or "512MiB", "2GB"...),
# read in the worker's own environment: a device shared with other jobs, or a test.
ENV_MEMORY_LIMIT = "DGEMM_DEVICE_MEMORY_LIMIT"


def memory_limit_from_env(value: str | None) -> int | None:
    """Parse ``DGEMM_DEVICE_MEMORY_LIMIT``.

    >>> memory_limit_from_env("64MiB"), memory_limit_from_env("1000"), memory_limit_from_env("")
    (67108864, 1000, None)
    >>> memory_limit_from_env("lots")
    Traceback (most recent call last):
    ...
    ValueError: DGEMM_DEVICE_MEMORY_LIMIT='lots' is not a size in bytes (like 1000, 512MiB or 2GB)
    """
    from dask.utils import parse_bytes

    if value is None or not value.strip():
        return None
    try:
        n = int(parse_bytes(value.strip()))
    except (ValueError, TypeError):
        n = -1
    if n <= 0:
        raise ValueError(f"{ENV_MEMORY_LIMIT}={value!r} is not a size in bytes (like 1000, 512MiB or 2GB)")
    return n


def describe_for_plan(dask_worker=None) -> dict | None:
    """Run on a worker: :func:`dgemm.worker.describe_worker` plus what the planner needs.

    Adds ``memory`` (bytes dgemm may assume the device has: its global
    memory, capped by ``DGEMM_DEVICE_MEMORY_LIMIT`` in the worker's
    environment) and ``max_alloc`` (the largest single buffer), and
    ``host`` (to tell which workers share a device).
    """
    d = describe_worker(dask_worker)
    if d is None or not d.get("ok"):
        return d
    try:
        limit = memory_limit_from_env(os.environ.get(ENV_MEMORY_LIMIT))
    except ValueError as e:
        return {**d, "ok": False, "error": str(e)}
    info = d["device"]
    memory = info.global_mem if limit is None else min(info.global_mem, limit)
    max_alloc = None
    try:
        max_alloc = int(dask_worker.plugins[PLUGIN_NAME].state.device.cl_device.max_mem_alloc_size)
    except Exception:
        pass
    import socket
    return {**d, "memory": memory, "memory_limit": limit, "max_alloc": max_alloc, "host": socket.gethostname()}


def device_limits(workers: dict) -> tuple[int | None, int | None]:
    """``(memory, max_alloc)`` a plan must fit: the smallest per-worker share over usable workers.

    Workers on one device (the same device id on the same host) share its memory.
    """
    share: dict = {}
    for d in workers.values():
        key = (d.get("host"), d["device"].id)
        share[key] = share.get(key, 0) + 1
    memory = max_alloc = None
    for d in workers.values():
        mem = d.get("memory")
        if mem is not None:
            mem //= share[(d.get("host"), d["device"].id)]
            memory = mem if memory is None else min(memory, mem)
        ma = d.get("max_alloc")
        if ma is not None:
            max_alloc = ma if max_alloc is None else min(max_alloc, ma)
    return memory, max_alloc


# Worker deaths a task of a DeviceCluster may see (see DeviceCluster).
ALLOWED_FAILURES = 10


class NoDeviceWorkerError(RuntimeError):
    """No worker of the cluster can run dgemm's GEMM tasks."""


class DeviceCluster(LocalCluster):
    """A local cluster with one worker process per OpenCL device.

    Parameters
    ----------
    devices : str, optional
        Which devices (see :func:`dgemm.opencl.discovery.select_devices`; default
        ``$DGEMM_DEVICES``, else all GPUs, else a CPU device).  Naming a
        device twice starts two workers on it.
    threads_per_worker : int
        Threads per worker: GEMM tasks run one at a time per device (they ask
        for ``GPU=1``), the others (reduce, store) use the rest.
    allowed_failures : int
        Worker deaths a task may see before the run fails with
        ``KilledWorker`` (the scheduler's ``allowed-failures``; dask's default
        is 3).  A dying worker counts against *every* task assigned to it,
        and GEMM tasks (resource-restricted, so never queued) are all assigned
        up front, so with dask's default a run survives only three worker
        deaths.  dgemm's default is :data:`ALLOWED_FAILURES`; a task that kills
        every worker it runs on still fails after that many restarts.
    **kwargs
        Passed to :class:`distributed.LocalCluster`.  The scheduler and the
        dashboard listen on localhost unless ``host``/``dashboard_address``
        say otherwise; ``memory_limit`` (per worker) defaults to the host's
        memory shared among the workers.
    """

    def __init__(self, devices: str | None = None, *, threads_per_worker: int = 2,
                 allowed_failures: int | None = None, **kwargs):
        import dask

        self.device_ids = [d.id for d in select_devices(devices)]
        kwargs.setdefault("host", "127.0.0.1")
        kwargs.setdefault("dashboard_address", "127.0.0.1:8787")
        kwargs.setdefault("resources", {"GPU": 1})
        kwargs.setdefault("silence_logs", logging.ERROR)
        # LocalCluster's "auto" gives each worker memory in proportion to its threads, which with
        # few threads per device is the whole host's memory each (or a sliver of it): share it.
        from distributed.system import MEMORY_LIMIT
        kwargs.setdefault("memory_limit", max(1, MEMORY_LIMIT // max(1, len(self.device_ids))))
        allowed = ALLOWED_FAILURES if allowed_failures is None else int(allowed_failures)
        with dask.config.set({"distributed.scheduler.allowed-failures": allowed}):  # read by the Scheduler
            super().__init__(n_workers=0, threads_per_worker=threads_per_worker, processes=True, **kwargs)
        self.scale(len(self.device_ids))
        self.sync(self._correct_state)

    def new_worker_spec(self):
        free = sorted(set(range(len(self.device_ids))) - set(self.worker_spec))
        if not free:
            raise ValueError(f"this cluster has {len(self.device_ids)} devices; it cannot have more workers")
        i = free[0]
        spec = copy.deepcopy(self.new_spec)
        env = dict(spec["options"].get("env") or {})
        env[ENV_DEVICE] = self.device_ids[i]
        # Several PoCL workers on one host must not each spawn a thread per core.
        n = len(self.device_ids)
        if n > 1 and "POCL_MAX_PTHREAD_COUNT" not in os.environ:
            env["POCL_MAX_PTHREAD_COUNT"] = str(max(1, (os.cpu_count() or 1) // n))
        # The host's cores shared out for reading blocks, at most 8 per device: on the H100 machine
        # (16 cores) 16 readers copied 1.1 GB/s each, 8 readers 3.4 GB/s each (2026-11-22).
        if "DGEMM_READ_THREADS" not in os.environ:
            env["DGEMM_READ_THREADS"] = str(reader_share(os.cpu_count() or 1, n))
        spec["options"].update(env=env, name=i)
        return {i: spec}


def reader_share(cpus: int, devices: int) -> int:
    """Reader threads per device worker on a host of ``cpus`` cores: its share of them, 2 to 8.

    >>> reader_share(64, 4), reader_share(16, 1), reader_share(2, 2), reader_share(12, 4)
    (8, 8, 2, 3)
    """
    return max(2, min(8, cpus // max(1, devices)))


def local_client(devices: str | None = None) -> Client:
    """The process-wide local :class:`DeviceCluster` client, started on first use."""
    key = devices or os.environ.get("DGEMM_DEVICES") or ""
    with _local_lock:
        entry = _local.get(key)
        if entry is not None and entry[1].status == "running":
            return entry[1]
        cluster = DeviceCluster(devices)
        client = Client(cluster, set_as_default=True)
        _local[key] = (cluster, client)
        return client


def close_local() -> None:
    """Shut down local clusters started by dgemm."""
    with _local_lock:
        for cluster, client in _local.values():
            client.close()
            cluster.close()
        _local.clear()


def get_client(client: Client | None = None, devices: str | None = None) -> Client:
    """``client``, else the current distributed client, else the local device cluster."""
    if client is not None:
        return client
    try:
        from distributed import default_client
        return default_client()
    except ValueError:
        return local_client(devices)


def prepare(client: Client, dtype, timeout: float | None = None) -> dict:
    """Make every worker dgemm-ready; return ``{address: description}`` of usable ones.

    Raises
    ------
    NoDeviceWorkerError
        When no worker (within ``timeout`` seconds, default
        ``$DGEMM_WORKER_TIMEOUT`` or 60) has a working device for ``dtype``.
    """
    import numpy as np

    timeout = float(os.environ.get("DGEMM_WORKER_TIMEOUT", 60)) if timeout is None else timeout
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        raise NoDeviceWorkerError(f"the cluster at {client.scheduler.address} has no workers "
                                  f"(waited {timeout:g} s)") from None
    infos = _describe_all(client)
    if any(v is None for v in infos.values()):
        if not _plugin_registered(client):
            client.register_plugin(DgemmPlugin(), name=PLUGIN_NAME)
        else:
            # Registered already: these workers are (re)starting and set it up
            # themselves.  Registering again would tear down every worker's
            # device under the tasks of runs in flight.
            _wait_for_plugin(client, infos, timeout)
        infos = _describe_all(client)
    dtype = np.dtype(dtype)
    usable, reasons = {}, []
    for addr, d in infos.items():
        if isinstance(d, BaseException):
            reasons.append(f"{addr}: did not answer ({type(d).__name__}: {d})")
        elif d is None or not d["ok"]:
            reasons.append(f"{addr}: {d['error'] if d else 'plugin missing'}")
        elif dtype == np.float64 and not d["device"].fp64:
            reasons.append(f"{addr}: {d['device'].name} has no double precision (cl_khr_fp64)")
        elif not d["resources"].get("GPU"):
            reasons.append(f"{addr}: no GPU resource")
        else:
            usable[addr] = d
    if not usable:
        raise NoDeviceWorkerError("no worker of the cluster can run dgemm's GEMM tasks for "
                                  f"{dtype}: " + "; ".join(reasons))
    return usable


def _plugin_registered(client) -> bool:
    try:
        return bool(client.run_on_scheduler(_scheduler_has_plugin))
    except Exception:  # an old scheduler, or a stand-in client
        return False


def _scheduler_has_plugin(dask_scheduler=None) -> bool:
    return PLUGIN_NAME in getattr(dask_scheduler, "worker_plugins", {})


def _wait_for_plugin(client, infos: dict, timeout: float) -> None:
    """Give workers that have not set up the plugin yet a moment (at most ``timeout``, 10 s)."""
    import time
    deadline = time.monotonic() + min(timeout, 10.0)
    while any(v is None for v in infos.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        infos = _describe_all(client)


def _describe_all(client) -> dict:
    """Every worker's :func:`describe_for_plan`; a worker that cannot answer (dying) gives its error."""
    return client.run(describe_for_plan, on_error="return")


def tiles_of(workers: dict, dtype, precision: str | None = None) -> tuple[int, int, int]:
    """Tile sizes every usable worker's kernel (for ``precision``) divides."""
    import numpy as np
    name = np.dtype(dtype).name if precision is None else f"{np.dtype(dtype).name}:{precision}"
    return lcm_tiles([KernelParams.from_dict(d["params"][name]["params"]) for d in workers.values()])

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

from .discovery import ENV_DEVICE, select_devices
from .params import KernelParams, lcm_tiles
from .worker import DgemmPlugin, describe_worker

_local: dict = {}
_local_lock = threading.Lock()


class NoDeviceWorkerError(RuntimeError):
    """No worker of the cluster can run dgemm's GEMM tasks."""


class DeviceCluster(LocalCluster):
    """A local cluster with one worker process per OpenCL device.

    Parameters
    ----------
    devices : str, optional
        Which devices (see :func:`dgemm.discovery.select_devices`; default
        ``$DGEMM_DEVICES``, else all GPUs, else a CPU device).  Naming a
        device twice starts two workers on it.
    threads_per_worker : int
        Threads per worker: GEMM tasks run one at a time per device (they ask
        for ``GPU=1``), the others (reduce, store) use the rest.
    **kwargs
        Passed to :class:`distributed.LocalCluster`.  The scheduler and the
        dashboard listen on localhost unless ``host``/``dashboard_address``
        say otherwise.
    """

    def __init__(self, devices: str | None = None, *, threads_per_worker: int = 2, **kwargs):
        self.device_ids = [d.id for d in select_devices(devices)]
        kwargs.setdefault("host", "127.0.0.1")
        kwargs.setdefault("dashboard_address", "127.0.0.1:8787")
        kwargs.setdefault("resources", {"GPU": 1})
        kwargs.setdefault("silence_logs", logging.ERROR)
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
        spec["options"].update(env=env, name=i)
        return {i: spec}


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
    infos = client.run(describe_worker)
    if any(v is None for v in infos.values()):
        client.register_plugin(DgemmPlugin(), name="dgemm")
        infos = client.run(describe_worker)
    dtype = np.dtype(dtype)
    usable, reasons = {}, []
    for addr, d in infos.items():
        if d is None or not d["ok"]:
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


def tiles_of(workers: dict, dtype) -> tuple[int, int, int]:
    """Tile sizes every usable worker's kernel divides."""
    import numpy as np
    name = np.dtype(dtype).name
    return lcm_tiles([KernelParams.from_dict(d["params"][name]["params"]) for d in workers.values()])

"""Worker side: the plugin that gives each Dask worker its OpenCL device.

As in dask-cuda, the device is picked by the worker's environment
(``DGEMM_DEVICE``), else the first GPU, else a CPU device; the context is
made here, in the worker process, never in the client.  A worker whose
device works advertises the resource ``GPU=1``, which the GEMM tasks ask for.
"""
from __future__ import annotations

import os
import threading

from distributed.diagnostics.plugin import WorkerPlugin

from .discovery import ENV_DEVICE, select_devices

PLUGIN_NAME = "dgemm"


class DeviceState:
    """A device and its engines (one per dtype), or the reason there is none."""

    def __init__(self, spec: str | None = None):
        from .device import Device

        self.device = None
        self.error = None
        self._engines: dict = {}
        self._lock = threading.Lock()
        try:
            info = select_devices(spec or os.environ.get(ENV_DEVICE) or None)[0]
            self.device = Device(info)
        except Exception as e:  # reported to the client by describe()
            self.error = f"{type(e).__name__}: {e}"

    def engine(self, dtype):
        from .device import DeviceError
        from .engine import BlockEngine
        import numpy as np

        if self.device is None:
            raise DeviceError(f"this worker has no usable OpenCL device ({self.error})")
        dtype = np.dtype(dtype)
        with self._lock:
            if dtype not in self._engines:
                self._engines[dtype] = BlockEngine(self.device, dtype)
            return self._engines[dtype]

    def describe(self) -> dict:
        """Plain data about this worker's device, for the client's checks and ``dgemm devices``."""
        if self.device is None:
            return {"ok": False, "error": self.error}
        info = self.device.info
        params = {}
        for dt in ("float32", "float64"):
            if dt == "float64" and not info.fp64:
                continue
            choice = self.device.choice(dt)
            params[dt] = {"params": choice.params.as_dict(), "source": choice.describe()}
        stats = {str(k): vars(e.stats) for k, e in self._engines.items()}
        return {"ok": True, "device": info, "params": params, "stats": stats}

    def close(self) -> None:
        for e in self._engines.values():
            e.release()
        self._engines.clear()


class DgemmPlugin(WorkerPlugin):
    """Open the worker's OpenCL device and advertise ``GPU=1`` when it works.

    Parameters
    ----------
    device : str, optional
        Device specification for every worker (see
        :func:`dgemm.discovery.select_devices`); by default each worker reads
        ``DGEMM_DEVICE`` from its environment.
    """

    name = PLUGIN_NAME

    def __init__(self, device: str | None = None):
        self.device_spec = device
        self.state: DeviceState | None = None

    async def setup(self, worker):
        self.state = DeviceState(self.device_spec)
        if self.state.device is not None:
            await worker.set_resources(GPU=1)
        elif worker.state.total_resources.get("GPU"):
            # Declared GPU=1 at start-up but the device does not work: take
            # the resource back so GEMM tasks are not sent here.
            await worker.set_resources(GPU=0)

    def teardown(self, worker):
        if self.state is not None:
            self.state.close()


_process_state: DeviceState | None = None
_process_lock = threading.Lock()


def device_state() -> DeviceState:
    """The device state of this process: the worker plugin's, or a process-wide one.

    The fallback serves dask's local schedulers (and tests' mock workers);
    under ``distributed`` the plugin is always there.
    """
    global _process_state
    try:
        from distributed import get_worker
        plugin = get_worker().plugins.get(PLUGIN_NAME)
        if plugin is not None and plugin.state is not None:
            return plugin.state
    except ValueError:
        pass
    with _process_lock:
        if _process_state is None:
            _process_state = DeviceState()
        return _process_state


def describe_worker(dask_worker=None) -> dict | None:
    """Run on a worker through ``client.run``: its dgemm state, or None if not prepared."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME) if dask_worker is not None else None
    if plugin is None or plugin.state is None:
        return None
    d = plugin.state.describe()
    d["resources"] = dict(dask_worker.state.total_resources)
    return d

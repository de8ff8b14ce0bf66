"""A worker's device and its engines, what they did, and how a task finds them.

:class:`DeviceState` opens the worker's OpenCL device, builds one
:class:`MeteredEngine` per dtype (and precision) and keeps the running
totals and recent block products that the worker metric reports.
:func:`device_state` is how a task finds its worker's state.
"""
from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import deque

import numpy as np
from distributed import get_worker
from distributed.core import Status
from distributed.metrics import context_meter

from dgemm import config
from dgemm.dtypes import PRECISIONS
from dgemm.names import COUNTERS, EXTRA, GEMM, TASK_SECONDS, WORKER_PLUGIN
from dgemm.opencl.device import Device, DeviceError
from dgemm.opencl.discovery import select_devices
from dgemm.opencl.engine import BlockEngine
from dgemm.plan import MEMORY_FRACTION

# Block products a worker remembers, and how old the ones it reports may be: the
# scheduler samples every second, so each product reaches it at least once.
EVENTS_KEPT = 512
EVENTS_SECONDS = 15.0


class MeteredEngine(BlockEngine):
    """A :class:`~dgemm.opencl.engine.BlockEngine` that also tells where a block product's time went.

    Besides the engine's :class:`~dgemm.opencl.engine.Stats`, each product adds to
    ``stats.extra``: ``read_wait_seconds`` (the product waiting for its
    inputs: the reading and uploading the pipeline did not hide) and
    ``transfer_seconds`` (uploads, padding, transposes and the download).
    Inside a Dask task the same figures go to distributed's Fine Performance
    Metrics (``dgemm-kernel``, ``dgemm-transfer``, ``dgemm-read-wait``
    seconds; ``dgemm-upload``/``dgemm-download`` bytes; ``dgemm-flop``).
    """

    def __init__(self, *args, on_product=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stats.extra.setdefault("read_wait_seconds", 0.0)
        self.stats.extra.setdefault("transfer_seconds", 0.0)
        self.on_product = on_product

    _FIELDS = ("flops", "bytes_up", "bytes_down", "kernel_seconds", "wait_seconds", "upload_seconds",
               "download_seconds")

    def _measured(self, fn):
        s = self.stats
        before = [getattr(s, f) for f in self._FIELDS]
        start = time.time()
        try:
            return fn()
        finally:
            flops, up, down, kernel, wait, upload, download = (
                getattr(s, f) - b for f, b in zip(self._FIELDS, before))
            transfer = upload + download
            s.extra["read_wait_seconds"] += wait
            s.extra["transfer_seconds"] += transfer
            _digest(kernel, transfer, wait, up, down, flops)
            if self.on_product is not None and flops:
                self.on_product(start, time.time(), flops, up + down)


def _digest(kernel, transfer, wait, up, down, flops) -> None:
    """Report one product to distributed's Fine Performance Metrics (a no-op outside a task)."""
    for label, value, unit in (("dgemm-kernel", kernel, "seconds"), ("dgemm-transfer", transfer, "seconds"),
                               ("dgemm-read-wait", wait, "seconds"), ("dgemm-upload", up, "bytes"),
                               ("dgemm-download", down, "bytes"), ("dgemm-flop", flops, "flop")):
        if value:
            context_meter.digest_metric(label, value, unit)


def device_memory(info) -> int:
    """Bytes dgemm may assume a device has: its global memory, capped by ``device-memory-limit`` (read here)."""
    limit = config.get("device-memory-limit")
    return info.global_mem if limit is None else min(info.global_mem, limit)


class DeviceState:
    """A device and its engines (one per dtype), or the reason there is none.

    Parameters
    ----------
    spec : str, optional
        Device specification (see :func:`dgemm.opencl.discovery.select_devices`);
        by default the ``device`` setting (``DGEMM_DEVICE``, see :mod:`dgemm.config`).
    """

    def __init__(self, spec: str | None = None):
        self.device = None
        self.error = None
        self._engines: dict = {}
        self._lock = threading.Lock()
        self.started = time.time()
        # (seq, start, end, flops, bytes) of recent block products: the dashboard's time series
        self.events: deque = deque(maxlen=EVENTS_KEPT)
        self._seq = itertools.count(1)
        try:
            info = select_devices(spec or config.get("device"))[0]
            self.device = Device(info)
        except Exception as e:  # reported to the client by describe()
            self.error = f"{type(e).__name__}: {e}"

    def engine(self, dtype, precision: str | None = None):
        """The engine for ``dtype`` and ``precision`` (see :func:`dgemm.tuning.database.lookup`), built once."""
        if self.device is None:
            raise DeviceError(f"this worker has no usable OpenCL device ({self.error})")
        dtype = np.dtype(dtype)
        key = dtype if precision is None else (dtype, precision)
        with self._lock:
            if key not in self._engines:
                params = self.device.choice(dtype, precision).params
                self._engines[key] = MeteredEngine(self.device, dtype, params, on_product=self._record)
            return self._engines[key]

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
            for prec in PRECISIONS[dt]:  # what each precision= would run here
                c = self.device.choice(dt, prec)
                params[f"{dt}:{prec}"] = {"params": c.params.as_dict(), "source": c.describe(), "note": c.note}
        stats = {str(k): vars(e.stats) for k, e in self._engines.items()}
        return {"ok": True, "device": info, "params": params, "stats": stats}

    def _record(self, start: float, end: float, flops: float, nbytes: float) -> None:
        self.events.append((next(self._seq), start, end, flops, nbytes))

    def totals(self) -> dict:
        """:data:`dgemm.names.COUNTERS` summed over this device's engines (zeros before the first product)."""
        out = dict.fromkeys(COUNTERS, 0.0)
        out["blocks"] = 0
        for e in list(self._engines.values()):
            st = e.stats
            for k in COUNTERS:
                out[k] += st.extra.get(k, 0.0) if k in EXTRA else getattr(st, k)
        if self.device is not None:
            out.update(self.device.cache.stats())
        return out

    def plan_cache(self, reserve: int) -> int:
        """Give the panel cache the device memory a run leaves: its share less ``reserve`` bytes.

        ``reserve`` is what the plan says one block product holds besides
        its cached inputs (accumulator, staging, inputs in flight).  The
        share is :data:`dgemm.plan.MEMORY_FRACTION` of the device memory,
        or of the ``device-memory-limit`` setting (``DGEMM_DEVICE_MEMORY_LIMIT``)
        when that is smaller; CPU devices (whose memory is the host's) keep
        a quarter of it.
        """
        info = self.device.info
        share = MEMORY_FRACTION * device_memory(info) * (0.25 if info.type == "CPU" else 1.0)
        self.device.cache.budget = max(0, int(share - reserve))
        return self.device.cache.budget

    def snapshot(self, dask_worker=None) -> dict:
        """Plain data for the dashboard and the metrics: the device and its running totals.

        With ``dask_worker``, also the seconds of its store, load and reduce
        tasks (:func:`task_seconds`) and how many GEMM tasks it is running now.
        """
        info = self.device.info if self.device is not None else None
        snap = {
            "time": time.time(), "started": self.started, "ok": self.device is not None, "error": self.error,
            "device": info.name if info else None, "device_id": info.id if info else None,
            "device_type": info.type if info else None, "driver": info.driver if info else None,
            "dtypes": sorted(str(k) for k in self._engines),
            **self.totals(), **dict.fromkeys(TASK_SECONDS, 0.0), "gemm_running": 0,
            # products of the last seconds; the scheduler keeps those with a new sequence number
            "events": [e for e in list(self.events) if e[2] >= time.time() - EVENTS_SECONDS],
        }
        if dask_worker is not None:
            snap.update(task_seconds(dask_worker))
            snap["gemm_running"] = sum(1 for ts in getattr(dask_worker.state, "executing", ())
                                       if str(getattr(ts, "prefix", "")).startswith(GEMM))
        return snap

    def close(self) -> None:
        for e in self._engines.values():
            e.release()
        self._engines.clear()


def task_seconds(dask_worker) -> dict:
    """Seconds a worker spent executing dgemm's store, load and reduce tasks, from its Fine Performance Metrics.

    >>> class W:
    ...     digests_total = {("execute", "span-1", "dgemm-store", "thread-cpu", "seconds"): 1.5,
    ...                      ("execute", "dgemm-store", "memory-read", "bytes"): 99.0}
    >>> task_seconds(W())
    {'store_seconds': 1.5, 'load_seconds': 0.0, 'reduce_seconds': 0.0}
    """
    out = dict.fromkeys(TASK_SECONDS, 0.0)
    digests = getattr(dask_worker, "digests_total", None) or {}
    for key, value in list(digests.items()):
        # ("execute", span_id, prefix, activity, unit), or without the span id
        if not (isinstance(key, tuple) and len(key) >= 4 and key[0] == "execute" and key[-1] == "seconds"):
            continue
        prefix = key[-3]
        for name, p in TASK_SECONDS.items():
            if isinstance(prefix, str) and prefix.startswith(p):
                out[name] += value
    return out


# The states of this process's dgemm workers (state -> weak reference to its
# worker): device_state() outside a task, and the Prometheus collector, find them here.
_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ALIVE = {Status.init, Status.running, Status.paused}


def attach(state: DeviceState, worker) -> None:
    """Make ``state`` the device state of ``worker``, a worker of this process (the plugin's set-up)."""
    _ATTACHED[state] = weakref.ref(worker)


def detach(state: DeviceState) -> None:
    """Forget ``state``'s worker (the plugin's teardown)."""
    _ATTACHED.pop(state, None)


def live_states() -> list:
    """``(worker, state)`` for every running worker of this process with an attached device state."""
    out = []
    for state, ref in list(_ATTACHED.items()):
        w = ref()
        if w is not None and getattr(w, "status", None) in _ALIVE:
            out.append((w, state))
    return out


_process_state: DeviceState | None = None
_process_lock = threading.Lock()


def device_state() -> DeviceState:
    """The device state of this process: the worker plugin's, or a process-wide one.

    The fallback serves dask's local schedulers (and tests' mock workers);
    under ``distributed`` the plugin is always there.
    """
    global _process_state
    try:
        plugin = get_worker().plugins.get(WORKER_PLUGIN)
        if plugin is not None and plugin.state is not None:
            return plugin.state
    except ValueError:   # not in a task: e.g. ``client.run``; a worker process holds one live state
        live = [s for _, s in live_states()]
        if len(live) == 1:
            return live[0]
    with _process_lock:
        if _process_state is None:
            _process_state = DeviceState()
        return _process_state


def build_kernels(dtype, precision: str | None = None, dask_worker=None) -> float:
    """Run on a worker (``client.run``): build its engine for ``dtype`` and ``precision`` now.

    So that a timed run that follows compiles nothing.  A worker without the
    dgemm plugin or without a usable device builds nothing.

    Parameters
    ----------
    dtype : str or numpy.dtype
        The element type of the product to come.
    precision : str, optional
        Its ``precision=`` option (see :data:`dgemm.dtypes.PRECISIONS`).
    dask_worker : distributed.Worker, optional
        Passed by ``client.run``.

    Returns
    -------
    float
        Seconds the building took.

    Examples
    --------
    >>> build_kernels("float32") >= 0   # no worker: nothing to build
    True
    """
    t0 = time.perf_counter()
    plugin = dask_worker.plugins.get(WORKER_PLUGIN) if dask_worker is not None else None
    state = plugin.state if plugin is not None else None
    if state is not None and state.device is not None:
        state.engine(dtype, precision)
    return time.perf_counter() - t0

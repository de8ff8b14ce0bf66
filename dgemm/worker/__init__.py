"""Worker side: the plugin that gives each Dask worker its OpenCL device.

As in dask-cuda, the device is picked by the worker's environment
(``DGEMM_DEVICE``), else the first GPU, else a CPU device; the context is
made here, in the worker process, never in the client.  A worker whose
device works advertises the resource ``GPU=1``, which the GEMM tasks ask for.

The plugin also makes the worker report what its device does: a worker
metric (``dgemm``, sent to the scheduler with every heartbeat, read there by
the dashboard page :mod:`dgemm.scheduler.dashboard`), the ``dgemm_*`` Prometheus
series on the worker's ``/metrics`` (:mod:`dgemm.metrics`), and Fine
Performance Metrics of the GEMM tasks (kernel, transfer and read-wait
seconds, bytes up and down, flop) through distributed's ``context_meter``.

``dask worker --preload dgemm.worker`` installs the plugin at start-up too.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections import deque

from distributed.core import Status
from distributed.diagnostics.plugin import WorkerPlugin

from dgemm.opencl.discovery import ENV_DEVICE, select_devices
from dgemm.tuning.database import PRECISIONS
from dgemm.opencl.engine import BlockEngine

PLUGIN_NAME = "dgemm"
METRIC_NAME = "dgemm"  # key of the worker metric in the scheduler's WorkerState.metrics

logger = logging.getLogger(__name__)

# Counters of one device, summed over its engines (one per dtype); the
# dashboard, the Prometheus collector and ``describe()`` read these names.
COUNTERS = ("flops", "bytes_up", "bytes_down", "kernel_seconds", "busy_seconds", "blocks",
            "transfer_seconds", "read_wait_seconds", "bytes_read", "read_seconds", "upload_seconds",
            "download_seconds")
EXTRA = ("transfer_seconds", "read_wait_seconds")   # kept in Stats.extra, the others are Stats fields
# Block products a worker remembers, and how old the ones it reports may be: the
# scheduler samples every second, so each product reaches it at least once.
EVENTS_KEPT = 512
EVENTS_SECONDS = 15.0
# Seconds of the other dgemm tasks, from the worker's Fine Performance Metrics.
TASK_SECONDS = {"store_seconds": "dgemm-store", "load_seconds": "dgemm-load", "reduce_seconds": "dgemm-reduce"}


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
    try:
        from distributed.metrics import context_meter
    except ImportError:  # pragma: no cover - distributed is a dependency
        return
    for label, value, unit in (("dgemm-kernel", kernel, "seconds"), ("dgemm-transfer", transfer, "seconds"),
                               ("dgemm-read-wait", wait, "seconds"), ("dgemm-upload", up, "bytes"),
                               ("dgemm-download", down, "bytes"), ("dgemm-flop", flops, "flop")):
        if value:
            context_meter.digest_metric(label, value, unit)


class DeviceState:
    """A device and its engines (one per dtype), or the reason there is none."""

    def __init__(self, spec: str | None = None):
        from dgemm.opencl.device import Device

        self.device = None
        self.error = None
        self._engines: dict = {}
        self._lock = threading.Lock()
        self.started = time.time()
        # (seq, start, end, flops, bytes) of recent block products: the dashboard's time series
        self.events: deque = deque(maxlen=EVENTS_KEPT)
        self._seq = itertools.count(1)
        try:
            info = select_devices(spec or os.environ.get(ENV_DEVICE) or None)[0]
            self.device = Device(info)
        except Exception as e:  # reported to the client by describe()
            self.error = f"{type(e).__name__}: {e}"

    def engine(self, dtype, precision: str | None = None):
        """The engine for ``dtype`` and ``precision`` (see :func:`dgemm.tuning.database.lookup`), built once."""
        from dgemm.opencl.device import DeviceError
        import numpy as np

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
        """:data:`COUNTERS` summed over this device's engines (zeros before the first product)."""
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
        or of ``DGEMM_DEVICE_MEMORY_LIMIT`` when that is smaller; CPU
        devices (whose memory is the host's) keep a quarter of it.
        """
        from dgemm.cluster import ENV_MEMORY_LIMIT, memory_limit_from_env
        from dgemm.plan import MEMORY_FRACTION

        info = self.device.info
        memory = info.global_mem
        limit = memory_limit_from_env(os.environ.get(ENV_MEMORY_LIMIT))
        if limit:
            memory = min(memory, limit)
        share = MEMORY_FRACTION * memory * (0.25 if info.type == "CPU" else 1.0)
        self.device.cache.budget = max(0, int(share - reserve))
        return self.device.cache.budget

    def snapshot(self, dask_worker=None) -> dict:
        """Plain data for the dashboard and the metrics: the device and its running totals.

        With ``dask_worker``, also the seconds of its store, load and reduce
        tasks (from the worker's Fine Performance Metrics) and how many GEMM
        tasks it is running now.
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
            snap.update(_task_seconds(dask_worker))
            snap["gemm_running"] = sum(1 for ts in getattr(dask_worker.state, "executing", ())
                                       if str(getattr(ts, "prefix", "")).startswith("dgemm-gemm"))
        return snap

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
        :func:`dgemm.opencl.discovery.select_devices`); by default each worker reads
        ``DGEMM_DEVICE`` from its environment.
    """

    name = PLUGIN_NAME

    def __init__(self, device: str | None = None, dashboard: bool = True):
        self.device_spec = device
        self.dashboard = dashboard
        self.state: DeviceState | None = None
        self.worker = None

    def __getstate__(self):  # a registered plugin travels to the workers without its state
        return {"device_spec": self.device_spec, "dashboard": self.dashboard, "state": None, "worker": None}

    async def setup(self, worker):
        self.state = DeviceState(self.device_spec)
        if self.state.device is not None:
            await _set_gpu(worker, 1)
        elif worker.state.total_resources.get("GPU"):
            # Declared GPU=1 at start-up but the device does not work: take
            # the resource back so GEMM tasks are not sent here.
            await _set_gpu(worker, 0)
        if getattr(worker, "address", None) is None:  # a stand-in worker (tests): no reporting
            return
        self.worker = weakref.ref(worker)
        # Reported to the scheduler with every heartbeat (WorkerState.metrics["dgemm"]).
        worker.metrics[METRIC_NAME] = self.metric
        _LIVE_PLUGINS.add(self)
        from dgemm import metrics
        metrics.register()
        if self.dashboard:
            await _register_dashboard(worker)

    def metric(self, dask_worker=None) -> dict:
        """The worker metric: :meth:`DeviceState.snapshot` of this worker's device."""
        if self.state is None:
            return {}
        return self.state.snapshot(dask_worker)

    def teardown(self, worker):
        _LIVE_PLUGINS.discard(self)
        metrics = getattr(worker, "metrics", None)
        if isinstance(metrics, dict) and metrics.get(METRIC_NAME) == self.metric:
            del metrics[METRIC_NAME]
        if self.state is not None:
            self.state.close()


async def _set_gpu(worker, value: int) -> None:
    """Set the worker's ``GPU`` resource; before it has registered with the scheduler, locally.

    Plugins given at start-up (``Worker(plugins=...)``, ``dgemm worker``, the
    preload) are set up before the worker registers: the scheduler does not
    know the worker yet, and the registration carries the resources anyway.
    """
    if getattr(worker, "status", None) == Status.init:
        st = worker.state
        st.available_resources["GPU"] = st.available_resources.get("GPU", 0) + value - st.total_resources.get("GPU", 0)
        st.total_resources["GPU"] = value
        return
    await worker.set_resources(GPU=value)


# Plugins of the live workers of this process, for the Prometheus collector.
_LIVE_PLUGINS: weakref.WeakSet = weakref.WeakSet()
_ALIVE = {Status.init, Status.running, Status.paused}


def live_plugins() -> list:
    """``(worker, plugin)`` for every running worker of this process with the dgemm plugin."""
    out = []
    for plugin in list(_LIVE_PLUGINS):
        w = plugin.worker() if plugin.worker is not None else None
        if w is not None and plugin.state is not None and getattr(w, "status", None) in _ALIVE:
            out.append((w, plugin))
    return out


def _task_seconds(dask_worker) -> dict:
    """Seconds the worker spent executing dgemm's store, load and reduce tasks, from its Fine Performance Metrics."""
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


async def _register_dashboard(worker) -> None:
    """Make sure the scheduler serves the dgemm dashboard page (once; any worker may ask first)."""
    from distributed.protocol.pickle import dumps

    from dgemm.scheduler.dashboard import PLUGIN_NAME as DASHBOARD, DgemmDashboard
    try:
        await worker.scheduler.register_scheduler_plugin(plugin=dumps(DgemmDashboard()), name=DASHBOARD,
                                                         idempotent=True)
    except Exception as e:  # e.g. dgemm not installed where the scheduler runs: only the page is missing
        logger.warning("dgemm: could not add the dashboard page to the scheduler: %s: %s", type(e).__name__, e)


def dask_setup(worker):
    """Preload hook: ``dask worker --preload dgemm.worker`` installs the plugin at start-up."""
    worker._pending_plugins = (*getattr(worker, "_pending_plugins", ()), DgemmPlugin())


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
    except ValueError:   # not in a task: e.g. ``client.run``; a worker process holds one live plugin
        live = [p.state for _, p in live_plugins()]
        if len(live) == 1:
            return live[0]
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

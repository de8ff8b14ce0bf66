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
from distributed.worker import thread_state

from dgemm import busy, config
from dgemm.dtypes import PRECISIONS
from dgemm.names import COUNTERS, EXTRA, GEMM, TASK_SECONDS, WORKER_PLUGIN
from dgemm.opencl.device import Device, DeviceError
from dgemm.opencl.discovery import select_devices
from dgemm.opencl import nogil
from dgemm.opencl.engine import BlockEngine
from dgemm.sizes import cache_budget
from dgemm.storage import sharing, zstd
from dgemm.storage import fastpaths
from dgemm.worker import encoding

# Block products a worker remembers, and how old the ones it reports may be: the
# scheduler samples every second, so each product reaches it at least once.
EVENTS_KEPT = 512
EVENTS_SECONDS = 15.0
# Transfer commands an engine holds until a product's busy time is split (uploads run ahead of it),
# and the products whose split waits for the next snapshot.
TRANSFERS_KEPT = 4096
UNSETTLED_KEPT = 64
# Seconds without a block product after which a worker gives back what its last run held
# (DeviceState.release_idle): the fallback where no run's end was seen (dgemm.worker.DgemmPlugin
# sees it in the task transitions, and releases at once).
IDLE_SECONDS = 10.0


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``), where there is one.

    A run's many reader and decode threads each allocate in glibc arenas
    of their own (chunk bytes, zstd contexts, PoCL's buffers); freed, those
    pages stay in the process until the arena's top is free, so an idle
    worker's RSS stayed megabytes above its idle figure, more with more
    threads (dask's documentation gives the same call as ``trim_memory``).
    """
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC = libc.malloc_trim
        except (OSError, AttributeError):   # not glibc (musl, macOS, Windows): nothing to trim
            _LIBC = False
    if _LIBC:
        _LIBC(0)


_LIBC = None


class MeteredEngine(BlockEngine):
    """A :class:`~dgemm.opencl.engine.BlockEngine` that also tells where a block product's time went.

    Besides the engine's :class:`~dgemm.opencl.stats.Stats`, each product adds to
    ``stats.extra``:

    * the parts of its busy time (:mod:`dgemm.busy`: ``busy_kernel_seconds``,
      ``busy_transfer_seconds``, ``busy_read_seconds``, ``busy_other_seconds``),
      exclusive, adding up to ``busy_seconds``; measured by a sweep over the
      product's GEMM kernels and transfer commands (their OpenCL profiling
      events) and its waits for inputs (host timestamps);
    * overlapping totals: ``read_wait_seconds`` (the product waiting for its
      inputs, while kernels may still run) and ``transfer_seconds`` (uploads,
      padding, transposes and the download, summed over the threads that do
      them).

    Inside a Dask task the overlapping figures also go to distributed's Fine
    Performance Metrics (``dgemm-kernel``, ``dgemm-transfer``,
    ``dgemm-read-wait`` seconds; ``dgemm-upload``/``dgemm-download`` bytes;
    ``dgemm-flop``).  :meth:`progress` tells how far the product in flight is.
    """

    def __init__(self, *args, on_product=None, **kwargs):
        super().__init__(*args, **kwargs)
        for key in ("read_wait_seconds", "transfer_seconds", "busy_split_seconds", *busy.KEYS.values()):
            self.stats.extra.setdefault(key, 0.0)
        self.on_product = on_product
        self.running: Running | None = None
        # Transfer commands not yet counted: an upload for a later product may finish after this one.
        self._transfers: deque = deque(maxlen=TRANSFERS_KEPT)
        self._offset: float | None = None   # the device clock's offset, as the last product measured it
        # Products whose busy time is not split yet: splitting queries every command's profiling
        # information, which is done by settle() (the heartbeat's snapshot), not on the task's path.
        self._unsettled: deque = deque()
        self._settle = threading.Lock()

    # Added by the reader threads, ahead of the products: a product's share is the stats' growth meanwhile.
    _AHEAD = ("bytes_up", "upload_seconds")
    # Added by the product's own thread: its share is what that thread added (products may overlap).
    _OWN = ("flops", "bytes_down", "kernel_seconds", "wait_seconds", "download_seconds")

    def _measured(self, fn, planned=None):
        s = self.stats
        before = [getattr(s, f) for f in self._AHEAD]
        # products overlap (one's download with the next one's kernels, or tasks that lost their GPU annotation)
        tally = self._mine.tally = {}
        start = time.time()
        run = self.running = Running(_task_key(), planned)
        run.marks.append(self._mark())
        try:
            return fn()
        except BaseException:
            # A failed product's kernels count nowhere: kernel_seconds is what its finished products
            # add, and the split must not give its busy time to kernels that total never saw.
            run.gemms.clear()
            raise
        finally:
            self._mine.tally = None
            up, upload = (getattr(s, f) - b for f, b in zip(self._AHEAD, before))
            flops, down, kernel, wait, download = (tally.get(f, 0) for f in self._OWN)
            transfer = upload + download
            with self._count:
                s.extra["read_wait_seconds"] += wait
                s.extra["transfer_seconds"] += transfer
            _digest(kernel, transfer, wait, up, down, flops)
            if self.on_product is not None and flops:
                self.on_product(start, time.time(), flops, up + down, run.key)

    # the engine's hooks (see BlockEngine): each only notes what it is given
    def _waited(self, start, end):
        if self.running is not None:
            self.running.waits.append((start, end))

    def _launched(self, event, flops):
        if self.running is not None:
            self.running.gemms.append((event, flops))

    def _transferred(self, event):
        if event is not None:
            self._transfers.append(event)

    def _handoff(self):
        # the next product sets running as soon as it has the lock: this one keeps its own
        run, self.running = self.running, None
        return run or Running(None)

    def _busy(self, start, end, handed=None):
        if handed is None:
            run, self.running = self.running, None
        else:
            run = handed
        if run is not None:
            run.marks.append(self._mark())
        start = super()._busy(start, end)
        self._unsettled.append((run or Running(None), start, end))
        if len(self._unsettled) > UNSETTLED_KEPT or len(self._transfers) > TRANSFERS_KEPT // 2:
            self.settle()   # nobody has asked for the figures for a while: keep what waits bounded

    def _mark(self):
        """``(marker, before, after)``: a marker on the compute queue and the host times around its enqueueing.

        The device stamps a command's ``CL_PROFILING_COMMAND_QUEUED`` in
        between, which places the device's clock on the host's
        (:func:`dgemm.busy.clock_offset`).  A marker, not the GEMM kernels:
        NVIDIA's driver stamps a kernel that waits for the transfer queue's
        events when they are done, tens of milliseconds late on an H100.
        """
        import pyopencl as cl

        q = self.device.queue
        before = time.perf_counter()
        try:
            ev = nogil.enqueue_marker(q)     # (the driver may wait in it: without Python's lock)
            nogil.flush(q)
        except Exception:   # no calibration is better than a failed product
            return None
        return ev, before, time.perf_counter()

    def settle(self) -> None:
        """Split the busy time of the products finished since the last call, and count it.

        Adds ``busy_seconds`` (the split busy time, which the parts add up
        to: :meth:`DeviceState.totals` reports this one) together with the
        parts, under the lock the totals are read with.
        """
        with self._settle:
            while self._unsettled:
                run, start, end = self._unsettled.popleft()
                parts = self.split(run, start, end)
                with self._count:
                    extra = self.stats.extra
                    extra["busy_split_seconds"] += end - start
                    for part, seconds in parts.items():
                        extra[busy.KEYS[part]] += seconds

    def split(self, run: Running, start: float, end: float) -> dict:
        """The parts of one product's busy window ``[start, end]`` (:func:`dgemm.busy.split`).

        Products must be split in the order they ran: transfer commands
        that reach past one product's end are kept for the next.
        """
        offset = busy.clock_offset((b, a, q) for ev, b, a in filter(None, run.marks)
                                   if (q := _queued(ev)) is not None)
        kernel = []
        if offset is not None:
            kernel = [iv for ev, _ in run.gemms if (iv := _interval(ev, offset)) is not None]
        if kernel and (kernel[0][0] < start - 1.0 or kernel[-1][1] > end + 1.0):
            # kernels placed outside their product: a runtime whose queued stamps do not follow
            # the enqueue; better no device intervals than wrong ones
            offset, kernel = None, []
        elif offset is None:
            offset = self._offset   # no kernel of its own (K = 0): the transfers on the last product's clock
        self._offset = offset
        if offset is None:   # no device command to place on the host's clock
            return busy.split(start, end, read=run.waits)
        transfer, keep = [], []
        for _ in range(len(self._transfers)):
            ev = self._transfers.popleft()
            iv = _interval(ev, offset)
            if iv is None:
                status = _status(ev)
                if status is not None and status > COMPLETE:
                    keep.append(ev)              # still to run: counts in the product it overlaps
                continue                         # failed: nothing to count
            transfer.append(iv)
            if iv[1] > end:
                keep.append(ev)                  # reaches into the next product's time too
        self._transfers.extend(keep)
        return busy.split(start, end, kernel, transfer, run.waits)

    def progress(self) -> dict | None:
        """How far the product in flight is: k steps and flops whose GEMM kernel has finished; None when idle.

        ``steps_total`` and ``flops_total`` are None where the product's
        steps are not known ahead (:meth:`~dgemm.opencl.engine.BlockEngine.product`
        from a generator).  Asks the device only for the status of the
        kernels not yet seen finished (a queue runs them in order).
        """
        run = self.running
        if run is None:
            return None
        gemms = list(run.gemms)
        while run.finished < len(gemms) and _status(gemms[run.finished][0]) == COMPLETE:
            run.finished += 1
        steps, flops = run.planned if run.planned is not None else (None, None)
        return {"key": run.key, "steps_done": run.finished, "steps_total": steps,
                "flops_done": sum(f for _, f in gemms[:run.finished]), "flops_total": flops}


class Running:
    """A product in flight: its task, its plan, its GEMM kernels and its waits for inputs so far."""

    __slots__ = ("key", "planned", "gemms", "waits", "marks", "finished")

    def __init__(self, key, planned=None):
        self.key, self.planned = key, planned
        self.gemms: list = []      # (event, flops)
        self.waits: list = []      # (start, end) on the host's clock
        self.marks: list = []      # MeteredEngine._mark() at the start and the end
        self.finished = 0          # GEMM kernels seen finished (progress)


# OpenCL's numbers (the spec's, so this module need not import pyopencl): queried directly, as
# Event.get_info and get_profiling_info cost a tenth of pyopencl's Event.profile attributes.
COMPLETE = 0                  # CL_COMPLETE
_STATUS = 0x11D3              # CL_EVENT_COMMAND_EXECUTION_STATUS
_QUEUED, _START, _END = 0x1280, 0x1282, 0x1283    # CL_PROFILING_COMMAND_QUEUED, _START, _END


def _status(event) -> int | None:
    try:
        return event.get_info(_STATUS)
    except Exception:   # a released or invalid event
        return None


def _queued(event) -> float | None:
    try:
        return event.get_profiling_info(_QUEUED) * 1e-9
    except Exception:   # not finished (the product failed): no profiling information
        return None


def _interval(event, offset: float) -> tuple[float, float] | None:
    """When a finished command ran, on the host's clock; None without profiling information."""
    try:
        return event.get_profiling_info(_START) * 1e-9 + offset, event.get_profiling_info(_END) * 1e-9 + offset
    except Exception:   # not finished yet, or failed
        return None


def _task_key():
    """The key of the Dask task running in this thread, if any."""
    key = getattr(thread_state, "key", None)
    return key if isinstance(key, (str, tuple)) else None


def _digest(kernel, transfer, wait, up, down, flops) -> None:
    """Report one product to distributed's Fine Performance Metrics (a no-op outside a task)."""
    for label, value, unit in (("dgemm-kernel", kernel, "seconds"), ("dgemm-transfer", transfer, "seconds"),
                               ("dgemm-read-wait", wait, "seconds"), ("dgemm-upload", up, "bytes"),
                               ("dgemm-download", down, "bytes"), ("dgemm-flop", flops, "flop")):
        if value:
            context_meter.digest_metric(label, value, unit)


def device_memory(info) -> int:
    """Bytes dgemm may assume a device has: its global memory, capped by ``device-memory-limit`` (read here:
    bytes, or a fraction of this device's memory)."""
    limit = config.get("device-memory-limit")
    limit = int(limit * info.global_mem) if isinstance(limit, float) else limit
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
        # (seq, start, end, flops, bytes, task key) of recent block products: the dashboard's time series
        self.events: deque = deque(maxlen=EVENTS_KEPT)
        self._seq = itertools.count(1)
        # When a product last started or ended, and whether what it held was given back since (release).
        self.last_used = time.time()
        self.released = True
        try:
            info = select_devices(spec or config.get("device"))[0]
            self.device = Device(info)
        except Exception as e:  # reported to the client by describe()
            self.error = f"{type(e).__name__}: {e}"

    def engine(self, dtype, precision: str | None = None):
        """The engine for ``dtype`` and ``precision`` (see :func:`dgemm.opencl.database.lookup`), built once."""
        if self.device is None:
            raise DeviceError(f"this worker has no usable OpenCL device ({self.error})")
        dtype = np.dtype(dtype)
        key = dtype if precision is None else (dtype, precision)
        with self._lock:
            self.last_used, self.released = time.time(), False
            if key not in self._engines:
                params = self.device.choice(dtype, precision).params
                self._engines[key] = MeteredEngine(self.device, dtype, params, on_product=self._record)
            return self._engines[key]

    def siblings(self) -> bool:
        """Whether other dgemm workers with a device run in this process (``worker-process: host``): the
        input blocks several of them read are then decoded once (:mod:`dgemm.storage.sharing`)."""
        return any(s is not self and s.device is not None for _, s in live_states())

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

    def _record(self, start: float, end: float, flops: float, nbytes: float, key=None) -> None:
        self.events.append((next(self._seq), start, end, flops, nbytes, key))
        self.last_used = time.time()

    def release(self, scope=None, others: bool = False, idle: bool = True) -> dict | None:
        """Give back what a finished run held on this worker: its panel cache entries, then, if no other run
        is going on (``others``), the engines' accumulators and page-locked memory.

        Called when the worker sees run ``scope``'s last block product here
        end (:meth:`dgemm.worker.DgemmPlugin.transition`, ``idle=False``:
        page-locked memory, one staging buffer per reader thread and the
        download buffers, stays for the next run, see
        :meth:`~dgemm.opencl.device.Device.trim`) and after
        :data:`IDLE_SECONDS` without a product (:meth:`release_idle`: all but
        the readers' default staging buffers).  Never waits: an engine
        running a product keeps its buffers (its run is not over).  Within a
        run nothing is released, so its products reuse their buffers.

        Returns
        -------
        dict or None
            The device's :meth:`~dgemm.opencl.device.Device.live_buffers`
            afterwards; None without a device.
        """
        if self.device is None:
            return None
        if scope is not None:
            self.device.cache.drop(lambda s: s == scope)
        if others:
            return self.device.live_buffers()
        with self._lock:
            engines = list(self._engines.values())
        if all([e.release(wait=False) for e in engines]):   # each engine, not only up to the first busy one
            self.device.trim(keep_pinned=not idle)
            encoding.release(self.device)   # (the blocks still being encoded keep theirs until they are done)
            zstd.release()   # the threads' zstd contexts and buffers (made again for the next run's chunks)
            if idle:
                if not self.siblings():   # (with others in this process, the end of each run drops its blocks)
                    sharing.drop()
                _trim_heap()
            self.released = idle
        return self.device.live_buffers()

    def release_idle(self, seconds: float | None = None) -> bool:
        """:meth:`release` if no product ran for ``seconds`` (:data:`IDLE_SECONDS`); whether it released."""
        seconds = IDLE_SECONDS if seconds is None else seconds
        if self.released or self.device is None or time.time() - self.last_used < seconds:
            return False
        if any(e.running is not None for e in list(self._engines.values())):
            return False
        self.release()
        return self.released

    def totals(self) -> dict:
        """:data:`dgemm.names.COUNTERS` and the parts of the busy time summed over this device's engines.

        Zeros before the first product.  The parts (:data:`dgemm.busy.KEYS`)
        add up to ``busy_seconds``: both count the products split so far
        (:meth:`MeteredEngine.settle`, called here first), and an engine's
        figures are read together, never in the middle of an update.
        """
        out = dict.fromkeys((*COUNTERS, *busy.KEYS.values()), 0.0)
        out["blocks"] = 0
        for e in list(self._engines.values()):
            e.settle()
            st = e.stats
            with e._count:
                for k in COUNTERS:
                    # busy: of the products split so far (one may have finished since settle())
                    key = "busy_split_seconds" if k == "busy_seconds" else k
                    out[k] += st.extra.get(key, 0.0) if key in EXTRA or key in st.extra else getattr(st, key)
                for k in busy.KEYS.values():
                    out[k] += st.extra.get(k, 0.0)
        if self.device is not None:
            out.update(self.device.cache.stats())
            out.update({f"live_{k}": v for k, v in self.device.live_buffers().items()})
        paths = fastpaths.snapshot()   # this process's chunk reads and writes, by path (all its devices')
        if not self._reports_process():
            paths = dict.fromkeys(paths, 0)
        out.update(paths)
        return out

    def _reports_process(self) -> bool:
        """Whether this state reports the process's own counters: the first live worker's of the process
        does (several workers in one process, ``worker-process: host``, would count them each)."""
        live = [s for _, s in live_states()]
        return self not in live or live[0] is self

    def memory_share(self) -> int:
        """Device bytes a run may hold here (the panel cache and what a product holds beside it):
        :func:`~dgemm.sizes.cache_budget` with nothing reserved."""
        info = self.device.info
        return cache_budget(device_memory(info), 0, info.type)

    def plan_cache(self, reserve: int) -> int:
        """Give the panel cache the device memory a run leaves: its share less ``reserve`` bytes.

        ``reserve`` is what the plan says one block product holds besides
        its cached inputs (accumulator, staging, inputs in flight).  The
        share is :data:`dgemm.sizes.MEMORY_FRACTION` of the device memory,
        or of the ``device-memory-limit`` setting (``DGEMM_DEVICE_MEMORY_LIMIT``)
        when that is smaller; CPU devices (whose memory is the host's) keep
        a quarter of it.
        """
        info = self.device.info
        self.device.cache.budget = cache_budget(device_memory(info), reserve, info.type)
        return self.device.cache.budget

    def snapshot(self, dask_worker=None) -> dict:
        """Plain data for the dashboard and the metrics: the device and its running totals.

        With ``dask_worker``, also the seconds of its store, load and reduce
        tasks (:func:`task_seconds`) and how many GEMM tasks it is running now.
        ``in_flight`` tells how far each block product running now is
        (:meth:`in_flight`), so that progress moves within long blocks.
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
            "in_flight": self.in_flight(),
        }
        if dask_worker is not None:
            snap.update(task_seconds(dask_worker))
            snap["gemm_running"] = sum(1 for ts in getattr(dask_worker.state, "executing", ())
                                       if str(getattr(ts, "prefix", "")).startswith(GEMM))
        return snap

    def in_flight(self) -> list[dict]:
        """The block products running now, how far each is (:meth:`MeteredEngine.progress`)."""
        return [p for e in list(self._engines.values()) if (p := e.progress()) is not None]

    def close(self) -> None:
        for e in self._engines.values():
            e.release()
        self._engines.clear()
        if self.device is not None:
            self.device.trim()


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

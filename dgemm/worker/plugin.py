"""The worker plugin: a Dask worker's OpenCL device, its ``GPU`` resource and its reporting.

It also prepares the device for the products to come in the background
(:meth:`DgemmPlugin.warm`): the kernels of the dtypes it is told of, and the
reader threads' page-locked staging buffers, so that a worker's first product
does not wait for them.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
import weakref

from distributed.core import Status
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol.pickle import dumps

from dgemm import config, metrics
from dgemm.dtypes import check_dtype
from dgemm.names import DASHBOARD_PLUGIN, GEMM, WORKER_METRIC, WORKER_PLUGIN
from dgemm.scheduler.dashboard import DgemmDashboard
from dgemm.storage import sharing
from dgemm.worker import siblings
from dgemm.worker.state import DeviceState, attach, detach, device_memory, live_states

# The task states in which a GEMM task is still to run (or running) on this worker; in any other
# (memory, error, released, forgotten...) it holds nothing on the device.
PENDING = frozenset({"waiting", "ready", "constrained", "executing", "long-running", "resumed"})
# How often (ms) a worker checks whether it has been idle long enough to give its memory back.
IDLE_CHECK_MS = 1000

logger = logging.getLogger(__name__)


class DgemmPlugin(WorkerPlugin):
    """Open the worker's OpenCL device and advertise ``GPU=1`` when it works.

    Parameters
    ----------
    device : str, optional
        Device specification for every worker (see
        :func:`dgemm.opencl.discovery.select_devices`); by default each worker reads
        ``DGEMM_DEVICE`` from its environment.
    dashboard : bool
        Make sure the scheduler serves the dgemm dashboard page.
    warm : sequence of str, optional
        Dtypes whose kernels the worker builds as soon as its device is open,
        in the background (:meth:`warm`), e.g. those of the product that
        made a local cluster start.
    sibling : bool
        This worker is one that another worker of its process started for
        another device (:mod:`dgemm.worker.siblings`); it starts none itself.
        Otherwise, where the process's environment names other devices
        (``worker-process: host``), the set-up starts a worker for each.
    """

    name = WORKER_PLUGIN
    warm_dtypes: tuple = ()
    _warmer = None

    def __init__(self, device: str | None = None, dashboard: bool = True, warm=(), sibling: bool = False):
        self.device_spec = device
        self.dashboard = dashboard
        self.sibling = sibling
        self.siblings: list = []
        # a wrong dtype fails here, not in every worker
        self.warm_dtypes = tuple(dict.fromkeys(check_dtype(d, "warm").name for d in warm))
        self.state: DeviceState | None = None
        self.worker = None
        self.runs: dict = {}

    def __getstate__(self):  # a registered plugin travels to the workers without its state
        return {"device_spec": self.device_spec, "dashboard": self.dashboard, "warm_dtypes": self.warm_dtypes,
                "sibling": self.sibling, "siblings": [], "state": None, "worker": None, "runs": {}}

    async def setup(self, worker):
        self.state = DeviceState(self.device_spec)
        self.runs = {}
        if self.state.device is not None:
            interval = config.get("switch-interval")
            if interval is not None:    # process-wide: every device worker of a process reads the same setting
                sys.setswitchinterval(interval)
            # What a run's end leaves of each reader's staging buffer: the default block's (bounded:
            # one per reader thread), so that runs one after another do not pin theirs again.
            self.state.device.staging_keep = staging_bytes(self.state.device.info, ["float64"])
            await _set_gpu(worker, 1)
            if self.warm_dtypes:
                self.warm(self.warm_dtypes)   # goes on while the worker registers and the client plans
        elif worker.state.total_resources.get("GPU"):
            # Declared GPU=1 at start-up but the device does not work: take
            # the resource back so GEMM tasks are not sent here.
            await _set_gpu(worker, 0)
        if getattr(worker, "address", None) is None:  # a stand-in worker (tests): no reporting
            return
        self.worker = weakref.ref(worker)
        callbacks = getattr(worker, "periodic_callbacks", None)
        if self.state.device is not None and isinstance(callbacks, dict):
            from tornado.ioloop import PeriodicCallback

            pc = callbacks[IDLE_CALLBACK] = PeriodicCallback(self.state.release_idle, IDLE_CHECK_MS)
            pc.start()
        # Reported to the scheduler with every heartbeat (WorkerState.metrics["dgemm"]).
        worker.metrics[WORKER_METRIC] = self.metric
        attach(self.state, worker)
        metrics.add_worker_source(metric_rows)
        if self.dashboard:
            await _register_dashboard(worker)
        pairs = [] if self.sibling else siblings.wanted()
        if pairs:   # worker-process: host; before this worker registers, so that the cluster is whole when it has
            self.siblings = await siblings.start(worker, pairs, lambda device: DgemmPlugin(
                device=device, dashboard=False, warm=self.warm_dtypes, sibling=True))

    def warm(self, dtypes) -> bool:
        """Prepare the device for products of ``dtypes``, in a background thread; whether one was started.

        Builds the default-precision kernels of each dtype not asked for
        before (the first product then finds them built: a build from
        pyopencl's cache takes seconds on NVIDIA, a first build more), and,
        the first time and if no product has read yet, gives each reader
        thread its page-locked staging buffer, sized for the default block of
        this device (:func:`staging_bytes`).  A product that starts meanwhile waits for
        what it needs and is not done yet (the device builds each
        program once, one at a time: a product of another dtype may wait for
        the build under way); a failure here is logged and left for that
        product to report.
        """
        if self.state is None or self.state.device is None:
            return False
        if self._warmer is None:
            self._warmer = Warmer(self.state)
        return self._warmer.ask(dtypes)

    def metric(self, dask_worker=None) -> dict:
        """The worker metric: :meth:`DeviceState.snapshot` of this worker's device."""
        if self.state is None:
            return {}
        return self.state.snapshot(dask_worker)

    def transition(self, key, start, finish, **kwargs):
        """Follow this worker's GEMM tasks: when the last of a run's ends here, give back what the run held.

        A run's GEMM tasks share their name (``dgemm-gemm-<token>``; the
        token is the run's scope, see :func:`dgemm.worker.tasks.gemm_block`).
        When none of them is pending on this worker any more, its panel
        cache entries are dropped and, if no other run is pending, the
        device's buffers are given back (:meth:`DeviceState.release`) at
        once, without waiting for the collector; page-locked host memory (one
        staging buffer per reader thread, download buffers up to the
        ``pinned-bytes`` setting) stays for the next run until the worker
        has been idle :data:`~dgemm.worker.state.IDLE_SECONDS`.  A task
        of the run that comes later (a block re-run after a worker death)
        reads its blocks again.  Runs on the worker's event loop: cheap.
        """
        name = key[0] if isinstance(key, tuple) and key else None
        if not (isinstance(name, str) and name.startswith(GEMM + "-")) or self.state is None:
            return
        pending = self.runs.setdefault(name, set())
        if finish in PENDING:
            pending.add(key)
            return
        pending.discard(key)
        if pending or start not in ("executing", "long-running"):
            if not pending:
                self.runs.pop(name, None)
            return
        del self.runs[name]
        scope = name[len(GEMM) + 1:]
        try:
            self.state.release(scope=scope, others=bool(self.runs), idle=False)
            # the blocks this process's workers shared, once none of them runs the run (none runs any: all)
            running = [p.runs for p in _process_plugins() if p is not self]
            if not any(name in runs for runs in running):
                sharing.drop(scope if self.runs or any(running) else None)
        except Exception as e:   # giving memory back must never fail a task
            logger.warning("dgemm: releasing the device's buffers after a run failed: %s: %s", type(e).__name__, e)

    def products_pending(self) -> bool:
        """Whether a block product of any run is still to run (or running) on this worker."""
        return any(list(self.runs.values()))   # (copied at once: the event loop's transition changes it)

    def teardown(self, worker):
        pc = getattr(worker, "periodic_callbacks", {}).pop(IDLE_CALLBACK, None)
        if pc is not None:
            pc.stop()
        if self._warmer is not None:
            self._warmer.stop()
        worker_metrics = getattr(worker, "metrics", None)
        if isinstance(worker_metrics, dict) and worker_metrics.get(WORKER_METRIC) == self.metric:
            del worker_metrics[WORKER_METRIC]
        if self.state is not None:
            detach(self.state)
            self.state.close()
        if self.siblings:   # (awaited by the worker's close)
            workers, self.siblings = self.siblings, []
            return siblings.close(workers)
        return None


IDLE_CALLBACK = "dgemm-idle-release"


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


def _process_plugins() -> list:
    """The dgemm plugins of this process's running workers."""
    return [p for w, _ in live_states() if (p := getattr(w, "plugins", {}).get(WORKER_PLUGIN)) is not None]


def metric_rows() -> list:
    """``(address, name, snapshot)`` of every running dgemm worker of this process (a :mod:`dgemm.metrics` source)."""
    return [(w.address, str(w.name), s.snapshot(w)) for w, s in live_states()]


async def _register_dashboard(worker) -> None:
    """Make sure the scheduler serves the dgemm dashboard page (once; any worker may ask first)."""
    try:
        await worker.scheduler.register_scheduler_plugin(plugin=dumps(DgemmDashboard()), name=DASHBOARD_PLUGIN,
                                                         idempotent=True)
    except Exception as e:  # e.g. dgemm not installed where the scheduler runs: only the page is missing
        logger.warning("dgemm: could not add the dashboard page to the scheduler: %s: %s", type(e).__name__, e)


def describe_worker(dask_worker=None) -> dict | None:
    """Run on a worker through ``client.run``: its dgemm state, or None if not prepared."""
    plugin = dask_worker.plugins.get(WORKER_PLUGIN) if dask_worker is not None else None
    if plugin is None or plugin.state is None:
        return None
    d = plugin.state.describe()
    d["resources"] = dict(dask_worker.state.total_resources)
    return d


def warm_worker(*dtypes, dask_worker=None) -> bool:
    """Run on a worker (``client.run``): start preparing its device for ``dtypes`` (:meth:`DgemmPlugin.warm`).

    Returns at once, whether a preparation was started (False: nothing new
    to do, or no dgemm plugin or device on this worker).
    """
    plugin = dask_worker.plugins.get(WORKER_PLUGIN) if dask_worker is not None else None
    if plugin is None or not hasattr(plugin, "warm"):
        return False
    return plugin.warm(dtypes)


def staging_bytes(info, dtypes) -> int:
    """Bytes of a reader thread's staging buffer for the default block of device ``info`` (the largest dtype).

    A block product reads each input block into one (:meth:`dgemm.opencl.device.Device.staging`);
    a larger block grows it when it comes.

    >>> from types import SimpleNamespace as NS
    >>> staging_bytes(NS(type="GPU"), ["float32"]) == 8192 * 4096 * 4, staging_bytes(NS(type="CPU"), ["float64"])
    (True, 8388608)
    >>> staging_bytes(NS(type="GPU", global_mem=16 << 30), ["float32"]) == 4096 * 4096 * 4   # a smaller GPU
    True
    """
    import numpy as np

    from dgemm.sizes import default_target, input_block_elements

    memory = device_memory(info) if getattr(info, "global_mem", None) is not None else None
    elements = input_block_elements(default_target([info.type], memory))
    return elements * max([np.dtype(d).itemsize for d in dtypes] or [4])


class Warmer:
    """One worker's background preparation of its device (:meth:`DgemmPlugin.warm`).

    ``seconds`` tells what each step took (``staging``, and each dtype's
    build), for the curious and the benchmarks.
    """

    def __init__(self, state: DeviceState):
        self.state = state
        self.seconds: dict = {}
        self._asked: set = set()
        self._staged = False
        self._stopped = False
        self._threads: list = []
        self._lock = threading.Lock()

    def ask(self, dtypes) -> bool:
        with self._lock:
            todo = [d for d in dict.fromkeys(check_dtype(x, "warm").name for x in dtypes) if d not in self._asked]
            if self._stopped or not todo:
                return False
            self._asked.update(todo)
            stage, self._staged = not self._staged, True
            thread = threading.Thread(target=self._run, args=(todo, stage), name="dgemm-warm", daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return True

    def _run(self, dtypes: list, stage: bool) -> None:
        device = self.state.device
        staging, staged_at = [], []
        t0 = time.perf_counter()
        try:
            if stage:
                # first: it takes the device's lock for a moment, which a build holds throughout;
                # the reader threads then pin their buffers while the kernels build
                staging = device.warm_staging(staging_bytes(device.info, dtypes), wait=False, first=True)
                for f in staging:
                    f.add_done_callback(lambda f: staged_at.append(time.perf_counter()))
            for dtype in dtypes:
                if self._stopped:
                    break
                if dtype == "float64" and not device.info.fp64:
                    continue   # no product of it will come here (dgemm.cluster.prepare says why)
                t = time.perf_counter()
                self.state.engine(dtype)
                self.seconds[dtype] = time.perf_counter() - t
            for f in staging:
                f.result()
            deadline = time.perf_counter() + 1.0   # a future's callbacks run just after its result is set
            while len(staged_at) < len(staging) and time.perf_counter() < deadline:
                time.sleep(0.001)
            if staged_at:
                self.seconds["staging"] = max(staged_at) - t0
        except Exception as e:   # the product that needs it fails with the same error, where the user sees it
            logger.info("dgemm: preparing the device for %s failed: %s: %s", ", ".join(dtypes), type(e).__name__, e)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the preparations asked for so far; whether all have finished."""
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout)
        return not any(t.is_alive() for t in threads)

    def stop(self, timeout: float = 60.0) -> None:
        """Start nothing more, and wait (at most ``timeout`` s) for the step under way: the device closes next."""
        with self._lock:
            self._stopped = True
            threads = list(self._threads)
        for t in threads:
            t.join(timeout)

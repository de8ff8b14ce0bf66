"""The worker plugin: a Dask worker's OpenCL device, its ``GPU`` resource and its reporting."""
from __future__ import annotations

import logging
import weakref

from distributed.core import Status
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol.pickle import dumps

from dgemm import metrics
from dgemm.names import DASHBOARD_PLUGIN, WORKER_METRIC, WORKER_PLUGIN
from dgemm.scheduler.dashboard import DgemmDashboard
from dgemm.worker.state import DeviceState, attach, detach, live_states

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
    """

    name = WORKER_PLUGIN

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
        worker.metrics[WORKER_METRIC] = self.metric
        attach(self.state, worker)
        metrics.add_worker_source(metric_rows)
        if self.dashboard:
            await _register_dashboard(worker)

    def metric(self, dask_worker=None) -> dict:
        """The worker metric: :meth:`DeviceState.snapshot` of this worker's device."""
        if self.state is None:
            return {}
        return self.state.snapshot(dask_worker)

    def teardown(self, worker):
        worker_metrics = getattr(worker, "metrics", None)
        if isinstance(worker_metrics, dict) and worker_metrics.get(WORKER_METRIC) == self.metric:
            del worker_metrics[WORKER_METRIC]
        if self.state is not None:
            detach(self.state)
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

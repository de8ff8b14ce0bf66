"""Worker side: the plugin that gives each Dask worker its OpenCL device.

As in dask-cuda, the device is picked by the worker's environment
(``DGEMM_DEVICE``, the ``device`` setting of :mod:`dgemm.config`), else the
first GPU, else a CPU device; the context is made here, in the worker
process, never in the client.  A worker whose device works advertises the
resource ``GPU=1``, which the GEMM tasks ask for.

The plugin also makes the worker report what its device does: a worker
metric (``dgemm``, sent to the scheduler with every heartbeat, read there by
the dashboard page :mod:`dgemm.scheduler.dashboard`), the ``dgemm_*`` Prometheus
series on the worker's ``/metrics`` (:mod:`dgemm.metrics`), and Fine
Performance Metrics of the GEMM tasks (kernel, transfer and read-wait
seconds, bytes up and down, flop) through distributed's ``context_meter``.

* :mod:`dgemm.worker.state`: the device, its engines and totals
  (:class:`DeviceState`), how a task finds them (:func:`device_state`),
  building the kernels ahead of a timed run (:func:`build_kernels`);
* :mod:`dgemm.worker.plugin`: :class:`DgemmPlugin` and :func:`describe_worker`.

``dask worker --preload dgemm.worker`` installs the plugin at start-up too.
"""
from __future__ import annotations

from dgemm.worker.plugin import DgemmPlugin, describe_worker
from dgemm.worker.state import DeviceState, build_kernels, device_state

__all__ = ["DeviceState", "DgemmPlugin", "build_kernels", "describe_worker", "device_state", "dask_setup"]


def dask_setup(worker):
    """Preload hook: ``dask worker --preload dgemm.worker`` installs the plugin at start-up."""
    worker._pending_plugins = (*getattr(worker, "_pending_plugins", ()), DgemmPlugin())

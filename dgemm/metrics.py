"""Prometheus series ``dgemm_*`` on the scheduler's and the workers' ``/metrics``.

Distributed serves ``/metrics`` from ``prometheus_client``'s process-wide
registry; dgemm adds one collector to it per process, which asks the
sources the process's dgemm code added (this module imports none of it):

* in a **worker** process, each dgemm worker's own figures (the device
  totals of :meth:`dgemm.worker.DeviceState.snapshot`; the worker plugin
  calls :func:`add_worker_source`);
* in the **scheduler** process, every worker's figures as their heartbeats
  last reported them, plus the recent rate, running GEMM tasks and the
  progress of matmuls (:class:`dgemm.scheduler.dashboard.DgemmDashboard`
  calls :func:`add_scheduler_source`).

Every series is labelled ``worker`` (address), ``name`` (worker name) and
``device``.  Counters (``*_total``) only grow while a worker lives.

======================================  ======================================================
``dgemm_flops_total``                   floating-point operations of the GEMM kernel (2 m n k)
``dgemm_busy_seconds_total``            seconds in block products (wall time)
``dgemm_busy_part_seconds_total``       the same seconds split by ``part``: ``kernel``, ``transfer``,
                                        ``read``, ``other`` (:mod:`dgemm.busy`); exclusive, so the
                                        parts of a worker add up to its ``dgemm_busy_seconds_total``
``dgemm_kernel_seconds_total``          seconds the GEMM kernel ran (OpenCL profiling)
``dgemm_transfer_seconds_total``        uploads, padding/transposing, unpadding and download, summed
                                        over the threads doing them (overlaps the kernels)
``dgemm_read_wait_seconds_total``       waiting for the next A/B blocks (overlaps earlier kernels)
``dgemm_store_seconds_total``           ``dgemm-store`` tasks (writing C blocks)
``dgemm_uploaded_bytes_total``          host to device
``dgemm_downloaded_bytes_total``        device to host
``dgemm_blocks_total``                  block products finished (``dgemm-gemm`` tasks)
``dgemm_storage_chunks_total``          chunks read or written, by ``path`` (:data:`dgemm.names.STORAGE_PATHS`:
                                        dgemm's fast paths or zarr's; ``*_zarr`` count regions), for
                                        the worker's whole process (:mod:`dgemm.storage.fastpaths`)
``dgemm_storage_bytes_total``           the bytes of array elements those moved, by ``path``
``dgemm_device_decoded_bytes_total``    bytes chunks decoded to on the device (:mod:`dgemm.opencl.codecs`),
                                        and ``dgemm_host_decoded_bytes_total`` on the host (dgemm's reader);
                                        ``dgemm_{device,host}_encoded_bytes_total`` the bytes encoded; for the
                                        worker's whole process (:data:`dgemm.names.CODEC_COUNTERS`)
``dgemm_device_info``                   1, with ``device_id``, ``type``, ``driver``; 0 when the device failed
``dgemm_gemm_tasks_running``            GEMM tasks executing now
``dgemm_tflops``                        (scheduler) TFLOPS over the last seconds
``dgemm_matmul_blocks``                 (scheduler) per recent matmul, ``state`` = done or total
``dgemm_matmul_progress``               (scheduler) per recent matmul, the share of its flops done,
                                        within running blocks too
======================================  ======================================================

The kernel, transfer and read-wait totals overlap each other; only the
``dgemm_busy_part_seconds_total`` parts split the busy time.
"""
from __future__ import annotations

import threading

from dgemm import busy
from dgemm.names import STORAGE_PATHS

# (snapshot key, metric name without _total, help)
COUNTER_FAMILIES = (
    ("flops", "dgemm_flops", "Floating-point operations of the GEMM kernel (2 m n k per block product)"),
    ("kernel_seconds", "dgemm_kernel_seconds", "Seconds the GEMM kernel ran on the device (OpenCL profiling)"),
    ("busy_seconds", "dgemm_busy_seconds", "Seconds in block products (wall time; dgemm_busy_part_seconds splits it)"),
    ("transfer_seconds", "dgemm_transfer_seconds",
     "Seconds of uploads, padding and downloads, summed over the threads doing them (overlaps the kernels)"),
    ("read_wait_seconds", "dgemm_read_wait_seconds",
     "Seconds block products waited for A/B blocks from the store (overlaps earlier kernels)"),
    ("store_seconds", "dgemm_store_seconds", "Seconds of dgemm-store tasks (writing C blocks)"),
    ("bytes_up", "dgemm_uploaded_bytes", "Bytes uploaded from host to device"),
    ("bytes_down", "dgemm_downloaded_bytes", "Bytes downloaded from device to host"),
    ("blocks", "dgemm_blocks", "Block products finished (dgemm-gemm tasks)"),
    ("device_decoded_bytes", "dgemm_device_decoded_bytes",
     "Bytes input chunks decoded to on the device (dgemm.opencl.codecs), for the worker's whole process"),
    ("host_decoded_bytes", "dgemm_host_decoded_bytes",
     "Bytes chunks decoded to on the host by dgemm's reader, for the worker's whole process"),
    ("device_encoded_bytes", "dgemm_device_encoded_bytes",
     "Bytes of chunks encoded on the device, for the worker's whole process"),
    ("host_encoded_bytes", "dgemm_host_encoded_bytes",
     "Bytes of chunks encoded on the host by dgemm's writer, for the worker's whole process"),
)
LABELS = ["worker", "name", "device"]

# Where the figures come from (see add_worker_source, add_scheduler_source).
_worker_sources: list = []
_scheduler_sources: list = []
_registered = False
_lock = threading.Lock()


def add_worker_source(source) -> bool:
    """Report the workers ``source()`` returns: ``[(address, name, snapshot), ...]``.

    The worker plugin adds one, listing the dgemm workers of its process
    (``snapshot``: :meth:`dgemm.worker.DeviceState.snapshot`).  Adding a
    source more than once adds it once.  Returns False when
    ``prometheus_client`` is not installed (distributed then serves no
    metrics either).
    """
    return _add(_worker_sources, source)


def add_scheduler_source(source) -> bool:
    """Report what a scheduler knows: ``source()`` returns None or ``(rows, matmuls)``.

    ``rows`` are ``(address, name, snapshot, tflops)`` of every live worker,
    ``tflops`` its recent rate; ``matmuls`` are dicts with ``id``,
    ``blocks_done``, ``blocks_total`` and (optional) ``work_done``, the
    share of the matmul's flops done.  None means no scheduler of this
    process has the figures (:class:`dgemm.scheduler.dashboard.DgemmDashboard`
    is not running).  Where a scheduler source answers, the worker sources
    are not asked: a scheduler's view already holds the workers of its
    process.  Returns False without ``prometheus_client``.
    """
    return _add(_scheduler_sources, source)


def _add(sources: list, source) -> bool:
    global _registered
    try:
        import prometheus_client
    except ImportError:
        return False
    with _lock:
        if source not in sources:
            sources.append(source)
        if not _registered:
            prometheus_client.REGISTRY.register(DgemmCollector())
            _registered = True
    return True


def rows() -> tuple[list, list | None]:
    """``([(address, name, snapshot, tflops), ...], matmuls)`` for this process, from its sources.

    Where a scheduler source answers, its view of every worker and the
    recent matmuls; else this process's own dgemm workers (``tflops`` and
    ``matmuls`` None).
    """
    for source in list(_scheduler_sources):
        found = source()
        if found is not None:
            return found
    return [(*r, None) for source in list(_worker_sources) for r in source()], None


class DgemmCollector:
    """The ``prometheus_client`` collector of the ``dgemm_*`` series (see the module doc)."""

    def _families(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        counters = {key: CounterMetricFamily(name, doc, labels=LABELS) for key, name, doc in COUNTER_FAMILIES}
        info = GaugeMetricFamily("dgemm_device_info", "1 for a worker whose OpenCL device works, 0 otherwise",
                                 labels=LABELS + ["device_id", "type", "driver"])
        running = GaugeMetricFamily("dgemm_gemm_tasks_running", "GEMM tasks executing now", labels=LABELS)
        tflops = GaugeMetricFamily("dgemm_tflops", "TFLOPS achieved over the last seconds (scheduler only)",
                                   labels=LABELS)
        blocks = GaugeMetricFamily("dgemm_matmul_blocks", "Block products of recent matmuls (scheduler only)",
                                   labels=["matmul", "state"])
        parts = CounterMetricFamily("dgemm_busy_part_seconds",
                                    "Seconds in block products by exclusive part (kernel, transfer, read, other): "
                                    "they add up to dgemm_busy_seconds", labels=LABELS + ["part"])
        progress = GaugeMetricFamily("dgemm_matmul_progress",
                                     "Share of the flops of recent matmuls done, within running blocks too "
                                     "(scheduler only)", labels=["matmul"])
        paths = (CounterMetricFamily("dgemm_storage_chunks", "Chunks read or written by the worker's process, by "
                                     "path: dgemm's own or zarr's (*_zarr: regions)", labels=LABELS + ["path"]),
                 CounterMetricFamily("dgemm_storage_bytes", "Bytes of array elements read or written by the "
                                     "worker's process, by path", labels=LABELS + ["path"]))
        return counters, info, running, tflops, blocks, parts, progress, paths

    def describe(self):
        counters, *others, paths = self._families()
        return [*counters.values(), *others, *paths]

    def collect(self):
        counters, info, running, tflops, blocks, parts, progress, paths = self._families()
        found, matmuls = rows()
        for addr, name, snap, rate in found:
            if not snap:
                continue
            labels = [addr, name, snap.get("device") or ""]
            for key, fam in counters.items():
                fam.add_metric(labels, float(snap.get(key) or 0))
            for part, key in busy.KEYS.items():
                parts.add_metric(labels + [part], float(snap.get(key) or 0))
            for path in STORAGE_PATHS:
                for fam, key in zip(paths, (f"storage_{path}", f"storage_{path}_bytes")):
                    fam.add_metric(labels + [path], float(snap.get(key) or 0))
            info.add_metric(labels + [snap.get("device_id") or "", snap.get("device_type") or "",
                                      snap.get("driver") or ""], 1.0 if snap.get("ok") else 0.0)
            running.add_metric(labels, float(snap.get("gemm_running") or 0))
            if rate is not None:
                tflops.add_metric(labels, rate)
        if matmuls is not None:
            for m in matmuls:
                blocks.add_metric([m["id"], "done"], float(m["blocks_done"]))
                blocks.add_metric([m["id"], "total"], float(m["blocks_total"]))
                if m.get("work_done") is not None:
                    progress.add_metric([m["id"]], float(m["work_done"]))
        yield from counters.values()
        yield parts
        yield from paths
        yield info
        yield running
        if matmuls is not None:
            yield tflops
            yield blocks
            yield progress


"""``dgemm demo``: an end-to-end, self-checking demonstration run.

:func:`run_demo` writes two random Zarr matrices
(:func:`dgemm.benchmarks.inputs.random_zarr`), multiplies them on the local
device cluster and checks a sample of the result against numpy in float64
(:func:`dgemm.accuracy.check_sample`).

What it reports, and why so.  The time that counts for a user is the whole
product, Zarr in and Zarr out, on a cluster that has started (``seconds``):
that is what the demo times, after starting the cluster, building the
kernels and running one small product, so that the timed run pays for none
of them (their time is reported apart, ``startup_seconds``, as what a
script's first call adds).  Beside it, the devices' own time for the same
product (``engine``): their GEMM kernels' time and rate, and how the GEMM
tasks' busy time divides between kernels, transfers and waiting for reads.
On a GPU the end-to-end rate is the store's, not the device's: a 16384²
float32 product is 8.8 TFLOP, about 0.2 s of an H100's kernels, against
3 GiB of Zarr chunks read and written.  No demo size changes that: the
flops grow as n³ and the bytes as n², and at an H100's rates (about 45
TFLOPS of kernels, a few GB/s of Zarr reads and writes) the kernels would
take as long as the store only past n ≈ 10⁵, matrices of tens of GB.  Hence
the two figures side by side.
"""
from __future__ import annotations

import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from dgemm.accuracy import check_sample
from dgemm.benchmarks.inputs import random_zarr
from dgemm.benchmarks.records import utc_now

DEMO_CPU_SIZE = 1024
DEMO_GPU_SIZE = 16384     # large enough to be fair to a GPU, small enough to write in seconds


def default_size(devices: str | None = None) -> int:
    """The demo's matrix size: small for CPU devices, large enough to be fair to a GPU."""
    from dgemm.opencl.discovery import select_devices
    chosen = select_devices(devices)
    return DEMO_GPU_SIZE if any(d.type == "GPU" for d in chosen) else DEMO_CPU_SIZE


def demo_chunks(size: int) -> int:
    """Chunk side for the demo's matrices: several chunks per axis, none tiny.

    >>> demo_chunks(256), demo_chunks(1024), demo_chunks(16384)
    (256, 256, 2048)
    """
    return min(size, max(256, size // 8))


def run_demo(size: int | None = None, dtype: str = "float32", devices: str | None = None,
             keep=None, seed: int = 0, log=print) -> dict:
    """Multiply two random ``size x size`` Zarr matrices on the local cluster and check the result.

    Parameters
    ----------
    size : int, optional
        Matrix side; by default 1024 when every selected device is a CPU,
        16384 when one is a GPU.
    dtype : {"float32", "float64"}
    devices : str, optional
        Devices for the local cluster (see :func:`dgemm.opencl.discovery.select_devices`).
    keep : str or os.PathLike, optional
        Folder to write ``a.zarr``, ``b.zarr`` and ``c.zarr`` into and keep;
        by default a temporary folder, removed afterwards.
    seed : int
        Seed of the random matrices and of the checked sample.
    log : callable
        Receives progress messages.

    Returns
    -------
    dict
        ``device``, ``devices``, ``date``, ``size``, ``dtype``, ``seconds``
        (the product end to end, Zarr in and Zarr out, on a started cluster:
        kernels built, a small product run before), ``tflops`` (of
        ``seconds``), ``max_rel_err``, ``tolerance``, ``entries_checked``,
        ``passed``, ``dashboard``, ``kernel_build_seconds``, ``workers``,
        ``host``, ``dgemm_version``; ``startup_seconds`` (starting the
        cluster, building the kernels and the small product: what a first
        call adds) and ``engine`` (the devices' figures for the timed
        product, see :func:`engine_figures`).

    Raises
    ------
    FileExistsError
        ``keep`` already holds one of the three arrays.
    LookupError
        No OpenCL device matches ``devices``.
    """
    from dgemm import __version__, matmul
    from dgemm.cluster import local_client, prepare
    from dgemm.cluster.local import closing_new_local_clusters
    from dgemm.worker import build_kernels

    dtype = np.dtype(dtype).name
    if size is None:
        size = default_size(devices)
    if size < 1:
        raise ValueError(f"size must be positive, not {size}")
    if keep is not None:
        folder = Path(keep)
        for name in ("a.zarr", "b.zarr", "c.zarr"):
            if os.path.lexists(folder / name):
                raise FileExistsError(f"{folder / name} already exists; give --keep an empty or new folder")
        folder.mkdir(parents=True, exist_ok=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix="dgemm-demo-"))
    try:
        chunk = demo_chunks(size)
        log(f"writing two random {size} x {size} {dtype} matrices (chunks {chunk} x {chunk}) to {folder}")
        a = random_zarr(folder / "a.zarr", (size, size), (chunk, chunk), dtype, seed=seed)
        b = random_zarr(folder / "b.zarr", (size, size), (chunk, chunk), dtype, seed=seed + 1)
        with closing_new_local_clusters():
            log("starting the local device cluster")
            t_start = time.perf_counter()
            client = local_client(devices, dtype=dtype)
            workers = prepare(client, dtype)
            names = sorted({d["device"].name for d in workers.values()})
            builds = client.run(build_kernels, dtype, workers=list(workers))
            dashboard = client.dashboard_link
            log(f"devices: {', '.join(names)}; kernels ready (waited {max(builds.values()):.2f} s); "
                f"dashboard: {dashboard}")
            _warm_up(client, dtype, chunk)
            startup = time.perf_counter() - t_start
            log(f"cluster started, kernels built and a small product run in {startup:.2f} s; "
                "now the timed product")
            before = client.run(device_totals, workers=list(workers))
            t0 = time.perf_counter()
            c = matmul(str(folder / "a.zarr"), str(folder / "b.zarr"), out=str(folder / "c.zarr"),
                       client=client)
            seconds = time.perf_counter() - t0
            after = client.run(device_totals, workers=list(workers))
        check = check_sample(a, b, c, seed=seed)
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    flops = 2.0 * size ** 3
    return {
        "device": ", ".join(names), "devices": names, "workers": len(workers),
        "date": utc_now(),
        "size": size, "dtype": dtype, "seconds": seconds, "tflops": flops / seconds / 1e12,
        "max_rel_err": check["max_rel_err"], "tolerance": check["tolerance"],
        "entries_checked": check["entries"], "passed": check["passed"], "dashboard": dashboard,
        "kernel_build_seconds": max(builds.values()), "host": platform.node(),
        "dgemm_version": __version__, "folder": str(folder) if keep is not None else None,
        "startup_seconds": startup, "engine": engine_figures(before, after),
    }


def _warm_up(client, dtype: str, chunk: int) -> None:
    """One small product through the whole path (device, download, Zarr store), so the timed one is not a first run.

    Its output goes to a folder of its own, removed after: nothing of the
    user's ``keep`` folder is touched.
    """
    from dgemm import matmul

    side = min(chunk, 256)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((side, side)).astype(dtype) for _ in range(2))
    folder = tempfile.mkdtemp(prefix="dgemm-demo-warm-up-")
    try:
        matmul(a, b, out=os.path.join(folder, "c.zarr"), client=client)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def device_totals(dask_worker=None) -> dict:
    """Run on a worker (``client.run``): its device's running totals and its store tasks' seconds.

    :meth:`dgemm.worker.DeviceState.totals` (flops, kernel seconds, the parts
    of the GEMM tasks' busy time...) and ``store_seconds``; ``{}`` on a
    worker without dgemm's plugin.
    """
    from dgemm.names import WORKER_PLUGIN
    from dgemm.worker.state import task_seconds

    plugin = dask_worker.plugins.get(WORKER_PLUGIN) if dask_worker is not None else None
    if plugin is None or plugin.state is None:
        return {}
    out = {k: float(v) for k, v in plugin.state.totals().items() if isinstance(v, (int, float))}
    out.update(task_seconds(dask_worker))
    return out


def engine_figures(before: dict, after: dict) -> dict:
    """The devices' share of one product, from :func:`device_totals` before and after it, summed over workers.

    ``kernel_seconds`` (the GEMM kernels' device time, summed over the
    devices), ``kernel_tflops`` (flops over that: one device's rate while
    its kernels run), ``busy_seconds`` (the GEMM tasks' busy time, summed)
    and its exclusive parts ``busy_kernel_seconds``,
    ``busy_transfer_seconds``, ``busy_read_seconds`` (waiting for input
    reads) and ``busy_other_seconds``; ``store_seconds`` (worker-seconds of
    writing C's blocks), ``flops`` and ``blocks``.

    >>> engine_figures({"w": {"flops": 1e12, "kernel_seconds": 1.0}},
    ...                {"w": {"flops": 3e12, "kernel_seconds": 1.5, "busy_seconds": 2.0}})["kernel_tflops"]
    4.0
    """
    keys = ("flops", "blocks", "kernel_seconds", "busy_seconds", "busy_kernel_seconds", "busy_transfer_seconds",
            "busy_read_seconds", "busy_other_seconds", "store_seconds")
    total = dict.fromkeys(keys, 0.0)
    for worker, now in after.items():
        was = before.get(worker, {})
        for k in keys:
            total[k] += now.get(k, 0.0) - was.get(k, 0.0)
    total["kernel_tflops"] = total["flops"] / total["kernel_seconds"] / 1e12 if total["kernel_seconds"] > 0 else None
    return total

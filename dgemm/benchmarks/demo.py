"""``dgemm demo``: an end-to-end, self-checking demonstration run.

:func:`run_demo` writes two random Zarr matrices
(:func:`dgemm.benchmarks.inputs.random_zarr`), multiplies them on the local
device cluster and checks a sample of the result against numpy in float64
(:func:`dgemm.accuracy.check_sample`).
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
        (the product, kernels already built), ``tflops``, ``max_rel_err``,
        ``tolerance``, ``entries_checked``, ``passed``, ``dashboard``,
        ``kernel_build_seconds``, ``workers``, ``host``, ``dgemm_version``.

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
            client = local_client(devices)
            workers = prepare(client, dtype)
            names = sorted({d["device"].name for d in workers.values()})
            builds = client.run(build_kernels, dtype, workers=list(workers))
            dashboard = client.dashboard_link
            log(f"devices: {', '.join(names)}; kernels built in {max(builds.values()):.2f} s; "
                f"dashboard: {dashboard}")
            t0 = time.perf_counter()
            c = matmul(str(folder / "a.zarr"), str(folder / "b.zarr"), out=str(folder / "c.zarr"),
                       client=client)
            seconds = time.perf_counter() - t0
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
    }

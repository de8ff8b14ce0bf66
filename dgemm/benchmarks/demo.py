"""Random Zarr matrices and an end-to-end, self-checking demonstration run.

:func:`random_zarr` writes test matrices without ever holding one whole in
memory; :func:`run_demo` multiplies two of them on the local device cluster
and checks a sample of the result against numpy in float64.  Both back the
``dgemm random`` and ``dgemm demo`` commands.
"""
from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

# Row panels are cut to about this many bytes, so that writing a very wide
# matrix does not need a whole chunk row in memory at once.
PANEL_BYTES = 256 * 2**20

DEFAULT_CPU_SIZE = 1024
DEFAULT_GPU_SIZE = 16384


def _exists(path: str) -> bool:
    if "://" not in path or path.startswith("file://"):
        return os.path.lexists(path[len("file://"):] if path.startswith("file://") else path)
    import zarr
    try:
        zarr.open(path, mode="r")
        return True
    except Exception:  # zarr raises several types for "nothing here"
        return False


def random_zarr(path, shape, chunks, dtype="float64", seed: int | None = None, overwrite: bool = False):
    """Write a standard-normal random matrix as a Zarr array, chunk row by chunk row.

    Parameters
    ----------
    path : str or os.PathLike
        Where to create the array (a local path or a URL zarr understands).
    shape : (int, int)
        Rows and columns; zero is allowed, negative is not.
    chunks : (int, int)
        Zarr chunk shape; both positive.
    dtype : {"float32", "float64"}
        Element type; values are drawn directly in this type.
    seed : int, optional
        Seed for :func:`numpy.random.default_rng`; the same seed, shape and
        chunks give the same array.
    overwrite : bool
        Replace an existing array or folder at ``path``.

    Returns
    -------
    zarr.Array
        The written array.

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is false; nothing is written.
    ValueError, TypeError
        Bad shape, chunks or dtype; nothing is written.

    Examples
    --------
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> a = random_zarr(os.path.join(d, "a.zarr"), (5, 3), (2, 2), "float32", seed=1)
    >>> a.shape, a.chunks, a.dtype.name
    ((5, 3), (2, 2), 'float32')
    >>> random_zarr(os.path.join(d, "a.zarr"), (5, 3), (2, 2))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileExistsError: ... already exists; pass overwrite=True to replace it
    >>> import shutil; shutil.rmtree(d)
    """
    import zarr

    shape = _pair(shape, "shape", minimum=0)
    chunks = _pair(chunks, "chunks", minimum=1)
    dt = np.dtype(dtype)
    if dt not in (np.dtype("float32"), np.dtype("float64")):
        raise TypeError(f"dtype must be float32 or float64, not {dt}")
    path = os.fspath(path)
    if not overwrite and _exists(path):
        raise FileExistsError(f"{path!r} already exists; pass overwrite=True to replace it")
    if overwrite and os.path.isfile(path):
        # zarr would refuse to turn a plain file into a store; the user asked to replace it.
        os.remove(path)
    # Random normals do not compress: skipping the codec makes writing several times faster.
    arr = zarr.create_array(store=path, shape=shape, chunks=chunks, dtype=dt, compressors=None,
                            fill_value=0, overwrite=overwrite)
    rng = np.random.default_rng(seed)
    (m, n), (cr, cc) = shape, chunks
    row_bytes = cr * cc * dt.itemsize
    cols_per_panel = max(1, PANEL_BYTES // row_bytes) * cc
    for r0 in range(0, m, cr):
        r1 = min(r0 + cr, m)
        for c0 in range(0, n, cols_per_panel):
            c1 = min(c0 + cols_per_panel, n)
            arr[r0:r1, c0:c1] = rng.standard_normal((r1 - r0, c1 - c0), dtype=dt)
    return arr


def _pair(value, what: str, minimum: int) -> tuple[int, int]:
    vals = tuple(value)
    if len(vals) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in vals):
        raise ValueError(f"{what} must be two integers (rows, columns), not {value!r}")
    if any(v < minimum for v in vals):
        need = "non-negative" if minimum == 0 else "positive"
        raise ValueError(f"{what} must be {need}, not {tuple(int(v) for v in vals)}")
    return tuple(int(v) for v in vals)


# -- checking a result by sampling ---------------------------------------------
def sample_indices(n: int, count: int, rng) -> np.ndarray:
    """``count`` distinct sorted indices of ``range(n)``, always including the first and last.

    The ends are where padding and edge blocks go wrong, so they are always checked.

    >>> sample_indices(100, 8, np.random.default_rng(0))[[0, -1]].tolist()
    [0, 99]
    >>> sample_indices(3, 8, np.random.default_rng(0)).tolist()
    [0, 1, 2]
    """
    if n <= count:
        return np.arange(n)
    inner = rng.choice(np.arange(1, n - 1), size=count - 2, replace=False)
    return np.sort(np.concatenate([[0, n - 1], inner]))


def check_sample(a, b, c, n_rows: int = 8, n_cols: int = 8, seed: int = 0) -> dict:
    """Compare sampled entries of ``c = a @ b`` with float64 dot products.

    Only the sampled rows of ``a`` and columns of ``b`` are read.  The error
    of an entry is ``|c_ij - ref_ij| / sum_k |a_ik b_kj|``: the reference
    itself can be near zero for random data, while this normalisation is the
    one rounding-error bounds for dot products use.

    Parameters
    ----------
    a, b, c : zarr.Array or numpy.ndarray
        2-D operands and result.
    n_rows, n_cols : int
        Rows and columns sampled (all when there are fewer); their product
        entries are checked.
    seed : int
        Seed for choosing the sample.

    Returns
    -------
    dict
        ``entries`` (number checked), ``max_rel_err``, ``tolerance`` and
        ``passed``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> a, b = rng.standard_normal((20, 30)), rng.standard_normal((30, 10))
    >>> r = check_sample(a, b, a @ b)
    >>> r["entries"], r["passed"]
    (64, True)
    >>> check_sample(a, b, a @ b + 1)["passed"]
    False
    """
    rng = np.random.default_rng(seed)
    m, k = a.shape
    n = b.shape[1]
    rows, cols = sample_indices(m, n_rows, rng), sample_indices(n, n_cols, rng)
    a_rows = np.asarray(_take(a, (rows, slice(None))), dtype=np.float64)
    b_cols = np.asarray(_take(b, (slice(None), cols)), dtype=np.float64)
    got = np.asarray(_take(c, (rows, cols)), dtype=np.float64)
    ref = a_rows @ b_cols
    scale = np.abs(a_rows) @ np.abs(b_cols)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.where(scale > 0, np.abs(got - ref) / np.where(scale > 0, scale, 1), np.abs(got - ref))
    eps = np.finfo(np.result_type(a.dtype, b.dtype, c.dtype)).eps
    # Blocked or pairwise sums err like sqrt(k) * eps on average; the 16 leaves
    # room for unlucky rounding while still catching a lost k-block, which
    # gives errors of order 1/sqrt(k).
    tol = 16 * eps * math.sqrt(max(k, 1))
    worst = float(np.nanmax(err)) if err.size else 0.0
    finite = bool(np.all(np.isfinite(got)))
    return {"entries": int(err.size), "max_rel_err": worst if finite else float("nan"),
            "tolerance": float(tol), "passed": bool(finite and worst <= tol)}


def _take(x, sel):
    if hasattr(x, "get_orthogonal_selection"):  # zarr: read only these rows / columns
        return x.get_orthogonal_selection(sel)
    return np.asarray(x)[np.ix_(*(np.arange(n)[s] if isinstance(s, slice) else s
                                   for s, n in zip(sel, x.shape)))]


# -- the demo -------------------------------------------------------------------
@contextlib.contextmanager
def closing_new_local_clusters():
    """Close the local dgemm clusters started inside the block, and only those.

    :func:`dgemm.cluster.close_local` would also close clusters the caller
    (a notebook, a test session) started before and still uses.
    """
    from dgemm import cluster as cluster_mod

    before = {id(entry[0]) for entry in cluster_mod._local.values()}
    try:
        yield
    finally:
        with cluster_mod._local_lock:
            new = {key: entry for key, entry in cluster_mod._local.items() if id(entry[0]) not in before}
            for key in new:
                del cluster_mod._local[key]
        for cluster, client in new.values():
            with contextlib.suppress(Exception):
                client.close()
            with contextlib.suppress(Exception):
                cluster.close()


def _build_kernels(dtype: str, dask_worker=None) -> float:
    """Run on each worker: build its kernels now, so the timed run does not include compiling."""
    from dgemm.worker import PLUGIN_NAME
    t0 = time.perf_counter()
    plugin = dask_worker.plugins.get(PLUGIN_NAME) if dask_worker is not None else None
    if plugin is not None and plugin.state is not None and plugin.state.device is not None:
        plugin.state.engine(dtype)
    return time.perf_counter() - t0


def default_size(devices: str | None = None) -> int:
    """The demo's matrix size: small for CPU devices, large enough to be fair to a GPU."""
    from dgemm.opencl.discovery import select_devices
    chosen = select_devices(devices)
    return DEFAULT_GPU_SIZE if any(d.type == "GPU" for d in chosen) else DEFAULT_CPU_SIZE


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
            builds = client.run(_build_kernels, dtype, workers=list(workers))
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
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "size": size, "dtype": dtype, "seconds": seconds, "tflops": flops / seconds / 1e12,
        "max_rel_err": check["max_rel_err"], "tolerance": check["tolerance"],
        "entries_checked": check["entries"], "passed": check["passed"], "dashboard": dashboard,
        "kernel_build_seconds": max(builds.values()), "host": platform.node(),
        "dgemm_version": __version__, "folder": str(folder) if keep is not None else None,
    }

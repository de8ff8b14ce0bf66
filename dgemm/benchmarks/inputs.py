"""Random test matrices as Zarr arrays (``dgemm random``, the demo, the benchmarks).

:func:`random_zarr` draws standard normals chunk by chunk, each chunk from
its own generator (spawned from the seed), in parallel threads: numpy's
generators release the GIL, so a many-core host writes several times faster
than with one generator.  The array depends on the seed, shape and chunks
only, not on the threads or the panels.  No whole matrix, nor a whole chunk
row of a very wide one, is ever held in memory: each thread writes a panel
of at most :data:`PANEL_BYTES` (whole chunks of one chunk row, or one chunk
when a chunk is larger), and the threads are fewer when their panels would
hold more than :data:`BYTES_IN_FLIGHT`.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dgemm.dtypes import SUPPORTED

PANEL_BYTES = 256 * 2**20         # one write: whole chunks of a chunk row, up to this size
BYTES_IN_FLIGHT = 8 * 2**30       # bound on what the writer threads hold at once


def _exists(path: str) -> bool:
    if "://" not in path or path.startswith("file://"):
        return os.path.lexists(path[len("file://"):] if path.startswith("file://") else path)
    import zarr
    try:
        zarr.open(path, mode="r")
        return True
    except Exception:  # zarr raises several types for "nothing here"
        return False


def _pair(value, what: str, minimum: int) -> tuple[int, int]:
    vals = tuple(value)
    if len(vals) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in vals):
        raise ValueError(f"{what} must be two integers (rows, columns), not {value!r}")
    if any(v < minimum for v in vals):
        need = "non-negative" if minimum == 0 else "positive"
        raise ValueError(f"{what} must be {need}, not {tuple(int(v) for v in vals)}")
    return tuple(int(v) for v in vals)


def panels(shape, chunks, itemsize: int) -> list[tuple[int, int, int, int]]:
    """``(r0, r1, c0, c1)`` of each write: whole chunks of one chunk row, at most :data:`PANEL_BYTES`.

    >>> panels((25, 30), (10, 8), 8)[:2]
    [(0, 10, 0, 30), (10, 20, 0, 30)]
    """
    (m, n), (cr, cc) = shape, chunks
    per_panel = max(1, PANEL_BYTES // (cr * cc * itemsize)) * cc
    return [(r0, min(r0 + cr, m), c0, min(c0 + per_panel, n))
            for r0 in range(0, m, cr) for c0 in range(0, n, per_panel)]


def random_zarr(path, shape, chunks, dtype="float64", seed: int | None = None, overwrite: bool = False,
                threads: int | None = None):
    """Write a standard-normal random matrix as an uncompressed Zarr array, chunks in parallel.

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
        Seed of the chunks' generators (:class:`numpy.random.SeedSequence`);
        the same seed, shape and chunks give the same array.  Default: fresh
        entropy.
    overwrite : bool
        Replace an existing array, folder or file at ``path``.
    threads : int, optional
        Writer threads; default the CPU count (fewer when the panels are large).

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
    if dt not in SUPPORTED:
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
    (m, n), (cr, cc) = shape, chunks
    grid_cols = -(-n // cc)
    seeds = np.random.SeedSequence(seed).spawn(-(-m // cr) * grid_cols)
    todo = panels(shape, chunks, dt.itemsize)
    if not todo:   # an empty matrix
        return arr
    biggest = max((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in todo) * dt.itemsize
    # a panel is held twice while it is written (the numbers and zarr's bytes)
    fit = max(1, BYTES_IN_FLIGHT // max(1, 2 * biggest))
    threads = threads or max(1, min(os.cpu_count() or 1, fit, len(todo)))

    def write(panel):
        r0, r1, c0, c1 = panel
        block = np.empty((r1 - r0, c1 - c0), dt)
        for j0 in range(c0, c1, cc):
            rng = np.random.default_rng(seeds[(r0 // cr) * grid_cols + j0 // cc])
            block[:, j0 - c0:min(j0 + cc, c1) - c0] = rng.standard_normal((r1 - r0, min(cc, c1 - j0)), dtype=dt)
        arr[r0:r1, c0:c1] = block

    with ThreadPoolExecutor(threads) as ex:
        for _ in ex.map(write, todo):  # re-raises a writer's error
            pass
    return arr

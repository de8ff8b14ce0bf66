"""Random test matrices as Zarr arrays (``dgemm random``, the demo, the benchmarks).

:func:`random_zarr` draws standard normals chunk by chunk, each chunk from
its own generator (spawned from the seed), in parallel threads: numpy's
generators release the GIL, so a many-core host writes several times faster
than with one generator.  The array depends on the seed, shape and chunks
only, not on the threads or the panels.  No whole matrix, nor a whole chunk
row of a very wide one, is ever held in memory: each thread writes a panel
of at most :data:`PANEL_BYTES` (whole chunks of one chunk row, or one chunk
when a chunk is larger), and the threads are fewer when their panels would
hold more than :data:`BYTES_IN_FLIGHT`.  A sharded array is written in whole
shards (a shard is one object: two threads writing parts of it would race).
The codec and the Zarr format are the caller's (by default raw chunks, v3).

:func:`make_inputs` writes the end-to-end benchmark's A and B that way, as
users write them (raw chunks, zarr's default codec or Blosc/LZ4, Zarr v2,
sharded: :data:`INPUT_CODECS`), in a local folder or on S3, and says what
zarr reads back (:func:`describe_zarr`).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from dgemm.benchmarks.objectstore import Location, open_zarr, stored_bytes
from dgemm.dtypes import SUPPORTED
from dgemm.sizes import roundup

PANEL_BYTES = 256 * 2**20         # one write: whole chunks of a chunk row, up to this size
BYTES_IN_FLIGHT = 8 * 2**30       # bound on what the writer threads hold at once
INPUT_CODECS = ("raw", "default", "blosc-lz4")   # how the benchmark's inputs are encoded (make_inputs)


def _exists(path: str, storage_options: dict | None = None) -> bool:
    if "://" not in path or path.startswith("file://"):
        return os.path.lexists(path[len("file://"):] if path.startswith("file://") else path)
    import zarr
    try:
        zarr.open(path, mode="r", storage_options=storage_options)
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

    ``chunks`` is the unit a write must not split: the chunks, or the shards
    of a sharded array.

    >>> panels((25, 30), (10, 8), 8)[:2]
    [(0, 10, 0, 30), (10, 20, 0, 30)]
    """
    (m, n), (cr, cc) = shape, chunks
    per_panel = max(1, PANEL_BYTES // (cr * cc * itemsize)) * cc
    return [(r0, min(r0 + cr, m), c0, min(c0 + per_panel, n))
            for r0 in range(0, m, cr) for c0 in range(0, n, per_panel)]


def random_zarr(path, shape, chunks, dtype="float64", seed: int | None = None, overwrite: bool = False,
                threads: int | None = None, *, compressors=None, shards=None, zarr_format: int = 3,
                storage_options: dict | None = None):
    """Write a standard-normal random matrix as a Zarr array (uncompressed by default), chunks in parallel.

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
    compressors : None, "auto" or codecs
        zarr's ``compressors``: ``None`` (default) writes raw chunks, ``"auto"``
        zarr's default codec for the format (zstd), as a user's array has it.
    shards : (int, int), optional
        Shard shape (zarr's ``shards``; multiples of ``chunks``, Zarr v3
        only): ``chunks`` are then the inner chunks.
    zarr_format : {3, 2}
        The Zarr format of the array.
    storage_options : dict, optional
        Options of the filesystem behind a URL ``path`` (s3fs: credentials,
        endpoint), as zarr's ``storage_options``; ignored for a local path.

    Returns
    -------
    zarr.Array
        The written array.

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is false; nothing is written.
    ValueError, TypeError
        Bad shape, chunks, shards, format or dtype; nothing is written.

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
    if zarr_format not in (2, 3):
        raise ValueError(f"zarr_format must be 2 or 3, not {zarr_format!r}")
    if shards is not None:
        shards = _pair(shards, "shards", minimum=1)
        if zarr_format != 3:
            raise ValueError("shards need Zarr v3 (zarr_format=3)")
        if any(s % c for s, c in zip(shards, chunks)):
            raise ValueError(f"shards {shards} must be multiples of the chunks {chunks}")
    path = os.fspath(path)
    storage_options = storage_options if "://" in path and not path.startswith("file://") else None
    if not overwrite and _exists(path, storage_options):
        raise FileExistsError(f"{path!r} already exists; pass overwrite=True to replace it")
    if overwrite and os.path.isfile(path):
        # zarr would refuse to turn a plain file into a store; the user asked to replace it.
        os.remove(path)
    # Random normals do not compress: by default the codec is skipped, which writes several times faster.
    arr = zarr.create_array(store=path, shape=shape, chunks=chunks, shards=shards, dtype=dt,
                            compressors=compressors, fill_value=0, overwrite=overwrite, zarr_format=zarr_format,
                            storage_options=storage_options)
    (m, n), (cr, cc) = shape, chunks
    grid_cols = -(-n // cc)
    seeds = np.random.SeedSequence(seed).spawn(-(-m // cr) * grid_cols)
    todo = panels(shape, shards or chunks, dt.itemsize)
    if not todo:   # an empty matrix
        return arr
    biggest = max((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in todo) * dt.itemsize
    # a panel is held twice while it is written (the numbers and zarr's bytes)
    fit = max(1, BYTES_IN_FLIGHT // max(1, 2 * biggest))
    threads = threads or max(1, min(os.cpu_count() or 1, fit, len(todo)))

    def write(panel):
        r0, r1, c0, c1 = panel
        block = np.empty((r1 - r0, c1 - c0), dt)
        for i0 in range(r0, r1, cr):    # a shard's panel spans several chunk rows
            rows = min(cr, r1 - i0)
            for j0 in range(c0, c1, cc):
                rng = np.random.default_rng(seeds[(i0 // cr) * grid_cols + j0 // cc])
                block[i0 - r0:i0 - r0 + rows, j0 - c0:min(j0 + cc, c1) - c0] = rng.standard_normal(
                    (rows, min(cc, c1 - j0)), dtype=dt)
        arr[r0:r1, c0:c1] = block

    with ThreadPoolExecutor(threads) as ex:
        for _ in ex.map(write, todo):  # re-raises a writer's error
            pass
    return arr


# -- the end-to-end benchmark's inputs ------------------------------------------------------
def input_compressors(codec: str, zarr_format: int = 3):
    """zarr's ``compressors`` for an input codec of :data:`INPUT_CODECS` in a Zarr format.

    ``"default"`` is zarr's own default (``"auto"``: zstd in both formats),
    what an array written without naming a codec has; ``"blosc-lz4"`` is
    Blosc with LZ4 and Blosc's other defaults (byte shuffle, level 5).

    >>> input_compressors("raw"), input_compressors("default", 2)
    (None, 'auto')
    >>> input_compressors("blosc-lz4", 2)
    Blosc(cname='lz4', clevel=5, shuffle=SHUFFLE, blocksize=0)
    """
    if codec == "raw":
        return None
    if codec == "default":
        return "auto"
    if codec == "blosc-lz4":
        if zarr_format == 2:
            from numcodecs import Blosc
            return Blosc(cname="lz4")
        from zarr.codecs import BloscCodec
        return BloscCodec(cname="lz4")
    raise ValueError(f"input codec must be one of {', '.join(INPUT_CODECS)}, not {codec!r}")


def codec_dict(codec) -> dict | str:
    """A codec as JSON: zarr v3 codecs have ``to_dict``, numcodecs' (Zarr v2) ``get_config``."""
    for method in ("to_dict", "get_config"):
        with contextlib.suppress(Exception):
            return _jsonable(getattr(codec, method)())
    return repr(codec)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return getattr(x, "value", None) if isinstance(getattr(x, "value", None), (str, int)) else str(x)


def describe_zarr(path, storage_options: dict | None = None) -> dict:
    """What zarr says the array at ``path`` is: format, chunks, shards and codecs, as JSON."""
    arr = open_zarr(path, storage_options)
    meta = arr.metadata
    out = {"zarr_format": meta.zarr_format, "chunks": list(arr.chunks),
           "shards": list(arr.shards) if arr.shards is not None else None,
           "compressors": [codec_dict(c) for c in arr.compressors],
           "filters": [codec_dict(c) for c in arr.filters]}
    if meta.zarr_format == 3:
        out["codecs"] = [codec_dict(c) for c in meta.codecs]
    return out


def _capped_shards(shards: int | None, shape, ch) -> tuple[int, int] | None:
    """The shard shape for an array: ``shards`` along each axis, capped to the array (rounded up to its chunks)."""
    if not shards:
        return None
    return tuple(min(shards, roundup(max(x, 1), c)) for x, c in zip(shape, ch))


def make_inputs(folder, m: int, n: int, k: int, chunks: int, dtype: str, seed: int, tag: str = "",
                codec: str = "raw", zarr_format: int = 3, shards: int | None = None, staging=None,
                op: str = "matmul") -> dict:
    """Write A (m x k) and B (k x n) into ``folder``; their paths, chunks, codecs, bytes and the write time.

    ``op`` names the arrays (:func:`dgemm.benchmarks.shapes.operands`):
    ``a.zarr`` and ``b.zarr`` for ``"matmul"``; ``x.zarr`` and ``w.zarr`` for
    ``"projection"``; for ``"gram"`` one X (k x n) in ``x.zarr``, written
    once, whose entry is both ``a`` and ``b`` (C = X^T X).

    Written with zarr's API (``zarr.create_array`` with zarr's defaults except
    the codec ``codec`` names, then whole chunks, or whole shards of
    ``shards`` x ``shards``, set from threads): the same arrays
    ``dask.array.to_zarr`` makes with the same codec.  Each array's entry
    carries what zarr reads back (:func:`describe_zarr`).

    ``folder`` is a local folder, or a remote
    :class:`~dgemm.benchmarks.objectstore.Location` (an S3 prefix): there
    each array is written into the local folder ``staging`` first, then
    uploaded file by file (its entry's ``upload``) and its local copy
    removed, so the objects are the same bytes as a local array's files.
    """
    remote = isinstance(folder, Location) and folder.remote
    if remote and staging is None:
        raise ValueError("inputs on a remote store are written in a local staging folder first: give staging")
    so = folder.storage_options if isinstance(folder, Location) else None
    out = {"seconds": 0.0, "codec": codec, "zarr_format": zarr_format, "shards": shards,
           "writer": "zarr.create_array (zarr's defaults but the codec) + threaded setitem of whole "
                     + ("shards" if shards else "chunks")
                     + ("; written locally, then every file uploaded (s3fs put)" if remote else "")}
    from dgemm.benchmarks.shapes import operands

    compressors = input_compressors(codec, zarr_format)
    for (name, (stem, shape)), s in zip(operands(op, m, n, k).items(), (seed, seed + 1)):
        if name == "b" and stem == out["a"]["stem"]:     # a Gram product's X: one array, both operands
            out["b"] = out["a"]
            continue
        path = folder / f"{stem}{tag}.zarr"
        local = Path(staging) / f"{stem}{tag}.zarr" if remote else path
        ch = (min(chunks, max(shape[0], 1)), min(chunks, max(shape[1], 1)))
        sh = _capped_shards(shards, shape, ch)
        t0 = time.perf_counter()
        random_zarr(local, shape, ch, dtype, seed=s, overwrite=True, compressors=compressors, shards=sh,
                    zarr_format=zarr_format)
        upload = None
        if remote:
            try:
                folder.remove(path)      # a stale copy's objects would stay beside the new ones
                upload = folder.upload(local, path)
            finally:
                shutil.rmtree(local, ignore_errors=True)
        sec = time.perf_counter() - t0
        out["seconds"] += sec
        nbytes = shape[0] * shape[1] * np.dtype(dtype).itemsize
        out[name] = {"stem": stem, "path": str(path), "shape": list(shape), "chunks": list(ch),
                     "shards": list(sh) if sh else None, "bytes": nbytes,
                     "bytes_on_disk": stored_bytes(path, so), "seconds": sec, "upload": upload,
                     "write_gbps": nbytes / sec / 1e9 if sec > 0 else None, "zarr": describe_zarr(path, so)}
    return out

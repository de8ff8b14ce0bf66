"""The public operations: :func:`matmul` and :func:`gemm`.

A call is checked whole first (:meth:`dgemm.client.request.Request.check`: shapes,
dtypes, output), before any cluster is used; :func:`dgemm.client.steps.run` then
takes the checked request through its steps.
"""
from __future__ import annotations

# dgemm.client.request and dgemm.client.steps (which import Dask, distributed and Zarr) are imported by the calls, not
# here: ``from dgemm import matmul`` stays cheap, in a script and in every worker process that imports it.
from dgemm.client.dataarrays import (
    align,
    check,
    is_dataarray,
    prepare_out,
    unwrap,
    wrap,
    write_out_metadata,
)


def matmul(a, b, out=None, *, client=None, overwrite: bool = False, resume: bool = False, block=None,
           devices: str | None = None, progress: bool = False, precision: str | None = None,
           compressors="auto", storage_options: dict | None = None, chunks=None, shards=None,
           zarr_format: int | None = None, dimension_names=None, attributes: dict | None = None):
    """Matrix product of two arrays, computed on the cluster's OpenCL devices.

    Follows :func:`numpy.matmul` for 1-D and 2-D operands: a 1-D first
    operand is a row vector, a 1-D second operand a column vector, and the
    added axis is removed from the result.

    Parameters
    ----------
    a, b : zarr.Array, str, os.PathLike, zarr store, dask.array.Array, numpy.ndarray or xarray.DataArray
        The operands; paths and URLs are opened as Zarr arrays (read-only).
        float32 and float64; mixed inputs give float64.  Two DataArrays
        follow :func:`xarray.dot`: the contracted dimension (``a``'s last,
        ``b``'s first) must have one name (two names are a ValueError
        naming both), and ``a`` and ``b`` are aligned on its labels first
        (an inner join, or xarray's ``arithmetic_join="exact"``), lazily
        for dask data; see :mod:`dgemm.client.dataarrays`.
    out : str, os.PathLike, zarr store or zarr.Array, optional
        Where to write the product as a Zarr array.  ``None`` returns a lazy
        dask array instead, chunked as :func:`dask.array.matmul` chunks it:
        rows as ``a``'s chunks, columns as ``b``'s, each chunk one block of
        the devices, so that a slice computes only the chunks it touches.
        Along an axis whose chunks are larger than the devices' block size
        or smaller than 128 (or of a numpy operand), and wherever
        ``block=`` is given, the chunks are the plan's blocks.
    client : distributed.Client, optional
        Defaults to the current client, else a local cluster with one worker
        per OpenCL device (see :class:`dgemm.DeviceCluster`).
    overwrite : bool
        Replace an existing ``out`` path.
    resume : bool
        Finish an interrupted run: ``out`` (written by the same call that was
        interrupted) keeps the blocks already stored, only the missing ones
        are computed.  The same operands, options and block grid are
        required (checked; anything else is refused).  An ``out`` that does
        not exist yet is simply written.  The finished output's
        ``attrs["dgemm"]`` records ``blocks``, ``blocks_run`` and ``resumed``.
    block : int or (int, int, int), optional
        Preferred block sizes along M, N and K (rounded to kernel tiles, and
        shrunk where the devices' memory needs it).  Blocks beyond 32-bit
        indexing (more than 2**31 - 1 elements) are refused.  Unset: 8192
        along M and N and 4096 along K on GPUs
        (:data:`dgemm.sizes.GPU_TARGET`), 4096 on GPUs with less than
        24 GiB a worker, 1024 on CPU devices.
    devices : str, optional
        Devices for a local cluster started by this call (``DGEMM_DEVICES``).
    progress : bool
        Show a progress bar while writing ``out``.
    precision : {None, "fma", "3xtf32", "tf32", "dmma"}, optional
        The arithmetic.  ``None`` (default) never loses accuracy: float32 runs
        the FMA kernel, float64 the fastest exact kernel the device has (DMMA
        tensor cores on NVIDIA compute capability >= 8.0).  float32 may ask for
        ``"3xtf32"`` (tensor cores, error-compensated: measured at least as
        accurate as FMA on the H100) or ``"tf32"`` (tensor cores, TF32
        accuracy, about 3e-4 relative: an explicit fast mode); float64 for
        ``"fma"``.  Devices without tensor cores run the FMA kernel instead.
    compressors : "auto", None, or numcodecs/zarr codecs
        Compression of a new ``out`` (zarr's ``compressors``; "auto" is
        zarr's default).  Products of random-looking data hardly compress;
        ``None`` writes raw chunks, several times faster (on the H100 host the
        default zstd held a 32768² float32 run to about 1 GB/s of writes).
        An existing ``out`` keeps its own codecs.
    chunks : int or tuple of int, optional
        Chunk shape of a new ``out``, as :func:`zarr.create_array` takes it
        (one size per dimension of the result; an int for every one).  By
        default C is chunked as :func:`dask.array.matmul` chunks it: rows as
        ``a``'s chunks, columns as ``b``'s (op(a), op(b) for ``gemm``),
        wherever the devices' blocks hold whole such chunks; along an axis
        where they do not (chunks larger than a block; numpy operands), C's
        chunks are the blocks.  The blocks are always whole chunks (or
        shards) of C, multiples of them as large as the devices allow.
    shards : int or tuple of int, optional
        Shard shape of a new ``out`` (Zarr v3 only; multiples of ``chunks``,
        which must then be given).
    zarr_format : {2, 3}, optional
        Zarr format of a new ``out`` (default: zarr's, 3).
    dimension_names : sequence of str or None, optional
        Zarr v3 ``dimension_names`` of a new ``out``, one per dimension of
        the result (xarray's dims).  With DataArray operands they must be
        the dims of the product, which are written anyway.
    attributes : dict, optional
        Attributes of a new ``out`` (JSON-serialisable).  The key
        ``"dgemm"`` is dgemm's own record of the run.

        These five are checked before any work, and a resumed ``out`` must
        have been created with the same ones; any other existing ``out``
        refuses them (it keeps its own).  A lazy result refuses them too.
    storage_options : dict, optional
        Options of the filesystem behind URL operands and ``out`` (strings
        such as ``"s3://bucket/a.zarr"``), as :func:`dask.array.from_zarr`
        and :func:`dask.array.to_zarr` take them: for s3fs, e.g.
        ``{"key": ..., "secret": ..., "endpoint_url": ...}`` or
        ``{"anon": True}``.  They travel with the opened arrays to the
        workers, which need no credentials of their own.  Local paths ignore
        them; a call with no URL at all refuses them (so do opened arrays
        and stores, which carry their own).

    Returns
    -------
    zarr.Array, numpy.ndarray, dask.array.Array or xarray.DataArray
        The written array when ``out`` is given.  Without ``out``: operands
        all in memory (numpy, lists) give a numpy array, computed at once
        (by numpy in this process below the ``small-flops`` setting, else on
        the devices); others a lazy dask array whose blocks the devices
        compute.  A finished ``out`` holds its chunks and, under
        ``.dgemm/``, nothing: the ``dgemm`` attribute alone records the run
        (the per-block records that ``resume`` needs go once it
        completes).  A lazy call starts no cluster: it is planned for
        ``client`` (or the current client) when there is one, and computed
        wherever dask computes it (a distributed client's workers, or this
        process's OpenCL device under dask's local schedulers).  An
        :class:`xarray.DataArray` operand gives a DataArray with the dims
        ``(a.dims[0], b.dims[-1])`` and the coordinates along them, named as
        xr.dot names it (the operands' common name, else None); lazy when
        the data is.  A written ``out`` is wrapped lazily, and holds the
        dims (Zarr v3 ``dimension_names``, v2 ``_ARRAY_DIMENSIONS``); when
        ``out`` lies in a Zarr group (``out="ds.zarr/c"``), the coordinates
        are written beside it as xarray lays them out, so that
        ``xr.open_zarr("ds.zarr")["c"]`` reads the product back (a
        coordinate the group holds with other labels is refused before any
        work), and the DataArray is named ``"c"``.  ``xr.open_zarr`` needs
        a group: an ``out`` in a plain folder gets the dims only.

    Examples
    --------
    Dask operands give a lazy result; the call starts no cluster, and dask's
    local scheduler computes the blocks on this process's OpenCL device:

    >>> import numpy as np, dask.array as da, dgemm
    >>> rng = np.random.default_rng()
    >>> a, b = rng.standard_normal((300, 200)), rng.standard_normal((200, 100))
    >>> lazy = dgemm.matmul(da.from_array(a, chunks=100), da.from_array(b, chunks=100))
    >>> lazy.shape, lazy.dtype
    ((300, 100), dtype('float64'))
    >>> np.allclose(lazy.compute(scheduler="threads"), a @ b)
    True

    Zarr in, Zarr out on a cluster (here a small one inside this process;
    :class:`dgemm.DeviceCluster` and ``dgemm cluster`` start a worker process
    per device); operands in memory give a numpy array:

    >>> import os, shutil, tempfile, zarr
    >>> from distributed import Client, LocalCluster
    >>> folder = tempfile.mkdtemp()
    >>> for name, x in (("a.zarr", a), ("b.zarr", b)):
    ...     zarr.create_array(os.path.join(folder, name), shape=x.shape, chunks=(100, 100), dtype=x.dtype)[...] = x
    >>> with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster:
    ...     with Client(cluster, set_as_default=False) as client:
    ...         c = dgemm.matmul(os.path.join(folder, "a.zarr"), os.path.join(folder, "b.zarr"),
    ...                          out=os.path.join(folder, "c.zarr"), client=client)
    ...         d = dgemm.matmul(a, b, client=client)
    >>> type(c).__name__, type(d).__name__
    ('Array', 'ndarray')
    >>> np.allclose(dgemm.open_result(os.path.join(folder, "c.zarr"))[...], a @ b), np.allclose(d, a @ b)
    (True, True)
    >>> shutil.rmtree(folder)
    """
    from dgemm.client import prestart
    prestart.start(client, out)   # the local cluster's workers' imports go on while this call imports and checks
    from dgemm.client.request import Request
    from dgemm.client.steps import run

    labelled = is_dataarray(a) or is_dataarray(b)
    if labelled:
        check(a, b)          # refused before any work: dims xarray would not multiply, or cannot hold
        a, b = align(a, b)   # on the contracted dim's labels, as xr.dot (lazily: nothing computed here)
    req = Request.check("matmul", unwrap(a), unwrap(b), out=out, client=client, overwrite=overwrite,
                        resume=resume, block=block, devices=devices, progress=progress, precision=precision,
                        compressors=compressors, storage_options=storage_options, chunks=chunks, shards=shards,
                        zarr_format=zarr_format, dimension_names=dimension_names, attributes=attributes)
    stored = prepare_out(out, a, b, storage_options=storage_options) if labelled else None   # clashes refused now
    _check_dims(stored, dimension_names)
    result = run(req)
    if not labelled:
        return result
    return wrap(result, a, b, name=write_out_metadata(result, stored))


def gemm(a, b, c=None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
         trans_b: bool = False, out=None, client=None, overwrite: bool = False, resume: bool = False,
         block=None, devices: str | None = None, progress: bool = False, precision: str | None = None,
         compressors="auto", storage_options: dict | None = None, chunks=None, shards=None,
         zarr_format: int | None = None, dimension_names=None, attributes: dict | None = None):
    """General matrix multiply: ``alpha * op(a) @ op(b) + beta * c``.

    ``op(x)`` is ``x.T`` when the matching ``trans_*`` flag is set; the
    transpose happens on the device, block by block, never as a copy in the
    store.  ``a``, ``b`` and ``c`` must be 2-D.  ``c`` is read only when
    ``beta != 0``; ``out`` may name the same Zarr array as ``c`` (a path or the
    array), which is then updated in place as in BLAS.  ``out`` may not be
    ``a`` or ``b``.

    Parameters are as for :func:`matmul`, plus
    ----------
    c : array-like, optional
        The ``M x N`` addend.  Required when ``beta != 0``.
    alpha, beta : float
        Scalars.
    trans_a, trans_b : bool
        Use the transpose of ``a`` / ``b``.
    """
    from dgemm.client import prestart
    prestart.start(client, out)   # the local cluster's workers' imports go on while this call imports and checks
    from dgemm.client.request import Request
    from dgemm.client.steps import run

    labelled = is_dataarray(a) or is_dataarray(b)
    if labelled:
        check(a, b, trans_a=trans_a, trans_b=trans_b)
        a, b = align(a, b, trans_a=trans_a, trans_b=trans_b)
    req = Request.check("gemm", unwrap(a), unwrap(b), unwrap(c), alpha=alpha, beta=beta, trans_a=trans_a,
                        trans_b=trans_b, out=out, client=client, overwrite=overwrite, resume=resume, block=block,
                        devices=devices, progress=progress, precision=precision, compressors=compressors,
                        storage_options=storage_options, chunks=chunks, shards=shards, zarr_format=zarr_format,
                        dimension_names=dimension_names, attributes=attributes)
    stored = (prepare_out(out, a, b, trans_a=trans_a, trans_b=trans_b, storage_options=storage_options)
              if labelled else None)
    _check_dims(stored, dimension_names)
    result = run(req)
    if not labelled:
        return result
    return wrap(result, a, b, trans_a=trans_a, trans_b=trans_b, name=write_out_metadata(result, stored))




def _check_dims(stored, dimension_names) -> None:
    """Refuse, before any work, ``dimension_names`` other than the dims that DataArray operands give the product."""
    if stored is None or dimension_names is None:
        return
    dims = tuple(stored.dims)
    if tuple(dimension_names) != dims:
        raise ValueError(f"dimension_names={tuple(dimension_names)!r}, but the DataArray operands give the product "
                         f"the dims {dims!r}, which out records; leave dimension_names out, or rename the dims")

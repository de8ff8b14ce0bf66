"""The public operations: :func:`matmul` and :func:`gemm`.

A call is checked whole first (:meth:`dgemm.request.Request.check`: shapes,
dtypes, output), before any cluster is used; :func:`dgemm.steps.run` then
takes the checked request through its steps.
"""
from __future__ import annotations

from dgemm.request import Request
from dgemm.steps import run


def matmul(a, b, out=None, *, client=None, overwrite: bool = False, resume: bool = False, block=None,
           devices: str | None = None, progress: bool = False, precision: str | None = None,
           compressors="auto"):
    """Matrix product of two arrays, computed on the cluster's OpenCL devices.

    Follows :func:`numpy.matmul` for 1-D and 2-D operands: a 1-D first
    operand is a row vector, a 1-D second operand a column vector, and the
    added axis is removed from the result.

    Parameters
    ----------
    a, b : zarr.Array, str, os.PathLike, zarr store, dask.array.Array or numpy.ndarray
        The operands; paths and URLs are opened as Zarr arrays (read-only).
        float32 and float64; mixed inputs give float64.
    out : str, os.PathLike, zarr store or zarr.Array, optional
        Where to write the product as a Zarr array.  ``None`` returns a lazy
        dask array instead.
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
        indexing (more than 2**31 - 1 elements) are refused.
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

    Returns
    -------
    zarr.Array or dask.array.Array
        The written array when ``out`` is given, else a lazy dask array whose
        blocks are computed on the devices.

    Examples
    --------
    >>> import numpy as np, dgemm                                # doctest: +SKIP
    >>> c = dgemm.matmul("a.zarr", "b.zarr", out="c.zarr")       # doctest: +SKIP
    >>> np.allclose(c[:], np.asarray(...))                       # doctest: +SKIP
    """
    return run(Request.check("matmul", a, b, out=out, client=client, overwrite=overwrite, resume=resume,
                              block=block, devices=devices, progress=progress, precision=precision,
                              compressors=compressors))


def gemm(a, b, c=None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
         trans_b: bool = False, out=None, client=None, overwrite: bool = False, resume: bool = False,
         block=None, devices: str | None = None, progress: bool = False, precision: str | None = None,
         compressors="auto"):
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
    return run(Request.check("gemm", a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, out=out,
                              client=client, overwrite=overwrite, resume=resume, block=block, devices=devices,
                              progress=progress, precision=precision, compressors=compressors))



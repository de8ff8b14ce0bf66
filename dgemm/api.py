"""The public operations: :func:`matmul` and :func:`gemm`.

Everything the user passed is checked first (shapes, dtypes, output); only
then is a cluster found or started, the product planned, the output created
and the graph run.
"""
from __future__ import annotations

import dataclasses

import numbers
import time
import uuid

import numpy as np

from dgemm import graph as graph_mod
from dgemm.scheduler import placement
from dgemm.cluster import device_limits, get_client, prepare, tiles_of
from dgemm.tuning.database import check_precision
from dgemm.plan import INT32_MAX, index_overflow, make_plan
from dgemm.storage import (COMPLETE_ATTR, BlockMarkers, Operand, _is_zarr_array, check_dtype, check_output,
                      create_output, location, mark_complete, run_id)


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
    return _run(a, b, None, 1.0, 0.0, False, False, out, client, overwrite, block, devices,
                progress, "matmul", resume, precision, compressors)


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
    return _run(a, b, c, alpha, beta, trans_a, trans_b, out, client, overwrite, block, devices,
                progress, "gemm", resume, precision, compressors)


def _check_scalar(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, not {type(x).__name__}")
    return float(x)


def _check_bool(x, name: str) -> bool:
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {x!r}")
    return bool(x)


def _check_block_overflow(target, m: int, n: int, k: int) -> None:
    """Refuse a ``block`` whose blocks would exceed the kernels' 32-bit indexing."""
    if target is None:
        return
    bm, bn, bk = (min(t, max(e, 1)) for t, e in zip(target, (m, n, k)))
    for what, x, y in (("C", bm, bn), ("A", bm, bk), ("B", bk, bn)):
        if x * y > INT32_MAX:
            raise ValueError(f"block={target} gives {what} blocks of {x} x {y} = {x * y} elements, more than the "
                             f"2**31 - 1 the kernels index with 32-bit integers; use smaller blocks "
                             f"(e.g. block=4096)")


def _check_block(block):
    if block is None:
        return None
    try:
        vals = (block,) * 3 if isinstance(block, numbers.Integral) else tuple(block)
    except TypeError:  # not iterable (e.g. a float): the same clear message as any other bad value
        vals = ()
    if len(vals) != 3 or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0
                                 for v in vals):
        raise ValueError(f"block must be a positive int or three positive ints (M, N, K), not {block!r}")
    return tuple(int(v) for v in vals)


def _run(a, b, c, alpha, beta, trans_a, trans_b, out, client, overwrite, block, devices, progress, op,
         resume=False, precision=None, compressors="auto"):
    # ---- check everything the user gave, before any work ----
    alpha, beta = _check_scalar(alpha, "alpha"), _check_scalar(beta, "beta")
    trans_a, trans_b = _check_bool(trans_a, "trans_a"), _check_bool(trans_b, "trans_b")
    overwrite, resume = _check_bool(overwrite, "overwrite"), _check_bool(resume, "resume")
    progress = _check_bool(progress, "progress")
    if resume and out is None:
        raise ValueError("resume=True finishes an interrupted run into out; give out")
    if resume and overwrite:
        raise ValueError("resume=True keeps the blocks already in out and overwrite=True discards them; "
                         "choose one")
    target = _check_block(block)
    A, B = Operand(a, "a"), Operand(b, "b")
    drop: tuple = ()
    if op == "gemm":
        for x in (A, B):
            if x.ndim != 2:
                raise ValueError(f"gemm needs 2-D operands; {x.what} has shape {x.stored_shape}")
    else:
        if A.ndim == 1:
            A.promote(0)
            drop += (0,)
        if B.ndim == 1:
            B.promote(1)
            drop += (1,)
    if trans_a:
        A.transpose()
    if trans_b:
        B.transpose()
    (m, ka), (kb, n) = A.shape, B.shape
    if ka != kb:
        sa = "a.T" if trans_a else "a"
        sb = "b.T" if trans_b else "b"
        raise ValueError(f"{op}: shapes do not match: {sa} has shape {_orig(A)} and {sb} has shape {_orig(B)}; "
                         f"the contracted dimensions differ ({ka} != {kb})")
    dtype = np.result_type(A.dtype, B.dtype)
    C = None
    if c is not None:
        C = Operand(c, "c")
        if C.ndim != 2 or C.shape != (m, n):
            raise ValueError(f"c has shape {C.stored_shape}, but op(a) @ op(b) has shape {(m, n)}")
        dtype = np.result_type(dtype, C.dtype)
    elif beta != 0:
        raise ValueError(f"beta={beta} needs c (the matrix to scale and add)")
    dtype = check_dtype(dtype, "the result")
    precision = check_precision(dtype.name, precision)
    _check_block_overflow(target, m, n, ka)
    full_shape = (m, n)
    shape = tuple(s for ax, s in enumerate(full_shape) if ax not in drop)
    if out is not None:
        in_place = c is not None and location(out) is not None and location(c) == location(out)
        out = _resolve_in_place(out, a, b, c)
        if resume and in_place and beta != 0:
            raise ValueError("cannot resume an in-place update (out is c): the blocks already written have "
                             "replaced the C they were computed from; start again from a copy of C")
    spec = check_output(out, shape, dtype, overwrite, resume) if out is not None else None
    if not (isinstance(compressors, str) and compressors == "auto"):
        if spec is None:
            raise ValueError("compressors= applies to a Zarr out; a lazy result (out=None) is not stored")
        if spec.array is not None:
            raise ValueError("compressors= applies to a new out; the existing array keeps its own codecs")
        spec = dataclasses.replace(spec, compressors=compressors)
    out_chunks = None
    if spec is not None and spec.chunks is not None:
        it = iter(spec.chunks)
        out_chunks = tuple(1 if ax in drop else next(it) for ax in range(2))
        why = index_overflow(*out_chunks, 1, (1, 1, 1))
        if why:
            raise ValueError(f"out's chunks {tuple(spec.chunks)} are too large for dgemm: {why} (the kernels index "
                             "with 32-bit integers, and a task writes whole chunks); use smaller chunks")
    fingerprint = None
    if spec is not None:
        fingerprint = {"operation": op, "shape": list(shape), "dtype": dtype.str, "a": A.identity(),
                       "b": B.identity(), "c": C.identity() if C is not None and beta != 0 else None,
                       "alpha": alpha, "beta": beta, "precision": precision}
        if spec.resume:
            _check_resumable(spec.array, fingerprint)
            if spec.array.attrs[COMPLETE_ATTR].get("complete"):
                return spec.array          # finished already: nothing to do

    # ---- trivial shapes need no device ----
    if m == 0 or n == 0:
        return _empty(spec, shape, dtype, fingerprint)

    # ---- cluster, plan, graph ----
    client = get_client(client, devices)
    workers = prepare(client, dtype)
    tiles = tiles_of(workers, dtype, precision)
    exact = target is not None
    if target is None:
        all_cpu = all(d["device"].type == "CPU" for d in workers.values())
        target = (1024,) * 3 if all_cpu else (4096,) * 3
    memory, max_alloc = device_limits(workers)
    plan = make_plan(m, n, ka, dtype, tiles, a_chunks=A.chunks, b_chunks=B.chunks, out_chunks=out_chunks,
                     target=target, n_workers=len(workers), device_memory=memory, max_alloc=max_alloc,
                     exact=exact)
    token = uuid.uuid4().hex[:12]
    if spec is None:
        g = graph_mod.build(plan, A, B, C, alpha=alpha, beta=beta, token=token, precision=precision)
        import dask.array as da
        arr = da.Array(g.hlg(), g.result_name, chunks=(tuple(b - a for a, b in plan.rows),
                                                       tuple(b - a for a, b in plan.cols)),
                       dtype=dtype, meta=np.empty((0, 0), dtype=dtype))
        return arr[tuple(0 if ax in drop else slice(None) for ax in range(2))] if drop else arr

    chunks = tuple(s for ax, s in enumerate(plan.block_shape[:2]) if ax not in drop)
    grid = (len(plan.rows), len(plan.cols))
    fingerprint["block"] = list(plan.block_shape[:2])
    fingerprint["grid"] = list(grid)
    run = run_id(fingerprint)
    all_blocks = {(i, j) for i in range(grid[0]) for j in range(grid[1])}
    if spec.resume:
        result = spec.array
        stored = result.attrs[COMPLETE_ATTR].get("run", {})
        if stored.get("id") != run:
            raise ValueError("cannot resume: " + (_differences(stored, fingerprint) or
                                                  "out was cut into different blocks") +
                             "; pass overwrite=True to start again")
        markers = BlockMarkers(result, run)
        todo = sorted(all_blocks - markers.done(grid))
    else:
        meta = {"operation": op, "a": A.label, "b": B.label, "plan": plan.explain(),
                "run": {"id": run, **fingerprint}}
        result = create_output(spec, chunks, meta)
        markers = BlockMarkers(result, run)
        markers.reset()
        todo = sorted(all_blocks)
    t0 = time.perf_counter()
    if todo:
        # each worker its rectangle of C blocks, so it reads only its share of A and B
        where = sorted(workers) if len(workers) > 1 and placement.ensure(client) else None
        g = graph_mod.build(plan, A, B, C, alpha=alpha, beta=beta, token=token, blocks=todo,
                            precision=precision, workers=where)
        done_key = graph_mod.add_store(g, plan, result, drop, token, markers, blocks=todo)
        from dask.delayed import Delayed
        future = client.compute(Delayed(done_key, g.hlg()))
        if progress:
            from distributed import progress as show_progress
            show_progress(future, scheduler=client.scheduler.address)  # the client given, not just the default
        future.result()
    seconds = time.perf_counter() - t0
    missing = all_blocks - markers.done(grid)
    if missing:  # never mark complete what is not: every block must have its marker
        raise RuntimeError(f"dgemm: {len(missing)} of {len(all_blocks)} blocks of {result.store_path} have no "
                           f"completion marker after the run (first: {min(missing)}); out is left incomplete, "
                           "resume=True finishes it")
    mark_complete(result, {"seconds": seconds, "tflops": plan.flops / seconds / 1e12 if seconds and
                           len(todo) == len(all_blocks) else None,
                           "blocks": len(all_blocks), "blocks_run": len(todo), "resumed": bool(spec.resume)})
    return result


def _check_resumable(array, fingerprint: dict) -> None:
    """Refuse to resume into an output made by a different product (before any work)."""
    stored = array.attrs[COMPLETE_ATTR].get("run")
    if not isinstance(stored, dict):
        raise ValueError(f"cannot resume: out ({array.store_path}) records no dgemm run to resume "
                         "(written by an older dgemm, or an empty product); pass overwrite=True to start again")
    diff = _differences(stored, fingerprint)
    if diff:
        raise ValueError(f"cannot resume: out ({array.store_path}) was written by a different product: {diff}; "
                         "pass overwrite=True to start again")


def _differences(stored: dict, now: dict) -> str:
    """What differs between a stored run fingerprint and this call's (ignoring the block fields not yet known)."""
    out = []
    for key, value in now.items():
        old = stored.get(key)
        if _plain(old) != _plain(value):
            out.append(f"{key} was {old!r}, now {value!r}")
    return "; ".join(out)


def _plain(x):
    """Lists and tuples alike, as JSON stores them."""
    import json
    return json.loads(json.dumps(x))


def _resolve_in_place(out, a, b, c):
    """Refuse an ``out`` that is also ``a`` or ``b``; make ``out`` = ``c`` an in-place update.

    Writing C blocks while other tasks still read A or B blocks from the same
    array would corrupt the result, and re-creating ``c`` would erase it
    before it is read.  ``out`` naming ``c`` therefore reuses the existing
    array (BLAS semantics: C is overwritten by the result).
    """
    import zarr

    where = location(out)
    if where is None:
        return out
    for x, name in ((a, "a"), (b, "b")):
        if location(x) == where:
            raise ValueError(f"out ({where}) is also the input {name}; dgemm reads {name} while it writes out, "
                             "so write the result somewhere else")
    if c is not None and location(c) == where:
        return c if _is_zarr_array(c) else zarr.open_array(out, mode="r+")
    return out


def _orig(x: Operand) -> tuple:
    """The shape the user passed (before 1-D promotion)."""
    return (x.stored_shape[1 - x.expand],) if x.expand is not None else x.stored_shape


def _empty(spec, shape, dtype, fingerprint):
    if spec is None:
        import dask.array as da
        return da.zeros(shape, dtype=dtype)
    chunks = tuple(max(s, 1) for s in shape)
    result = create_output(spec, spec.chunks or chunks,
                           {"operation": "empty", "run": {"id": run_id(fingerprint), **fingerprint}})
    mark_complete(result, {"seconds": 0.0})
    return result

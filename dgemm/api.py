"""The public operations: :func:`matmul` and :func:`gemm`.

A call goes through five steps, each its own function: everything the user
passed is checked first (:meth:`Request.check`: shapes, dtypes, output),
then an output to resume is checked against this call, and only then is a
cluster found or started, the product planned, the graph run and the output
marked complete.
"""
from __future__ import annotations

import dataclasses
import numbers
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from dgemm import graph as graph_mod
from dgemm.cluster import device_limits, get_client, prepare, tiles_of
from dgemm.dtypes import check_dtype, check_precision
from dgemm.plan import Plan, default_target, index_overflow, make_plan
from dgemm.scheduler import placement
from dgemm.sizes import INT32_MAX
from dgemm.storage import (COMPLETE_ATTR, BlockMarkers, Operand, OutputSpec, check_output, create_output,
                           is_zarr_array, location, mark_complete, run_id)


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
    return _run(Request.check("matmul", a, b, out=out, client=client, overwrite=overwrite, resume=resume,
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
    return _run(Request.check("gemm", a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, out=out,
                              client=client, overwrite=overwrite, resume=resume, block=block, devices=devices,
                              progress=progress, precision=precision, compressors=compressors))


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


@dataclass(frozen=True)
class Request:
    """One call of :func:`matmul` or :func:`gemm`, checked: all that the steps after the checks need.

    ``a``, ``b`` and ``c`` are already promoted (1-D operands of matmul)
    and transposed (``trans_*``); ``drop`` names the axes of the 2-D product
    that the result does not have.  ``spec`` is the checked output (None for
    a lazy result), ``out_chunks`` the C blocks an existing output fixes, and
    ``fingerprint`` what identifies the product in the output's attributes
    (None for a lazy result).
    """

    op: str
    a: Operand
    b: Operand
    c: Operand | None
    alpha: float
    beta: float
    m: int
    n: int
    k: int
    drop: tuple
    dtype: np.dtype
    precision: str | None
    block: tuple[int, int, int] | None      # the user's, None: the devices' default
    spec: OutputSpec | None
    out_chunks: tuple[int, int] | None
    fingerprint: dict | None
    client: Any
    devices: str | None
    progress: bool

    @property
    def shape(self) -> tuple[int, ...]:
        """The result's shape (the 2-D product's less the ``drop`` axes)."""
        return tuple(s for ax, s in enumerate((self.m, self.n)) if ax not in self.drop)

    @classmethod
    def check(cls, op: str, a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None,
              client=None, overwrite=False, resume=False, block=None, devices=None, progress=False,
              precision=None, compressors="auto") -> Request:
        """Check everything the user gave, before any work; the errors name what is wrong."""
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
        A, B, C, drop = _check_operands(op, a, b, c, trans_a, trans_b, beta)
        (m, k), (_, n) = A.shape, B.shape
        dtype = check_dtype(np.result_type(*(x.dtype for x in (A, B, C) if x is not None)), "the result")
        precision = check_precision(dtype.name, precision)
        _check_block_overflow(target, m, n, k)
        shape = tuple(s for ax, s in enumerate((m, n)) if ax not in drop)
        spec = None
        if out is not None:
            spec = _check_out(out, a, b, c, shape, dtype, overwrite=overwrite, resume=resume, beta=beta)
        spec = _with_compressors(spec, compressors)
        out_chunks = _out_chunks(spec, drop)
        fingerprint = None
        if spec is not None:
            fingerprint = {"operation": op, "shape": list(shape), "dtype": dtype.str, "a": A.identity(),
                           "b": B.identity(), "c": C.identity() if C is not None and beta != 0 else None,
                           "alpha": alpha, "beta": beta, "precision": precision}
        return cls(op, A, B, C, alpha, beta, m, n, k, drop, dtype, precision, target, spec, out_chunks,
                   fingerprint, client, devices, progress)


def _run(req: Request):
    """The steps after the checks: resume check, plan, run, completion."""
    finished = _finished(req)
    if finished is not None:
        return finished
    if req.m == 0 or req.n == 0:   # trivial shapes need no device
        return _empty(req)
    client = get_client(req.client, req.devices)
    workers = prepare(client, req.dtype)
    plan = _plan(req, workers)
    token = uuid.uuid4().hex[:12]
    if req.spec is None:
        return _lazy(req, plan, token)
    result, markers, todo = _open_output(req, plan)
    t0 = time.perf_counter()
    if todo:
        _compute(req, plan, token, client, workers, result, markers, todo)
    _complete(req, plan, result, markers, len(todo), time.perf_counter() - t0)
    return result


def _check_operands(op: str, a, b, c, trans_a: bool, trans_b: bool, beta: float):
    """The operands as the product sees them: ``(A, B, C, drop)``; refuses shapes that do not multiply."""
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
    C = None
    if c is not None:
        C = Operand(c, "c")
        if C.ndim != 2 or C.shape != (m, n):
            raise ValueError(f"c has shape {C.stored_shape}, but op(a) @ op(b) has shape {(m, n)}")
    elif beta != 0:
        raise ValueError(f"beta={beta} needs c (the matrix to scale and add)")
    return A, B, C, drop


def _check_out(out, a, b, c, shape, dtype, *, overwrite: bool, resume: bool, beta: float) -> OutputSpec:
    """Check ``out`` (and that it is not an input; ``c`` means in place) without writing anything."""
    in_place = c is not None and location(out) is not None and location(c) == location(out)
    out = _resolve_in_place(out, a, b, c)
    if resume and in_place and beta != 0:
        raise ValueError("cannot resume an in-place update (out is c): the blocks already written have "
                         "replaced the C they were computed from; start again from a copy of C")
    return check_output(out, shape, dtype, overwrite, resume)


def _with_compressors(spec: OutputSpec | None, compressors) -> OutputSpec | None:
    """The output spec with the codecs asked for, which only a new Zarr output can take."""
    if isinstance(compressors, str) and compressors == "auto":
        return spec
    if spec is None:
        raise ValueError("compressors= applies to a Zarr out; a lazy result (out=None) is not stored")
    if spec.array is not None:
        raise ValueError("compressors= applies to a new out; the existing array keeps its own codecs")
    return dataclasses.replace(spec, compressors=compressors)


def _out_chunks(spec: OutputSpec | None, drop: tuple) -> tuple[int, int] | None:
    """The C blocks an existing output fixes (its chunks, or shards), refused when beyond 32-bit indexing."""
    if spec is None or spec.chunks is None:
        return None
    it = iter(spec.chunks)
    out_chunks = tuple(1 if ax in drop else next(it) for ax in range(2))
    why = index_overflow(*out_chunks, 1, (1, 1, 1))
    if why:
        raise ValueError(f"out's chunks {tuple(spec.chunks)} are too large for dgemm: {why} (the kernels index "
                         "with 32-bit integers, and a task writes whole chunks); use smaller chunks")
    return out_chunks


def _finished(req: Request):
    """Resume check, before any work: refuse an output of another product; return it when already complete."""
    if req.spec is None or not req.spec.resume:
        return None
    _check_resumable(req.spec.array, req.fingerprint)
    return req.spec.array if req.spec.array.attrs[COMPLETE_ATTR].get("complete") else None


def _plan(req: Request, workers: dict) -> Plan:
    """Cut the product into blocks for these workers' kernels and memory."""
    tiles = tiles_of(workers, req.dtype, req.precision)
    target = req.block or default_target(d["device"].type for d in workers.values())
    memory, max_alloc = device_limits(workers)
    return make_plan(req.m, req.n, req.k, req.dtype, tiles, a_chunks=req.a.chunks, b_chunks=req.b.chunks,
                     out_chunks=req.out_chunks, target=target, n_workers=len(workers), device_memory=memory,
                     max_alloc=max_alloc, exact=req.block is not None)


def _lazy(req: Request, plan: Plan, token: str):
    """The result as a lazy dask array whose blocks the devices compute."""
    import dask.array as da

    g = graph_mod.build(plan, req.a, req.b, req.c, alpha=req.alpha, beta=req.beta, token=token,
                        precision=req.precision)
    arr = da.Array(g.hlg(), g.result_name, chunks=(tuple(b - a for a, b in plan.rows),
                                                   tuple(b - a for a, b in plan.cols)),
                   dtype=req.dtype, meta=np.empty((0, 0), dtype=req.dtype))
    return arr[tuple(0 if ax in req.drop else slice(None) for ax in range(2))] if req.drop else arr


def _grid(plan: Plan) -> tuple[int, int]:
    return (len(plan.rows), len(plan.cols))


def _all_blocks(plan: Plan) -> set[tuple[int, int]]:
    return {(i, j) for i in range(len(plan.rows)) for j in range(len(plan.cols))}


def _open_output(req: Request, plan: Plan):
    """Create the output, or reopen the one to resume; returns ``(array, markers, blocks to compute)``.

    A resumed output must have been cut into the same blocks: its run id
    (a hash of the fingerprint with the block grid) must match.
    """
    grid = _grid(plan)
    fingerprint = {**req.fingerprint, "block": list(plan.block_shape[:2]), "grid": list(grid)}
    run = run_id(fingerprint)
    if req.spec.resume:
        result = req.spec.array
        stored = result.attrs[COMPLETE_ATTR].get("run", {})
        if stored.get("id") != run:
            raise ValueError("cannot resume: " + (_differences(stored, fingerprint) or
                                                  "out was cut into different blocks") +
                             "; pass overwrite=True to start again")
        markers = BlockMarkers(result, run)
        return result, markers, sorted(_all_blocks(plan) - markers.done(grid))
    chunks = tuple(s for ax, s in enumerate(plan.block_shape[:2]) if ax not in req.drop)
    meta = {"operation": req.op, "a": req.a.label, "b": req.b.label, "plan": plan.explain(),
            "run": {"id": run, **fingerprint}}
    result = create_output(req.spec, chunks, meta)
    markers = BlockMarkers(result, run)
    markers.reset()
    return result, markers, sorted(_all_blocks(plan))


def _compute(req: Request, plan: Plan, token: str, client, workers: dict, result, markers: BlockMarkers,
             todo: list) -> None:
    """Compute and store the blocks ``todo`` on the cluster, each marked once stored."""
    from dask.delayed import Delayed

    # each worker its rectangle of C blocks, so it reads only its share of A and B
    where = sorted(workers) if len(workers) > 1 and placement.ensure(client) else None
    g = graph_mod.build(plan, req.a, req.b, req.c, alpha=req.alpha, beta=req.beta, token=token, blocks=todo,
                        precision=req.precision, workers=where)
    done_key = graph_mod.add_store(g, plan, result, req.drop, token, markers, blocks=todo)
    future = client.compute(Delayed(done_key, g.hlg()))
    if req.progress:
        from distributed import progress as show_progress
        show_progress(future, scheduler=client.scheduler.address)  # the client given, not just the default
    future.result()


def _complete(req: Request, plan: Plan, result, markers: BlockMarkers, blocks_run: int, seconds: float) -> None:
    """Mark the output complete, once every block's marker says it is stored."""
    all_blocks = _all_blocks(plan)
    missing = all_blocks - markers.done(_grid(plan))
    if missing:  # never mark complete what is not: every block must have its marker
        raise RuntimeError(f"dgemm: {len(missing)} of {len(all_blocks)} blocks of {result.store_path} have no "
                           f"completion marker after the run (first: {min(missing)}); out is left incomplete, "
                           "resume=True finishes it")
    mark_complete(result, {"seconds": seconds, "tflops": plan.flops / seconds / 1e12 if seconds and
                           blocks_run == len(all_blocks) else None,
                           "blocks": len(all_blocks), "blocks_run": blocks_run, "resumed": bool(req.spec.resume)})


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
        return c if is_zarr_array(c) else zarr.open_array(out, mode="r+")
    return out


def _orig(x: Operand) -> tuple:
    """The shape the user passed (before 1-D promotion)."""
    return (x.stored_shape[1 - x.expand],) if x.expand is not None else x.stored_shape


def _empty(req: Request):
    """A product with no elements: nothing to compute, an output (if any) complete at once."""
    if req.spec is None:
        import dask.array as da
        return da.zeros(req.shape, dtype=req.dtype)
    chunks = tuple(max(s, 1) for s in req.shape)
    result = create_output(req.spec, req.spec.chunks or chunks,
                           {"operation": "empty", "run": {"id": run_id(req.fingerprint), **req.fingerprint}})
    mark_complete(result, {"seconds": 0.0})
    return result

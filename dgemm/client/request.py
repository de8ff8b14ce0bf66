"""The checks of a call: :class:`Request`, everything the user passed, checked before any work."""
from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from dgemm import config
from dgemm.dtypes import check_dtype, check_precision
from dgemm.sizes import index_overflow
from dgemm.storage import Operand, OutputSpec, check_output, check_storage_options, is_url, is_zarr_array
from dgemm.storage.layout import check_layout, differences
from dgemm.storage.locations import is_dask_array, locate, open_array, plain_zarr, sources
from dgemm.storage.markers import COMPLETE_ATTR
from dgemm.storage.outputs import codec_configs, output_codecs


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
    why = index_overflow(*(min(t, max(e, 1)) for t, e in zip(target, (m, n, k))), (1, 1, 1))
    if why:
        raise ValueError(f"block={target} is too large: {why}, the limit of the kernels' 32-bit indexing; "
                         "use smaller blocks (e.g. block=4096)")


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
    a lazy result), ``out_chunks`` the C blocks an existing output fixes,
    ``out_unit`` what the C blocks of a new output must be multiples of (its
    chunks or shards, where the user gave them: 2-D, 1 along a dropped
    axis), and ``fingerprint`` what identifies the product in the output's
    attributes (None for a lazy result).
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
    # The URLs the user named ({"a": "s3://...", ...}) and the storage options the run sends with them:
    # what the workers must open on their own (dgemm.cluster.check_worker_access).
    urls: dict = dataclasses.field(default_factory=dict)
    storage_options: dict | None = None
    out_unit: tuple[int, int] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The result's shape (the 2-D product's less the ``drop`` axes)."""
        return tuple(s for ax, s in enumerate((self.m, self.n)) if ax not in self.drop)

    @classmethod
    def check(cls, op: str, a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None,
              client=None, overwrite=False, resume=False, block=None, devices=None, progress=False,
              precision=None, compressors="auto", storage_options=None, chunks=None, shards=None,
              zarr_format=None, dimension_names=None, attributes=None) -> Request:
        """Check everything the user gave, before any work; the errors name what is wrong."""
        alpha, beta = _check_scalar(alpha, "alpha"), _check_scalar(beta, "beta")
        trans_a, trans_b = _check_bool(trans_a, "trans_a"), _check_bool(trans_b, "trans_b")
        overwrite, resume = _check_bool(overwrite, "overwrite"), _check_bool(resume, "resume")
        progress = _check_bool(progress, "progress")
        config.get("gemm-tasks")   # the graph's, read here so that a bad value stops the call before any work
        if resume and out is None:
            raise ValueError("resume=True finishes an interrupted run into out; give out")
        if resume and overwrite:
            raise ValueError("resume=True keeps the blocks already in out and overwrite=True discards them; "
                             "choose one")
        target = _check_block(block)
        storage_options = check_storage_options(storage_options, {"a": a, "b": b, "c": c, "out": out})
        # An in-place update being resumed reads its own incomplete output as C: the originals of the
        # blocks it already wrote are kept beside it (dgemm.storage.originals).
        resuming_c = (resume and out is not None and c is not None
                      and locate(out, storage_options) in sources(c, storage_options))
        A, B, C, drop = _check_operands(op, a, b, c, trans_a, trans_b, beta, storage_options,
                                        incomplete_c_ok=resuming_c)
        (m, k), (_, n) = A.shape, B.shape
        dtype = check_dtype(np.result_type(*(x.dtype for x in (A, B, C) if x is not None)), "the result")
        precision = check_precision(dtype.name, precision)
        _check_block_overflow(target, m, n, k)
        shape = tuple(s for ax, s in enumerate((m, n)) if ax not in drop)
        spec = None
        if out is not None:
            spec = _check_out(out, a, b, c, shape, dtype, overwrite=overwrite, resume=resume,
                              storage_options=storage_options)
        layout = check_layout(shape, dtype, chunks=chunks, shards=shards, zarr_format=zarr_format,
                              dimension_names=dimension_names, attributes=attributes)
        spec = _with_layout(spec, layout)
        spec = _with_compressors(spec, compressors)
        out_chunks = _out_chunks(spec, drop)
        out_unit = _out_unit(spec, drop)
        fingerprint = None
        if spec is not None:
            fingerprint = {"operation": op, "shape": list(shape), "dtype": dtype.str, "a": A.identity(),
                           "b": B.identity(), "c": C.identity() if C is not None and beta != 0 else None,
                           "alpha": alpha, "beta": beta, "precision": precision}
        urls = {name: str(x) for name, x in (("a", a), ("b", b), ("c", c), ("out", out))
                if isinstance(x, (str, os.PathLike)) and is_url(str(x))}
        return cls(op, A, B, C, alpha, beta, m, n, k, drop, dtype, precision, target, spec, out_chunks,
                   fingerprint, client, devices, progress, urls, storage_options, out_unit)


def _check_operands(op: str, a, b, c, trans_a: bool, trans_b: bool, beta: float, storage_options=None,
                    incomplete_c_ok: bool = False):
    """The operands as the product sees them: ``(A, B, C, drop)``; refuses shapes that do not multiply."""
    if trans_a == trans_b:   # op(a) = op(b).T: a Gram product, once one array is read both ways
        if _transpose_of(a, b) is not None:      # matmul(X.T, X): X read transposed, one operand twice
            a, trans_a = b, not trans_a
        elif _transpose_of(b, a) is not None:    # matmul(X, X.T)
            b, trans_b = a, not trans_b
    A, B = Operand(a, "a", storage_options), Operand(b, "b", storage_options)
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
        C = Operand(c, "c", storage_options, incomplete_ok=incomplete_c_ok)
        if C.ndim != 2 or C.shape != (m, n):
            raise ValueError(f"c has shape {C.stored_shape}, but op(a) @ op(b) has shape {(m, n)}")
    elif beta != 0:
        raise ValueError(f"beta={beta} needs c (the matrix to scale and add)")
    return A, B, C, drop


def _transpose_of(x, y):
    """``y`` when ``x`` is its transpose (``y.T`` of a 2-D dask or numpy array), else None.

    Given as ``y`` read transposed, ``x`` is one operand with ``y`` (the
    same Zarr array or dask blocks, read once; :func:`is_gram`), not a
    second array computed from it.
    """
    if is_dask_array(x) and is_dask_array(y):
        # dask names its arrays by what they compute: y.T made here has the name of the user's y.T
        return y if x.ndim == y.ndim == 2 and x.name == y.T.name else None
    if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.ndim == y.ndim == 2:
        return y if _same_memory(x.T, y) else None
    return None


def _same_memory(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two numpy arrays are the same elements: one buffer, shape, strides and dtype."""
    return (x is y or (x.__array_interface__["data"][0] == y.__array_interface__["data"][0]
                       and x.shape == y.shape and x.strides == y.strides and x.dtype == y.dtype))


def is_gram(a: Operand, b: Operand, beta: float) -> bool:
    """Whether ``op(a) @ op(b)`` is a Gram product X^T X or X X^T: symmetric, so one triangle may be mirrored.

    ``a`` and ``b`` are the same 2-D array (the same Zarr array in its
    store, the same dask collection, the same numpy elements) read with
    opposite transposes, and ``beta`` is 0: a C added in (``beta != 0``) is
    never assumed symmetric.
    """
    if beta != 0 or a.trans == b.trans or a.expand is not None or b.expand is not None:
        return False
    if a.zarr is not None and b.zarr is not None:
        # what the engine's panel cache keys a block by (ZarrBlock.key): one store, one array in it
        return a.zarr is b.zarr or (str(a.zarr.store_path) == str(b.zarr.store_path)
                                    and getattr(a.zarr, "path", "") == getattr(b.zarr, "path", "")
                                    and a.zarr.dtype == b.zarr.dtype)
    if is_dask_array(a.data) and is_dask_array(b.data):
        return a.data.name == b.data.name
    if isinstance(a.data, np.ndarray) and isinstance(b.data, np.ndarray):
        return _same_memory(a.data, b.data)
    return False


def _check_out(out, a, b, c, shape, dtype, *, overwrite: bool, resume: bool,
               storage_options=None) -> OutputSpec:
    """Check ``out`` (and that it is not an input; ``c`` means in place) without writing anything."""
    out = _resolve_in_place(out, a, b, c, storage_options)
    return check_output(out, shape, dtype, overwrite, resume, storage_options=storage_options)


def _with_compressors(spec: OutputSpec | None, compressors) -> OutputSpec | None:
    """The output spec with the codecs asked for: checked now (zarr builds them for out's dtype), used by a new out.

    An out to resume keeps the codecs it was created with: the same
    ``compressors=`` as the interrupted call is accepted, others are refused
    (naming both).  Any other existing array keeps its own codecs.
    """
    if isinstance(compressors, str) and compressors == "auto":
        return spec
    if spec is None:
        raise ValueError("compressors= applies to a Zarr out; a lazy result (out=None) is not stored")
    wanted = output_codecs(compressors, spec.shape, spec.dtype, spec.layout.zarr_format if spec.layout else None)
    if spec.array is None:
        return dataclasses.replace(spec, compressors=compressors)
    if not spec.resume:
        raise ValueError("compressors= applies to a new out; the existing array keeps its own codecs")
    have = codec_configs(spec.array.compressors)
    if have != wanted:
        raise ValueError(f"cannot resume: out ({spec.array.store_path}) was written with compressors {have}, but "
                         f"this call asks for {wanted}; give the interrupted call's compressors= (or leave it "
                         "out), or pass overwrite=True to start again")
    return spec


def _with_layout(spec: OutputSpec | None, layout) -> OutputSpec | None:
    """The output spec with the layout asked for (chunks, shards, zarr_format, dimension_names, attributes).

    They make a new ``out``; an ``out`` to resume must already have them
    (the interrupted call's are accepted, others refused, naming them); any
    other existing array keeps its own, and they are refused.
    """
    if layout is None:
        return spec
    names = ", ".join(f"{k}=" for k in layout.given())
    if spec is None:
        raise ValueError(f"{names} applies to a Zarr out; a lazy result (out=None) is not stored: give out=, or "
                         "rechunk the lazy result and write it yourself")
    if spec.array is None:
        return dataclasses.replace(spec, layout=layout)
    if not spec.resume:
        raise ValueError(f"{names} applies to a new out; the existing array {spec.array.store_path} keeps its "
                         "own (pass its path with overwrite=True to replace it)")
    diff = differences(spec.array, layout)
    if diff:
        raise ValueError(f"cannot resume: out ({spec.array.store_path}) was created with other options: "
                         f"{'; '.join(diff)}; give the interrupted call's (or leave them out), or pass "
                         "overwrite=True to start again")
    return spec


def _out_chunks(spec: OutputSpec | None, drop: tuple) -> tuple[int, int] | None:
    """The C blocks an existing output fixes, refused when beyond 32-bit indexing.

    Those of the run to resume (recorded in its ``dgemm`` attribute: its
    blocks may hold several chunks), else the array's chunks (or shards).
    """
    if spec is None or spec.chunks is None:
        return None
    stored = spec.array.attrs.get(COMPLETE_ATTR, {}).get("run", {}).get("block") if spec.resume else None
    if isinstance(stored, list) and len(stored) == 2 and all(isinstance(s, int) and s > 0 for s in stored):
        out_chunks = tuple(stored)
    else:
        it = iter(spec.chunks)
        out_chunks = tuple(1 if ax in drop else next(it) for ax in range(2))
    why = index_overflow(*out_chunks, 1, (1, 1, 1))
    if why:
        raise ValueError(f"out's chunks {tuple(spec.chunks)} are too large for dgemm: {why} (the kernels index "
                         "with 32-bit integers, and a task writes whole chunks); use smaller chunks")
    return out_chunks


def _out_unit(spec: OutputSpec | None, drop: tuple) -> tuple[int, int] | None:
    """What the C blocks of a new output must be multiples of: its shards, else chunks, where the user gave them."""
    unit = spec.layout.unit if spec is not None and spec.layout is not None else None
    if unit is None:
        return None
    it = iter(unit)
    out = tuple(1 if ax in drop else next(it) for ax in range(2))
    why = index_overflow(*out, 1, (1, 1, 1))
    if why:
        raise ValueError(f"{'shards' if spec.layout.shards else 'chunks'}={unit} are too large for dgemm: {why} "
                         "(the kernels index with 32-bit integers, and a task writes whole chunks or shards); "
                         "use smaller ones")
    return out


def _resolve_in_place(out, a, b, c, storage_options=None):
    """Refuse an ``out`` that is ``a`` or ``b``, or holds or lies in an input; make ``out`` = ``c`` in place.

    Writing C blocks while other tasks still read A or B blocks from the same
    array would corrupt the result, and re-creating ``c`` would erase it
    before it is read.  ``out`` naming ``c`` therefore reuses the existing
    array (BLAS semantics: C is overwritten by the result).  An ``out``
    folder that holds an input would be replaced with it (``overwrite``),
    and one inside an input would change it.  All of this is decided on
    where the arrays are, however they are spelt (a relative path, a
    ``file://`` URL, a symlink, an opened array, a store, or the Zarr arrays
    that a dask input reads): :mod:`dgemm.storage.locations`.
    """
    where = locate(out, storage_options)
    if where is None:
        return out
    for x, name in ((a, "a"), (b, "b"), (c, "c")):
        reads = " (a dask array that reads it)" if is_dask_array(x) else ""
        for place in sources(x, storage_options) if x is not None else ():
            if name == "c" and place == where:
                continue   # in place, below
            if place == where:
                raise ValueError(f"out ({where}) is also the input {name}{reads}; dgemm reads {name} while it "
                                 "writes out, so write the result somewhere else")
            if where.contains(place):
                raise ValueError(f"out ({where}) holds the input {name} ({place}): writing out (or replacing it, "
                                 f"with overwrite=True) would destroy {name}; write the result somewhere else")
            if place.contains(where):
                raise ValueError(f"out ({where}) lies inside the input {name} ({place}): writing it would change "
                                 f"{name}; write the result somewhere else")
    if c is None or where not in sources(c, storage_options):
        return out
    if is_dask_array(c) and plain_zarr(c) is None:
        raise ValueError(f"out ({where}) is read by c, a dask array computed from it: its blocks would be "
                         "overwritten while c's tasks still read them; pass the Zarr array itself (or its path) as "
                         "c to update it in place, or write the result somewhere else")
    if is_zarr_array(out):
        return out   # check_output makes it absolute, and refuses it read-only
    return open_array(out, mode="r+", storage_options=storage_options)


def _orig(x: Operand) -> tuple:
    """The shape the user passed (before 1-D promotion)."""
    return (x.stored_shape[1 - x.expand],) if x.expand is not None else x.stored_shape



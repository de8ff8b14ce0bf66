"""Operands and outputs: what the user passes in, checked before any work.

An :class:`Operand` wraps a Zarr array, a dask array or an in-memory array
and hands out *references* to blocks: for Zarr a :class:`ZarrBlock` that the
worker reads straight from the store, for dask a graph key.  The client never
reads matrix data.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

SUPPORTED = (np.dtype("float32"), np.dtype("float64"))


def check_dtype(dtype, what: str) -> np.dtype:
    """Accept float32 and float64; say clearly why anything else is refused.

    >>> check_dtype("f4", "a")
    dtype('float32')
    >>> check_dtype("i8", "a")
    Traceback (most recent call last):
    ...
    TypeError: a has dtype int64; dgemm multiplies float32 and float64 only (cast it first, e.g. a.astype('float64'))
    """
    dt = np.dtype(dtype)
    if dt not in SUPPORTED:
        raise TypeError(f"{what} has dtype {dt}; dgemm multiplies float32 and float64 only "
                        f"(cast it first, e.g. {what}.astype('float64'))")
    return dt


@dataclass(frozen=True)
class ZarrBlock:
    """A rectangular region of a Zarr array, read where it is needed (in a worker)."""

    array: Any                    # zarr.Array, pickled by reference to its store
    rows: tuple[int, int]
    cols: tuple[int, int]
    expand: int | None = None     # 1-D array promoted to 2-D: axis to insert

    def load(self) -> np.ndarray:
        if self.expand is None:
            return np.asarray(self.array[self.rows[0]:self.rows[1], self.cols[0]:self.cols[1]])
        # A 1-D operand: its one axis is the non-expanded one.
        lo, hi = self.cols if self.expand == 0 else self.rows
        v = np.asarray(self.array[lo:hi])
        return v[None, :] if self.expand == 0 else v[:, None]

    def describe(self) -> str:
        path = getattr(self.array, "store_path", None) or getattr(self.array, "path", "?")
        return f"Zarr array {path} rows {self.rows[0]}:{self.rows[1]}, columns {self.cols[0]}:{self.cols[1]}"


def load(ref) -> np.ndarray:
    """Materialise a block reference (a :class:`ZarrBlock` or an array)."""
    return ref.load() if isinstance(ref, ZarrBlock) else np.asarray(ref)


class Operand:
    """One input matrix, seen through an optional transpose (BLAS ``op``).

    ``shape`` is the logical 2-D shape of ``op(x)``; ``stored_shape`` the
    stored one.  1-D inputs are promoted as :func:`numpy.matmul` does, by
    :meth:`promote`.
    """

    def __init__(self, x, what: str):
        import dask.array as da

        self.what = what
        self.zarr = None
        self.dask = None
        self.label = what
        self.expand: int | None = None
        self.trans = False
        x = _open_if_path(x, what)
        if _is_zarr_array(x):
            self.zarr = x
            self.label = f"{what} (Zarr {x.store_path})" if hasattr(x, "store_path") else what
            shape, dtype, chunks = tuple(x.shape), x.dtype, tuple(x.chunks)
        elif isinstance(x, da.Array):
            self.dask = x
            shape, dtype = tuple(x.shape), x.dtype
            chunks = tuple(c[0] if c else 0 for c in x.chunks)
        elif isinstance(x, (np.ndarray, list, tuple)) or hasattr(x, "__array__"):
            arr = np.asarray(x)
            self.dask = arr  # turned into a dask array once the plan fixes its blocks
            shape, dtype, chunks = arr.shape, arr.dtype, None
        else:
            raise TypeError(f"{what} must be a zarr.Array, a path or URL of one, a dask array or a numpy "
                            f"array, not {type(x).__name__}")
        if len(shape) == 0:
            raise ValueError(f"{what} is 0-dimensional; matmul takes 1-D and 2-D operands "
                             "(numpy.matmul refuses scalars too: use multiply)")
        if len(shape) > 2:
            raise ValueError(f"{what} has {len(shape)} dimensions {shape}; dgemm supports 1-D and 2-D operands")
        self.dtype = check_dtype(dtype, what)
        self.stored_shape = tuple(int(s) for s in shape)
        self.stored_chunks = chunks

    @property
    def ndim(self) -> int:
        return len(self.stored_shape)

    def promote(self, axis: int) -> None:
        """View a 1-D operand as 2-D by inserting ``axis`` (0: row vector, 1: column vector)."""
        assert self.ndim == 1
        self.expand = axis
        n = self.stored_shape[0]
        c = self.stored_chunks[0] if self.stored_chunks else None
        self.stored_shape = (1, n) if axis == 0 else (n, 1)
        self.stored_chunks = None if c is None else ((1, c) if axis == 0 else (c, 1))
        if self.dask is not None:
            self.dask = self.dask[None, :] if axis == 0 else self.dask[:, None]

    def transpose(self) -> None:
        self.trans = not self.trans

    @property
    def shape(self) -> tuple[int, int]:
        r, c = self.stored_shape
        return (c, r) if self.trans else (r, c)

    @property
    def chunks(self) -> tuple[int | None, int | None]:
        """Chunk sizes along the logical axes, for aligning blocks with storage."""
        if not self.stored_chunks:
            return (None, None)
        r, c = self.stored_chunks
        return (c, r) if self.trans else (r, c)

    def block_refs(self, row_bounds, col_bounds):
        """References to every logical block; returns ``(ref(i, j), graph layers)``.

        ``ref(i, j)`` is what a task receives for logical block (i, j): a
        :class:`ZarrBlock` or a dask key, in *stored* orientation (the device
        does the transpose).
        """
        import dask.array as da
        from dask.base import tokenize

        sr, sc = (col_bounds, row_bounds) if self.trans else (row_bounds, col_bounds)
        if self.zarr is not None:
            def ref(i, j):
                if self.trans:
                    i, j = j, i
                return ZarrBlock(self.zarr, sr[i], sc[j], self.expand)
            return ref, None
        if not sr or not sc:  # an empty axis (K == 0): no blocks, nothing for a task to reference
            def no_ref(i, j):
                raise IndexError(f"{self.what} has no blocks")
            return no_ref, None
        chunks = (tuple(b - a for a, b in sr), tuple(b - a for a, b in sc))
        if isinstance(self.dask, np.ndarray):
            x = da.from_array(self.dask, chunks=chunks, name=f"dgemm-load-{self.what}-{tokenize(self.dask)}")
        else:
            x = self.dask.rechunk(chunks)

        def ref(i, j):
            if self.trans:
                i, j = j, i
            return (x.name, i, j)
        return ref, x


def _is_zarr_array(x) -> bool:
    import zarr
    return isinstance(x, zarr.Array)


def _open_if_path(x, what: str):
    """Open a path, URL or store as a read-only Zarr array; anything else passes through."""
    import zarr
    from zarr.abc.store import Store

    if not isinstance(x, (str, os.PathLike, Store)):
        return x
    try:
        return zarr.open_array(x, mode="r")
    except Exception as e:  # zarr raises several types for "not an array here"
        raise ValueError(f"{what}: {os.fspath(x) if not isinstance(x, Store) else x} is not a Zarr array "
                         f"({type(e).__name__}: {e})") from None


# -- outputs ------------------------------------------------------------------
@dataclass
class OutputSpec:
    """A checked but not yet created output."""

    target: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    overwrite: bool
    array: Any = None             # an existing zarr.Array given as ``out``

    @property
    def chunks(self) -> tuple[int, ...] | None:
        if self.array is None:
            return None
        # A task writes whole shards where there are shards, whole chunks otherwise.
        return tuple(getattr(self.array, "shards", None) or self.array.chunks)


def check_output(out, shape: tuple[int, ...], dtype: np.dtype, overwrite: bool) -> OutputSpec:
    """Check that ``out`` can receive a ``shape``/``dtype`` result; write nothing."""
    from zarr.abc.store import Store
    from zarr.storage import MemoryStore

    if _is_zarr_array(out):
        if tuple(out.shape) != tuple(shape):
            raise ValueError(f"out has shape {tuple(out.shape)}, but the result has shape {tuple(shape)}")
        if out.dtype != dtype:
            raise ValueError(f"out has dtype {out.dtype}, but the result is {dtype}")
        if out.read_only:
            raise PermissionError("out is opened read-only; open it with mode='r+' or 'a'")
        _refuse_memory(out.store)
        return OutputSpec(out, tuple(shape), dtype, overwrite, array=out)
    if isinstance(out, Store):
        if out.read_only:
            raise PermissionError(f"out store {out} is read-only")
        _refuse_memory(out)
        if not overwrite and _exists(out):
            raise FileExistsError(f"out {out} already holds Zarr data; pass overwrite=True to replace it")
        return OutputSpec(out, tuple(shape), dtype, overwrite)
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a path, URL, zarr store or zarr.Array, not {type(out).__name__}")
    target = os.fspath(out)
    if target.startswith("memory://"):
        _refuse_memory(MemoryStore())
    if "://" not in target or target.startswith("file://"):
        local = target[len("file://"):] if target.startswith("file://") else target
        if os.path.exists(local):
            if not overwrite:
                raise FileExistsError(f"out {target!r} already exists; pass overwrite=True to replace it")
            if not os.path.isdir(local):
                raise FileExistsError(f"out {target!r} is a file, not a Zarr store; remove it first")
        parent = os.path.abspath(local)
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.access(parent, os.W_OK) or (os.path.exists(local) and not os.access(local, os.W_OK)):
            raise PermissionError(f"out {target!r} is not writable ({parent} does not allow writing)")
    elif not overwrite and _exists(target):
        raise FileExistsError(f"out {target!r} already holds Zarr data; pass overwrite=True to replace it")
    return OutputSpec(target, tuple(shape), dtype, overwrite)


def _refuse_memory(store) -> None:
    from zarr.storage import MemoryStore
    if isinstance(store, MemoryStore):
        raise ValueError("out is an in-memory Zarr store, which worker processes cannot write to; "
                         "give a path or URL, or use out=None for a lazy dask array")


def _exists(target) -> bool:
    import zarr
    try:
        zarr.open(target, mode="r")
        return True
    except Exception:
        return False


def location(x) -> str | None:
    """Where an array lives, comparable across a path and an opened array.

    >>> location("/tmp/x.zarr")
    'file:///tmp/x.zarr'
    >>> location(3) is None
    True
    """
    if _is_zarr_array(x):
        return str(x.store_path).rstrip("/")
    if isinstance(x, (str, os.PathLike)):
        s = os.fspath(x)
        if "://" not in s:
            return "file://" + os.path.abspath(s).rstrip("/")
        return s.rstrip("/")
    return None


COMPLETE_ATTR = "dgemm"


def create_output(spec: OutputSpec, chunks: tuple[int, ...], meta: dict):
    """Create the output array (metadata only); marked incomplete until the run ends."""
    import zarr

    attrs = {COMPLETE_ATTR: {"complete": False, **meta}}
    if spec.array is not None:
        spec.array.attrs.update(attrs)
        return spec.array
    return zarr.create_array(store=spec.target, shape=spec.shape, chunks=chunks, dtype=spec.dtype,
                             fill_value=0, overwrite=spec.overwrite, attributes=attrs,
                             config={"write_empty_chunks": True})


def mark_complete(array, meta: dict) -> None:
    """Written last: a reader can tell a finished result from an interrupted one."""
    attrs = dict(array.attrs.get(COMPLETE_ATTR, {}))
    attrs.update(meta)
    attrs["complete"] = True
    array.attrs[COMPLETE_ATTR] = attrs


def store_block(array, rows: tuple[int, int], cols: tuple[int, int], block: np.ndarray, drop: tuple = ()):
    """Write one output block (whole chunks) into ``array``.

    ``drop`` names the axes of the 2-D block that the output does not have
    (matmul with 1-D operands, as numpy squeezes them).
    """
    region = tuple(slice(*r) for ax, r in enumerate((rows, cols)) if ax not in drop)
    array[region] = np.squeeze(block, axis=drop) if drop else block

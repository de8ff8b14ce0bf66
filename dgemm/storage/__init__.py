"""Operands and outputs: what the user passes in, checked before any work.

An :class:`Operand` wraps a Zarr array, a dask array or an in-memory array
and hands out *references* to blocks: for Zarr a :class:`ZarrBlock` that the
worker reads straight from the store, for dask a graph key.  The client never
reads matrix data.
"""
from __future__ import annotations

import hashlib
import json
import math
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

    @property
    def shape(self) -> tuple[int, int]:
        """The block's 2-D shape as :meth:`load` returns it (a promoted 1-D block has a 1 on its new axis)."""
        return (self.rows[1] - self.rows[0], self.cols[1] - self.cols[0])

    def key(self) -> tuple:
        """What the block holds, hashable: the same region of the same array gives the same key."""
        return (str(getattr(self.array, "store_path", id(self.array))), getattr(self.array, "path", ""),
                self.rows, self.cols, self.expand)

    def chunk_file(self) -> str | None:
        """The file holding this block, when it is exactly one plain chunk of a local Zarr v3 array.

        "Plain": stored raw (the ``bytes`` codec alone, in this machine's
        byte order, no sharding), so the file's bytes are the block's
        elements in C order and :meth:`read_into` can read them straight
        into (pinned) memory, skipping zarr's decode and copies.  None for
        anything else (compressed, sharded, remote, an edge chunk cut short,
        a 1-D operand): those are read through zarr.
        """
        import sys

        from zarr.codecs import BytesCodec
        from zarr.storage import LocalStore

        arr = self.array
        meta = arr.metadata
        if (self.expand is not None or getattr(meta, "zarr_format", None) != 3 or arr.ndim != 2
                or not isinstance(arr.store, LocalStore) or getattr(arr, "shards", None)):
            return None
        codecs = meta.codecs
        if len(codecs) != 1 or not isinstance(codecs[0], BytesCodec) or not arr.dtype.isnative:
            return None
        endian = getattr(codecs[0].endian, "value", codecs[0].endian)
        if arr.dtype.itemsize > 1 and endian not in (None, sys.byteorder):
            return None
        (cr, cc), (r0, r1), (c0, c1) = arr.chunks, self.rows, self.cols
        if r0 % cr or c0 % cc or r1 - r0 != cr or c1 - c0 != cc:
            return None
        key = meta.encode_chunk_key((r0 // cr, c0 // cc))
        path = os.path.join(str(arr.store.root), arr.path.strip("/"), key)
        if not os.path.isfile(path) or os.path.getsize(path) != cr * cc * arr.dtype.itemsize:
            return None   # missing (zarr reads the fill value) or not what a raw chunk would be
        return path

    def read_into(self, out: np.ndarray) -> bool:
        """Read the block into ``out`` (C-contiguous, its shape and dtype) without zarr, if :meth:`chunk_file` allows.

        Returns False (``out`` untouched) when the block must go through
        zarr instead.
        """
        path = self.chunk_file()
        if path is None or out.dtype != self.array.dtype or out.shape != self.shape:
            return False
        view = memoryview(out.reshape(-1).view(np.uint8))
        with open(path, "rb", buffering=0) as f:
            done = 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    raise OSError(f"{path} ended after {done} of {len(view)} bytes")
                done += got
        return True

    def describe(self) -> str:
        path = getattr(self.array, "store_path", None) or getattr(self.array, "path", "?")
        return f"Zarr array {path} rows {self.rows[0]}:{self.rows[1]}, columns {self.cols[0]}:{self.cols[1]}"

    def _region(self) -> tuple[slice, ...]:
        if self.expand is None:
            return (slice(*self.rows), slice(*self.cols))
        return (slice(*(self.cols if self.expand == 0 else self.rows)),)

    def bad_chunk(self) -> str | None:
        """After a failed :meth:`load`: the first stored chunk of the region that cannot be read.

        Reads the region chunk by chunk (shard by shard in a sharded array),
        so it costs a second read of the block; only used to explain an error.
        """
        import itertools

        arr = self.array
        grid = tuple(getattr(arr, "shards", None) or arr.chunks)
        ranges = [range(s.start // g, -(-s.stop // g)) for s, g in zip(self._region(), grid)]
        for idx in itertools.product(*ranges):
            sel = tuple(slice(i * g, min((i + 1) * g, n)) for i, g, n in zip(idx, grid, arr.shape))
            try:
                np.asarray(arr[sel])
            except Exception as e:
                key = arr.metadata.encode_chunk_key(idx)
                path = arr.path.strip("/")
                key = f"{path}/{key}" if path else key
                return f"chunk {idx} (store key {key!r}): {type(e).__name__}: {e}"
        return None


def load(ref) -> np.ndarray:
    """Materialise a block reference (a :class:`ZarrBlock` or an array)."""
    return ref.load() if isinstance(ref, ZarrBlock) else np.asarray(ref)


def read_error(ref, e: Exception) -> str:
    """A message naming what could not be read: array, rows and columns, and the chunk when it can tell."""
    if not isinstance(ref, ZarrBlock):
        return f"dgemm could not read an input block: {type(e).__name__}: {e}"
    try:
        chunk = ref.bad_chunk()
    except Exception:  # explaining must not hide the original error
        chunk = None
    where = f"{ref.describe()}, {chunk}" if chunk else f"{ref.describe()}: {type(e).__name__}: {e}"
    return f"dgemm could not read {where}"


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
            meta = x.attrs.get(COMPLETE_ATTR)
            if isinstance(meta, dict) and meta.get("complete") is False:
                raise ValueError(f"{what} ({x.store_path}) is an incomplete dgemm output: the run that writes it "
                                 "did not finish, so some of its blocks are missing; finish it first "
                                 "(the same call with resume=True)")
        elif isinstance(x, da.Array):
            self.dask = x
            shape, dtype = tuple(x.shape), x.dtype
            if any(math.isnan(s) for s in shape):
                raise ValueError(f"{what} is a dask array of unknown shape {shape} (unknown chunk sizes); "
                                 f"call {what}.compute_chunk_sizes() first")
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

    def identity(self) -> dict:
        """What this operand is, as plain data: a resumed run must see the same one.

        Zarr: where it is stored, its shape, dtype and chunks (not its
        contents: rewriting an input between a run and its resumption is not
        detected).  dask: the graph's name (a hash of its inputs).  numpy: a
        hash of the data.
        """
        from dask.base import tokenize

        d = {"shape": list(self.stored_shape), "dtype": self.dtype.str, "trans": self.trans, "expand": self.expand}
        if self.zarr is not None:
            d["zarr"] = location(self.zarr)
            d["chunks"] = list(self.zarr.chunks)
        elif isinstance(self.dask, np.ndarray):
            d["numpy"] = tokenize(self.dask)
        else:
            d["dask"] = self.dask.name
        return d

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
            x = da.from_array(self.dask, chunks=chunks, name=f"dgemm-load-{self.what}-{tokenize(self.dask, chunks)}")
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
    resume: bool = False          # ``array`` is an earlier dgemm output to finish
    compressors: Any = "auto"     # codecs of a new output (zarr.create_array's ``compressors``)

    @property
    def chunks(self) -> tuple[int, ...] | None:
        if self.array is None:
            return None
        # A task writes whole shards where there are shards, whole chunks otherwise.
        return tuple(getattr(self.array, "shards", None) or self.array.chunks)


def check_output(out, shape: tuple[int, ...], dtype: np.dtype, overwrite: bool,
                 resume: bool = False) -> OutputSpec:
    """Check that ``out`` can receive a ``shape``/``dtype`` result; write nothing.

    With ``resume``, an existing ``out`` must be a dgemm output of that
    shape and dtype, and is returned opened for writing (``spec.resume``);
    a missing one gives a fresh output.
    """
    from zarr.abc.store import Store
    from zarr.storage import MemoryStore

    if resume:
        existing = _open_for_resume(out)
        if existing is not None:
            spec = check_output(existing, shape, dtype, False)
            meta = existing.attrs.get(COMPLETE_ATTR)
            if not isinstance(meta, dict) or "complete" not in meta:
                raise ValueError(f"cannot resume: out {_name(out)} was not written by dgemm "
                                 f"(it has no {COMPLETE_ATTR!r} attribute); pass overwrite=True to replace it")
            spec.resume = True
            return spec
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


def _name(out) -> str:
    return repr(os.fspath(out)) if isinstance(out, (str, os.PathLike)) else str(getattr(out, "store_path", out))


def _open_for_resume(out):
    """The existing array at ``out`` opened for writing, or None when there is nothing there."""
    import zarr
    from zarr.abc.store import Store

    if _is_zarr_array(out):
        return out
    if not isinstance(out, (str, os.PathLike, Store)):
        return None  # check_output explains what is wrong with it
    if isinstance(out, (str, os.PathLike)):
        local = os.fspath(out)
        if "://" not in local or local.startswith("file://"):
            local = local[len("file://"):] if local.startswith("file://") else local
            if not os.path.exists(local):
                return None
    elif not _exists(out):
        return None
    try:
        return zarr.open_array(out, mode="r+")
    except Exception as e:
        raise ValueError(f"cannot resume: out {_name(out)} exists but is not a Zarr array "
                         f"({type(e).__name__}: {e})") from None


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
MARKERS = ".dgemm"   # key prefix, inside the output's own prefix, of the per-block completion markers


def run_id(fingerprint: dict) -> str:
    """A short stable hash of a run's fingerprint (names its block markers).

    >>> run_id({"a": 1}) == run_id({"a": 1}) != run_id({"a": 2})
    True
    """
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


class BlockMarkers:
    """Which C blocks of one run are safely stored: one tiny store object per block.

    A store task writes its block, then its marker ``<array>/.dgemm/done/<run>/<i>.<j>``.
    Each block has its own key, so concurrent writers never touch the same
    object (unlike a Zarr attribute, which is one JSON document), and the
    markers live in the output's own store, so they work for any Zarr store
    (local, fsspec/object stores) and go when the array is overwritten.  Zarr
    ignores keys it does not know, so readers of the array never see them.
    """

    def __init__(self, array, run: str):
        self.store = array.store
        node = array.path.strip("/")
        self.root = f"{node}/{MARKERS}" if node else MARKERS
        self.prefix = f"{self.root}/done/{run}/"

    def key(self, i: int, j: int) -> str:
        return f"{self.prefix}{i}.{j}"

    def mark(self, i: int, j: int) -> None:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync
        sync(self.store.set(self.key(i, j), default_buffer_prototype().buffer.from_bytes(b"1")))

    def done(self, grid: tuple[int, int] | None = None) -> set[tuple[int, int]]:
        """The ``(i, j)`` of every marked block (``grid`` is needed by stores that cannot list keys)."""
        from zarr.core.sync import sync

        async def listed():
            return [k async for k in self.store.list_prefix(self.prefix)]

        if getattr(self.store, "supports_listing", True):
            keys = sync(listed())
            out = set()
            for k in keys:
                name = k[len(self.prefix):] if k.startswith(self.prefix) else k.rsplit("/", 1)[-1]
                i, _, j = name.partition(".")
                if i.isdigit() and j.isdigit():
                    out.add((int(i), int(j)))
            return out
        if grid is None:
            raise ValueError(f"{self.store} cannot list keys; pass the block grid")
        return {(i, j) for i in range(grid[0]) for j in range(grid[1]) if sync(self.store.exists(self.key(i, j)))}

    def reset(self) -> None:
        """Remove every marker (of any run) of this array: a fresh run starts from none."""
        from zarr.core.sync import sync
        if getattr(self.store, "supports_deletes", True):
            sync(self.store.delete_dir(self.root))


def create_output(spec: OutputSpec, chunks: tuple[int, ...], meta: dict):
    """Create the output array (metadata only); marked incomplete until the run ends."""
    import zarr

    attrs = {COMPLETE_ATTR: {"complete": False, **meta}}
    if spec.array is not None:
        spec.array.attrs.update(attrs)
        return spec.array
    return zarr.create_array(store=spec.target, shape=spec.shape, chunks=chunks, dtype=spec.dtype,
                             fill_value=0, overwrite=spec.overwrite, attributes=attrs, compressors=spec.compressors,
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
    (matmul with 1-D operands, as numpy squeezes them).  Idempotent: writing
    the same block again (a task re-run after a worker died) stores the same
    chunks, each replaced whole.
    """
    region = tuple(slice(*r) for ax, r in enumerate((rows, cols)) if ax not in drop)
    array[region] = np.squeeze(block, axis=drop) if drop else block

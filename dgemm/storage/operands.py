"""What the user passes in: :class:`Operand` wraps a Zarr array, a dask array or an in-memory array.

Paths, URLs and stores are opened as read-only Zarr arrays, with every local
path made absolute on the client (:mod:`~dgemm.storage.locations`): the
workers run in folders of their own.  An operand hands out *references* to
its blocks: for Zarr a :class:`~dgemm.storage.blocks.ZarrBlock`
that the worker reads straight from the store, for dask a graph key.  The
client never reads matrix data.
"""
from __future__ import annotations

import math
import os

import numpy as np

from dgemm.dtypes import check_dtype
from dgemm.names import LOAD
from dgemm.storage.blocks import ZarrBlock
from dgemm.storage.locations import (absolute, check_readable, is_dask_array, location, open_array, plain_zarr, sources,
                                     zarr_arrays)
from dgemm.storage.markers import COMPLETE_ATTR
from dgemm.storage.options import access_hint


class Operand:
    """One input matrix, seen through an optional transpose (BLAS ``op``).

    ``shape`` is the logical 2-D shape of ``op(x)``; ``stored_shape`` the
    stored one.  1-D inputs are promoted as :func:`numpy.matmul` does, by
    :meth:`promote`.
    """

    def __init__(self, x, what: str, storage_options: dict | None = None, incomplete_ok: bool = False):
        self.what = what
        self.zarr = None
        self.data = None   # the numpy or dask array of an operand not in Zarr
        self.label = what
        self.expand: int | None = None
        self.trans = False
        x = _open_read_only(x, what, storage_options)
        if is_zarr_array(x):
            self.zarr = x
            self.label = f"{what} (Zarr {x.store_path})" if hasattr(x, "store_path") else what
            shape, dtype, chunks = tuple(x.shape), x.dtype, tuple(x.chunks)
            _check_chunks(x, what)
            if not incomplete_ok:
                _refuse_incomplete(x, what)
        elif is_dask_array(x):
            # computed from Zarr arrays (from_zarr(...) * 2, a slice, a cast): each must be finished too, or
            # the product of a half-written matrix would be marked complete
            for z in zarr_arrays(x) if not incomplete_ok else ():
                _refuse_incomplete(z, what)
            self.data = x
            shape, dtype = tuple(x.shape), x.dtype
            if any(math.isnan(s) for s in shape):
                raise ValueError(f"{what} is a dask array of unknown shape {shape} (unknown chunk sizes); "
                                 f"call {what}.compute_chunk_sizes() first")
            chunks = tuple(c[0] if c else 0 for c in x.chunks)
        elif isinstance(x, (np.ndarray, list, tuple)) or hasattr(x, "__array__"):
            arr = np.asarray(x)
            self.data = arr  # turned into a dask array once the plan fixes its blocks
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
        if self.data is not None:
            self.data = self.data[None, :] if axis == 0 else self.data[:, None]

    def transpose(self) -> None:
        self.trans = not self.trans

    def identity(self) -> dict:
        """What this operand is, as plain data: a resumed run must see the same one.

        Zarr: where it is stored, its shape, dtype and chunks (not its
        contents: rewriting an input between a run and its resumption is not
        detected).  dask: the graph's name (a hash of its inputs) and the Zarr
        arrays it reads (where they live).  numpy: a
        hash of the data.
        """
        from dask.base import tokenize

        d = {"shape": list(self.stored_shape), "dtype": self.dtype.str, "trans": self.trans, "expand": self.expand}
        if self.zarr is not None:
            d["zarr"] = location(self.zarr)
            d["chunks"] = list(self.zarr.chunks)
        elif isinstance(self.data, np.ndarray):
            d["numpy"] = tokenize(self.data)
        else:
            d["dask"] = self.data.name
            # the name hashes how each Zarr array was spelt, not where it lives: "a.zarr" in two folders
            # gives one name, so the arrays the graph reads are part of what it is
            d["reads"] = sorted(str(loc) for loc in sources(self.data))
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
        sr, sc = (col_bounds, row_bounds) if self.trans else (row_bounds, col_bounds)
        if self.zarr is not None:
            def ref(i, j):
                if self.trans:
                    i, j = j, i
                return ZarrBlock(self.zarr, sr[i], sc[j], self.expand)
            return ref, None
        import dask.array as da      # here, not above: Zarr operands never need it (0.3-1 s to import)
        from dask.base import tokenize

        if not sr or not sc:  # an empty axis (K == 0): no blocks, nothing for a task to reference
            def no_ref(i, j):
                raise IndexError(f"{self.what} has no blocks")
            return no_ref, None
        chunks = (tuple(b - a for a, b in sr), tuple(b - a for a, b in sc))
        if isinstance(self.data, np.ndarray):
            x = da.from_array(self.data, chunks=chunks, name=f"{LOAD}-{self.what}-{tokenize(self.data, chunks)}")
        else:
            x = self.data.rechunk(chunks)

        def ref(i, j):
            if self.trans:
                i, j = j, i
            return (x.name, i, j)
        return ref, x


def _check_chunks(z, what: str) -> None:
    """Refuse a Zarr input whose metadata gives a chunk (or shard) size of 0: no block could be cut from it.

    Zarr opens such an array (an edited or corrupt ``zarr.json``); the plan
    would divide by it on the cluster.  Refused here, before any work.
    """
    where = z.store_path if hasattr(z, "store_path") else z
    for name, sizes in (("chunk", tuple(z.chunks)), ("shard", tuple(getattr(z, "shards", None) or ()))):
        if any(int(s) <= 0 for s in sizes):
            raise ValueError(f"{what} ({where}) has a {name} size of 0 in its metadata ({name}s {sizes}, shape "
                             f"{tuple(z.shape)}): its zarr.json (or .zarray) is damaged; write the array again "
                             "with positive chunk sizes")


def _refuse_incomplete(z, what: str) -> None:
    """Refuse an input that is an unfinished dgemm output (its ``dgemm`` attribute says ``complete: false``)."""
    meta = z.attrs.get(COMPLETE_ATTR)
    if isinstance(meta, dict) and meta.get("complete") is False:
        where = z.store_path if hasattr(z, "store_path") else z
        raise ValueError(f"{what} ({where}) is an incomplete dgemm output: the run that writes it "
                         "did not finish, so some of its blocks are missing; finish it first "
                         "(the same call with resume=True)")


def is_zarr_array(x) -> bool:
    """Whether ``x`` is an opened Zarr array (zarr is imported only when asked)."""
    import zarr
    return isinstance(x, zarr.Array)


def _open_read_only(x, what: str, storage_options=None):
    """The operand as the workers will read it, checked here: nothing relative, nothing only this process holds.

    A path, URL or store is opened as a read-only Zarr array; a
    :class:`zarr.Array` is kept (re-created over an absolute store where its
    own is relative); a dask array that only reads one Zarr array whole
    (``da.from_zarr``) is that array, read by the workers straight from the
    store; another dask array keeps its graph, its Zarr arrays made
    absolute.  Anything else passes through.
    """
    from zarr.abc.store import Store
    from zarr.storage import MemoryStore

    if is_dask_array(x):
        check_readable(x, what, storage_options)
        z = plain_zarr(x)
        # A MemoryStore inside a dask graph travels with its data (dask's business); as a Zarr operand it would not.
        if z is None or isinstance(z.store, MemoryStore):
            return absolute(x)
        x = z
    if is_zarr_array(x):
        check_readable(x, what, storage_options)
        return absolute(x)
    if not isinstance(x, (str, os.PathLike, Store)):
        return x
    check_readable(x, what, storage_options)
    try:
        return open_array(x, mode="r", storage_options=storage_options)
    except Exception as e:  # zarr raises several types for "not an array here"
        raise ValueError(f"{what}: {os.fspath(x) if not isinstance(x, Store) else x} is not a Zarr array "
                         f"({type(e).__name__}: {e}){access_hint(e, storage_options)}") from None

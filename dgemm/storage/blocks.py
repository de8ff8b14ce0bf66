"""What a worker reads: :class:`ZarrBlock` references to regions of Zarr arrays.

A task receives either a :class:`ZarrBlock` (read from the store where it
runs; for an in-place C, :class:`~dgemm.storage.originals.OriginalBlock`) or
the block itself (held by dask); :func:`load` turns each into an array and
:func:`read_error` explains a read that failed.

A failed read raises one error wherever it happens, :func:`unreadable`'s:
from :func:`read_block` (a task reading C) and from
:meth:`ZarrBlock.fill_into`, the one call the device engine makes, which
knows no storage: it hands a block a host buffer (page-locked staging memory
where it can) and gets it back full.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dgemm.storage import chunks


class Through:
    """A block read through something else (the host cache, the process's board, the device): it is read
    like the block it wraps, ``self.block``, whose ``shape``, ``dtype``, ``copies`` and ``key()`` are its own;
    a subclass gives ``fill_into``."""

    __slots__ = ()

    @property
    def shape(self) -> tuple[int, int]:
        return self.block.shape

    @property
    def dtype(self) -> np.dtype:
        return self.block.dtype

    @property
    def copies(self) -> bool:
        return self.block.copies

    def key(self) -> tuple:
        return self.block.key()


@dataclass(frozen=True)
class ZarrBlock:
    """A rectangular region of a Zarr array, read where it is needed (in a worker)."""

    array: Any                    # zarr.Array, pickled by reference to its store
    rows: tuple[int, int]
    cols: tuple[int, int]
    expand: int | None = None     # 1-D array promoted to 2-D: axis to insert
    # Read by several workers of one host in its run (the client's placement says so): shared through the
    # host cache where it is on (dgemm.storage.hostcache.through); any other block is read where it is needed.
    host_shared: bool = False
    # How many workers of the host read it (set with host_shared): the workers of one process that share it
    # (dgemm.storage.sharing) know when the last of them has taken it.
    host_readers: int = 0

    def load(self) -> np.ndarray:
        """The block, in this machine's byte order: read by :mod:`~dgemm.storage.chunks` where it can, else by zarr."""
        out = np.empty(self.shape, self.dtype)
        if self.read_into(out):
            return out
        return self._through_zarr()

    def _through_zarr(self) -> np.ndarray:
        chunks.visible(self.array)
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

    @property
    def dtype(self) -> np.dtype:
        """The dtype :meth:`load` returns and :meth:`fill_into` fills: the array's, in this machine's byte order."""
        return np.dtype(self.array.dtype).newbyteorder("=")

    @property
    def copies(self) -> bool:
        """Whether reading the block only copies file bytes (raw local chunks: little CPU; see
        :func:`~dgemm.storage.chunks.copies`)."""
        return chunks.copies(self.array)

    def key(self) -> tuple:
        """What the block holds, hashable: the same region of the same array gives the same key."""
        return (str(getattr(self.array, "store_path", id(self.array))), getattr(self.array, "path", ""),
                self.rows, self.cols, self.expand)

    def read_into(self, out: np.ndarray) -> bool:
        """Read the block into ``out`` (C-contiguous, its shape, the array's dtype in native order) without zarr.

        Chunks are read and decoded by :func:`dgemm.storage.chunks.read_into`,
        outside the GIL and straight into ``out`` where they cover whole rows
        of it.  Returns False (``out`` untouched) when the array's layout is
        one that module leaves to zarr (:func:`~dgemm.storage.chunks.why_not`).
        """
        return chunks.read_into(self, out)

    def decode_into(self, out: np.ndarray) -> None:
        """Fill all of ``out`` (as for :meth:`read_into`): by :meth:`read_into` where it can, else by zarr.

        A failure raises the reader's own error; :meth:`fill_into` is the
        same read with the one read error.
        """
        if not self.read_into(out):
            out[...] = self._through_zarr()

    def fill_into(self, out: np.ndarray) -> None:
        """Fill all of ``out`` with the block, or raise the one read error (:func:`unreadable`).

        What the device engine calls to read a block it knows only by its
        ``shape``, ``dtype``, ``key()`` and ``copies``: ``out`` is
        C-contiguous, of :attr:`shape` and :attr:`dtype`, most often this
        thread's page-locked staging buffer, which raw local chunks are read
        into and zstd chunks decoded into directly.  Layouts that
        :mod:`~dgemm.storage.chunks` leaves to zarr are read by zarr and
        copied in.  (:class:`~dgemm.storage.hostcache.Shared` makes the same
        call through the host cache.)

        Raises
        ------
        OSError
            Naming the array, rows and columns, and the chunk and its store
            key when it can tell (:func:`read_error`).
        """
        try:
            self.decode_into(out)
        except Exception as e:
            raise unreadable(self, e) from e

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
    """Materialise a block reference: anything with a ``load()`` (a :class:`ZarrBlock`, an in-place C's
    :class:`~dgemm.storage.originals.OriginalBlock`) or an array."""
    return ref.load() if hasattr(ref, "load") else np.asarray(ref)


def read_block(ref) -> np.ndarray:
    """:func:`load` a block reference in this worker; a failed read raises the one read error (:func:`unreadable`)."""
    try:
        return load(ref)
    except Exception as e:
        raise unreadable(ref, e) from e


def unreadable(ref, e: Exception) -> OSError:
    """The one error of a failed read of ``ref``: an :class:`OSError` with :func:`read_error`'s message.

    Raise it ``from e``: the reader's own error stays the cause.
    """
    return OSError(read_error(ref, e))


def read_error(ref, e: Exception) -> str:
    """A message naming what could not be read: array, rows and columns, and the chunk when it can tell."""
    if not hasattr(ref, "describe"):
        return f"dgemm could not read an input block: {type(e).__name__}: {e}"
    try:
        chunk = ref.bad_chunk()
    except Exception:  # explaining must not hide the original error
        chunk = None
    where = f"{ref.describe()}, {chunk}" if chunk else f"{ref.describe()}: {type(e).__name__}: {e}"
    return f"dgemm could not read {where}"

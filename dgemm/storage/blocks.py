"""What a worker reads: :class:`ZarrBlock` references to regions of Zarr arrays.

A task receives either a :class:`ZarrBlock` (read from the store where it
runs; for an in-place C, :class:`~dgemm.storage.originals.OriginalBlock`) or
the block itself (held by dask); :func:`load` turns each into an array and
:func:`read_error` explains a read that failed.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ZarrBlock:
    """A rectangular region of a Zarr array, read where it is needed (in a worker)."""

    array: Any                    # zarr.Array, pickled by reference to its store
    rows: tuple[int, int]
    cols: tuple[int, int]
    expand: int | None = None     # 1-D array promoted to 2-D: axis to insert

    def load(self) -> np.ndarray:
        visible(self.array)
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
        visible(self.array)
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


# The arrays this process has seen in their stores (store, path): checked once each.
_SEEN: set = set()
_SEEN_LOCK = threading.Lock()


def visible(array) -> None:
    """Raise :class:`OSError` unless this process sees ``array``'s metadata in its store (checked once).

    An array arrives with its metadata inside it, so a worker that does not
    see the store (another host without the mount, a container without the
    volume, a path that means another folder here) would read every chunk
    as missing: the fill value, a wrong product marked complete.
    """
    from zarr.core.sync import sync

    key = (repr(array.store), array.path)
    if key in _SEEN:
        return
    node = array.path.strip("/")
    names = ("zarr.json",) if array.metadata.zarr_format == 3 else (".zarray",)
    meta = [f"{node}/{n}" if node else n for n in names]
    if not any(sync(array.store.exists(m)) for m in meta):
        raise OSError(f"this worker does not see the Zarr array {array.store_path}: its metadata ({meta[0]}) is not "
                      "in the store here (another host without the same files or mount?); every chunk would read "
                      "as the fill value, so dgemm stops")
    with _SEEN_LOCK:
        _SEEN.add(key)


def load(ref) -> np.ndarray:
    """Materialise a block reference: anything with a ``load()`` (a :class:`ZarrBlock`, an in-place C's
    :class:`~dgemm.storage.originals.OriginalBlock`) or an array."""
    return ref.load() if hasattr(ref, "load") else np.asarray(ref)


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

"""What a worker reads: :class:`ZarrBlock` references to regions of Zarr arrays.

A task receives either a :class:`ZarrBlock` (read from the store where it
runs; for an in-place C, :class:`~dgemm.storage.originals.OriginalBlock`) or
the block itself (held by dask); :func:`load` turns each into an array and
:func:`read_error` explains a read that failed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dgemm.storage.chunks import visible


@dataclass(frozen=True)
class ZarrBlock:
    """A rectangular region of a Zarr array, read where it is needed (in a worker)."""

    array: Any                    # zarr.Array, pickled by reference to its store
    rows: tuple[int, int]
    cols: tuple[int, int]
    expand: int | None = None     # 1-D array promoted to 2-D: axis to insert

    def load(self) -> np.ndarray:
        """The block, in this machine's byte order: read by :mod:`~dgemm.storage.chunks` where it can, else by zarr."""
        out = np.empty(self.shape, np.dtype(self.array.dtype).newbyteorder("="))
        if self.read_into(out):
            return out
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

    def read_into(self, out: np.ndarray) -> bool:
        """Read the block into ``out`` (C-contiguous, its shape, the array's dtype in native order) without zarr.

        Chunks are read and decoded by :func:`dgemm.storage.chunks.read_into`,
        outside the GIL and straight into ``out`` where they cover whole rows
        of it.  Returns False (``out`` untouched) when the array's layout is
        one that module leaves to zarr (:func:`~dgemm.storage.chunks.why_not`).
        """
        from dgemm.storage.chunks import read_into

        return read_into(self, out)

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

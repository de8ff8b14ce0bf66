"""In-place updates (``out`` is ``c``): the original C blocks, kept until the run is complete.

A block of C that a run has overwritten can no longer be read as the
original C, yet dask re-runs the GEMM task of a block already stored when
the worker holding its result dies, and ``resume`` re-runs every block
without a marker, some of them perhaps already written.  So before a store
task first overwrites C block ``(i, j)`` it keeps the original, raw, at
``<c>/.dgemm/original/<owner>/<i>.<j>``, then a marker ``<i>.<j>.ok``
saying the copy is whole; only then does it write the block.  The invariant:
**without a whole copy, C block (i, j) is still the original**, so a reader
(:class:`OriginalBlock`) takes the copy when its marker exists, else C.  The
copies are removed once the run is marked complete.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dgemm.storage import keys
from dgemm.storage.blocks import ZarrBlock


class Originals:
    """The kept original C blocks of one in-place run (``owner``), in C's own store."""

    def __init__(self, array, owner: str):
        self.store = array.store
        self.root = f"{keys.root(array)}/original"
        self.prefix = f"{self.root}/{owner}/"

    def key(self, i: int, j: int) -> str:
        return f"{self.prefix}{i}.{j}"

    def has(self, i: int, j: int) -> bool:
        """Whether a whole copy of block ``(i, j)`` is kept (its marker is written after the copy)."""
        return keys.exists(self.store, self.key(i, j) + ".ok")

    def keep(self, i: int, j: int, block: ZarrBlock) -> None:
        """Copy C block ``(i, j)`` (``block``, still the original) before it is first overwritten.

        A copy already whole is left alone: by then C may hold the result.
        """
        if self.has(i, j):
            return
        # in the array's own dtype (byte order included), as load() reads the copy back
        data = np.ascontiguousarray(block.load(), dtype=block.array.dtype)
        keys.put(self.store, self.key(i, j), data.tobytes())
        keys.put(self.store, self.key(i, j) + ".ok", b"1")

    def load(self, i: int, j: int, shape: tuple[int, int], dtype) -> np.ndarray:
        raw = keys.get(self.store, self.key(i, j))
        dtype = np.dtype(dtype)
        if raw is None or len(raw) != shape[0] * shape[1] * dtype.itemsize:
            raise OSError(f"the kept original of C block ({i}, {j}) at {self.key(i, j)!r} is "
                          f"{'missing' if raw is None else f'{len(raw)} bytes'}, expected "
                          f"{shape[0] * shape[1] * dtype.itemsize}")
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()   # writable, as a zarr read gives

    def remove(self) -> None:
        """Drop every copy (once the run is complete, C is the result: no copy of any run is needed)."""
        keys.delete_dir(self.store, self.root)


@dataclass(frozen=True)
class OriginalBlock:
    """The original C block ``(i, j)`` of an in-place run: the kept copy if there is one, else C itself."""

    block: ZarrBlock              # the region of C
    originals: Originals
    i: int
    j: int

    def load(self) -> np.ndarray:
        if self.originals.has(self.i, self.j):
            return self.originals.load(self.i, self.j, self.block.shape, self.block.array.dtype)
        return self.block.load()

    @property
    def shape(self) -> tuple[int, int]:
        return self.block.shape

    @property
    def array(self) -> Any:
        return self.block.array

    def describe(self) -> str:
        return self.block.describe() + " (the original, in place)"

    def bad_chunk(self) -> str | None:
        return None if self.originals.has(self.i, self.j) else self.block.bad_chunk()

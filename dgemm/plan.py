"""The plan: how C = op(A) op(B) is cut into blocks.

Block sizes are multiples of the kernel's tile sizes (so only edge blocks are
padded) and, where it costs little, of the storage chunks (so each input
chunk is read by whole blocks and each output block covers whole chunks).
K-blocking reconciles A's and B's chunkings.  When there are fewer C blocks
than workers, the k range is split so every device has work, and a
reduction adds the pieces.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def bounds(extent: int, size: int) -> tuple[tuple[int, int], ...]:
    """Cut ``range(extent)`` into pieces of ``size`` (the last may be shorter).

    >>> bounds(10, 4)
    ((0, 4), (4, 8), (8, 10))
    >>> bounds(0, 4)
    ()
    """
    return tuple((s, min(s + size, extent)) for s in range(0, extent, max(size, 1)))


def block_size(extent: int, target: int, tile: int, chunk: int | None = None) -> int:
    """Choose a block size along one axis.

    The result is a multiple of ``tile`` (and of ``chunk`` when the common
    multiple is no larger than ``target``), at most about ``target``, and the
    whole ``extent`` when that is smaller.

    >>> block_size(10000, 4096, 64)
    4096
    >>> block_size(10000, 4096, 64, chunk=1000)   # lcm(64, 1000) = 8000 > 4096
    4096
    >>> block_size(10000, 4096, 64, chunk=1024)
    4096
    >>> block_size(300, 4096, 64)
    300
    """
    if extent <= 0:
        return 1
    unit = tile
    if chunk and chunk > 0:
        common = math.lcm(tile, chunk)
        if common <= max(target, tile):
            unit = common
    size = max(unit, (target // unit) * unit)
    return extent if size >= extent else size


@dataclass(frozen=True)
class Plan:
    """Blocks of C and of the k range, and how the k range is split over tasks."""

    m: int
    n: int
    k: int
    dtype: np.dtype
    tiles: tuple[int, int, int]
    rows: tuple[tuple[int, int], ...]
    cols: tuple[tuple[int, int], ...]
    ks: tuple[tuple[int, int], ...]
    segments: tuple[tuple[int, int], ...]   # ranges of indices into ``ks``

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def block_shape(self) -> tuple[int, int, int]:
        return (self.rows[0][1] - self.rows[0][0] if self.rows else 0,
                self.cols[0][1] - self.cols[0][0] if self.cols else 0,
                self.ks[0][1] - self.ks[0][0] if self.ks else 0)

    @property
    def n_tasks(self) -> int:
        return len(self.rows) * len(self.cols) * max(len(self.segments), 1)

    def bytes_read(self) -> int:
        """Bytes the block products read: each A block once per block column, each B block once per block row."""
        item = self.dtype.itemsize
        return item * (self.m * self.k * len(self.cols) + self.k * self.n * len(self.rows))

    def explain(self) -> str:
        bm, bn, bk = self.block_shape
        return "\n".join([
            f"C[{self.m} x {self.n}] = A[{self.m} x {self.k}] @ B[{self.k} x {self.n}]  ({self.dtype})",
            f"blocks: {bm} x {bn} (C), k-blocks of {bk}; kernel tiles {self.tiles}",
            f"grid: {len(self.rows)} x {len(self.cols)} C blocks, {len(self.ks)} k-blocks, "
            f"k split into {len(self.segments)} segment(s): {self.n_tasks} GEMM tasks",
            f"work: {self.flops / 1e9:.3f} GFLOP; input bytes read {self.bytes_read() / 1e6:.1f} MB, "
            f"output bytes written {self.m * self.n * self.dtype.itemsize / 1e6:.1f} MB",
        ])


def make_plan(m: int, n: int, k: int, dtype, tiles: tuple[int, int, int], *,
              a_chunks=(None, None), b_chunks=(None, None), out_chunks=None,
              target: int | tuple[int, int, int] = 4096, n_workers: int = 1) -> Plan:
    """Plan ``C[m x n] = A[m x k] @ B[k x n]``.

    Parameters
    ----------
    tiles : (TSM, TSN, TSK)
        Tile sizes the blocks must be multiples of (all workers' kernels).
    a_chunks, b_chunks : pairs of int or None
        Storage chunk sizes along the logical axes of op(A) and op(B).
    out_chunks : (int, int), optional
        Chunking fixed by an existing output array; C blocks then equal it.
    target : int or (int, int, int)
        Preferred block size along M, N, K.
    n_workers : int
        Devices available; the k range is split when C has fewer blocks.

    Examples
    --------
    >>> p = make_plan(1000, 600, 700, "float32", (64, 64, 16), target=256, n_workers=2)
    >>> len(p.rows), len(p.cols), len(p.ks), len(p.segments)
    (4, 3, 3, 1)
    >>> p = make_plan(100, 100, 1000, "float32", (64, 64, 16), target=256, n_workers=2)
    >>> p.segments
    ((0, 2), (2, 4))
    """
    tm, tn, tk = tiles
    gm, gn, gk = (target, target, target) if isinstance(target, int) else target
    if out_chunks is not None:
        bm, bn = out_chunks
    else:
        bm = block_size(m, gm, tm, a_chunks[0])
        bn = block_size(n, gn, tn, b_chunks[1])
    kchunk = None
    ka, kb = a_chunks[1], b_chunks[0]
    if ka and kb:
        kchunk = math.lcm(ka, kb) if math.lcm(ka, kb) <= max(gk, tk) else max(ka, kb)
    else:
        kchunk = ka or kb
    bk = block_size(k, gk, tk, kchunk)
    rows, cols, ks = bounds(m, bm), bounds(n, bn), bounds(k, bk)
    nk = len(ks)
    n_c = len(rows) * len(cols)
    parts = 1
    if 0 < n_c < n_workers and nk > 1:
        parts = min(nk, -(-n_workers // n_c))
    # ``parts`` segments of (nearly) equal numbers of k-blocks: every one of them gets work
    segments = tuple((s * nk // parts, (s + 1) * nk // parts) for s in range(parts)) if nk else ((0, 0),)
    return Plan(m, n, k, np.dtype(dtype), tuple(tiles), rows, cols, ks, segments)

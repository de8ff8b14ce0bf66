"""The plan: how C = op(A) op(B) is cut into blocks.

Block sizes are multiples of the kernel's tile sizes (so only edge blocks are
padded) and, where it costs little, of the storage chunks (so each input
chunk is read by whole blocks and each output block covers whole chunks).
K-blocking reconciles A's and B's chunkings.  When there are fewer C blocks
than workers, the k range is split so every device has work, and a
reduction adds the pieces.

Two limits cap the blocks.  Every device buffer of a block product (A and B
panels and C, padded to the kernel tiles) must stay within 32-bit indexing
(:data:`INT32_MAX` elements), so a huge matrix is always split.  And when
the devices' memory is known, the working set of one block product
(:func:`working_set`) must fit in the smallest device's share: the plan
shrinks blocks until it does, or says clearly that even one tile does not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dask.utils import format_bytes

INT32_MAX = 2**31 - 1
# Share of a device's memory a plan may fill (the rest: programs, the driver,
# another dtype's engine).
MEMORY_FRACTION = 0.8


class PlanError(ValueError):
    """No blocking of the product fits the devices' limits."""


def _roundup(x: int, m: int) -> int:
    return -(-x // m) * m


def working_set(bm: int, bn: int, bk: int, tiles: tuple[int, int, int], itemsize: int) -> tuple[int, int]:
    """Device bytes one block product holds, and its largest single buffer.

    The engine keeps the A and B panels padded to the tiles (``kp x mp`` and
    ``kp x np``), the padded C accumulator, the unpadded C for the download,
    and one staging buffer as large as the largest host block it uploads.

    >>> working_set(64, 64, 64, (64, 64, 16), 4)
    (81920, 16384)
    >>> working_set(100, 10, 1, (64, 64, 16), 8)   # padded to 128 x 64, k to 16
    (106112, 65536)
    """
    tm, tn, tk = tiles
    mp, np_, kp = _roundup(max(bm, 1), tm), _roundup(max(bn, 1), tn), _roundup(max(bk, 1), tk)
    buffers = (kp * mp, kp * np_, mp * np_, max(bm * bk, bk * bn, bm * bn), bm * bn)
    return itemsize * sum(buffers), itemsize * max(buffers)


def index_overflow(bm: int, bn: int, bk: int, tiles: tuple[int, int, int]) -> str | None:
    """Why blocks of ``bm x bn x bk`` overflow the kernels' 32-bit indexing (None if they do not).

    >>> index_overflow(4096, 4096, 4096, (64, 64, 16)) is None
    True
    >>> index_overflow(50000, 50000, 64, (64, 64, 16))
    'a C block of 50048 x 50048 padded elements exceeds 2**31 - 1'
    """
    tm, tn, tk = tiles
    mp, np_, kp = _roundup(max(bm, 1), tm), _roundup(max(bn, 1), tn), _roundup(max(bk, 1), tk)
    for what, x, y in (("a C block", mp, np_), ("an A block", mp, kp), ("a B block", kp, np_)):
        if x * y > INT32_MAX:
            return f"{what} of {x} x {y} padded elements exceeds 2**31 - 1"
    return None


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
    note: str = ""                          # why blocks are smaller than asked, if they are

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
            *([self.note] if self.note else []),
        ])

    def device_bytes(self) -> int:
        """Device memory one block product needs (see :func:`working_set`)."""
        bm, bn, bk = self.block_shape
        return working_set(bm, bn, bk, self.tiles, self.dtype.itemsize)[0]


def make_plan(m: int, n: int, k: int, dtype, tiles: tuple[int, int, int], *,
              a_chunks=(None, None), b_chunks=(None, None), out_chunks=None,
              target: int | tuple[int, int, int] = 4096, n_workers: int = 1,
              device_memory: int | None = None, max_alloc: int | None = None) -> Plan:
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
    device_memory : int, optional
        Bytes of memory of the smallest device (per worker sharing it); a
        block product may use :data:`MEMORY_FRACTION` of it.
    max_alloc : int, optional
        The largest single buffer a device allows (``CL_DEVICE_MAX_MEM_ALLOC_SIZE``).

    Blocks are halved (the largest dimension first, K on ties) until they
    stay within 32-bit indexing and the memory limits; when even one tile
    does not, :class:`PlanError` says so.

    Examples
    --------
    >>> p = make_plan(1000, 600, 700, "float32", (64, 64, 16), target=256, n_workers=2)
    >>> len(p.rows), len(p.cols), len(p.ks), len(p.segments)
    (4, 3, 3, 1)
    >>> p = make_plan(100, 100, 1000, "float32", (64, 64, 16), target=256, n_workers=2)
    >>> p.segments
    ((0, 2), (2, 4))
    >>> make_plan(4096, 4096, 4096, "float64", (64, 64, 16), device_memory=2**20).block_shape
    (128, 128, 128)
    """
    tm, tn, tk = tiles
    dtype = np.dtype(dtype)
    targets = list((target, target, target) if isinstance(target, int) else target)
    budget = None if device_memory is None else int(device_memory * MEMORY_FRACTION)
    ka, kb = a_chunks[1], b_chunks[0]
    shrunk = []

    def sizes():
        if out_chunks is not None:
            bm, bn = out_chunks
        else:
            bm = block_size(m, targets[0], tm, a_chunks[0])
            bn = block_size(n, targets[1], tn, b_chunks[1])
        gk = targets[2]
        if ka and kb:
            kchunk = math.lcm(ka, kb) if math.lcm(ka, kb) <= max(gk, tk) else max(ka, kb)
        else:
            kchunk = ka or kb
        return [bm, bn, block_size(k, gk, tk, kchunk)]

    while True:
        cur = sizes()
        why = index_overflow(*cur, tiles)
        if why is None and (budget is not None or max_alloc is not None):
            total, largest = working_set(*cur, tiles, dtype.itemsize)
            if budget is not None and total > budget:
                why = (f"a block product of {cur[0]} x {cur[1]} x {cur[2]} needs {format_bytes(total)} of "
                       f"device memory; {MEMORY_FRACTION:.0%} of the smallest device's "
                       f"{format_bytes(device_memory)} is {format_bytes(budget)}")
            elif max_alloc is not None and largest > max_alloc:
                why = (f"a block product of {cur[0]} x {cur[1]} x {cur[2]} needs a {format_bytes(largest)} "
                       f"buffer; the device allows {format_bytes(max_alloc)} in one buffer")
        if why is None:
            break
        # Shrink the largest dimension that can shrink (C blocks are fixed by an existing output).
        units = (tm, tn, tk)
        can = [d for d in (2, 0, 1) if cur[d] > units[d] and (d == 2 or out_chunks is None)]
        if not can:
            fixed = f" (C blocks are fixed to the output's chunks {tuple(out_chunks)})" if out_chunks else ""
            raise PlanError(f"no blocking of C[{m} x {n}] = A @ B[{k}] ({dtype}) fits: {why}{fixed}")
        d = max(can, key=lambda x: cur[x])
        if not shrunk:
            shrunk.append(why)
        targets[d] = max(units[d], cur[d] // 2)
    bm, bn, bk = cur
    rows, cols, ks = bounds(m, bm), bounds(n, bn), bounds(k, bk)
    nk = len(ks)
    n_c = len(rows) * len(cols)
    parts = 1
    if 0 < n_c < n_workers and nk > 1:
        parts = min(nk, -(-n_workers // n_c))
    # ``parts`` segments of (nearly) equal numbers of k-blocks: every one of them gets work
    segments = tuple((s * nk // parts, (s + 1) * nk // parts) for s in range(parts)) if nk else ((0, 0),)
    note = f"blocks shrunk: {shrunk[0]}" if shrunk else ""
    return Plan(m, n, k, dtype, tuple(tiles), rows, cols, ks, segments, note)

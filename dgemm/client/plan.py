"""The plan: how C = op(A) op(B) is cut into blocks.

Block sizes are multiples of the kernel's tile sizes (so only edge blocks are
padded) and, where it costs little, of the storage chunks (so each input
chunk is read by whole blocks and each output block covers whole chunks).
K-blocking reconciles A's and B's chunkings.  When there are fewer C blocks
than workers, the k range is split so every device has work, and a
reduction adds the pieces.

Two limits cap the blocks.  Every device buffer of a block product (A and B
panels and C, padded to the kernel tiles) must stay within 32-bit indexing
(:data:`dgemm.sizes.INT32_MAX` elements), so a huge matrix is always split.  And when
the devices' memory is known, the working set of one block product
(:func:`working_set`) must fit in the smallest device's share: the plan
shrinks blocks until it does, or says clearly that even one tile does not.
"""
from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from dask.utils import format_bytes

from dgemm.client.balance import even_split, imbalance, weighted_starts
from dgemm.errors import PlanError
from dgemm.sizes import MEMORY_FRACTION, index_overflow, working_set

# numpy and Zarr address an array with 64-bit indices: beyond this, Zarr reads garbage, silently.
INDEX_MAX = 2**63 - 1

# The most block products (one A block times one B block: a device GEMM call) a call's task graph may
# hold.  The graph is built on the client, every block product named in it (measured: about 1 kB of memory
# and 30 us each, so 10**7 is some 10 GB and minutes), and a scheduler would hold every task; beyond this,
# the shape is a mistake (metadata-only Zarr arrays may claim any shape) or the blocks are too small.
MAX_BLOCK_PRODUCTS = 10**7


class Cuts(Sequence):
    """``range(extent)`` cut into pieces of ``size``: the ``(start, stop)`` pairs, computed when asked for.

    A plan's rows, columns and k-blocks.  Nothing is built per piece, so a
    plan of any size is made at once (10**7 x 10**7 has 10**4 pieces per
    axis; a metadata-only array may have 10**20).  It compares equal to the
    tuple of its pieces (but hashes by extent and size); ``count`` is their
    number (``len`` works too, up to ``sys.maxsize``, as for ``range``).

    >>> c = Cuts(10, 4)
    >>> tuple(c), c.count, c[-1], c[1:]
    (((0, 4), (4, 8), (8, 10)), 3, (8, 10), ((4, 8), (8, 10)))
    >>> c == ((0, 4), (4, 8), (8, 10)), Cuts(0, 4) == ()
    (True, True)
    >>> Cuts(10**20, 1024).count, Cuts(10**20, 1024)[-1]
    (97656250000000000, (99999999999999998976, 100000000000000000000))
    """

    __slots__ = ("extent", "size", "count")

    def __init__(self, extent: int, size: int):
        self.extent, self.size = int(extent), max(int(size), 1)
        self.count = -(-self.extent // self.size) if self.extent > 0 else 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[x] for x in range(*i.indices(self.count)))
        i = operator.index(i)
        if i < 0:
            i += self.count
        if not 0 <= i < self.count:
            raise IndexError(f"piece {i} of {self.count}")
        start = i * self.size
        return (start, min(start + self.size, self.extent))

    def __iter__(self):
        for start in range(0, self.extent, self.size):
            yield (start, min(start + self.size, self.extent))

    def total(self, lo: int, hi: int) -> int:
        """The summed length of pieces ``lo`` to ``hi - 1``.

        >>> Cuts(10, 4).total(1, 3)
        6
        """
        return min(hi * self.size, self.extent) - min(lo * self.size, self.extent) if hi > lo else 0

    def _key(self):
        return (self.extent, self.size if self.count > 1 else 0)

    def __eq__(self, other):
        if isinstance(other, Cuts):
            return self._key() == other._key()
        if isinstance(other, (tuple, list)):
            return len(other) == self.count and all(tuple(x) == y for x, y in zip(other, self))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Cuts({self.extent}, {self.size})"


def bounds(extent: int, size: int) -> Cuts:
    """Cut ``range(extent)`` into pieces of ``size`` (the last may be shorter).

    >>> tuple(bounds(10, 4))
    ((0, 4), (4, 8), (8, 10))
    >>> bounds(0, 4) == ()
    True
    """
    return Cuts(extent, size)


def block_size(extent: int, target: int, tile: int, chunk: int | None = None, slack: int = 2) -> int:
    """Choose a block size along one axis.

    The result is a multiple of ``tile`` (and of ``chunk`` when the common
    multiple is at most ``slack`` times ``target``: a block that cuts a
    chunk makes every block sharing it read the whole chunk again), at most about
    ``target`` otherwise, and the whole ``extent`` when that is smaller.

    >>> block_size(10000, 4096, 64)
    4096
    >>> block_size(10000, 4096, 64, chunk=1000)   # lcm(64, 1000) = 8000 < 2 * 4096
    8000
    >>> block_size(10000, 4096, 64, chunk=1000 * 9)   # lcm = 72000: too large, cut chunks
    4096
    >>> block_size(32768, 4096, 128, chunk=8192)  # one block per chunk
    8192
    >>> block_size(300, 4096, 64)
    300
    """
    if extent <= 0:
        return 1
    unit = tile
    if chunk and chunk > 0:
        common = math.lcm(tile, chunk)
        if common <= slack * max(target, tile):
            unit = common
    size = max(unit, (target // unit) * unit)
    return extent if size >= extent else size


def _num(x: float, places: int) -> str:
    """``x`` with ``places`` decimals, or in scientific notation once that would print a wall of digits.

    >>> _num(1234.5678, 2), _num(6e93, 2)
    ('1234.57', '6e+93')
    """
    return f"{x:.{places}f}" if abs(x) < 1e12 else f"{x:.4g}"


@dataclass(frozen=True)
class Plan:
    """Blocks of C and of the k range, and how the k range is split over tasks."""

    m: int
    n: int
    k: int
    dtype: np.dtype
    tiles: tuple[int, int, int]
    rows: Cuts                              # C's block rows: (start, stop) pairs
    cols: Cuts
    ks: Cuts                                # the k-blocks
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
        return self.rows.count * self.cols.count * max(len(self.segments), 1)

    def bytes_read(self) -> int:
        """Bytes the block products read: each A block once per block column, each B block once per block row."""
        item = self.dtype.itemsize
        return item * (self.m * self.k * self.cols.count + self.k * self.n * self.rows.count)

    def explain(self) -> str:
        bm, bn, bk = self.block_shape
        return "\n".join([
            f"C[{self.m} x {self.n}] = A[{self.m} x {self.k}] @ B[{self.k} x {self.n}]  ({self.dtype})",
            f"blocks: {bm} x {bn} (C), k-blocks of {bk}; kernel tiles {self.tiles}",
            f"grid: {self.rows.count} x {self.cols.count} C blocks, {self.ks.count} k-blocks, "
            f"k split into {len(self.segments)} segment(s): {self.n_tasks} GEMM tasks",
            f"work: {_num(self.flops / 1e9, 3)} GFLOP; input bytes {format_bytes(self.bytes_read())} if no block "
            f"were reused, output bytes written {format_bytes(self.m * self.n * self.dtype.itemsize)}",
            *([self.note] if self.note else []),
            *([f"graph: {_count(self.block_products)} block products, more than the {MAX_BLOCK_PRODUCTS:,} a task "
               "graph may hold: dgemm.matmul refuses it"] if self.block_products > MAX_BLOCK_PRODUCTS else []),
        ])

    @property
    def block_products(self) -> int:
        """How many block products (one A block times one B block) the whole product takes; at least one per C block."""
        return self.rows.count * self.cols.count * max(self.ks.count, 1)

    def tasks(self) -> list[tuple[int, int, int]]:
        """Every GEMM task ``(i, j, segment)``."""
        return [(i, j, s) for i in range(self.rows.count) for j in range(self.cols.count)
                for s in range(len(self.segments))]

    def estimate(self, n_workers: int = 1, rates=None, cache_bytes: float | None = None, **how) -> dict:
        """Bytes moved and the time floor on ``n_workers`` devices placed by :func:`assign`.

        :func:`dgemm.client.estimate.estimate` on this plan's shares (``how``:
        its codecs, hosts and the like).
        """
        from dgemm.client.estimate import estimate

        return estimate(self, loads(self, n_workers), rates, cache_bytes, **how)

    def explain_estimate(self, n_workers: int = 1, rates=None, cache_bytes: float | None = None, **how) -> str:
        """:meth:`estimate` as text: :func:`dgemm.client.estimate.explain_estimate`."""
        from dgemm.client.estimate import explain_estimate

        return explain_estimate(self, loads(self, n_workers), rates, cache_bytes, **how)

    def device_bytes(self) -> int:
        """Device memory one block product needs (see :func:`working_set`)."""
        bm, bn, bk = self.block_shape
        return working_set(bm, bn, bk, self.tiles, self.dtype.itemsize)[0]


def _count(x: int) -> str:
    """An integer with thousands separators, or in scientific notation once that would print a wall of digits.

    >>> _count(1234567), _count(10**30)
    ('1,234,567', '1e+30')
    """
    return f"{x:,}" if x < 10**12 else f"{x:.4g}"


def check_graph_size(plan: Plan, limit: int = MAX_BLOCK_PRODUCTS, *, slack: int = 1) -> None:
    """Refuse (:class:`PlanError`) a plan whose task graph would name more than ``limit`` block products.

    ``slack``: refuse only beyond ``slack * limit`` (the message still names
    ``limit``), for a plan coarser than the one the devices will run (a
    check before any cluster is found).

    Costs nothing, whatever the plan's size: called on the client before a
    graph is built or an output created, so that metadata claiming an
    absurd shape is answered at once rather than by the graph growing
    until memory runs out.  The message names the count, the limit, the
    blocks, and a ``block=`` that would bring the count within the limit
    where one exists (blocks may also be capped by the devices' memory and
    32-bit indexing: :func:`make_plan`).

    >>> check_graph_size(make_plan(500_000, 500_000, 500_000, "float32", (1, 1, 1), target=4096))
    >>> check_graph_size(make_plan(10**6, 10**6, 10**6, "float32", (1, 1, 1), target=4096))
    Traceback (most recent call last):
    ...
    dgemm.errors.PlanError: C[1000000 x 1000000] = A @ B[1000000] (float32) would take 14,706,125 block products (245 x 245 C blocks of 4096 x 4096, 245 k-blocks of 4096), more than the 10,000,000 a task graph may hold (each costs the client about 1 kB and 30 us to build); check the operands' shapes (a Zarr array's metadata may claim any shape), or use larger blocks: block=(5120, 5120, 5120) would give 7,529,536
    """
    count = plan.block_products
    if count <= slack * limit:
        return
    bm, bn, bk = plan.block_shape
    # the smallest cube of blocks per side that fits, if any: a side of ceil(limit ** (1/3)) is too many
    per_axis = max(round(limit ** (1 / 3)), 1)
    while per_axis ** 3 > limit:
        per_axis -= 1
    # rounded up to a multiple of 512, which every kernel's tiles divide (make_plan rounds blocks down to tiles)
    sizes = [-(-max(-(-e // per_axis), 1) // 512) * 512 for e in (plan.m, plan.n, plan.k)]
    fits = all(s * s <= 2**31 - 1 for s in sizes[:2])    # C blocks within 32-bit indexing, at least
    hint = ""
    if fits:
        after = math.prod(-(-e // s) if e else 1 for e, s in zip((plan.m, plan.n, plan.k), sizes))
        hint = f": block={tuple(sizes)} would give {_count(after)}"
    raise PlanError(f"C[{plan.m} x {plan.n}] = A @ B[{plan.k}] ({plan.dtype}) would take {_count(count)} block "
                    f"products ({plan.rows.count} x {plan.cols.count} C blocks of {bm} x {bn}, {plan.ks.count} "
                    f"k-blocks of {bk}), more than the {limit:,} a task graph may hold (each costs the client "
                    "about 1 kB and 30 us to build); check the operands' shapes (a Zarr array's metadata may claim "
                    "any shape), or use larger blocks" + (hint or " (none fits: the blocks would be beyond 32-bit "
                                                                    "indexing)"))


def check_extents(m: int, n: int, k: int) -> None:
    """Refuse a product whose dimensions no index can address (:class:`PlanError`); costs nothing.

    >>> check_extents(10**7, 10**7, 2**63 - 1)
    >>> check_extents(10**31, 3, 3)
    Traceback (most recent call last):
    ...
    dgemm.errors.PlanError: C[10000000000000000000000000000000 x 3] = A @ B[3]: M (rows of C) is 10000000000000000000000000000000, beyond 2**63 - 1, the largest index numpy and Zarr can address an array with
    """
    for what, x in (("M (rows of C)", m), ("N (columns of C)", n), ("K (the contracted dimension)", k)):
        if x > INDEX_MAX:
            raise PlanError(f"C[{m} x {n}] = A @ B[{k}]: {what} is {x}, beyond 2**63 - 1, the largest index "
                            "numpy and Zarr can address an array with")


def _k_slack(slack: int, kchunk: int | None, tk: int, bmn: int, targets) -> int:
    """How far the K blocks may grow to cover whole chunks along K.

    A K block that cuts a chunk makes each block sharing it decode the whole
    chunk again (a tall X of 16384-row chunks read by 4096-row K blocks was
    decoded four times).  Along K only the panels grow, not C's blocks, so a
    K block may cover whole chunks while its panels (``bk x (bm + bn)``) stay
    within four times those of the target block; the memory checks still
    shrink it.  A block size the user gave (``slack`` 1) is kept.

    >>> _k_slack(2, 16384, 32, 2048 + 2048, (4096, 4096, 4096))   # a Gram's 2048² blocks
    4
    >>> _k_slack(2, 65536, 32, 4096 + 4096, (4096, 4096, 4096))   # too large: the chunk is cut
    2
    >>> _k_slack(2, None, 32, 8192, (4096, 4096, 4096)), _k_slack(1, 16384, 32, 4096, (4096, 4096, 4096))
    (2, 1)
    """
    if not kchunk or kchunk <= 0 or slack <= 1:
        return slack
    unit = math.lcm(tk, kchunk)
    gk = max(targets[2], tk)
    if unit <= slack * gk or unit * bmn > 4 * (targets[0] + targets[1]) * gk:
        return slack
    return -(-unit // gk)


def make_plan(m: int, n: int, k: int, dtype, tiles: tuple[int, int, int], *,
              a_chunks=(None, None), b_chunks=(None, None), out_chunks=None,
              target: int | tuple[int, int, int] = 4096, n_workers: int = 1,
              device_memory: int | None = None, max_alloc: int | None = None, exact: bool = False) -> Plan:
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
    exact : bool
        ``target`` is the user's: blocks may follow the chunks only up to it,
        not up to twice it.

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
    check_extents(m, n, k)
    targets = list((target, target, target) if isinstance(target, int) else target)
    budget = None if device_memory is None else int(device_memory * MEMORY_FRACTION)
    ka, kb = a_chunks[1], b_chunks[0]
    shrunk = []
    slack = 1 if exact else 2
    cut: set = set()    # axes whose blocks may cut chunks: following them no longer fits the device

    def sizes():
        if out_chunks is not None:
            bm, bn = out_chunks
        else:
            bm = block_size(m, targets[0], tm, None if 0 in cut else a_chunks[0], slack)
            bn = block_size(n, targets[1], tn, None if 1 in cut else b_chunks[1], slack)
        gk = targets[2]
        if 2 in cut:
            kchunk = None
        elif ka and kb:
            kchunk = math.lcm(ka, kb) if math.lcm(ka, kb) <= slack * max(gk, tk) else max(ka, kb)
        else:
            kchunk = ka or kb
        return [bm, bn, block_size(k, gk, tk, kchunk, _k_slack(slack, kchunk, tk, bm + bn, targets))]

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
        if sizes()[d] == cur[d]:    # whole chunks hold it at this size: cut them rather than loop forever
            cut.add(d)
    bm, bn, bk = cur
    rows, cols, ks = bounds(m, bm), bounds(n, bn), bounds(k, bk)
    nk = ks.count
    n_c = rows.count * cols.count
    parts = 1
    if 0 < n_c < n_workers and nk > 1:
        parts = min(nk, -(-n_workers // n_c))
    # ``parts`` segments of (nearly) equal numbers of k-blocks: every one of them gets work
    segments = tuple((s * nk // parts, (s + 1) * nk // parts) for s in range(parts)) if nk else ((0, 0),)
    note = f"blocks shrunk: {shrunk[0]}" if shrunk else ""
    return Plan(m, n, k, dtype, tuple(tiles), rows, cols, ks, segments, note)


# -- placement ----------------------------------------------------------------
def _snake(tasks) -> list:
    """Tasks ``(i, j, s)`` row by row, every other row backwards, so consecutive rows share a B panel.

    >>> _snake([(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)])
    [(0, 0, 0), (0, 1, 0), (1, 1, 0), (1, 0, 0)]
    """
    return sorted(tasks, key=_snake_key)


def _snake_key(t) -> tuple:
    return t[0], t[1] if t[0] % 2 == 0 else -t[1], t[2]


def assign(tasks, n_workers: int, plan: Plan | None = None) -> list[list]:
    """Share GEMM tasks ``(i, j, s)`` among ``n_workers`` for locality; each worker's list is in run order.

    Candidates are every ``pr x pc = n_workers`` grid of rectangles of C
    blocks and contiguous runs of the row-by-row order, cut by count and,
    given the ``plan``, by work (an edge block is smaller); the one whose
    busiest worker has least work wins (:mod:`dgemm.client.balance`; its
    multiply-adds, else its tasks), then the one reading the fewest panel
    bytes.  Within a worker tasks go row by row (see :func:`_snake`), so the
    A panel of a row is reused along it and the B panels along the columns.

    >>> tasks = [(i, j, 0) for i in range(4) for j in range(4)]
    >>> [sorted({(i // 2, j // 2) for i, j, _ in part}) for part in assign(tasks, 4)]
    [[(0, 0)], [(0, 1)], [(1, 0)], [(1, 1)]]
    >>> [len(p) for p in assign(tasks, 3)]
    [6, 5, 5]
    >>> assign([(0, 0, 0), (0, 0, 1)], 2)      # k split: one segment each
    [[(0, 0, 0)], [(0, 0, 1)]]
    """
    tasks = list(tasks)
    if n_workers <= 1 or len(tasks) <= 1:
        return [_snake(tasks)] + [[] for _ in range(max(n_workers, 1) - 1)]
    rows, cols = sorted({t[0] for t in tasks}), sorted({t[1] for t in tasks})
    # each row's height, column's width and segment's depth (1 without a plan: tasks counted); each task's work
    rh = {r: plan.rows.total(r, r + 1) if plan else 1 for r in rows}
    cw = {c: plan.cols.total(c, c + 1) if plan else 1 for c in cols}
    sk = {s: plan.ks.total(*plan.segments[s]) if plan else 1 for s in {t[2] for t in tasks}}
    work = [rh[i] * cw[j] * sk[s] for i, j, s in tasks]
    grids = [(pr, n_workers // pr) for pr in range(1, n_workers + 1)
             if not n_workers % pr and pr <= len(rows) and n_workers // pr <= len(cols)]
    cuts = [(even_split(rows, pr), even_split(cols, pc)) for pr, pc in grids]
    if plan is not None:   # the same grids cut by work (each row's, each column's, summed over its tasks)
        prefixes = []
        for axis, keys in ((0, rows), (1, cols)):
            weight = dict.fromkeys(keys, 0)
            for t, w in zip(tasks, work):
                weight[t[axis]] += w
            prefixes.append([0, *itertools.accumulate(weight[x] for x in keys)])   # once for every grid
        for pr, pc in grids:
            along = []
            for keys, n, prefix in ((rows, pr, prefixes[0]), (cols, pc, prefixes[1])):
                at = weighted_starts(prefix.__getitem__, len(keys), n)
                along.append([keys[at[g]:at[g + 1]] for g in range(n)])
            cuts.append(tuple(along))
    # each candidate as the worker of each task, weighed before any is built; rectangles first: a tie with the
    # runs of the snake order (whole rows alike) goes to a rectangle, whose workers are staggered (_staggered)
    rect = []
    for rsplit, csplit in cuts:
        rgroup = {r: g for g, part in enumerate(rsplit) for r in part}
        cgroup = {c: g for g, part in enumerate(csplit) for c in part}
        rect.append([rgroup[t[0]] * len(csplit) + cgroup[t[1]] for t in tasks])
    order = sorted(range(len(tasks)), key=lambda x: _snake_key(tasks[x]))
    runs = [even_split(list(range(len(order))), n_workers)]
    if plan is not None and len(order) >= n_workers:   # the snake order cut by work too
        prefix = [0, *itertools.accumulate(work[x] for x in order)]
        at = weighted_starts(prefix.__getitem__, len(order), n_workers)
        runs.append([list(range(at[w], at[w + 1])) for w in range(n_workers)])
    by_run = [[0] * len(tasks) for _ in runs]
    for owner, split in zip(by_run, runs):
        for w, positions in enumerate(split):
            for q in positions:
                owner[order[q]] = w
    candidates = [("rect", o) for o in rect[:len(grids)]] + [("run", by_run[0])] + \
                 [("rect", o) for o in rect[len(grids):]] + [("run", o) for o in by_run[1:]]
    unit = plan.k * plan.dtype.itemsize if plan else 1
    total = sum(work)

    def key(candidate):
        load = [0] * n_workers
        for w, o in zip(work, candidate[1]):
            load[o] += w
        panels = sum(rh[r] for _, r in {(o, t[0]) for o, t in zip(candidate[1], tasks)}) \
            + sum(cw[c] for _, c in {(o, t[1]) for o, t in zip(candidate[1], tasks)})
        return imbalance(max(load), total, n_workers), panels * unit
    kind, owner = min(candidates, key=key)
    parts = [[] for _ in range(n_workers)]
    for x in order if kind == "run" else range(len(tasks)):
        parts[owner[x]].append(tasks[x])
    return parts if kind == "run" else [_staggered(p, w, n_workers) for w, p in enumerate(parts)]


def _staggered_ends(i0: int, i1: int, j0: int, j1: int, w: int, n: int) -> tuple:
    """The first and last task of :func:`_staggered` for worker ``w`` of ``n`` on rows ``i0:i1``, columns ``j0:j1``.

    >>> part = [(i, j, 0) for i in range(3, 6) for j in range(2, 7)]
    >>> order = _staggered(part, 2, 3)
    >>> _staggered_ends(3, 6, 2, 7, 2, 3) == (order[0], order[-1])
    True
    """
    nr, nc = i1 - i0, j1 - j0
    ro, co = w * nr // n, w * nc // n
    last_row = i0 + (ro + nr - 1) % nr
    last_col = j0 + ((co + nc - 1) % nc if (nr - 1) % 2 == 0 else co)
    return (i0 + ro, j0 + co, 0), (last_row, last_col, 0)


def _staggered(part, w: int, n: int) -> list:
    """Worker ``w`` of ``n``'s tasks in snake order, starting ``w / n`` of the way through its rows and columns.

    Workers that share panels (a row split shares B's, a column split A's)
    would otherwise read them in the same order at the same time: on one
    host with a shared cache of decoded blocks
    (:mod:`dgemm.storage.hostcache`) one decodes while the other waits, so
    each ends up reading at half speed.  Staggered, each decodes its own
    part of the shared panels first and finds the rest decoded by the other.

    >>> _staggered([(i, j, 0) for i in range(2) for j in range(4)], 1, 2)
    [(1, 2, 0), (1, 3, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 0, 0), (0, 3, 0), (0, 2, 0)]
    """
    rows = sorted({t[0] for t in part})
    cols = sorted({t[1] for t in part})
    rows = rows[w * len(rows) // n:] + rows[:w * len(rows) // n]
    cols = cols[w * len(cols) // n:] + cols[:w * len(cols) // n]
    rpos = {r: p for p, r in enumerate(rows)}
    cpos = {c: p for p, c in enumerate(cols)}
    return sorted(part, key=lambda t: (rpos[t[0]], cpos[t[1]] if rpos[t[0]] % 2 == 0 else -cpos[t[1]], t[2]))


@dataclass(frozen=True)
class Load:
    """One worker's share of a plan's GEMM tasks, summed: what :meth:`Plan.estimate` needs (in elements)."""

    tasks: int
    a: int            # A elements of the distinct (block row, k segment) pairs it touches
    b: int            # B elements of the distinct (block column, k segment) pairs
    b_each: int       # B elements read once per task (when the cache cannot hold them all)
    area: int         # C elements its tasks produce
    flop_terms: int   # multiply-adds
    panels: int       # elements of C's rows plus columns it touches (what assign minimises)
    first: tuple      # its first and last task (i, j, s)
    last: tuple


def _load(plan: Plan, part) -> Load:
    """The :class:`Load` of an explicit list of tasks (in run order)."""
    rm = [plan.rows.total(i, i + 1) for i in range(plan.rows.count)]
    cn = [plan.cols.total(j, j + 1) for j in range(plan.cols.count)]
    seg_k = [plan.ks.total(a, b) for a, b in plan.segments]
    return Load(len(part), sum(rm[i] * seg_k[s] for i, s in {(i, s) for i, _, s in part}),
                sum(cn[j] * seg_k[s] for j, s in {(j, s) for _, j, s in part}),
                sum(seg_k[s] * cn[j] for _, j, s in part), sum(rm[i] * cn[j] for i, j, _ in part),
                sum(rm[i] * cn[j] * seg_k[s] for i, j, s in part),
                sum(rm[i] for i in {t[0] for t in part}) + sum(cn[j] for j in {t[1] for t in part}),
                part[0] if part else None, part[-1] if part else None)


def loads(plan: Plan, n_workers: int) -> list[Load]:
    """Each worker's :class:`Load` when :func:`assign` shares out all of ``plan``'s tasks, in O(workers).

    Without a k split (one segment), a worker's share is a rectangle of C
    blocks or a run of the row-by-row (snake) order: a few bands of whole
    rows, whose sums come from the block sizes without listing a task, so a
    plan of 10**8 blocks (or 10**40) is summed as fast as one of 4.  A k
    split only happens when C has fewer blocks than there are workers: those
    few tasks are listed.  ``tests/test_plan.py`` checks both against
    :func:`assign`.

    >>> p = make_plan(1000, 1000, 64, "float32", (64, 64, 16), target=256)   # edge blocks of 232
    >>> [(x.tasks, x.first, x.last) for x in loads(p, 3)]                   # runs cut by work: 6 tasks
    [(5, (0, 0, 0), (1, 3, 0)), (5, (1, 2, 0), (2, 1, 0)), (6, (2, 2, 0), (3, 0, 0))]
    """
    rows, cols = plan.rows, plan.cols
    R, C, S = rows.count, cols.count, len(plan.segments)
    W = max(n_workers, 1)
    if S > 1:
        return [_load(plan, part) for part in assign(plan.tasks(), W, plan)]
    seg_k = plan.ks.total(0, plan.ks.count)
    nothing = Load(0, 0, 0, 0, 0, 0, 0, None, None)

    def load(bands, first, last) -> Load:
        # ``bands``: disjoint (i0, i1, j0, j1) rectangles of one share; their rows and columns are each
        # one interval (two snake rows in a run meet at the end one leaves off and the next starts from)
        r0, r1 = min(b[0] for b in bands), max(b[1] for b in bands)
        c0, c1 = min(b[2] for b in bands), max(b[3] for b in bands)
        rs, cs = rows.total(r0, r1), cols.total(c0, c1)
        area = sum(rows.total(i0, i1) * cols.total(j0, j1) for i0, i1, j0, j1 in bands)
        return Load(sum((i1 - i0) * (j1 - j0) for i0, i1, j0, j1 in bands), rs * seg_k, cs * seg_k,
                    seg_k * sum((i1 - i0) * cols.total(j0, j1) for i0, i1, j0, j1 in bands), area,
                    area * seg_k, rs + cs, first, last)

    def col(i, pos):   # the column at position ``pos`` of row ``i`` in the snake order
        return pos if i % 2 == 0 else C - 1 - pos

    def run(t0, t1) -> Load:   # positions t0 .. t1 - 1 of the snake order
        if t1 <= t0:
            return nothing
        (i0, p0), (i1, p1) = divmod(t0, C), divmod(t1 - 1, C)

        def band(i, pa, pb):
            ja, jb = col(i, pa), col(i, pb)
            return (i, i + 1, min(ja, jb), max(ja, jb) + 1)
        bands = [band(i0, p0, p1 if i1 == i0 else C - 1)]
        if i1 > i0 + 1:
            bands.append((i0 + 1, i1, 0, C))
        if i1 > i0:
            bands.append(band(i1, 0, p1))
        return load(bands, (i0, col(i0, p0), 0), (i1, col(i1, p1), 0))

    def starts(n, parts):   # where even_split cuts n items into parts
        q, r = divmod(n, parts)
        return [p * q + min(p, r) for p in range(parts + 1)]

    T = R * C
    if W <= 1 or T <= 1:
        return [run(0, T)] + [nothing] * (W - 1)
    cut = starts(T, W)
    grids = [(pr, W // pr) for pr in range(1, W + 1) if not W % pr and pr <= R and W // pr <= C]
    # in assign's order: rectangles cut by count, runs, rectangles cut by work (a row's: its height, a column's:
    # its width, times the rest, which scales every cut alike)
    cuts = [(starts(R, pr), starts(C, pc)) for pr, pc in grids]
    cuts += [(weighted_starts(lambda i: rows.total(0, i), R, pr), weighted_starts(lambda j: cols.total(0, j), C, pc))
             for pr, pc in grids]
    candidates = []
    for rc, cc in cuts:
        parts = []
        for g in range(len(rc) - 1):
            i0, i1 = rc[g], rc[g + 1]
            for h in range(len(cc) - 1):
                j0, j1 = cc[h], cc[h + 1]
                parts.append(load([(i0, i1, j0, j1)], *_staggered_ends(i0, i1, j0, j1, len(parts), W)))
        candidates.append(parts)
    candidates.insert(len(grids), [run(cut[p], cut[p + 1]) for p in range(W)])

    def snake_prefix(t):   # the work of the first t positions of the snake order (up to the constant k)
        i, q = divmod(t, C)
        head = rows.total(i, i + 1) * (cols.total(0, q) if i % 2 == 0 else cols.total(C - q, C)) if q else 0
        return rows.total(0, i) * cols.total(0, C) + head
    if T >= W:
        at = weighted_starts(snake_prefix, T, W)
        candidates.append([run(at[p], at[p + 1]) for p in range(W)])
    unit = plan.k * plan.dtype.itemsize   # as assign weighs panels
    total = sum(x.flop_terms for x in candidates[0])
    return min(candidates, key=lambda parts: (imbalance(max(x.flop_terms for x in parts), total, W),
                                              sum(x.panels * unit for x in parts)))

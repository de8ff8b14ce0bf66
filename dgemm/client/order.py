"""The order a worker runs its C blocks in: reads spread over the run while its device cache holds them all.

:func:`dgemm.client.plan.assign` gives each worker its blocks in snake order,
row by row.  That order needs the fewest panels at once, which is right when
the device's panel cache cannot hold all the worker's A and B panels.  When
it can, it front-loads the reading: the first row reads every B panel the
worker needs while its GPU computes one row of products.  On an H200 (49152²
float32 from zstd, 4096² blocks) the first row's products waited on the
readers for about a second, and the rows after it read one A panel each while
their kernels ran.  :func:`grow` runs the same blocks as a growing rectangle
instead: step ``s`` adds the next row panel and the next column panel, so
that each step reads two panels while computing ``2s + 1`` products, and the
reads the worker must do anyway overlap its kernels from the start.
"""
from __future__ import annotations


def grow(part: list, panel_bytes: float, cache_bytes: float | None) -> list:
    """``part`` (one worker's ``(i, j, s)`` tasks, in run order) as a growing rectangle where its panels fit.

    ``panel_bytes`` is what the worker's distinct A and B panels hold;
    ``cache_bytes`` its device's panel cache (None: unknown, the order is
    kept).  The rows and columns keep the order in which ``part`` first
    reaches them (a staggered start stays where it was); step ``s`` of a
    rectangle of ``R`` rows and ``C`` columns holds the blocks whose row and
    column positions ``r`` and ``c`` have ``max(r * C, c * R)`` in step s's
    range, so a tall or wide rectangle grows in proportion.

    >>> [t[:2] for t in grow([(i, j, 0) for i in range(3) for j in range(3)], 1, 10)]
    [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (1, 2), (2, 0), (2, 1), (2, 2)]
    >>> grow([(0, 0, 0), (0, 1, 0)], 10, 5) == [(0, 0, 0), (0, 1, 0)]   # does not fit: as given
    True
    """
    if cache_bytes is None or panel_bytes > cache_bytes or len(part) < 3:
        return list(part)
    rows = {i: None for i, _, _ in part}
    cols = {j: None for _, j, _ in part}
    rpos = {i: p for p, i in enumerate(rows)}
    cpos = {j: p for p, j in enumerate(cols)}
    nr, nc = len(rpos), len(cpos)

    def key(t):
        r, c = rpos[t[0]], cpos[t[1]]
        return max(r * nc, c * nr), r, c, t[2]
    return sorted(part, key=key)


def panel_bytes(plan, part) -> int:
    """Bytes of the distinct A and B panels (block row or column, k segment) that tasks ``part`` read.

    >>> from dgemm.client.plan import make_plan
    >>> p = make_plan(256, 256, 128, "float32", (64, 64, 16), target=128)
    >>> panel_bytes(p, [(0, 0, 0), (0, 1, 0)]) == 4 * (128 * 128 + 2 * 128 * 128)
    True
    """
    seg = [plan.ks.total(a, b) for a, b in plan.segments]
    rows = {(i, s) for i, _, s in part}
    cols = {(j, s) for _, j, s in part}
    return plan.dtype.itemsize * (sum(plan.rows.total(i, i + 1) * seg[s] for i, s in rows)
                                  + sum(plan.cols.total(j, j + 1) * seg[s] for j, s in cols))

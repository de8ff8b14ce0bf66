"""How the plan shares work among workers evenly (:func:`dgemm.client.plan.assign` and its sums, ``loads``).

A worker's work is its block products' multiply-adds, not their count: an
edge block may be a tenth of the others (50000 in blocks of 8192: six of
8192 and one of 848), and shares cut by count left one of two GPUs 1.35x
the other's work.  Rows, columns and runs of blocks are cut where the work
is shared evenly (:func:`weighted_starts`; by count: :func:`even_split`), and among the candidate shares
the one whose busiest worker has the least work wins, to a percent
(:func:`imbalance`), then the one that reads the fewest panels.
"""
from __future__ import annotations


def even_split(items: list, parts: int) -> list[list]:
    """``items`` cut into ``parts`` contiguous runs of nearly equal length.

    >>> even_split([1, 2, 3, 4, 5], 2)
    [[1, 2, 3], [4, 5]]
    """
    q, r = divmod(len(items), parts)
    start = [p * q + min(p, r) for p in range(parts + 1)]
    return [items[start[p]:start[p + 1]] for p in range(parts)]


def weighted_starts(prefix, n: int, parts: int) -> list[int]:
    """Where to cut ``n`` items into ``parts`` non-empty runs of nearly equal weight (``prefix(i)``: the weight
    of the first ``i``, non-decreasing integers): each cut at the item boundary nearest its share.

    >>> weighted_starts(lambda i: 8 * min(i, 6) + (i > 6), 7, 2)   # six blocks of 8 and an edge block of 1
    [0, 3, 7]
    """
    total, cuts = prefix(n), [0]
    for g in range(1, parts):
        lo, hi = cuts[-1] + 1, n - (parts - g)
        a, b = lo, hi                      # the first i in lo..hi with parts * prefix(i) >= g * total
        while a < b:
            mid = (a + b) // 2
            a, b = (mid + 1, b) if parts * prefix(mid) < g * total else (a, mid)
        if a > lo and 2 * g * total - parts * (prefix(a - 1) + prefix(a)) <= 0:
            a -= 1                         # the boundary before is as near or nearer
        cuts.append(a)
    return cuts + [n]


def imbalance(busiest: int, total: int, n_workers: int) -> int:
    """The busiest worker's work against an even share, in whole percents (rounded up): candidates within a
    percent of each other are told apart by the panel bytes they read.

    >>> imbalance(50, 100, 2), imbalance(51, 100, 2), imbalance(52, 100, 2)
    (100, 102, 104)
    """
    return -(-100 * n_workers * busiest // max(total, 1))

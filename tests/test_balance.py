"""Shares of a plan cut by work, not by count (dgemm.client.balance; dgemm.client.plan.assign and loads).

An edge block can be a tenth of the others: 50000² in blocks of 8192 is six
rows of 8192 and one of 848.  Cut by count, two workers got 1.35x each
other's multiply-adds; cut by work they are within a few percent, and a
share is never worse than the count's.  ``loads`` (sums in O(workers), for
plans too large to list) stays exactly the sum of what ``assign`` places.
"""
from __future__ import annotations

import pytest

from dgemm.client.balance import imbalance, weighted_starts
from dgemm.client.plan import _load, assign, loads, make_plan


def _work(plan, part) -> int:
    return sum(plan.rows.total(i, i + 1) * plan.cols.total(j, j + 1) * plan.ks.total(*plan.segments[s])
               for i, j, s in part)


def _ratio(plan, parts) -> float:
    work = [_work(plan, p) for p in parts]
    return max(work) / min(work)


@pytest.mark.parametrize("weights, parts, cuts", [
    ([1] * 5, 2, [0, 2, 5]),                         # even weights: the nearer boundary, the first on a tie
    ([1] * 4, 3, [0, 1, 3, 4]),
    ([8] * 6 + [1], 2, [0, 3, 7]),                   # six blocks and an edge block
    ([100, 1, 1, 1], 2, [0, 1, 4]),                  # one heavy item: alone
    ([0, 0, 0], 3, [0, 1, 2, 3]),                    # no weight at all: every run still has an item
    ([1, 100], 2, [0, 1, 2]),
])
def test_weighted_starts_cut_nearest_each_share_and_leave_no_run_empty(weights, parts, cuts):
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    got = weighted_starts(prefix.__getitem__, len(weights), parts)
    assert got == cuts
    assert all(b > a for a, b in zip(got, got[1:]))


def test_imbalance_is_in_whole_percents_rounded_up():
    assert imbalance(50, 100, 2) == 100 and imbalance(50, 99, 2) == 102 and imbalance(7, 0, 3) == 2100


SHAPES = [(50000, 4096, 2), (40000, 5000, 2), (30000, 4096, 2), (50000, 4096, 3), (50000, 4096, 4),
          (100000, 4096, 8), (49152, 4096, 2), (20000, 3000, 6)]


@pytest.mark.parametrize("n, chunk, workers", SHAPES)
def test_shares_by_work_are_never_worse_than_by_count(n, chunk, workers):
    """The busiest worker's work with the plan's block sizes, against the same tasks shared by count alone."""
    plan = make_plan(n, n, n, "float32", (128, 128, 32), a_chunks=(chunk, chunk), b_chunks=(chunk, chunk),
                     target=8192, n_workers=workers)
    tasks = plan.tasks()
    by_work, by_count = assign(tasks, workers, plan), assign(tasks, workers)
    assert sorted(t for p in by_work for t in p) == sorted(tasks)      # every task once
    total = _work(plan, tasks)
    assert imbalance(max(_work(plan, p) for p in by_work), total, workers) \
        <= imbalance(max(_work(plan, p) for p in by_count), total, workers)


def test_an_edge_row_no_longer_unbalances_two_gpus():
    """50000² float32 on two workers in blocks of 8192 (its edge row 848): 1.35x by count, now within 5 %."""
    plan = make_plan(50000, 50000, 50000, "float32", (128, 128, 32), a_chunks=(4096, 4096),
                     b_chunks=(4096, 4096), target=8192, n_workers=2)
    assert [b - a for a, b in plan.rows] == [8192] * 6 + [848]
    assert _ratio(plan, assign(plan.tasks(), 2)) > 1.3
    assert _ratio(plan, assign(plan.tasks(), 2, plan)) < 1.05


@pytest.mark.parametrize("m, n, k, target", [(50000, 50000, 64, 8192), (7000, 1300, 64, 1024),
                                             (1000, 1000, 64, 256), (9000, 300, 64, 2048)])
@pytest.mark.parametrize("workers", [2, 3, 4, 6, 8])
def test_loads_sum_what_assign_places_with_edge_blocks(m, n, k, target, workers):
    plan = make_plan(m, n, k, "float64", (32, 32, 16), target=target, n_workers=workers)
    assert loads(plan, workers) == [_load(plan, part) for part in assign(plan.tasks(), workers, plan)]


@pytest.mark.parametrize("n, workers", [(49152, 2), (50000, 2), (50000, 3), (100000, 4)])
def test_a_grams_triangle_is_shared_by_work_too(n, workers):
    """X^T X computes the blocks i <= j only (dgemm.client.graph.mirrored): rows of very different work."""
    plan = make_plan(n, n, 4096, "float32", (128, 128, 32), a_chunks=(4096, 4096), b_chunks=(4096, 4096),
                     target=8192, n_workers=workers)
    tasks = [t for t in plan.tasks() if t[0] <= t[1]]
    total = _work(plan, tasks)
    by_work, by_count = assign(tasks, workers, plan), assign(tasks, workers)
    assert sorted(t for p in by_work for t in p) == sorted(tasks)
    assert imbalance(max(_work(plan, p) for p in by_work), total, workers) <= 105 \
        and imbalance(max(_work(plan, p) for p in by_work), total, workers) \
        <= imbalance(max(_work(plan, p) for p in by_count), total, workers)

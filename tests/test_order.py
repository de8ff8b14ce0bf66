"""dgemm.client.order: a worker's blocks as a growing rectangle where its panels fit its device cache."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dgemm.client import graph
from dgemm.client.order import grow, panel_bytes
from dgemm.client.plan import assign, make_plan
from dgemm.storage import Operand


def _panels_read(order):
    """How many distinct panels (A rows, B columns) the first t tasks of ``order`` read, for each t."""
    seen, out = set(), []
    for i, j, s in order:
        seen.update({("a", i, s), ("b", j, s)})
        out.append(len(seen))
    return out


@pytest.mark.parametrize("rows,cols", [(12, 12), (6, 12), (12, 5), (1, 7), (7, 1)])
def test_grow_spreads_the_reads(rows, cols):
    part = [(i, j, 0) for i in range(rows) for j in range(cols)]
    order = grow(part, panel_bytes=1, cache_bytes=2)
    assert sorted(order) == sorted(part)                    # the same tasks, each once
    read = _panels_read(order)
    r, c = rows, cols
    for t, n in enumerate(read, 1):
        # a growing rectangle of t blocks in proportion r:c has about sqrt(t r / c) rows and sqrt(t c / r) columns
        bound = math.ceil(math.sqrt(t * r / c)) + math.ceil(math.sqrt(t * c / r)) + 1
        assert n <= bound, (t, n, bound)


def test_row_order_would_front_load_the_reads():
    """The property above fails for the snake order it replaces: the first row reads every column panel."""
    part = [(i, j, 0) for i in range(12) for j in range(12)]
    read = _panels_read(part)
    assert read[11] == 13 > math.ceil(math.sqrt(12)) * 2 + 1


def test_grow_keeps_the_order_when_the_panels_do_not_fit_or_are_unknown():
    part = [(i, j, 0) for i in range(4) for j in (range(4) if i % 2 == 0 else range(3, -1, -1))]
    assert grow(part, panel_bytes=100, cache_bytes=99) == part
    assert grow(part, panel_bytes=100, cache_bytes=None) == part


def test_grow_keeps_a_staggered_start_and_the_k_segments_in_order():
    part = [(i, j, s) for i in (2, 3, 0, 1) for j in (1, 0) for s in (0, 1)]
    order = grow(part, panel_bytes=1, cache_bytes=1)
    assert order[0][:2] == (2, 1)
    for t in range(0, len(order), 2):
        assert order[t][:2] == order[t + 1][:2] and (order[t][2], order[t + 1][2]) == (0, 1)


def test_panel_bytes_counts_each_panel_once():
    plan = make_plan(300, 200, 100, "float64", (16, 16, 16), target=64)
    part = [t for t in plan.tasks() if t[0] < 2]
    rows = sum(plan.rows.total(i, i + 1) for i in range(2))
    assert panel_bytes(plan, part) == 8 * 100 * (rows + 200)


def _gemm_order(g):
    layer = g.layers[g.result_name]
    prio = layer.annotations["priority"]
    where = layer.annotations.get("workers")
    per = {}
    for key in layer:
        w = where(key)[0] if where else None
        per.setdefault(w, []).append((-prio(key), key[1], key[2]))
    return {w: [(i, j, 0) for _, i, j in sorted(v)] for w, v in per.items()}


def test_build_runs_each_workers_blocks_in_grow_order_when_they_fit():
    rng = np.random.default_rng()
    a, b = rng.standard_normal((96, 40)), rng.standard_normal((40, 80))
    plan = make_plan(96, 80, 40, "float64", (8, 8, 8), target=16)
    ops = Operand(a, "a"), Operand(b, "b")
    workers = ["tcp://w0", "tcp://w1"]
    big = graph.build(plan, *ops, None, alpha=1.0, beta=0.0, token="t1", workers=workers, cache_bytes=1 << 40)
    small = graph.build(plan, *ops, None, alpha=1.0, beta=0.0, token="t2", workers=workers, cache_bytes=1)
    snake = assign(plan.tasks(), 2, plan)
    got_big, got_small = _gemm_order(big), _gemm_order(small)
    for w, mine in zip(workers, snake):
        assert got_small[w] == mine
        assert got_big[w] == grow(mine, 1, 1) != mine

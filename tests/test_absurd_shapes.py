"""Metadata that claims an absurd shape (issue 26): refused at once, before any graph or output is built.

A Zarr array written with ``zarr.create_array`` and no data is metadata
only: it may claim 10**12 x 10**12 elements in a few chunks.  ``dgemm plan``
answers for it at once (its cuts are lazy), and so must a call: the lazy
result and ``out=`` refuse it with :class:`dgemm.PlanError` naming the block
count and the limit, in well under a second and without growing the
process's memory.  Each call runs in a child process that watches its own
memory, so that a regression fails the test quickly instead of filling this
machine's memory.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr

from dgemm.client.plan import MAX_BLOCK_PRODUCTS, check_graph_size, make_plan
from dgemm.errors import PlanError

HUGE = 10**12
RSS_LIMIT = 200e6     # bytes the child may grow by during the call
SECONDS = 5.0         # "at once", with room for a loaded test machine

CHILD = textwrap.dedent("""
    import json, os, sys, threading, time
    import psutil

    import dgemm

    args = json.loads(sys.argv[1])
    client = None
    if args["scheduler"]:
        from distributed import Client
        client = Client(args["scheduler"], set_as_default=False)
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]

    def watch():   # a regression would grow by gigabytes: stop it at the limit, and say so
        while True:
            rss = proc.memory_info().rss
            peak[0] = max(peak[0], rss)
            if rss - base > args["rss_limit"]:
                print(json.dumps({"killed": True, "grew": rss - base}), flush=True)
                os._exit(3)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    t0 = time.perf_counter()
    try:
        r = dgemm.matmul(args["a"], args["b"], out=args["out"], client=client)
        error = None
    except Exception as e:
        error = [type(e).__name__, str(e), isinstance(e, dgemm.PlanError)]
    seconds = time.perf_counter() - t0
    peak[0] = max(peak[0], proc.memory_info().rss)
    print(json.dumps({"killed": False, "seconds": seconds, "grew": peak[0] - base, "error": error}), flush=True)
    os._exit(0)   # no cluster teardown to wait for
""")


def run_child(a, b, out=None, scheduler=None) -> dict:
    args = {"a": a, "b": b, "out": out, "scheduler": scheduler, "rss_limit": RSS_LIMIT}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                          timeout=120, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    assert lines, f"the child printed no result (rc {proc.returncode}): {proc.stderr[-2000:]}"
    got = json.loads(lines[-1])
    assert not got["killed"], f"the call grew the process by more than {RSS_LIMIT / 1e6:.0f} MB (stopped there)"
    return got


@pytest.fixture
def absurd(tmp_path):
    """Two metadata-only float32 arrays of 10**12 x 10**12 elements in 4 x 4 chunks: no chunk written."""
    paths = []
    for name in ("a", "b"):
        path = str(tmp_path / f"{name}.zarr")
        zarr.create_array(path, shape=(HUGE, HUGE), chunks=(HUGE // 4, HUGE // 4), dtype="float32")
        paths.append(path)
    return paths


def assert_refused_at_once(got):
    assert got["error"] is not None, "the call accepted a 10**12 x 10**12 product"
    name, message, is_plan_error = got["error"]
    assert is_plan_error, f"{name}: {message}"
    assert "block products" in message and f"{MAX_BLOCK_PRODUCTS:,}" in message, message
    assert got["seconds"] < SECONDS, f"took {got['seconds']:.1f} s"
    assert got["grew"] < RSS_LIMIT


def test_an_absurd_lazy_product_is_refused_at_once(absurd):
    got = run_child(*absurd)
    assert_refused_at_once(got)


def test_an_absurd_product_into_out_is_refused_at_once_and_writes_nothing(absurd, tmp_path, client):
    out = str(tmp_path / "c.zarr")
    got = run_child(*absurd, out=out, scheduler=client.scheduler.address)
    assert_refused_at_once(got)
    assert not os.path.exists(out), "out was created for a product that was refused"


def test_the_limit_counts_block_products_and_names_the_fix():
    plan = make_plan(HUGE, HUGE, HUGE, np.float32, (1, 1, 1), target=4096)
    assert plan.rows.count == plan.cols.count == plan.ks.count == -(-HUGE // 4096)
    with pytest.raises(PlanError, match=r"1.455e\+25 block products.*more than the 10,000,000.*none fits"):
        check_graph_size(plan)
    big = make_plan(10**6, 10**6, 10**6, np.float32, (1, 1, 1), target=4096)   # 245**3 block products
    with pytest.raises(PlanError, match=r"14,706,125 block products.*block=\(5120, 5120, 5120\) would give"):
        check_graph_size(big)
    check_graph_size(make_plan(10**6, 10**6, 10**6, np.float32, (1, 1, 1), target=5120))   # the hint fits
    assert "dgemm.matmul refuses it" in plan.explain()          # dgemm plan says so too
    small = make_plan(4096 * 3, 4096 * 2, 4096 * 5, np.float32, (1, 1, 1), target=4096)
    check_graph_size(small)                                        # 30 block products
    with pytest.raises(PlanError, match="30 block products"):
        check_graph_size(small, limit=29)
    assert "refuses" not in small.explain()


def test_an_absurd_product_into_out_without_a_client_starts_no_cluster(absurd, tmp_path, monkeypatch):
    """No client and no current one: the refusal comes before a local cluster is started for it."""
    import dgemm
    import dgemm.client.steps

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was looked for (or started) before the absurd shape was refused")
    monkeypatch.setattr(dgemm.client.steps, "get_client", no_cluster)
    monkeypatch.setattr(dgemm.client.steps, "_current_client", lambda: None)
    out = str(tmp_path / "c.zarr")
    with pytest.raises(PlanError, match=r"block products .*more than the"):
        dgemm.matmul(*absurd, out=out)
    assert not os.path.exists(out)

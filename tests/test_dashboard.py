"""The dashboard's dgemm page, the ``dgemm_*`` Prometheus series and the Fine Performance Metrics.

The page is checked in a real browser: headless Chromium (Debian's
``chromium``, which ``.ci/run`` installs) loads ``/dgemm`` from the test
cluster's scheduler after a matmul, and the test reads the rendered DOM and
saves a screenshot to ``test-artifacts/``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

import dgemm
from _check import randn, wait_for
from dgemm import busy
from dgemm.scheduler.dashboard import DgemmDashboard, MatmulProgress
from dgemm.scheduler.page import render_page

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = ("no chromium on this host (Debian: apt-get install -y chromium; .ci/run installs it)")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHAPES = ((192, 160), (160, 224))     # with block 32: 6 x 7 = 42 GEMM tasks, 5 k-steps each
BLOCKS = 42


def http_get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def base_url(cluster) -> str:
    return cluster.dashboard_link.rsplit("/", 1)[0]


def page_data(cluster) -> dict | None:
    try:
        return json.loads(http_get(base_url(cluster) + "/dgemm/data.json"))
    except urllib.error.HTTPError as e:
        if e.code == 404:  # the page appears with the first dgemm worker plugin
            return None
        raise



@pytest.fixture(scope="module")
def run(cluster, client):
    """One matmul on the session cluster; returns the dashboard data once the heartbeats show it."""
    rng = np.random.default_rng(0)
    A, B = randn(rng, SHAPES[0], "float32"), randn(rng, SHAPES[1], "float32")
    before = page_data(cluster)
    blocks_before = sum(w["blocks"] for w in before["workers"]) if before else 0
    with tempfile.TemporaryDirectory() as d:
        out = dgemm.matmul(A, B, out=os.path.join(d, "c.zarr"), client=client, block=32)
        np.testing.assert_allclose(out[:], A @ B, rtol=1e-4, atol=1e-4)

    def reported():
        data = page_data(cluster)
        if data is None or not data["matmuls"] or data["matmuls"][0]["state"] != "done":
            return None
        alive = [w for w in data["workers"] if w["alive"]]
        if len(alive) < len(cluster.device_ids) or sum(w["blocks"] for w in alive) < blocks_before + BLOCKS:
            return None
        return data
    return wait_for(reported, what="the workers' heartbeats to report the matmul")


# -- the page's data -----------------------------------------------------------
def test_page_data_after_a_matmul(run, cluster):
    m = run["matmuls"][0]
    assert m["blocks_done"] == m["blocks_total"] == BLOCKS
    assert m["stores_done"] == m["stores_total"] > 0 and m["erred"] == 0
    workers = [w for w in run["workers"] if w["alive"]]
    assert {w["address"] for w in workers} == set(cluster.scheduler_info["workers"])
    for w in workers:
        assert w["ok"] and w["device"] and w["device_type"] in ("CPU", "GPU", "ACCELERATOR")
        assert w["blocks"] > 0 and w["flops"] > 0 and w["bytes_up"] > 0 and w["bytes_down"] > 0
        assert w["kernel_seconds"] > 0 and w["busy_seconds"] >= w["kernel_seconds"]
        # kernels, transfers (in the read threads, partly ahead of the product) and the wait for
        # inputs overlap: the wait is within the busy time, transfers are thread-seconds
        assert 0 <= w["read_wait_seconds"] <= w["busy_seconds"] and w["transfer_seconds"] > 0
        assert w["store_seconds"] > 0
        # the split of the busy time: exclusive parts that add up to it
        assert_parts_add_up(w)
        # the part is on the host clock (device events placed on it by calibration): within its error of the sum
        assert w[busy.KEYS["kernel"]] > 0 and w[busy.KEYS["kernel"]] <= w["kernel_seconds"] * 1.01 + 1e-3
        assert w["tflops_busy"] > 0 and w["tflops_kernel"] >= w["tflops_busy"]
        assert w["series"] and w["tflops_peak"] > 0
        assert max(s["tflops"] for s in w["series"]) == w["tflops_peak"]
    assert_parts_add_up(run["total"])
    assert run["total"]["busy_seconds"] == pytest.approx(sum(w["busy_seconds"] for w in run["workers"]))
    # the series holds the products of its time window (a loaded machine can push the first of
    # them out of it before the heartbeat that carries the last): never more than the totals
    total = sum(s["tflops"] for w in workers for s in w["series"]) * 1e12
    assert 0 < total <= sum(w["flops"] for w in workers) * (1 + 1e-6)


def test_page_link_and_fragment(run, cluster):
    base = base_url(cluster)
    assert '<div id="dgemm">' in http_get(base + "/dgemm")
    frag = http_get(base + "/dgemm/fragment")
    assert "<h2>Workers</h2>" in frag and "<html" not in frag
    pytest.importorskip("bokeh", reason="the Dask dashboard's own pages need Bokeh")
    status = http_get(base + "/status")
    assert 'href="dgemm"' in status  # the navigation bar links the page


def test_fine_performance_metrics_name_the_pipeline(run, client):
    """The GEMM tasks report kernel, transfer and read-wait seconds, bytes and flop to distributed."""
    def metrics():
        m = client.run_on_scheduler(lambda dask_scheduler: {
            k: v for k, v in dask_scheduler.cumulative_worker_metrics.items()
            if isinstance(k, tuple) and k[:2] == ("execute", "dgemm-gemm")})
        return m if m.get(("execute", "dgemm-gemm", "dgemm-kernel", "seconds")) else None
    m = wait_for(metrics, what="fine performance metrics of the GEMM tasks")
    for label, unit in (("dgemm-transfer", "seconds"), ("dgemm-upload", "bytes"),
                        ("dgemm-download", "bytes"), ("dgemm-flop", "flop")):
        assert m.get(("execute", "dgemm-gemm", label, unit), 0) > 0, (label, sorted(m))


def assert_parts_add_up(w: dict) -> None:
    """The exclusive parts of a worker's busy time (or of all workers') add up to it."""
    parts = {p: w[busy.KEYS[p]] for p in busy.PARTS}
    assert all(v >= -1e-9 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(w["busy_seconds"], rel=1e-9, abs=1e-9), (parts, w["busy_seconds"])


def test_progress_within_blocks_and_a_busy_split_that_adds_up(cluster, client, tmp_path):
    """While a block product runs, the page shows how far it is; afterwards each worker's parts add up.

    512 x 512 blocks of a 1024 x 1024 C over K = 32768: 64 k steps in each of the workers' block
    products, each step a GEMM of 512^3 (seconds in all on a CPU device, whose kernel does some 20
    GFLOPS on two cores), so the heartbeats report products in flight.
    """
    import threading

    import zarr

    rng = np.random.default_rng()
    A, B = randn(rng, (1024, 32768), "float32"), randn(rng, (32768, 1024), "float32")
    paths = []
    for name, x in (("a", A), ("b", B)):
        z = zarr.create_array(store=str(tmp_path / f"{name}.zarr"), shape=x.shape, chunks=(512, 512),
                              dtype=x.dtype)
        z[:] = x
        paths.append(str(tmp_path / f"{name}.zarr"))
    before = page_data(cluster)
    known = {m["id"] for m in before["matmuls"]} if before else set()
    result: dict = {}

    def work():
        try:
            result["out"] = dgemm.matmul(*paths, out=str(tmp_path / "c.zarr"), client=client, block=512)[:]
        except BaseException as e:   # re-raised below, in the test's thread
            result["error"] = e

    t = threading.Thread(target=work)
    t.start()
    in_block, finer = [], []
    while t.is_alive():
        data = page_data(cluster)
        for w in (data or {}).get("workers", ()):
            in_block += [p["fraction"] for p in w["in_flight"] if p["fraction"] is not None and 0 < p["fraction"] < 1]
        for m in (data or {}).get("matmuls", ()):
            if m["id"] not in known and m["state"] == "running" and m["blocks_total"]:
                if m["blocks_done"] / m["blocks_total"] < m["work_done"] < 1:
                    finer.append((m["blocks_done"], m["blocks_total"], m["work_done"]))
        time.sleep(0.1)
    t.join()
    if "error" in result:
        raise result["error"]
    np.testing.assert_allclose(result["out"], A @ B, rtol=1e-3, atol=1e-3)
    assert in_block, "no block product in flight was seen between 0 and 1 of its flops"
    assert finer, "the matmul's progress never moved within its blocks"

    def reported():
        data = page_data(cluster)
        ours = [m for m in data["matmuls"] if m["id"] not in known]
        return data if ours and ours[0]["state"] == "done" and not any(w["in_flight"] for w in data["workers"]) \
            else None
    data = wait_for(reported, what="the heartbeats after the matmul")
    assert [m for m in data["matmuls"] if m["id"] not in known][0]["work_done"] == 1.0
    for w in data["workers"]:
        if w["alive"]:
            assert_parts_add_up(w)
            assert w[busy.KEYS["kernel"]] > 0
    assert_parts_add_up(data["total"])


# -- in the browser --------------------------------------------------------------
class TableText(HTMLParser):
    """The text of each cell of each table, by table id."""

    def __init__(self):
        super().__init__()
        self.tables: dict = {}
        self._table = self._row = self._cell = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._table = self.tables.setdefault(dict(attrs).get("id"), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
            self._table.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(" ".join(" ".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def chromium(url: str, screenshot: Path, tmp_path: Path) -> str:
    """Load ``url`` in headless Chromium (5 s of page time: the page refreshes itself); return the DOM."""
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1500,1150",
           "--virtual-time-budget=5000", f"--screenshot={screenshot}", "--dump-dom", url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_dashboard_page_in_chromium(run, cluster, tmp_path):
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dgemm-dashboard.png"
    shot.unlink(missing_ok=True)
    dom = chromium(base_url(cluster) + "/dgemm", shot, tmp_path)
    (ARTIFACTS / "dgemm-dashboard.html").write_text(dom)

    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    # the page's script replaced the content with fresh fragments while Chromium ran it
    assert 'data-refreshed="' in dom and 'data-refreshed="0"' not in dom
    tables = TableText()
    tables.feed(dom)
    m_head, *m_rows = tables.tables["matmuls"]
    ours = next(r for r in m_rows if r[m_head.index("matmul")] == run["matmuls"][0]["id"])
    assert ours[m_head.index("state")] == "done"
    assert ours[m_head.index("blocks done / total")] == f"{BLOCKS} / {BLOCKS}"
    w_head, *w_rows = tables.tables["workers"]
    alive = {w["name"]: w for w in run["workers"] if w["alive"]}
    shown = {r[0].split()[0]: dict(zip(w_head, r)) for r in w_rows}
    assert set(alive) <= set(shown)
    for name, w in alive.items():
        row = shown[name]
        assert w["device"] in row["device"]
        assert int(row["blocks"]) >= w["blocks"] > 0
        for col in ("FLOP", "uploaded", "downloaded", "busy", "kernel running", "while busy", "kernel only",
                    "peak"):
            assert float(row[col].split()[0]) > 0, (col, row[col])
    assert "all workers" in {r[0] for r in w_rows}
    # the overlapping totals are in a table of their own, not among the parts of the busy time
    o_head, *o_rows = tables.tables["overlapped"]
    assert "transfers (overlapped)" in o_head and "transfers (overlapped)" not in w_head
    assert {r[0] for r in o_rows} >= set(alive)
    # a line per worker in the TFLOPS chart
    assert dom.count('class="line"') >= 2 * len(alive) and "no samples yet" not in dom


# -- Prometheus ---------------------------------------------------------------------
def dgemm_samples(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("dgemm_"):
                out.setdefault(s.name, {})[s.labels.get("worker", s.labels.get("matmul"))] = (s.labels, s.value)
    return out


COUNTERS = ("dgemm_flops_total", "dgemm_kernel_seconds_total", "dgemm_busy_seconds_total",
            "dgemm_uploaded_bytes_total", "dgemm_downloaded_bytes_total", "dgemm_blocks_total")


def test_prometheus_metrics(run, cluster, client):
    pytest.importorskip("prometheus_client", reason="distributed serves /metrics through prometheus_client")
    # the scheduler: every worker, as its heartbeats reported
    sched = dgemm_samples(http_get(base_url(cluster) + "/metrics"))
    workers = set(cluster.scheduler_info["workers"])
    for name in COUNTERS + ("dgemm_store_seconds_total", "dgemm_transfer_seconds_total"):
        assert workers <= set(sched[name]), name
        assert all(sched[name][w][1] > 0 for w in workers), name
    for w in workers:
        labels, ok = sched["dgemm_device_info"][w]
        assert ok == 1 and labels["device"] and labels["type"] and labels["device_id"]
    assert sched["dgemm_matmul_blocks"][run["matmuls"][0]["id"]][1] == BLOCKS
    assert sched["dgemm_matmul_progress"][run["matmuls"][0]["id"]][1] == 1.0
    assert "dgemm_tflops" in sched
    # the parts of the busy time, one sample per part: they add up to the busy seconds
    parts = http_get(base_url(cluster) + "/metrics")
    from prometheus_client.parser import text_string_to_metric_families
    by_worker: dict = {}
    for fam in text_string_to_metric_families(parts):
        for s in fam.samples:
            if s.name == "dgemm_busy_part_seconds_total":
                by_worker.setdefault(s.labels["worker"], {})[s.labels["part"]] = s.value
    for w in workers:
        assert set(by_worker[w]) == set(busy.PARTS)
        assert sum(by_worker[w].values()) == pytest.approx(sched["dgemm_busy_seconds_total"][w][1], rel=1e-6)
    # each worker: its own figures
    ports = client.run(lambda dask_worker: dask_worker.http_server.port)
    for addr, port in ports.items():
        own = dgemm_samples(http_get(f"http://127.0.0.1:{port}/metrics"))
        for name in COUNTERS:
            assert set(own[name]) == {addr}, name
            assert own[name][addr][1] >= sched[name][addr][1] > 0, name


# -- the plugin's bookkeeping, without a cluster ------------------------------------
def test_matmul_progress_states():
    d = DgemmDashboard()
    gemm = [("dgemm-gemm-aaaaaaaaaaa1", i, 0) for i in range(3)]
    stores = [("dgemm-store-aaaaaaaaaaa1", i, 0) for i in range(3)]
    d.update_graph(None, tasks=[*gemm, *stores, "dgemm-done-aaaaaaaaaaa1", ("sum-other", 0)], client="c1")
    [m] = d.matmuls()
    assert (m["state"], m["blocks_done"], m["blocks_total"], m["stores_total"]) == ("running", 0, 3, 3)
    for k in [*gemm, *stores]:
        d.transition(k, "waiting", "processing")
        d.transition(k, "processing", "memory")
    d.transition(gemm[0], "processing", "memory")      # counted once
    assert d.matmuls()[0]["blocks_done"] == 3 and d.matmuls()[0]["state"] == "running"
    d.transition("dgemm-done-aaaaaaaaaaa1", "processing", "memory")
    m = d.matmuls()[0]
    assert m["state"] == "done" and m["finished"] is not None

    d.update_graph(None, tasks=[("dgemm-gemm-bbbbbbbbbbb2", 0, 0)], client="c1")
    d.transition(("dgemm-gemm-bbbbbbbbbbb2", 0, 0), "processing", "erred")
    d.update_graph(None, tasks=[("dgemm-gemm-ccccccccccc3", 0, 0)], client="c1")
    d.transition(("dgemm-gemm-ccccccccccc3", 0, 0), "released", "forgotten")
    states = {m["id"]: m["state"] for m in d.matmuls()}
    assert states == {"aaaaaaaaaaa1": "done", "bbbbbbbbbbb2": "erred", "ccccccccccc3": "cancelled"}


def test_finished_matmuls_are_trimmed():
    d = DgemmDashboard(keep=2)
    for i in range(5):
        key = (f"dgemm-gemm-{i:012d}", 0, 0)
        d.update_graph(None, tasks=[key])
        d.transition(key, "processing", "memory")
    assert [m["id"] for m in d.matmuls()] == [f"{i:012d}" for i in (4, 3, 2)]  # the newest may still run


def test_render_escapes_and_handles_no_data():
    page = render_page({"time": 1e9, "scheduler": "tcp://x:1", "workers": [], "matmuls": []})
    assert "No matmul yet" in page and "No worker has reported" in page and "no samples yet" in page
    w = {"address": "tcp://a:1", "name": "<script>x</script>", "alive": False, "ok": False, "error": "E<1>",
         "device": None, "device_type": None, "device_id": None, "blocks": 0, "flops": 0.0, "bytes_up": 0,
         "bytes_down": 0, "tflops_now": 0.0, "tflops_peak": 0.0, "tflops_busy": 0.0, "tflops_kernel": 0.0,
         "series": []}
    page = render_page({"time": 1e9, "scheduler": "tcp://x:1", "workers": [w], "matmuls": []})
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "no device: E&lt;1&gt;" in page and "(gone)" in page


def test_plugin_pickles_without_its_state():
    import pickle
    d = DgemmDashboard(interval=2.0)
    d._matmuls["x"] = MatmulProgress("x", None, 0.0)
    d2 = pickle.loads(pickle.dumps(d))
    assert d2.interval == 2.0 and d2._matmuls == {} and d2.scheduler is None


def test_collector_asks_its_sources(monkeypatch):
    """Worker sources, unless a scheduler source (a running dashboard) answers for every worker."""
    pytest.importorskip("prometheus_client")
    from dgemm import metrics

    monkeypatch.setattr(metrics, "_worker_sources", [])
    monkeypatch.setattr(metrics, "_scheduler_sources", [])

    def families():
        return {f.name: {s.labels.get("worker") or (s.labels["matmul"], s.labels["state"]): s.value
                         for s in f.samples} for f in metrics.DgemmCollector().collect()}

    snap = {"device": "dev", "device_id": "0:0", "device_type": "CPU", "driver": "1", "ok": True,
            "flops": 5.0, "blocks": 2}
    assert metrics.add_worker_source(lambda: [("tcp://w:1", "w1", snap)])
    f = families()
    assert f["dgemm_flops"] == {"tcp://w:1": 5.0} and f["dgemm_blocks"] == {"tcp://w:1": 2.0}
    assert "dgemm_tflops" not in f and "dgemm_matmul_blocks" not in f
    metrics.add_scheduler_source(lambda: None)        # no dashboard running here: the workers' own figures
    assert families()["dgemm_flops"] == {"tcp://w:1": 5.0}
    seen = ([("tcp://w:2", "w2", {**snap, "flops": 7.0}, 2.5)], [{"id": "t", "blocks_done": 1, "blocks_total": 4}])
    metrics.add_scheduler_source(lambda: seen)
    f = families()
    assert f["dgemm_flops"] == {"tcp://w:2": 7.0} and f["dgemm_tflops"] == {"tcp://w:2": 2.5}
    assert f["dgemm_matmul_blocks"] == {("t", "done"): 1.0, ("t", "total"): 4.0}

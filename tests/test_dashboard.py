"""The dashboard's dgemm pages, the ``dgemm_*`` Prometheus series and the Fine Performance Metrics.

The Bokeh pages (``/dgemm`` and the ``/individual-dgemm-*`` plots) are read
as a browser gets them: their documents are pulled from the test cluster's
dashboard over its websocket (``bokeh.client.pull_session``), after a real
matmul, and their figures compared with ``/dgemm/data.json`` and
``dask.utils.format_bytes``.  Headless Chromium (Debian's ``chromium``, which
``.ci/run`` installs) loads ``/dgemm`` and saves its screenshot; with
``DGEMM_UPDATE_SCREENSHOT=1`` also as the one the README shows, ``docs/dgemm-dashboard.png``.
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
from pathlib import Path

import numpy as np
import pytest
from _check import randn, wait_for

import dgemm
from dgemm import busy
from dgemm.scheduler import plots
from dgemm.scheduler.dashboard import DgemmDashboard, MatmulProgress

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOT = ROOT / "docs" / "dgemm-dashboard.png"     # the README shows it
# The dashboard's dgemm pages, as JupyterLab's Dask extension finds them in /individual-plots.json.
INDIVIDUAL = ("/individual-dgemm-progress", "/individual-dgemm-rates", "/individual-dgemm-transfers",
              "/individual-dgemm-time-split", "/individual-dgemm-workers", "/individual-dgemm-overlapped")
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


def test_pages_are_listed_for_jupyterlab(run, cluster):
    """``/individual-plots.json`` (where dask-labextension finds its panels) lists every dgemm page; each is served."""
    base = base_url(cluster)
    listed = set(json.loads(http_get(base + "/individual-plots.json")).values())
    assert set(INDIVIDUAL) <= listed, sorted(set(INDIVIDUAL) - listed)
    for route in (*INDIVIDUAL, "/dgemm"):
        html = http_get(base + route)
        assert "static/js/bokeh" in html and "<title>Dask" in html, route   # a Bokeh document of the dashboard's
    status = http_get(base + "/status")
    assert 'href="dgemm"' in status and "individual-dgemm-rates" in status  # navigation bar and "More..." menu


def pull(cluster, route: str):
    """The Bokeh document of a dashboard page, as its browser gets it (over the page's websocket)."""
    from bokeh.client import pull_session
    with pull_session(url=base_url(cluster) + route) as session:
        return session.document


def sources(doc) -> list:
    from bokeh.models import ColumnDataSource
    return [dict(s.data) for s in doc.select({"type": ColumnDataSource})]


def source_with(doc, *columns) -> dict:
    found = [d for d in sources(doc) if all(c in d for c in columns)]
    assert len(found) == 1, (columns, [sorted(d) for d in sources(doc)])
    return found[0]


PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_rate(text: str, unit: str = "FLOPS") -> tuple[float, float, str]:
    """``(mantissa, value, unit)`` of "8.33 GFLOPS"."""
    number, u = text.split()
    assert u.endswith(unit), text
    return float(number), float(number) * PREFIX[u[:-len(unit)]], u


def test_pages_show_the_figures(run, cluster):
    """The plots of /dgemm: a readable matmul name, rates in units that suit them, format_bytes, hover tooltips."""
    from bokeh.models import ColumnDataSource, HBar, HoverTool, MultiLine, Plot
    from dask.utils import format_bytes
    doc = pull(cluster, "/dgemm")
    data = page_data(cluster)
    workers = [w for w in data["workers"] if w["alive"]]

    # the matmul, by its output's name and a short token
    m = source_with(doc, "name", "output", "blocks")
    token = run["matmuls"][0]["id"]
    row = m["name"].index(f"c.zarr {token[:6]}")
    assert m["output"][row].rstrip("/").endswith("/c.zarr") and m["state"][row] == "done"
    assert m["blocks"][row] == f"{BLOCKS} / {BLOCKS}" and m["done"][row] == 1.0

    # the workers' table: format_bytes for bytes, each rate in the unit that suits its size
    t = source_with(doc, "uploaded", "rate_kernel")
    for w in workers:
        r = t["address"].index(w["address"])
        assert t["uploaded"][r] == format_bytes(w["bytes_up"]) and t["downloaded"][r] == format_bytes(w["bytes_down"])
        for col, raw in (("rate_busy", w["flops_busy"]), ("rate_kernel", w["flops_kernel"])):
            mantissa, value, _ = parse_rate(t[col][r])
            assert 1 <= mantissa < 1000 and value == pytest.approx(raw, rel=5e-3), (col, t[col][r], raw)
            assert raw < 1e12 or w["device_type"] != "CPU"     # a CPU device never reads in TFLOPS
        if w["device_type"] == "CPU" and w["flops_kernel"] >= 1e9:
            assert t["rate_kernel"][r].endswith(" GFLOPS"), t["rate_kernel"][r]

    # the rate over time: its axis in the unit of the fastest second, hover text per second
    [rates] = [f for f in doc.select({"type": Plot}) if "achieved rate" in f.title.text]
    dots = next(s.data for s in doc.select({"type": ColumnDataSource})
                if "value" in s.data and any(v.endswith("FLOPS") for v in s.data["value"]))
    peak = max(dots["y"])
    assert 1 <= peak < 1000, (peak, rates.yaxis[0].axis_label)
    top = dots["value"][dots["y"].index(peak)]
    assert top.endswith(" " + rates.yaxis[0].axis_label), (top, rates.yaxis[0].axis_label)
    assert any(isinstance(tool, HoverTool) and "@value" in str(tool.tooltips) for tool in rates.tools)

    # transfers per second, as format_bytes writes them
    moved = {(w["name"], s["t"] * 1000): s["bytes"] for w in workers for s in w["series"]}
    tdots = next(s.data for s in doc.select({"type": ColumnDataSource})
                 if "value" in s.data and any(v.endswith("B/s") for v in s.data["value"]))
    checked = 0
    for name, when, text in zip(tdots["worker"], tdots["time"], tdots["value"]):
        if (name, when) in moved:
            assert text == format_bytes(int(moved[name, when])) + "/s", (text, moved[name, when])
            checked += moved[name, when] > 0
    assert checked, "no second with bytes moved in the transfers plot"

    # the time split: parts that add up to each worker's busy seconds; colours unlike the workers'
    split = source_with(doc, "worker", "busy", *(p for p in busy.PARTS))
    for w in workers:
        r = split["worker"].index(w["name"])
        assert sum(split[p][r] for p in busy.PARTS) == pytest.approx(w["busy_seconds"], rel=1e-6)
    split_colours = {c for c in map(colour_value, (g.fill_color for g in doc.select({"type": HBar})))
                     if isinstance(c, str) and c.startswith("#")}
    assert doc.select({"type": MultiLine})
    line_colours = {c for d in sources(doc) if "xs" in d for c in d["colour"]}
    assert len(split_colours) >= len(busy.PARTS) and len(line_colours) == len(workers)
    assert not split_colours & line_colours, (split_colours, line_colours)


def colour_value(spec):
    """A glyph's colour as set (a string, or the value of a deserialized ``value(...)`` spec)."""
    if isinstance(spec, dict):
        return spec.get("value")
    return getattr(spec, "value", spec)


def test_individual_pages_have_one_plot_each(run, cluster):
    for route in INDIVIDUAL:
        doc = pull(cluster, route)
        assert len(doc.roots) == 1 and doc.title.startswith("Dask: "), route
        assert any(d and any(len(v) for v in d.values()) for d in sources(doc)), route   # figures, not empty


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
async def _devtools_screenshot(ws_url: str, url: str, shot: Path, width: int, height: int, timeout: float) -> int:
    """Drive one Chromium tab over the DevTools protocol: open ``url``, wait for Bokeh's views, save a screenshot.

    Returns how many Bokeh views the page made.  (``chromium --screenshot`` takes its picture before
    Bokeh's document arrives over the websocket, so the test waits for the views itself.)
    """
    import asyncio
    import base64

    from tornado.websocket import websocket_connect
    ws = await websocket_connect(ws_url, max_message_size=256 * 2 ** 20)
    n = 0

    async def call(method, **params):
        nonlocal n
        n += 1
        ws.write_message(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            msg = json.loads(await ws.read_message())
            if msg.get("id") == n:
                assert "error" not in msg, (method, msg["error"])
                return msg["result"]
    try:
        await call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                   mobile=False)
        await call("Page.navigate", url=url)
        probe = "(() => window.Bokeh && window.Bokeh.index ? Object.keys(window.Bokeh.index).length : 0)()"
        end, views = time.monotonic() + timeout, 0
        while not views and time.monotonic() < end:
            await asyncio.sleep(0.25)
            views = (await call("Runtime.evaluate", expression=probe, returnByValue=True))["result"].get("value")
        assert views, f"Bokeh drew nothing on {url} in {timeout} s"
        await asyncio.sleep(3)    # the plots' first draw, and a periodic update
        shot.write_bytes(base64.b64decode((await call("Page.captureScreenshot", format="png"))["data"]))
        return views
    finally:
        ws.close()


def chromium_screenshot(url: str, shot: Path, tmp_path: Path, width: int = 1500, height: int = 1300) -> int:
    """Open ``url`` in headless Chromium and save a screenshot once Bokeh has drawn it (see above)."""
    import asyncio
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    proc = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        wait_for(lambda: port_file.exists() and len(port_file.read_text().splitlines()) >= 2 or proc.poll(),
                 what="Chromium's DevTools port")
        assert proc.poll() is None, f"chromium exited with {proc.returncode}"
        port = port_file.read_text().splitlines()[0]
        tabs = json.loads(http_get(f"http://127.0.0.1:{port}/json/list"))
        tab = next(t for t in tabs if t["type"] == "page")
        return asyncio.run(_devtools_screenshot(tab["webSocketDebuggerUrl"], url, shot, width, height, 60))
    finally:
        proc.terminate()
        proc.wait(30)


def pixels_near(png: Path, colour: str, tol: int = 12) -> int:
    """How many pixels of the screenshot are within ``tol`` of ``colour`` on each channel."""
    from PIL import Image
    want = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    img = Image.open(png).convert("RGB")
    return sum(n for n, px in img.getcolors(img.width * img.height)
               if all(abs(a - b) <= tol for a, b in zip(px, want)))


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_dashboard_page_in_chromium(run, cluster, tmp_path):
    """/dgemm in a browser: the plots are drawn (their colours are on the screenshot the README shows)."""
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dgemm-dashboard.png"
    shot.unlink(missing_ok=True)
    assert chromium_screenshot(base_url(cluster) + "/dgemm", shot, tmp_path)   # Bokeh made its root views
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    if os.environ.get("DGEMM_UPDATE_SCREENSHOT"):   # the README's copy, renewed on purpose only (it is tracked)
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
    pytest.importorskip("PIL", reason="Pillow reads the screenshot's pixels")
    # each worker's lines are drawn (their colours are nowhere else on the page)
    for i in range(len(cluster.device_ids)):
        assert pixels_near(shot, plots.worker_colour(i)) > 50, f"worker {i}'s lines"


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


def fake_worker(name: str, device_type: str, rate: float, nbytes: int) -> dict:
    parts = {busy.KEYS[p]: v for p, v in zip(busy.PARTS, (3.0, 0.5, 0.25, 0.25))}
    return {"address": f"tcp://{name}:1", "name": name, "alive": True, "ok": True, "device": "dev",
            "device_type": device_type, "device_id": "0:0", "blocks": 4, "gemm_running": 0, "in_flight": [],
            "flops": rate * 4, "bytes_up": nbytes, "bytes_down": nbytes // 2, "busy_seconds": 4.0, **parts,
            "kernel_seconds": 3.5, **{f"flops_{k}": rate for k in ("now", "peak", "busy", "kernel")},
            "series": [{"t": 1e9 + i, "flops": rate * (i + 1) / 3, "bytes": nbytes / 3} for i in range(3)]}


def test_plots_scale_their_units_and_keep_colours_apart():
    """Without a cluster: 8.33 GFLOPS on a CPU, TFLOPS on a GPU, format_bytes for bytes, no shared colours."""
    from bokeh.core.validation import check_integrity
    from dask.utils import format_bytes

    from dgemm.scheduler.page import Everything
    cpu, gpu = fake_worker("cpu", "CPU", 8.33e9, 123_456_789), fake_worker("gpu", "GPU", 45.1e12, 7 * 2 ** 30)
    data = {"time": 1e9 + 3, "scheduler": "tcp://s:1", "workers": [cpu, gpu],
            "total": {k: cpu.get(k, 0) + gpu.get(k, 0) for k in ("blocks", "flops", "bytes_up", "bytes_down",
                                                                   "busy_seconds", *busy.KEYS.values())},
            "matmuls": [{"id": "e7c510083e35aa", "name": "c.zarr e7c510", "output": "s3://b/c.zarr",
                         "state": "running", "started": 1e9, "seconds": 2.0, "blocks_done": 1, "blocks_total": 4,
                         "blocks_running": 1, "work_done": 0.375, "stores_done": 1, "stores_total": 4}]}
    page = Everything(None)
    for p in page.parts:
        p.show(data)
    table = page.parts[3].source.data
    assert table["rate_kernel"][:2] == ["8.33 GFLOPS", "45.1 TFLOPS"]
    assert table["uploaded"][:2] == [format_bytes(123_456_789), format_bytes(7 * 2 ** 30)]
    assert page.parts[1].source.data["label"] == ["c.zarr e7c510: 37 % (running)"]
    rates = page.parts[5]
    assert rates.root.yaxis[0].axis_label == "TFLOPS" and max(rates.source.data["y"]) == pytest.approx(45.1)
    alone = plots.Rates(None)
    alone.show({**data, "workers": [cpu]})
    assert alone.root.yaxis[0].axis_label == "GFLOPS" and max(alone.source.data["y"]) == pytest.approx(8.33)
    assert set(plots.SPLIT_COLOURS.values()).isdisjoint(plots.worker_colour(i) for i in range(12))
    issues = check_integrity(list(page.root.references()))
    assert not issues.error and not issues.warning, issues
    # no data: the page shows its empty plots
    for p in Everything(None).parts:
        p.show({"time": 1e9, "scheduler": None, "workers": [], "matmuls": [], "total": {}})


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


def test_without_the_bokeh_dashboard_the_figures_stay_served():
    """A scheduler started with ``dashboard=False``: /dgemm says where the figures are, data.json has them."""
    import asyncio

    from distributed import Scheduler
    from tornado.httpclient import AsyncHTTPClient

    from dgemm.names import DASHBOARD_PLUGIN

    async def main():
        async with Scheduler(dashboard=False, dashboard_address="127.0.0.1:0", port=0) as s:
            plugin = DgemmDashboard()
            s.add_plugin(plugin, name=DASHBOARD_PLUGIN)   # as register_scheduler_plugin does: add, then start
            await plugin.start(s)
            base = f"http://127.0.0.1:{s.http_server.port}"
            http = AsyncHTTPClient()
            page = (await http.fetch(base + "/dgemm")).body.decode()
            data = json.loads((await http.fetch(base + "/dgemm/data.json")).body)
            plots_listed = (await http.fetch(base + "/individual-plots.json", raise_error=False)).body.decode()
            return page, data, plots_listed
    page, data, listed = asyncio.run(main())
    assert "without the Bokeh dashboard" in page and "dgemm/data.json" in page
    assert data["workers"] == [] and data["matmuls"] == []
    assert "individual-dgemm" not in listed

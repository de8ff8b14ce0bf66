"""Worker side: the device state, the plugin, describing a worker."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

import dgemm
from _check import randn
from dgemm import busy, names, worker as worker_mod
from dgemm.opencl.device import DeviceError
from dgemm.worker import DeviceState, DgemmPlugin, build_kernels, describe_worker, device_state
from dgemm.worker import state as state_mod


@pytest.fixture(scope="module")
def cpu_state(any_device):
    state = DeviceState(any_device.info.id)
    assert state.device is not None, state.error
    yield state
    state.close()


def test_state_opens_the_named_device(cpu_state, any_device):
    assert cpu_state.error is None
    assert cpu_state.device.info == any_device.info


def test_engines_cached_per_dtype(cpu_state):
    e32 = cpu_state.engine("float32")
    assert cpu_state.engine(np.float32) is e32 and e32.dtype == np.float32
    if cpu_state.device.info.fp64:
        assert cpu_state.engine("f8") is not e32


def test_describe(cpu_state, rng):
    d = cpu_state.describe()
    assert d["ok"] is True and d["device"] == cpu_state.device.info
    for dt in ("float32", "float64") if cpu_state.device.info.fp64 else ("float32",):
        p = dgemm.opencl.params.KernelParams.from_dict(d["params"][dt]["params"])
        assert p == cpu_state.device.choice(dt).params
        assert "database" in d["params"][dt]["source"]
    e = cpu_state.engine("float32")
    e.product([(randn(rng, (8, 4), "f4"), randn(rng, (4, 6), "f4"))], 8, 6)
    stats = cpu_state.describe()["stats"]["float32"]
    assert stats["blocks"] >= 1 and stats["flops"] >= 2 * 8 * 6 * 4


def test_state_without_a_device():
    state = DeviceState("nonexistent-device")
    assert state.device is None
    assert "LookupError" in state.error and "nonexistent-device" in state.error
    assert state.describe() == {"ok": False, "error": state.error}
    with pytest.raises(DeviceError, match="this worker has no usable OpenCL device.*nonexistent-device"):
        state.engine("float32")
    state.close()


def test_process_wide_state_outside_a_worker(any_device, monkeypatch):
    monkeypatch.setattr(state_mod, "_process_state", None)
    s1 = device_state()
    assert s1 is device_state()
    assert s1.device is not None, s1.error
    s1.close()


def test_describe_worker_without_plugin():
    assert describe_worker(None) is None

    class W:
        plugins = {}

    assert describe_worker(W()) is None


class FakeWorker:
    def __init__(self, gpu=None):
        self.resources_set = []
        self.plugins = {}
        self.state = type("S", (), {"total_resources": {} if gpu is None else {"GPU": gpu}})()

    async def set_resources(self, **r):
        self.resources_set.append(r)
        self.state.total_resources.update(r)


def test_plugin_gives_a_working_device_the_gpu_resource(any_device):
    w = FakeWorker()
    plugin = DgemmPlugin(any_device.info.id)
    asyncio.run(plugin.setup(w))
    try:
        assert w.resources_set == [{"GPU": 1}]
        w.plugins[plugin.name] = plugin
        d = describe_worker(w)
        assert d["ok"] and d["resources"] == {"GPU": 1}
    finally:
        plugin.teardown(w)
    assert plugin.state._engines == {}


def test_plugin_sets_the_switch_interval_setting_in_its_process(any_device):
    import sys

    import dask

    before = sys.getswitchinterval()
    w = FakeWorker()
    plugin = DgemmPlugin(any_device.info.id)
    try:
        with dask.config.set({"dgemm.switch-interval": "0.7ms"}):
            asyncio.run(plugin.setup(w))
        assert sys.getswitchinterval() == pytest.approx(0.0007)
        plugin.teardown(w)
        sys.setswitchinterval(before)
        plugin = DgemmPlugin(any_device.info.id)
        asyncio.run(plugin.setup(w))    # unset: Python's own, as it was
        assert sys.getswitchinterval() == pytest.approx(before)
    finally:
        plugin.teardown(w)
        sys.setswitchinterval(before)


def test_plugin_takes_back_a_declared_gpu_without_a_device():
    w = FakeWorker(gpu=1)
    plugin = DgemmPlugin("nonexistent-device")
    asyncio.run(plugin.setup(w))
    assert w.resources_set == [{"GPU": 0}]
    w.plugins[plugin.name] = plugin
    assert describe_worker(w)["ok"] is False
    w2 = FakeWorker()                                # nothing declared: nothing to take back
    asyncio.run(DgemmPlugin("nonexistent-device").setup(w2))
    assert w2.resources_set == []


def test_cluster_workers_describe_their_devices(client, rng):
    import dask.array as da

    def blocks_done(infos):   # the session's cluster ran other tests' products before: count this test's only
        return sum(d["stats"].get("float32", {}).get("blocks", 0) for d in infos.values())

    A, B = randn(rng, (64, 32), "float32"), randn(rng, (32, 48), "float32")
    before = blocks_done(client.run(describe_worker))
    # dask operands: a lazy product, which the workers compute (numpy ones this small stay in this process)
    lazy = dgemm.matmul(da.from_array(A, chunks=32), da.from_array(B, chunks=32), client=client, block=32)
    gemm_tasks = sum(len(layer) for name, layer in lazy.dask.layers.items() if name.startswith("dgemm-gemm-"))
    np.testing.assert_allclose(client.compute(lazy).result(), A @ B, rtol=1e-4, atol=1e-4)
    infos = client.run(describe_worker)
    assert len(infos) == 2
    for d in infos.values():
        assert d["ok"] and d["resources"].get("GPU") == 1
        assert isinstance(d["device"], dgemm.opencl.discovery.DeviceInfo)
    # one block product per GEMM task, each counted once by the device that ran it (4 on 32-wide tiles)
    assert gemm_tasks >= 1 and blocks_done(infos) - before == gemm_tasks
    # tasks found the plugin's state, not a process-wide fallback
    fallback = client.run(lambda: state_mod._process_state is None)
    assert all(fallback.values())


# -- metering and reporting ------------------------------------------------------
def test_metered_engine_splits_busy_time_and_records_products(cpu_state, rng):
    e = cpu_state.engine("float32")
    assert isinstance(e, state_mod.MeteredEngine)
    before = cpu_state.totals()
    n_events = len(cpu_state.events)
    a, b = randn(rng, (40, 24), "f4"), randn(rng, (24, 36), "f4")

    def slow_pairs():  # a store that makes the idle device wait for the first pair, and then for the second
        import time
        time.sleep(0.05)
        yield a[:, :12], b[:12]
        time.sleep(0.05)
        yield a[:, 12:], b[12:]

    out = e.product(slow_pairs(), 40, 36)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    after = cpu_state.totals()
    d = {k: after[k] - before[k] for k in after}
    assert d["blocks"] == 1 and d["flops"] == 2 * 40 * 36 * 24
    # waiting, uploading and the kernels overlap: each overlapping total is within the busy time
    assert 0.1 <= d["read_wait_seconds"] <= d["busy_seconds"]
    assert 0 < d["kernel_seconds"] <= d["busy_seconds"] and 0 < d["transfer_seconds"] <= d["busy_seconds"]
    assert d["transfer_seconds"] == pytest.approx(d["upload_seconds"] + d["download_seconds"])
    # the exclusive parts add up to the busy time; the wait before the first pair had nothing on the
    # device to hide it (no kernel, no upload yet), so at least that much of it is "waiting for reads"
    parts = {p: d[busy.KEYS[p]] for p in busy.PARTS}
    assert all(v >= 0 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(d["busy_seconds"], rel=1e-9, abs=1e-12)
    assert parts["read"] >= 0.045 and 0 < parts["kernel"] <= d["kernel_seconds"] + 1e-6
    assert len(cpu_state.events) == n_events + 1
    seq, start, end, flops, nbytes, key = cpu_state.events[-1]
    assert end >= start + 0.1 and flops == d["flops"] and nbytes == d["bytes_up"] + d["bytes_down"] > 0
    assert key is None        # not run by a Dask task
    assert cpu_state.in_flight() == []


def test_products_at_once_each_record_their_own_flops(cpu_state, rng):
    """Two threads run products on one engine (the next one enters as the last one's result comes down, or
    tasks that lost their GPU annotation): each recorded product carries its own flops, and they add up to
    the engine's total (the dashboard's series never exceeds it)."""
    import concurrent.futures

    e = cpu_state.engine("float64")
    seen, flops0 = len(cpu_state.events), e.stats.flops
    shapes = [(24 + i, 16 + 2 * i, 8 + 3 * i) for i in range(16)]
    pairs = [(randn(rng, (m, k), "float64"), randn(rng, (k, n), "float64")) for m, n, k in shapes]

    def one(i):
        (m, n, _), pair = shapes[i], pairs[i]
        e.product([pair], m, n)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(one, range(len(shapes))))
    events = list(cpu_state.events)[seen:]
    assert sorted(ev[3] for ev in events) == sorted(2.0 * m * n * k for m, n, k in shapes)
    assert sum(ev[3] for ev in events) == e.stats.flops - flops0


def test_a_failed_products_kernels_are_counted_nowhere(cpu_state, rng):
    """A product that fails after some of its GEMM kernels ran adds its busy time but neither kernel seconds
    nor a kernel part: the busy split's kernel part never exceeds the kernel seconds (a dashboard test saw
    it do so after a corrupt chunk had failed products on the same workers)."""
    e = cpu_state.engine("float32")
    m, n, k = 24, 20, 16
    a = [randn(rng, (m, k), "f4") for _ in range(3)]
    b = [randn(rng, (k, n), "f4") for _ in range(3)]

    def pairs():     # two k steps run on the device, then the store fails
        yield a[0], b[0]
        yield a[1], b[1]
        raise OSError("the third block could not be read")

    before = cpu_state.totals()      # (totals() splits the products finished so far first)
    with pytest.raises(OSError, match="third block"):
        e.product(pairs(), m, n)
    after = cpu_state.totals()
    d = {key: after[key] - before[key] for key in after}
    assert d["busy_seconds"] > 0 and d["kernel_seconds"] == 0 and d["blocks"] == 0
    assert d[busy.KEYS["kernel"]] == 0
    assert sum(d[busy.KEYS[p]] for p in busy.PARTS) == pytest.approx(d["busy_seconds"], rel=1e-9, abs=1e-12)


def test_progress_of_a_product_in_flight(cpu_state, rng, monkeypatch):
    """While a product runs, the state reports the k steps and flops its finished kernels did."""
    e = cpu_state.engine("float32")
    m, n, k = 24, 20, 16
    a = [randn(rng, (m, k), "f4") for _ in range(3)]
    b = [randn(rng, (k, n), "f4") for _ in range(3)]
    fetch, seen = e._fetch, []

    def slow_fetch(ref, *args):   # the last k step's B block is read once the first kernel has finished
        if ref is b[2]:
            for _ in range(3000):
                p = cpu_state.in_flight()
                if p and p[0]["steps_done"] >= 1:
                    seen.append(p[0])
                    break
                import time
                time.sleep(0.01)
        return fetch(ref, *args)

    monkeypatch.setattr(e, "_fetch", slow_fetch)
    out = e.stream(a, b, m, n)
    np.testing.assert_allclose(out, sum(x @ y for x, y in zip(a, b)), rtol=1e-4, atol=1e-4)
    assert seen, "the first kernel never finished while the product waited"
    [p] = seen
    assert p["key"] is None and p["steps_total"] == 3 and p["flops_total"] == 3 * 2.0 * m * n * k
    assert 1 <= p["steps_done"] < 3 and 0 < p["flops_done"] < p["flops_total"]
    assert cpu_state.in_flight() == []


def test_busy_split_counts_overlapped_time_once(rng):
    """The parts of a busy window: exclusive, first part wins, adding up to the window exactly."""
    # kernel [1, 4] and [6, 8]; transfers [0, 2] and [3, 7] overlap them; the read wait [0, 9] spans all
    got = busy.split(0.0, 10.0, kernel=[(1, 4), (6, 8)], transfer=[(0, 2), (3, 7)], read=[(0, 9)])
    assert got == {"kernel": 5.0, "transfer": 3.0, "read": 1.0, "other": 1.0}
    # the same time in several intervals of one part counts once; what lies outside the window not at all
    got = busy.split(2.0, 6.0, kernel=[(1, 3), (2, 3), (2.5, 3)], transfer=[(5, 9), (5, 9)], read=[(-5, 1)])
    assert got == {"kernel": 1.0, "transfer": 1.0, "read": 0.0, "other": 2.0}
    assert busy.split(0.0, 1.0) == {"kernel": 0.0, "transfer": 0.0, "read": 0.0, "other": 1.0}

    # random overlapping intervals against counting each instant on a fine grid
    for _ in range(50):
        grid = 1000

        def intervals():
            s = rng.integers(-100, grid + 100, size=rng.integers(0, 12))
            return [(int(x), int(x + d)) for x, d in zip(s, rng.integers(0, 300, size=len(s)))]
        kernel, transfer, read = intervals(), intervals(), intervals()
        lo, hi = sorted(rng.integers(0, grid, size=2))
        got = busy.split(lo / 8, hi / 8, [(s / 8, e / 8) for s, e in kernel],
                         [(s / 8, e / 8) for s, e in transfer], [(s / 8, e / 8) for s, e in read])
        want = dict.fromkeys(busy.PARTS, 0)
        for t in range(lo, hi):   # the unit cell [t, t + 1]: the first part covering it
            part = next((p for p, ivs in (("kernel", kernel), ("transfer", transfer), ("read", read))
                         if any(s <= t and t + 1 <= e for s, e in ivs)), "other")
            want[part] += 1
        assert got == pytest.approx({p: v / 8 for p, v in want.items()}, abs=1e-9)
        assert sum(got.values()) == pytest.approx((hi - lo) / 8, abs=1e-12)
        overlapped = sum(e - s for s, e in kernel + transfer + read) / 8
        assert sum(got[p] for p in ("kernel", "transfer", "read")) <= overlapped + 1e-9


def test_clock_offset_from_enqueue_brackets():
    # the device clock runs 100 s behind the host's; each queued stamp lies within its bracket
    brackets = [(t, t + 0.002, t - 100 + 0.0015) for t in (1.0, 2.0, 3.0)] + [(4.0, 4.01, 4.0 - 100 + 0.001)]
    assert busy.clock_offset(brackets) == pytest.approx(100.0, abs=1e-3)
    # brackets that do not intersect (a runtime stamping later): the median of their middles
    assert busy.clock_offset([(0, 1, 0), (10, 11, 0), (20, 21, 0)]) == 10.5
    assert busy.clock_offset([]) is None


def test_snapshot_reports_the_device_and_recent_products(cpu_state):
    snap = cpu_state.snapshot()
    assert snap["ok"] and snap["device"] == cpu_state.device.info.name
    assert snap["device_id"] == cpu_state.device.info.id and snap["started"] == cpu_state.started
    assert set(names.COUNTERS) <= set(snap) and set(names.TASK_SECONDS) <= set(snap)
    assert all(e[2] >= snap["time"] - state_mod.EVENTS_SECONDS for e in snap["events"])
    bad = DeviceState("nonexistent-device").snapshot()
    assert bad["ok"] is False and bad["device"] is None and "nonexistent-device" in bad["error"]


def test_task_seconds_from_fine_performance_metrics():
    class W:
        digests_total = {("execute", "span-1", "dgemm-store", "thread-cpu", "seconds"): 1.0,
                         ("execute", "dgemm-store", "thread-noncpu", "seconds"): 0.5,
                         ("execute", "dgemm-load-a", "thread-cpu", "seconds"): 0.25,
                         ("execute", "dgemm-store", "memory-read", "bytes"): 99.0,
                         ("execute", "sum", "thread-cpu", "seconds"): 7.0,
                         "latency": 0.1}
    assert state_mod.task_seconds(W()) == {"store_seconds": 1.5, "load_seconds": 0.25, "reduce_seconds": 0.0}


def test_plugin_set_up_before_registration_sets_resources_locally(any_device):
    """Plugins given at start-up run before the worker registers: no RPC, the registration carries GPU=1."""
    from distributed.core import Status

    w = FakeWorker()
    w.status = Status.init
    w.state.available_resources = {}
    plugin = DgemmPlugin(any_device.info.id)
    asyncio.run(plugin.setup(w))
    try:
        assert w.resources_set == [] and w.state.total_resources == {"GPU": 1}
        assert w.state.available_resources == {"GPU": 1}
    finally:
        plugin.teardown(w)


def test_preload_adds_the_plugin():
    class W:
        _pending_plugins = ()
    w = W()
    worker_mod.dask_setup(w)
    assert [type(p) for p in w._pending_plugins] == [DgemmPlugin]


def test_plugin_pickles_without_its_state(any_device):
    import pickle
    p = DgemmPlugin("0:0", dashboard=False)
    p.state = DeviceState(any_device.info.id)
    try:
        q = pickle.loads(pickle.dumps(p))
        assert (q.device_spec, q.dashboard, q.state, q.worker) == ("0:0", False, None, None)
    finally:
        p.state.close()


def test_plan_cache_reads_the_device_memory_limit_setting(cpu_state, monkeypatch):
    import dask

    monkeypatch.delenv("DGEMM_DEVICE_MEMORY_LIMIT", raising=False)
    cpu = 0.25 if cpu_state.device.info.type == "CPU" else 1.0
    with dask.config.set({"dgemm.device-memory-limit": "100MB"}):
        assert cpu_state.plan_cache(1000) == int(0.8 * 100e6 * cpu - 1000)
    monkeypatch.setenv("DGEMM_DEVICE_MEMORY_LIMIT", "40MB")        # the variable wins
    with dask.config.set({"dgemm.device-memory-limit": "100MB"}):
        assert cpu_state.plan_cache(0) == int(0.8 * 40e6 * cpu)


def test_build_kernels_builds_the_workers_engine(any_device):
    w = FakeWorker()
    plugin = DgemmPlugin(any_device.info.id)
    asyncio.run(plugin.setup(w))
    try:
        assert build_kernels("float32", dask_worker=w) >= 0    # no plugin among the worker's: nothing built
        assert plugin.state._engines == {}
        w.plugins[plugin.name] = plugin
        assert build_kernels("float32", "fma", dask_worker=w) > 0
        assert list(plugin.state._engines) == [(np.dtype("float32"), "fma")]
    finally:
        plugin.teardown(w)


def test_a_live_plugin_reports_its_worker(any_device):
    """The plugin attaches its state to its worker: the metrics' worker source and device_state() find it."""
    from distributed.core import Status

    from dgemm import metrics
    from dgemm.worker.plugin import metric_rows

    w = FakeWorker()
    w.address, w.name, w.status, w.metrics = "tcp://127.0.0.1:1", "w-0", Status.running, {}
    plugin = DgemmPlugin(any_device.info.id, dashboard=False)
    asyncio.run(plugin.setup(w))
    try:
        assert (w, plugin.state) in state_mod.live_states()
        assert w.metrics[names.WORKER_METRIC] == plugin.metric
        [row] = [r for r in metric_rows() if r[0] == w.address]
        assert row[1] == "w-0" and row[2]["device_id"] == any_device.info.id
        if metrics.add_worker_source(metric_rows):                    # with prometheus_client
            assert metric_rows in metrics._worker_sources
        if len(state_mod.live_states()) == 1:                         # outside a task: the worker's state
            assert device_state() is plugin.state
    finally:
        plugin.teardown(w)
    assert (w, plugin.state) not in state_mod.live_states() and names.WORKER_METRIC not in w.metrics


# -- preparing the device ahead of the first product ---------------------------------
def each_readers_staging(device) -> list[int]:
    """The bytes of every reader thread's staging buffer (a thread that had none reports 1: it pins 1 byte now)."""
    return [f.result() for f in device.warm_staging(1)]


def test_a_plugin_told_a_dtype_builds_its_kernels_and_pins_the_readers_staging_at_setup(any_device):
    from dgemm.opencl.device import read_threads
    from dgemm.worker.plugin import staging_bytes

    w = FakeWorker()
    plugin = DgemmPlugin(any_device.info.id, warm=["float32"])
    asyncio.run(plugin.setup(w))
    try:
        assert plugin._warmer.wait(120)
        assert list(plugin.state._engines) == [np.dtype("float32")]           # built before any product
        assert set(plugin._warmer.seconds) == {"float32", "staging"}
        expected = staging_bytes(plugin.state.device.info, ["float32"])
        assert each_readers_staging(plugin.state.device) == [expected] * read_threads()
        # once the readers have started, a first-time preparation leaves them alone (a run may be reading)
        assert plugin.state.device.warm_staging(2 * expected, first=True) == []
    finally:
        plugin.teardown(w)


def test_warm_worker_prepares_each_dtype_once(any_device):
    from dgemm.worker.plugin import warm_worker

    assert warm_worker("float32", dask_worker=FakeWorker()) is False    # no dgemm plugin: nothing to do
    w = FakeWorker()
    plugin = DgemmPlugin(any_device.info.id)
    asyncio.run(plugin.setup(w))
    w.plugins[plugin.name] = plugin
    try:
        assert plugin.state._engines == {}                                  # told nothing: builds nothing
        assert warm_worker("float32", dask_worker=w) is True
        assert warm_worker("float32", dask_worker=w) is False               # asked before
        assert plugin._warmer.wait(120) and list(plugin.state._engines) == [np.dtype("float32")]
        if plugin.state.device.info.fp64:
            assert warm_worker(">f8", "float32", dask_worker=w) is True    # only float64 is new
            assert plugin._warmer.wait(120)
            assert sorted(map(str, plugin.state._engines)) == ["float32", "float64"]
    finally:
        plugin.teardown(w)
    assert plugin._warmer.ask(["float64"]) is False                         # torn down: nothing starts


def test_warm_dtypes_are_checked_and_travel_with_the_plugin():
    import pickle

    with pytest.raises(TypeError, match="warm has dtype int8"):
        DgemmPlugin(warm=["int8"])
    p = pickle.loads(pickle.dumps(DgemmPlugin(warm=["float64", "<f8", "float32"])))
    assert p.warm_dtypes == ("float64", "float32") and p.state is None


def test_a_runs_last_gemm_task_gives_its_memory_back(any_device, rng):
    """The plugin follows a run's GEMM tasks: when the last one here ends, the device's buffers go (issue 26)."""
    w = FakeWorker()
    plugin = DgemmPlugin(any_device.info.id)
    asyncio.run(plugin.setup(w))
    state = plugin.state
    device = state.device
    try:
        a, b = randn(rng, (40, 30), "float32"), randn(rng, (30, 20), "float32")
        name = f"{names.GEMM}-tok1"
        keys = [(name, 0, 0), (name, 0, 1)]
        for key in keys:
            plugin.transition(key, "released", "waiting")
            plugin.transition(key, "waiting", "ready")
        engine = state.engine("float32")
        for key in keys:
            plugin.transition(key, "ready", "executing")
            engine.product([(a, b)], 40, 20)
            held = device.live_buffers()
            plugin.transition(key, "executing", "memory")
            if key != keys[-1]:   # the run goes on: its buffers stay for the next block
                assert device.live_buffers() == held and held["buffers"] > 0
        assert device.live_buffers()["buffers"] == 0 and plugin.runs == {}
        # page-locked memory stays for the next run until the worker is idle (IDLE_SECONDS)
        assert engine._buffers == {} and not device.idle and not state.released
        assert state.release_idle(0.0) and device.idle
        plugin.transition(("dgemm-store-tok1", 0, 0), "executing", "memory")   # not a GEMM task: ignored
        assert plugin.runs == {}
    finally:
        plugin.teardown(w)


def test_an_idle_state_gives_its_memory_back(cpu_state, rng):
    """Without a run's end seen, IDLE_SECONDS without a product release what the last product held."""
    a, b = randn(rng, (40, 30), "float64"), randn(rng, (30, 20), "float64")
    cpu_state.engine("float64").product([(a, b)], 40, 20)
    assert cpu_state.device.live_buffers()["buffers"] > 0
    assert not cpu_state.release_idle(3600.0)               # not idle long enough: kept
    assert cpu_state.device.live_buffers()["buffers"] > 0
    assert cpu_state.release_idle(0.0)
    assert cpu_state.device.live_buffers()["buffers"] == 0
    assert not cpu_state.release_idle(0.0)                  # nothing more to give back
    snap = cpu_state.snapshot()
    assert snap["live_buffers"] == 0 and snap["live_buffer_bytes"] == 0 and "live_pinned_bytes" in snap


def test_a_cached_engine_output_survives_the_release_of_its_run(cpu_state, rng):
    """A C block downloaded into page-locked memory stays valid after its run's buffers are released."""
    a, b = randn(rng, (64, 48), "float32"), randn(rng, (48, 32), "float32")
    out = cpu_state.engine("float32").product([(a, b)], 64, 32)
    cpu_state.release()
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    del out          # given back while idle: released at once, not kept in the free list
    assert cpu_state.device._free == []


# -- a store task's helpers (dgemm.worker.tasks.encode_threads) -----------------------------------------
def test_a_store_task_gets_helpers_only_once_its_worker_has_no_block_product_left(client):
    """While a GEMM task is pending on the worker, a store encodes on its own thread; once none is, on its
    thread and the worker's idle ones."""
    from dgemm.worker.tasks import encode_threads

    worker = min(client.scheduler_info()["workers"])
    nthreads = client.run(lambda dask_worker: dask_worker.state.nthreads, workers=[worker])[worker]
    key = ("dgemm-gemm-helpers-test", 0, 0)

    def gemm_state(start, finish, dask_worker=None):
        dask_worker.plugins["dgemm"].transition(key, start, finish)

    def threads_now():
        return client.submit(encode_threads, workers=[worker], pure=False).result()
    assert threads_now() == nthreads            # nothing else runs there: every thread (this task's too)
    client.run(gemm_state, "released", "waiting", workers=[worker])
    try:
        assert threads_now() == 1
    finally:
        client.run(gemm_state, "executing", "memory", workers=[worker])
    assert threads_now() == nthreads


def test_a_runs_last_block_is_encoded_with_helpers(client, tmp_path, rng):
    """One block product, its C block in 4 zstd chunks: its store runs after the worker's last GEMM, and
    helpers encode some of its chunks (the counters say so); C is right."""
    import zarr
    from _check import check_product

    from dgemm.storage import fastpaths

    a, b = randn(rng, (64, 40), "float32"), randn(rng, (40, 64), "float32")
    before = client.run(lambda: fastpaths.snapshot())
    out = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=64, chunks=(32, 32))
    check_product(zarr.open_array(str(tmp_path / "c.zarr"), mode="r")[...], a, b, dtype="float32")
    grew = {w: fastpaths.since(before[w], s) for w, s in client.run(lambda: fastpaths.snapshot()).items()}
    assert sum(g["storage_write_direct"] for g in grew.values()) == 4, grew
    assert sum(g["storage_write_helped"] for g in grew.values()) > 0, grew
    assert out.shape == (64, 64)

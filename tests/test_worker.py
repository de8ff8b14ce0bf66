"""Worker side: the device state, the plugin, describing a worker."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

import dgemm
from _check import randn
from dgemm import names, worker as worker_mod
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
        p = dgemm.tuning.params.KernelParams.from_dict(d["params"][dt]["params"])
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
    A, B = randn(rng, (64, 32), "float32"), randn(rng, (32, 48), "float32")
    client.compute(dgemm.matmul(A, B, client=client, block=32)).result()
    infos = client.run(describe_worker)
    assert len(infos) == 2
    for d in infos.values():
        assert d["ok"] and d["resources"].get("GPU") == 1
        assert isinstance(d["device"], dgemm.opencl.discovery.DeviceInfo)
    done = sum(d["stats"].get("float32", {}).get("blocks", 0) for d in infos.values())
    assert done >= 4
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

    def slow_pairs():  # a store that makes the device wait for the second pair
        yield a[:, :12], b[:12]
        import time
        time.sleep(0.05)
        yield a[:, 12:], b[12:]

    out = e.product(slow_pairs(), 40, 36)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    after = cpu_state.totals()
    d = {k: after[k] - before[k] for k in after}
    assert d["blocks"] == 1 and d["flops"] == 2 * 40 * 36 * 24
    # waiting, uploading and the kernels overlap now: each is within the product's busy time
    assert 0.05 <= d["read_wait_seconds"] <= d["busy_seconds"]
    assert 0 < d["kernel_seconds"] <= d["busy_seconds"] and 0 < d["transfer_seconds"] <= d["busy_seconds"]
    assert d["transfer_seconds"] == pytest.approx(d["upload_seconds"] + d["download_seconds"])
    assert len(cpu_state.events) == n_events + 1
    seq, start, end, flops, nbytes = cpu_state.events[-1]
    assert end >= start + 0.05 and flops == d["flops"] and nbytes == d["bytes_up"] + d["bytes_down"] > 0


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

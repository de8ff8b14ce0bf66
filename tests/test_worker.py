"""Worker side: the device state, the plugin, describing a worker."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

import dgemm
from _check import randn
from dgemm import worker as worker_mod
from dgemm.device import DeviceError
from dgemm.worker import DeviceState, DgemmPlugin, describe_worker, device_state


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
        p = dgemm.params.KernelParams.from_dict(d["params"][dt]["params"])
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
    monkeypatch.setattr(worker_mod, "_process_state", None)
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
        assert isinstance(d["device"], dgemm.discovery.DeviceInfo)
    done = sum(d["stats"].get("float32", {}).get("blocks", 0) for d in infos.values())
    assert done >= 4
    # tasks found the plugin's state, not a process-wide fallback
    fallback = client.run(lambda: worker_mod._process_state is None)
    assert all(fallback.values())

"""Clusters: the DeviceCluster, preparing any cluster's workers, the graph as the scheduler sees it."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr
from dask.utils import key_split
from distributed import Client, LocalCluster, get_task_stream
from distributed.diagnostics.plugin import SchedulerPlugin

import dgemm
from _check import check_product, randn
from dgemm import config
from dgemm.cluster import NoDeviceWorkerError, get_client, prepare, tiles_of
from dgemm.cluster import local as cluster_mod
from dgemm.cluster.launch import worker_specs
from dgemm.opencl.device import reader_share
from dgemm.opencl.discovery import DeviceInfo
from dgemm.opencl.params import KernelParams
from dgemm.worker.plugin import warm_worker

CLUSTER_KW = dict(processes=True, threads_per_worker=2, dashboard_address=":0", silence_logs=50)


def test_device_cluster_pins_one_worker_per_device(cluster, client):
    assert cluster.device_ids == [d.id for d in dgemm.opencl.discovery.select_devices(os.environ.get(
        "DGEMM_TEST_DEVICES", "cpu,cpu"))]
    envs = client.run(lambda: (os.environ.get("DGEMM_DEVICE"), os.environ.get("POCL_MAX_PTHREAD_COUNT")))
    assert sorted(e[0] for e in envs.values()) == sorted(cluster.device_ids)
    if len(cluster.device_ids) > 1 and "POCL_MAX_PTHREAD_COUNT" not in os.environ:
        expected = str(max(1, (os.cpu_count() or 1) // len(cluster.device_ids)))
        assert {e[1] for e in envs.values()} == {expected}
    assert sorted(w.name for w in cluster.workers.values()) == list(range(len(cluster.device_ids)))
    resources = client.run(lambda dask_worker: dict(dask_worker.state.total_resources))
    assert all(r.get("GPU") == 1 for r in resources.values())


def test_device_cluster_and_dgemm_worker_give_a_worker_the_same_spec(cluster, client):
    """One spec for both launchers: the same environment, threads and memory for the same devices."""
    n = len(cluster.device_ids)
    specs = worker_specs(",".join(cluster.device_ids))
    assert [d.id for d in (s["device"] for s in specs)] == cluster.device_ids
    for i, spec in enumerate(specs):
        options = cluster.worker_spec[i]["options"]
        assert options["env"] == spec["env"]
        assert options["env"][config.environment("device")] == cluster.device_ids[i]
        assert options["nthreads"] == spec["nthreads"] and options["memory_limit"] == spec["memory_limit"]
    if n > 1 and config.get("read-threads") is None:
        # each worker reads with its share of the host's cores, set in its environment
        shares = client.run(lambda: config.get("read-threads"))
        assert set(shares.values()) == {reader_share(os.cpu_count() or 1, n)}


def test_device_cluster_workers_get_the_plugin_at_start(cluster, client):
    """Each worker's spec carries dgemm's plugin, so its device opens as it starts; prepare() finds it there."""
    for spec in cluster.worker_spec.values():
        [plugin] = [p for p in spec["options"]["plugins"] if isinstance(p, dgemm.DgemmPlugin)]
    ready = client.run(lambda dask_worker: dask_worker.plugins["dgemm"].state.device is not None)
    assert len(ready) == len(cluster.device_ids) and all(ready.values())
    assert set(prepare(client, "float32")) == set(ready)


@pytest.mark.timeout(180)
def test_a_device_cluster_told_a_dtype_builds_it_before_any_product(any_device):
    """``warm``: the workers build the kernels while the cluster starts; no product, no build asked for."""
    with dgemm.DeviceCluster(any_device.info.id, warm=["float32"], dashboard_address=":0",
                             silence_logs=50) as lc, Client(lc, set_as_default=False) as c:
        def engines(dask_worker):
            warmer = dask_worker.plugins["dgemm"]._warmer
            return warmer is not None and warmer.wait(120) and sorted(map(str, dask_worker.plugins["dgemm"].state._engines))
        assert list(c.run(engines).values()) == [["float32"]]


def test_device_cluster_has_no_spare_devices(cluster):
    with pytest.raises(ValueError, match=f"this cluster has {len(cluster.device_ids)} devices"):
        cluster.new_worker_spec()


@pytest.mark.timeout(180)
def test_a_first_calls_cluster_runs_before_its_dashboard_is_imported(any_device, monkeypatch, tmp_path, rng):
    """local_client (a script's first call) returns once its worker runs, while Bokeh's import is still
    going on (held here until the product is done); the dashboard then serves dgemm's pages all the same."""
    import threading
    import urllib.request

    release = threading.Event()
    real_import = cluster_mod._import_dashboard

    def slow_import():
        assert release.wait(60), "the product never ran while the dashboard was being imported"
        real_import()
    monkeypatch.setattr(cluster_mod, "_import_dashboard", slow_import)
    monkeypatch.setenv("DGEMM_DEVICES", any_device.info.id)
    with cluster_mod.closing_new_local_clusters():
        c = cluster_mod.local_client(any_device.info.id)   # would wait for release for ever if it waited for Bokeh
        cluster = c.cluster
        assert not cluster.dashboard_ready(0)
        A, B = randn(rng, (80, 60), "float32"), randn(rng, (60, 70), "float32")
        out = dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=c, block=32)
        check_product(out[...], A, B, dtype="float32")
        release.set()
        assert cluster.dashboard_ready(120)
        base = cluster.dashboard_link.rsplit("/", 1)[0]
        with urllib.request.urlopen(base + "/individual-plots.json", timeout=30) as r:
            assert "/individual-dgemm-rates" in r.read().decode()
        with urllib.request.urlopen(base + "/dgemm", timeout=30) as r:
            assert "static/js/bokeh" in r.read().decode()


@pytest.mark.timeout(120)
def test_a_cluster_closed_before_its_dashboard_came_up_closes_cleanly(any_device, monkeypatch, caplog):
    """The background dashboard of a cluster closed meanwhile is never connected, says it is done and
    warns of nothing (the dashboard did not fail: nobody needs it any more)."""
    import logging
    import threading

    release = threading.Event()
    connected = []
    real_connect = dgemm.DeviceCluster._connect_dashboard

    async def connect(self, prefix):
        connected.append(prefix)
        await real_connect(self, prefix)
    monkeypatch.setattr(cluster_mod, "_import_dashboard", lambda: release.wait(120))
    monkeypatch.setattr(dgemm.DeviceCluster, "_connect_dashboard", connect)
    cluster = dgemm.DeviceCluster(any_device.info.id, dashboard_address=":0", wait_for_dashboard=False,
                                  silence_logs=50)
    cluster.close()
    with caplog.at_level(logging.WARNING, logger="dgemm"):
        release.set()
        assert cluster.dashboard_ready(60) and connected == []
    assert not [r for r in caplog.records if r.name.startswith("dgemm") and "dashboard" in r.getMessage()], caplog.text


def test_device_cluster_unknown_device():
    with pytest.raises(LookupError, match="no OpenCL device matches 'nonexistent-device'"):
        dgemm.DeviceCluster("nonexistent-device", dashboard_address=":0")


@pytest.mark.timeout(120)
def test_plain_local_cluster_gets_the_gpu_resource(any_device, tmp_path, rng):
    """A cluster that knows nothing of dgemm: prepare() gives each worker its device and GPU=1."""
    with LocalCluster(n_workers=1, **CLUSTER_KW) as lc, Client(lc, set_as_default=False) as c:
        before = c.run(lambda dask_worker: dict(dask_worker.state.total_resources))
        assert all("GPU" not in r for r in before.values())
        usable = prepare(c, "float32")
        assert set(usable) == set(before)
        after = c.run(lambda dask_worker: dict(dask_worker.state.total_resources))
        assert all(r.get("GPU") == 1 for r in after.values())
        A, B = randn(rng, (80, 60), "float32"), randn(rng, (60, 70), "float32")
        out = dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=c, block=32)
        check_product(out[...], A, B, dtype="float32")


@pytest.mark.timeout(120)
def test_workers_without_a_device_fail_fast(any_device, tmp_path):
    """Workers that cannot open their device: NoDeviceWorkerError naming why, not a hang."""
    with LocalCluster(n_workers=1, env={"DGEMM_DEVICE": "nonexistent-device"}, resources={"GPU": 1},
                      **CLUSTER_KW) as lc, Client(lc, set_as_default=False) as c:
        with pytest.raises(NoDeviceWorkerError, match="no OpenCL device matches 'nonexistent-device'"):
            dgemm.matmul(np.ones((4, 4)), np.ones((4, 4)), out=str(tmp_path / "c.zarr"), client=c)
        assert not (tmp_path / "c.zarr").exists()
        # the GPU=1 declared at start-up was taken back, so no GEMM task is sent there
        res = c.run(lambda dask_worker: dict(dask_worker.state.total_resources))
        assert all(r.get("GPU") == 0 for r in res.values())


@pytest.mark.timeout(60)
def test_cluster_without_workers(monkeypatch):
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as c:
        with pytest.raises(NoDeviceWorkerError, match=r"has no workers \(waited 0.5 s\)"):
            prepare(c, "float32", timeout=0.5)
        monkeypatch.setenv("DGEMM_WORKER_TIMEOUT", "0.25")
        with pytest.raises(NoDeviceWorkerError, match=r"waited 0.25 s"):
            dgemm.matmul(np.ones((2, 2)), np.ones((2, 2)), client=c)


def _names(task_stream) -> set:
    return {key_split(t["key"]) for t in task_stream}


def test_task_names_and_k_split_reduce(client, tmp_path, rng):
    A, B = randn(rng, (40, 512), "float32"), randn(rng, (512, 50), "float32")
    a = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=A.shape, chunks=(40, 64), dtype="f4")
    a[...] = A
    with get_task_stream(client) as ts:
        out = dgemm.matmul(a, B, out=str(tmp_path / "c.zarr"), client=client, block=(64, 64, 128))
    names = _names(ts.data)
    assert {"dgemm-gemm", "dgemm-store", "dgemm-done", "dgemm-reduce"} <= names, names
    assert all(n.startswith("dgemm-") for n in names), names
    gemm_tasks = [t for t in ts.data if key_split(t["key"]) == "dgemm-gemm"]
    assert len(gemm_tasks) == 2                      # one C block, k split over the two workers
    check_product(out[...], A, B, dtype="float32")
    assert "k split into 2 segment(s)" in out.attrs["dgemm"]["plan"]


def test_no_reduce_without_split(client, tmp_path, rng):
    A, B = randn(rng, (200, 64), "float64"), randn(rng, (64, 100), "float64")
    with get_task_stream(client) as ts:
        out = dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=client, block=64)
    names = _names(ts.data)
    assert "dgemm-reduce" not in names and {"dgemm-gemm", "dgemm-store", "dgemm-load-a"} <= names
    check_product(out[...], A, B, dtype="float64")


class RecordRestrictions(SchedulerPlugin):
    """Remembers the resource restrictions of every dgemm task the scheduler sees."""

    name = "dgemm-test-restrictions"

    def __init__(self):
        self.seen = {}
        self.scheduler = None

    async def start(self, scheduler):
        self.scheduler = scheduler

    def transition(self, key, start, finish, *args, **kwargs):
        ts = self.scheduler.tasks.get(key) if self.scheduler is not None else None
        if ts is not None and "dgemm-" in str(key):
            self.seen.setdefault(str(key), ts.resource_restrictions)


@pytest.fixture
def restrictions(client):
    """``restrictions()``: {task key: resource restrictions} of the dgemm tasks run so far in this test."""
    client.register_plugin(RecordRestrictions())

    def get():
        return client.run_on_scheduler(
            lambda dask_scheduler: dict(dask_scheduler.plugins[RecordRestrictions.name].seen))

    yield get
    client.unregister_scheduler_plugin(RecordRestrictions.name)


def _check_restrictions(seen, n_blocks, others_expected=True, share=1):
    """Every GEMM task (at least one per C block) asks for ``share`` of GPU=1; no other dgemm task does."""
    gemm = {k: v for k, v in seen.items() if "dgemm-gemm-" in k}
    assert len(gemm) >= n_blocks, sorted(seen)
    assert all(v == {"GPU": share} for v in gemm.values()), gemm
    others = {k: v for k, v in seen.items() if "dgemm-gemm-" not in k}
    assert all(not v for v in others.values()), others
    assert others or not others_expected, "no store tasks seen"


def test_gemm_tasks_carry_the_resource_annotation(client, restrictions, tmp_path, rng):
    A, B = randn(rng, (100, 40), "float32"), randn(rng, (40, 90), "float32")
    out = dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=client, block=32)
    _check_restrictions(restrictions(), out.nchunks)
    check_product(out[...], A, B, dtype="float32")


def test_gemm_tasks_setting_runs_two_at_once_per_device(client, restrictions, tmp_path, rng):
    """``gemm-tasks: 2``: each GEMM task asks for half of GPU=1, a worker runs two at once, and every product
    of mixed dtypes on the long-lived cluster is right."""
    import dask

    A, B = randn(rng, (224, 96), "float32"), randn(rng, (96, 192), "float64")
    a = zarr.create_array(store=str(tmp_path / "a.zarr"), data=A, chunks=(32, 32))
    with dask.config.set({"dgemm.gemm-tasks": 2}), get_task_stream(client) as ts:
        out = dgemm.matmul(a, B, out=str(tmp_path / "c.zarr"), client=client, block=32)
        out32 = dgemm.matmul(a, A.T.copy(), out=str(tmp_path / "c32.zarr"), client=client, block=32)
    check_product(out[...], A, B, dtype="float64")
    check_product(out32[...], A, A.T, dtype="float32")
    _check_restrictions(restrictions(), out.nchunks + out32.nchunks, share=0.5)
    spans: dict = {}
    for t in ts.data:
        if key_split(t["key"]) == "dgemm-gemm":
            for ss in t["startstops"]:
                if ss["action"] == "compute":
                    spans.setdefault(t["worker"], []).append((ss["start"], ss["stop"]))
    overlapped = sum(b0 < a1 for w in spans.values() for (_, a1), (b0, _) in zip(sorted(w), sorted(w)[1:]))
    assert overlapped, f"no two GEMM tasks ran at once on a worker: {spans}"


def test_a_bad_gemm_tasks_value_stops_the_call_before_any_work(client, tmp_path, rng):
    import dask

    A = randn(rng, (64, 64), "float32")
    with dask.config.set({"dgemm.gemm-tasks": 9}), pytest.raises(ValueError, match="gemm-tasks=9 must be 1 to 8"):
        dgemm.matmul(A, A, out=str(tmp_path / "c.zarr"), client=client, block=32)
    assert not (tmp_path / "c.zarr").exists()


@pytest.mark.xfail(strict=True, reason="dask's low-level fusion (on by default for arrays) drops layer annotations "
                                       "(dask/dask#7036), so the lazy result's GEMM tasks reach the scheduler "
                                       "without GPU=1")
def test_lazy_gemm_tasks_carry_the_resource_annotation(client, restrictions, rng):
    A, B = randn(rng, (100, 40), "float32"), randn(rng, (40, 90), "float32")
    lazy = dgemm.matmul(da.from_array(A, chunks=50), da.from_array(B, chunks=45), client=client, block=32)
    check_product(client.compute(lazy).result(), A, B, dtype="float32")
    _check_restrictions(restrictions(), lazy.npartitions, others_expected=False)


def test_lazy_gemm_tasks_without_graph_optimization_carry_the_annotation(client, restrictions, rng):
    """The workaround for the above: compute the lazy result with optimize_graph=False."""
    A, B = randn(rng, (100, 40), "float32"), randn(rng, (40, 90), "float32")
    lazy = dgemm.matmul(da.from_array(A, chunks=50), da.from_array(B, chunks=45), client=client, block=32)
    check_product(client.compute(lazy, optimize_graph=False).result(), A, B, dtype="float32")
    _check_restrictions(restrictions(), lazy.npartitions, others_expected=False)   # a lazy result stores nothing


# -- get_client and prepare without a real cluster ----------------------------
def test_get_client_order(monkeypatch):
    sentinel, default, local = object(), object(), object()
    assert get_client(sentinel) is sentinel
    import distributed
    monkeypatch.setattr(distributed, "default_client", lambda: default)
    assert get_client(None) is default
    monkeypatch.setattr(distributed, "default_client", lambda: (_ for _ in ()).throw(ValueError("none")))
    seen = []
    monkeypatch.setattr(cluster_mod, "local_client", lambda devices, dtype=None: seen.append((devices, dtype)) or local)
    assert get_client(None, "cpu") is local and seen == [("cpu", None)]
    assert get_client(None, "cpu", dtype="float32") is local and seen[-1] == ("cpu", "float32")


@pytest.fixture
def old_output(tmp_path, rng):
    """Inputs a, b and an existing output c (ones) that a refused call must leave as it was."""
    for name in ("a", "b"):
        zarr.create_array(str(tmp_path / f"{name}.zarr"), data=randn(rng, (64, 64), "float32"), chunks=(32, 32))
    zarr.create_array(str(tmp_path / "c.zarr"), data=np.ones((64, 64), "float32"), chunks=(32, 32))
    return [str(tmp_path / f"{name}.zarr") for name in "abc"]


def _untouched(c):
    assert np.array_equal(zarr.open_array(c, mode="r")[:], np.ones((64, 64), "float32"))


def test_a_closed_client_is_refused_before_any_work(cluster, old_output):
    """A closed Client failed inside dgemm ('NoneType' object has no attribute 'broadcast')."""
    a, b, c = old_output
    closed = Client(cluster, set_as_default=False)
    closed.close()
    for out in (c, None):   # Zarr out (replacing c), and lazy
        with pytest.raises(ValueError, match=r"client= is a closed Client \(tcp://127\.0\.0\.1:\d+\); dgemm needs "
                                             "a running one"):
            dgemm.matmul(a, b, out=out, overwrite=True, client=closed)
    _untouched(c)


def test_an_asynchronous_client_on_its_loop_is_refused_before_any_work(cluster, old_output):
    """An asynchronous Client used from its event loop failed inside dgemm ('coroutine' object has no
    attribute 'values'); from a thread (run_in_executor) its calls block, and dgemm works through it."""
    import asyncio

    a, b, c = old_output

    async def main():
        async with Client(cluster.scheduler_address, asynchronous=True) as ac:
            for out in (c, None):
                with pytest.raises(ValueError, match="dgemm.matmul and dgemm.gemm need a synchronous Client; "
                                                     r"client= was made with asynchronous=True.*run_in_executor"):
                    dgemm.matmul(a, b, out=out, overwrite=True, client=ac)
            _untouched(c)
            loop = asyncio.get_running_loop()
            return await asyncio.wait_for(loop.run_in_executor(
                None, lambda: dgemm.matmul(a, b, out=c, overwrite=True, client=ac)), 120)

    result = asyncio.run(main())
    np.testing.assert_allclose(result[:], zarr.open_array(a)[:] @ zarr.open_array(b)[:], rtol=1e-4, atol=1e-4)


def test_a_local_cluster_started_for_a_product_builds_its_dtype_as_it_starts(monkeypatch):
    """local_client passes the product's dtype to the DeviceCluster it starts (its workers' ``warm``)."""
    started = []

    class Running:
        status = "running"
        dashboard_link = "http://127.0.0.1:1/status"

    class Cluster:
        device_ids = ["0:0"]

    def start(devices, warm=(), **more):
        started.append((devices, warm))
        assert more == {"wait_for_dashboard": False}   # a script's product does not wait for Bokeh's import
        return Cluster()

    monkeypatch.setattr(cluster_mod, "_started", {})
    monkeypatch.setattr(cluster_mod, "DeviceCluster", start)
    monkeypatch.setattr(cluster_mod, "Client", lambda cluster, set_as_default: Running())
    client = cluster_mod.local_client("cpu", dtype="float64")
    assert started == [("cpu", ("float64",))]
    assert cluster_mod.local_client("cpu", dtype="float32") is client and len(started) == 1   # reused as it is
    cluster_mod.local_client("cpu:0")
    assert started[-1] == ("cpu:0", ())


INFO32 = DeviceInfo(0, 0, "P", "no-fp64 gpu", "v", "GPU", 1, 65536, 1024, 1, False, None, "")
INFO64 = DeviceInfo(0, 1, "P", "good gpu", "v", "GPU", 1, 65536, 1024, 1, True, None, "")
P32 = {"float32": {"params": KernelParams(TSM=32, TSN=32, TSK=16, WPTM=4, WPTN=4).as_dict(), "source": "x"},
       "float64": {"params": KernelParams(TSM=96, TSN=64, TSK=8, WPTM=6, WPTN=4, WIDTH=2).as_dict(), "source": "x"}}


class FakeClient:
    """Just enough of a Client for prepare(): canned worker descriptions."""

    def __init__(self, before, after):
        self.answers = [before, after]
        self.registered = []
        self.warmed = []
        self.scheduler = type("S", (), {"address": "tcp://fake:1"})()

    def wait_for_workers(self, n, timeout=None):
        pass

    def run(self, fn, *args, **kw):
        if fn is warm_worker:
            self.warmed.append(args)
            return {}
        return self.answers[0] if not self.registered else self.answers[1]

    def register_plugin(self, plugin, name=None):
        self.registered.append((plugin, name))


def desc(info, gpu=1, ok=True, error=None):
    if not ok:
        return {"ok": False, "error": error, "resources": {}}
    return {"ok": True, "device": info, "params": P32, "stats": {}, "resources": {"GPU": gpu}}


def test_prepare_registers_the_plugin_once_and_filters_workers():
    after = {"w1": desc(INFO32), "w2": desc(INFO64), "w3": desc(INFO64, gpu=0),
             "w4": desc(None, ok=False, error="LookupError: no device")}
    c = FakeClient({"w1": None, "w2": None}, after)
    assert set(prepare(c, "float32", timeout=1)) == {"w1", "w2"}
    assert len(c.registered) == 1 and isinstance(c.registered[0][0], dgemm.DgemmPlugin)
    assert c.registered[0][1] == "dgemm"
    assert c.registered[0][0].warm_dtypes == ("float32",)   # registered workers build the call's kernels at once
    assert set(prepare(c, "float64", timeout=1)) == {"w2"}
    assert len(c.registered) == 1                    # already there: not registered again
    assert c.warmed == [("float32",), ("float64",)]   # each call has the workers prepare for its dtype


def test_prepare_explains_every_unusable_worker():
    after = {"w1": desc(INFO32), "w3": desc(INFO64, gpu=0), "w4": desc(None, ok=False, error="LookupError: xyz"),
             "w5": None, "w6": OSError("connection reset")}
    c = FakeClient({"w1": None}, after)
    with pytest.raises(NoDeviceWorkerError) as err:
        prepare(c, "float64", timeout=1)
    msg = str(err.value)
    assert "for float64" in msg
    assert "w1: no-fp64 gpu has no double precision" in msg
    assert "w3: no GPU resource" in msg
    assert "w4: LookupError: xyz" in msg
    assert "w5: plugin missing" in msg
    assert "w6: did not answer (OSError: connection reset)" in msg      # a worker dying meanwhile


def test_tiles_of():
    workers = {"a": desc(INFO64), "b": desc(INFO64)}
    assert tiles_of(workers, "float32") == (32, 32, 16)
    assert tiles_of(workers, np.float64) == (96, 64, 8)


# -- a script without ``if __name__ == "__main__":`` (issue 14) -------------------------
SCRIPT = '''\
import sys

import numpy as np
import zarr

import dgemm

{indent_intro}c = dgemm.matmul(sys.argv[1], sys.argv[2], out=sys.argv[3], block=64)
{indent}a, b = zarr.open_array(sys.argv[1])[...], zarr.open_array(sys.argv[2])[...]
{indent}err = np.abs(c[...] - a @ b).max() / np.abs(a @ b).max()
{indent}print("relative error", err)
{indent}assert err < 1e-12
'''


@pytest.mark.timeout(420)
def test_a_script_without_a_main_guard_fails_at_once_and_names_the_fix(any_device, tmp_path, rng):
    """Unguarded, the local cluster's spawned workers re-ran the script and the call waited 60 s for workers.

    Now the call fails before starting anything and names the fix; the same script
    with the guard works.  ``timeout`` guards against a hang only.
    """
    import subprocess
    import sys

    A, B = randn(rng, (150, 100)), randn(rng, (100, 120))
    for name, x in (("a.zarr", A), ("b.zarr", B)):
        zarr.create_array(store=str(tmp_path / name), shape=x.shape, chunks=(64, 64), dtype=x.dtype)[...] = x
    env = {k: v for k, v in os.environ.items() if not k.startswith("DGEMM_TEST")}
    env.update(DGEMM_DEVICES="cpu", DGEMM_WORKER_TIMEOUT="60")
    guard = 'if __name__ == "__main__":\n'

    def run(name, body, timeout):
        (tmp_path / name).write_text(body)
        return subprocess.run([sys.executable, name, "a.zarr", "b.zarr", f"c-{name}.zarr"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=timeout)

    r = run("unguarded.py", SCRIPT.format(indent_intro="", indent=""), 90)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: ") and 'if __name__ == "__main__":' in last, r.stderr
    assert f"{tmp_path / 'unguarded.py'}, line 8" in last, r.stderr
    assert "no workers" not in r.stderr
    assert not (tmp_path / "c-unguarded.py.zarr").exists()

    # an unguarded call inside a function the script calls at its top level: the same
    r = run("indirect.py", SCRIPT.format(indent_intro="def main():\n    ", indent="    ") + "\n\nmain()\n", 90)
    assert r.returncode != 0 and f"{tmp_path / 'indirect.py'}, line 16" in r.stderr, r.stderr

    r = run("guarded.py", SCRIPT.format(indent_intro=guard + "    ", indent="    "), 300)
    assert r.returncode == 0, r.stderr
    assert "relative error" in r.stdout
    check_product(zarr.open_array(str(tmp_path / "c-guarded.py.zarr"))[...], A, B, dtype="float64")


# -- tests never take the default dashboard port (8787) ------------------------------------
SCHEDULERS = {"DeviceCluster", "LocalCluster", "Scheduler"}          # constructors that start a dashboard
LAUNCHES = {("dgemm", "cluster"), ("dask", "scheduler")}           # commands that do
ON_PURPOSE = "default dashboard on purpose"                       # a comment that exempts its line


def _names_a_dashboard(value) -> bool:
    """Whether ``value`` (an expression) is a dict of keyword arguments naming a dashboard address."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
        return any(k.arg in ("dashboard_address", "dashboard") for k in value.keywords)
    return isinstance(value, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "dashboard_address"
                                               for k in value.keys)


def default_port_users(path: Path) -> list[str]:
    """Where the test file ``path`` starts a scheduler (so a dashboard) without naming its address."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, str(path))
    spreads = {t.id for node in tree.body if isinstance(node, ast.Assign) and _names_a_dashboard(node.value)
               for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or ON_PURPOSE in lines[node.lineno - 1]:
            continue
        where = f"{path.name}:{node.lineno}"
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        named = {k.arg for k in node.keywords} & {"dashboard_address", "dashboard"}
        spread = {k.value.id for k in node.keywords if k.arg is None and isinstance(k.value, ast.Name)}
        if name in SCHEDULERS and not named and not spread & spreads:
            found.append(f"{where}: {name}(...) without dashboard_address (\":0\" is a free port)")
        if name == "filterwarnings" and node.args and isinstance(node.args[0], ast.Constant) and \
                str(node.args[0].value).startswith("ignore:Port 8787"):
            found.append(f"{where}: a filter hiding a cluster that asked for 8787")
        for arg in node.args:   # a command line: subprocess.run([...]), runner.invoke(cli, [...])
            if not isinstance(arg, (ast.List, ast.Tuple)):
                continue
            words = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in arg.elts]
            starts = any(tuple(words[i:i + 2]) in LAUNCHES for i in range(len(words))) or \
                (bool(words) and words[0] == "cluster")
            if starts and not any(w and (w.startswith("--dashboard-address") or w == "--no-dashboard")
                                  for w in words):
                found.append(f"{where}: a scheduler command without --dashboard-address (127.0.0.1:0)")
    return sorted(found, key=lambda f: int(f.split(":")[1]))


def test_default_port_users_finds_each_kind(tmp_path):
    """The check below, on a file with one of each kind of mistake and their corrected forms."""
    bad = tmp_path / "test_bad.py"
    bad.write_text("""
import pytest, subprocess, sys
KW = dict(processes=True)
GOOD_KW = dict(dashboard_address=":0")

@pytest.mark.filterwarnings("ignore:Port 8787 is already in use")
def test_x(runner):
    dgemm.DeviceCluster("cpu,cpu")
    LocalCluster(n_workers=1, **KW)
    Scheduler(port=0)
    subprocess.Popen([sys.executable, "-m", "dgemm", "cluster", "--port", "0"])
    subprocess.Popen([sys.executable, "-m", "dask", "scheduler"])
    runner.invoke(cli, ["cluster", "--devices", "cpu"])
    dgemm.DeviceCluster("cpu", dashboard_address=":0")
    LocalCluster(n_workers=1, **GOOD_KW)
    Scheduler(port=0, dashboard_address="127.0.0.1:0")
    subprocess.Popen(["dgemm", "cluster", "--dashboard-address", "127.0.0.1:0"])
    runner.invoke(cli, ["worker", "tcp://127.0.0.1:1"])
    dgemm.DeviceCluster("cpu")  # default dashboard on purpose
""")
    assert [f.split(":")[1] for f in default_port_users(bad)] == ["6", "8", "9", "10", "11", "12", "13"]


def test_no_test_starts_a_cluster_on_the_default_dashboard_port():
    """Every scheduler a test starts names a free dashboard port: 8787 is the user's (conftest holds it
    during the session, and a cluster of the test process asking for it fails its test; this finds the
    ones started in subprocesses, and filters that would hide the failure)."""
    found = [f for path in sorted(Path(__file__).parent.glob("*.py")) for f in default_port_users(path)]
    assert not found, "\n".join(found)


def test_a_cluster_left_on_the_default_dashboard_port_fails_its_test(any_device):
    """The session's hold on 8787 (conftest): DeviceCluster's default address fails at once, before any
    worker starts.  (Held here too where the session could not take it: another pytest session on the host held
    it then, and lets it go when it ends.)"""
    import socket

    from conftest import DEFAULT_DASHBOARD_PORT

    mine = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        mine.bind(("127.0.0.1", DEFAULT_DASHBOARD_PORT))
        mine.listen(1)
    except OSError:     # held already (this session's hold, or another process's): taken either way
        pass
    try:
        cluster = dgemm.DeviceCluster(any_device.info.id)  # default dashboard on purpose
    except RuntimeError as e:
        assert f"Port {DEFAULT_DASHBOARD_PORT} is already in use" in str(e)
    else:
        port = cluster.scheduler.http_server.port
        cluster.close()
        pytest.fail(f"a cluster started with the default dashboard address (on port {port}) and its test went on")
    finally:
        mine.close()


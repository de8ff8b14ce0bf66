"""The first call's order (issue 27): the local cluster's worker processes are begun before the call's checks
(dgemm.client.prestart: a fork server with their modules imported), and a refused call starts no cluster and
no worker.

Each case is a user's script in a fresh Python process (the fork server is one per process), with real
workers on this host's CPU device.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import zarr

from _check import check_product, randn
from conftest import DEVICES
from dgemm.client import prestart

SCRIPT = """\
import json, os, sys
import dgemm
import dgemm.client.request as request

seen = {{}}
check = request.Request.check.__func__
PRE_SPAWN = {pre_spawn!r}


def checked(cls, *args, **kwargs):   # what had started when the call's checks began
    from multiprocessing import forkserver
    from dgemm.client import prestart
    seen["method_at_checks"] = prestart.start_method()
    seen["server_at_checks"] = forkserver._forkserver._forkserver_pid
    seen["cluster_modules_at_checks"] = "dgemm.cluster.local" in sys.modules and bool(
        sys.modules["dgemm.cluster.local"]._started)
    return check(cls, *args, **kwargs)


request.Request.check = classmethod(checked)
if __name__ == "__main__":
    if len(sys.argv) > 4:   # a refused call first (it starts the fork server), then the environment changes
        try:
            dgemm.matmul(sys.argv[1], sys.argv[1], out=sys.argv[3], devices="{devices}")
        except ValueError as e:
            seen["first"] = str(e)
        os.environ["DGEMM_READ_THREADS"] = sys.argv[4]
    try:
        dgemm.matmul(sys.argv[1], sys.argv[2], out=sys.argv[3], devices="{devices}")
        seen["error"] = None
    except Exception as e:
        seen["error"] = f"{{type(e).__name__}}: {{e}}"
    import psutil
    from multiprocessing import forkserver
    server = forkserver._forkserver._forkserver_pid
    local = sys.modules.get("dgemm.cluster.local")
    seen["clusters"] = len(local._started) if local else 0
    seen["client_opened_opencl"] = "pyopencl" in sys.modules
    seen["server"] = server
    seen["server_children"] = len(psutil.Process(server).children()) if server else None
    if seen["clusters"]:
        client = next(iter(local._started.values()))[1]   # the cluster the call started
        seen["worker_parents"] = sorted(set(client.run(os.getppid).values()))
        seen["worker_read_threads"] = sorted(set(client.run(lambda: os.environ.get("DGEMM_READ_THREADS")).values()))
        seen["worker_pre_spawn"] = sorted(set(client.run(
            lambda: json.dumps({{k: os.environ.get(k) for k in PRE_SPAWN}}, sort_keys=True)).values()))
    print("SEEN " + json.dumps(seen), flush=True)
"""


def pre_spawn_environ() -> dict:
    """What a nanny sets in a worker's environment before it starts it, as distributed's configuration says."""
    import dask.config
    import distributed  # noqa: F401  (its defaults join the configuration)

    return {k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()}


def run_script(tmp_path, a, b, out, devices="cpu", *more) -> dict:
    script = tmp_path / "users_script.py"
    script.write_text(SCRIPT.format(devices=devices, pre_spawn=sorted(pre_spawn_environ())))
    # the script's own environment without the nanny's variables: a worker has them only if they were set for it
    env = {k: v for k, v in os.environ.items() if k not in pre_spawn_environ()}
    proc = subprocess.run([sys.executable, str(script), str(a), str(b), str(out), *more], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("SEEN ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][5:])


@pytest.fixture
def cpu_device():
    if not any(d.type == "CPU" for d in DEVICES):
        pytest.skip("no CPU OpenCL device (install pocl-binary-distribution)")


def write(path, data, chunks=(32, 32)):
    zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype)[...] = data
    return path


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_first_call_forks_its_workers_from_a_server_begun_before_its_checks(tmp_path, rng, cpu_device):
    A, B = randn(rng, (96, 70), "float32"), randn(rng, (70, 50), "float32")
    a, b = write(tmp_path / "a.zarr", A), write(tmp_path / "b.zarr", B)
    seen = run_script(tmp_path, a, b, tmp_path / "c.zarr")
    assert seen["error"] is None
    assert seen["method_at_checks"] == "forkserver" and seen["server_at_checks"]   # begun before the checks
    assert not seen["cluster_modules_at_checks"]                                   # but no cluster yet
    assert seen["worker_parents"] == [seen["server"]], seen                         # the workers came from it
    assert not seen["client_opened_opencl"], seen   # the devices were listed by a helper process, meanwhile
    # with the environment a nanny gives a spawned worker (malloc's trim threshold, one BLAS thread)
    assert [json.loads(x) for x in seen["worker_pre_spawn"]] == [pre_spawn_environ()], seen
    check_product(zarr.open_array(str(tmp_path / "c.zarr"))[...], A, B, dtype="float32")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("bad", ["shapes", "missing input"])
def test_a_refused_first_call_starts_no_cluster_and_no_worker(tmp_path, rng, cpu_device, bad):
    a = write(tmp_path / "a.zarr", randn(rng, (40, 30), "float32"))
    b = write(tmp_path / "b.zarr", randn(rng, (31 if bad == "shapes" else 30, 20), "float32"))
    if bad == "missing input":
        b = tmp_path / "no-such.zarr"
    seen = run_script(tmp_path, a, b, tmp_path / "c.zarr")
    assert seen["error"] and ("do not match" in seen["error"] or "no-such" in seen["error"]), seen
    assert seen["clusters"] == 0 and seen["server_children"] in (0, None), seen
    assert not (tmp_path / "c.zarr").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_workers_see_the_environment_of_the_call_that_starts_them(tmp_path, rng, cpu_device, monkeypatch):
    """A refused call starts the fork server; the script then sets a variable and calls again: the cluster's
    workers have it (forked from a server that predates it, they would not: they are spawned instead)."""
    monkeypatch.delenv("DGEMM_READ_THREADS", raising=False)
    A, B = randn(rng, (64, 48), "float32"), randn(rng, (48, 40), "float32")
    a, b = write(tmp_path / "a.zarr", A), write(tmp_path / "b.zarr", B)
    seen = run_script(tmp_path, a, b, tmp_path / "c.zarr", "cpu", "3")
    assert "do not match" in seen["first"] and seen["error"] is None, seen
    assert seen["worker_read_threads"] == ["3"], seen
    check_product(zarr.open_array(str(tmp_path / "c.zarr"))[...], A, B, dtype="float32")


def test_nothing_is_begun_for_a_call_that_starts_no_local_cluster(monkeypatch):
    """A client given, or no out (a lazy result, or numpy in and out): no fork server (this test process
    starts none)."""
    monkeypatch.setattr(prestart, "_started", False)
    assert prestart.start(client=object(), out="c.zarr") is False
    assert prestart.start(client=None, out=None) is False
    assert prestart.start_method() is None


def test_the_preload_names_modules_that_exist():
    """The fork server skips a preload module it cannot import without a word (multiprocessing's rule): each must
    exist and import, here in a fresh interpreter as in the server."""
    import importlib.util

    for name in prestart.PRELOAD:
        assert importlib.util.find_spec(name) is not None, name
    proc = subprocess.run([sys.executable, "-c", f"for m in {list(prestart.PRELOAD)!r}: __import__(m)"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_server_starts_with_distributeds_defaults_and_the_configuration_is_checked_later(monkeypatch):
    """The fork server starts before Dask is imported, with the nanny's variables as distributed.yaml has them;
    once the configuration is read, a call whose configuration asks for other variables, or another start
    method, spawns its workers (this test process starts no server: the state a started one leaves is set)."""
    import dask.config

    assert prestart._pre_spawn_environment(prestart._distributed_defaults()) == {
        **pre_spawn_environ(), "PYTHONHASHSEED": "6640"}
    monkeypatch.setattr(prestart, "_started", True)
    monkeypatch.setattr(prestart, "_pre_spawn", prestart._pre_spawn_environment(prestart._distributed_defaults()))
    monkeypatch.setattr(prestart, "_environment_at_start", prestart._own_environment())
    assert prestart.start_method() == "forkserver"
    with dask.config.set({prestart.ENVIRON_KEY: {**pre_spawn_environ(), "OMP_NUM_THREADS": 4}}):
        assert prestart.start_method() is None
    with dask.config.set({prestart.METHOD_KEY: "fork"}):
        assert prestart.start_method() is None
    monkeypatch.setenv("DGEMM_SOMETHING_NEW", "1")   # and, as before, a variable set since the server started
    assert prestart.start_method() is None


def test_a_helper_that_cannot_list_the_devices_leaves_it_to_the_cluster(monkeypatch):
    """The devices listed beforehand are an option: a helper that fails gives None (the cluster lists them)."""
    monkeypatch.setattr(prestart, "_helper", None)
    monkeypatch.setattr(prestart, "_started", True)
    monkeypatch.setattr(prestart, "_pre_spawn", prestart._pre_spawn_environment(prestart._distributed_defaults()))
    monkeypatch.setattr(prestart, "_environment_at_start", prestart._own_environment())
    monkeypatch.setattr(prestart, "_discovery", subprocess.Popen(
        [sys.executable, "-c", "raise SystemExit(3)"], stdout=subprocess.PIPE, text=True))
    assert prestart.devices() is None
    helper = subprocess.Popen([sys.executable, "-c", prestart.DISCOVER], stdout=subprocess.PIPE,
                              stdin=subprocess.PIPE, text=True)
    monkeypatch.setattr(prestart, "_discovery", helper)
    assert [d.id for d in prestart.devices()] == [d.id for d in DEVICES]   # as listed in this process
    with pytest.raises(subprocess.TimeoutExpired):   # it holds the platforms open until this process ends
        helper.wait(timeout=5)
    helper.stdin.close()
    assert helper.wait(timeout=60) == 0

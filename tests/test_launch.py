"""``dgemm worker`` and ``dgemm cluster``: device workers started the way ``dask cuda worker`` starts them.

The end-to-end tests run the commands as subprocesses against a real
scheduler (``dask scheduler`` in a subprocess for ``dgemm worker``), connect
a client, run a matmul and stop the commands with a signal.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from click.testing import CliRunner

import dgemm
from _check import randn
from conftest import CLUSTER_DEVICES, DEVICES
from dgemm.cli import cli
from dgemm.opencl.discovery import DeviceInfo
from dgemm.cluster.launch import parse_resources, worker_specs
from dgemm.worker import DgemmPlugin, describe_worker

needs_device = pytest.mark.skipif(not DEVICES, reason="no OpenCL device (pip install pocl-binary-distribution)")


def _gpus(n):
    return [DeviceInfo(0, i, "NVIDIA CUDA", f"GPU {i}", "NVIDIA", "GPU", 2**34, 2**16, 1024, 100, True, "sm_90", "1")
            for i in range(n)]


# -- the worker specifications -------------------------------------------------
def test_one_worker_per_device_pinned_with_the_plugin(monkeypatch):
    monkeypatch.delenv("POCL_MAX_PTHREAD_COUNT", raising=False)
    specs = worker_specs(None, name="job", nthreads=3, memory_limit="4GB", resources={"SSD": 1.0},
                         dashboard_address="127.0.0.1:8790", device_infos=_gpus(3))
    assert [s["name"] for s in specs] == ["job-0", "job-1", "job-2"]
    assert [s["env"]["DGEMM_DEVICE"] for s in specs] == ["0:0", "0:1", "0:2"]
    assert all(s["resources"] == {"SSD": 1.0, "GPU": 1} for s in specs)
    assert all(s["nthreads"] == 3 and s["memory_limit"] == "4GB" for s in specs)
    assert [s["dashboard_address"] for s in specs] == ["127.0.0.1:8790", "127.0.0.1:8791", "127.0.0.1:8792"]
    assert all(len(s["plugins"]) == 1 and isinstance(next(iter(s["plugins"])), DgemmPlugin) for s in specs)
    assert all("POCL_MAX_PTHREAD_COUNT" in s["env"] for s in specs)


def test_one_device_keeps_its_name_and_defaults(monkeypatch):
    from distributed.system import MEMORY_LIMIT
    [spec] = worker_specs("GPU 1", name="pod-7", device_infos=_gpus(2))
    assert spec["name"] == "pod-7" and spec["env"] == {"DGEMM_DEVICE": "0:1"}
    assert spec["nthreads"] >= 2 and spec["memory_limit"] == MEMORY_LIMIT
    assert spec["dashboard"] and spec["dashboard_address"] == ":0"
    specs = worker_specs("0:0,0:0", device_infos=_gpus(1), dashboard_address=None, memory_limit="auto")
    assert [s["name"] for s in specs] == [None, None]          # dask names them by address
    assert all(not s["dashboard"] for s in specs)
    assert all(s["memory_limit"] == MEMORY_LIMIT // 2 for s in specs)


@pytest.mark.parametrize("kwargs, message", [
    ({"memory_limit": "lots"}, "--memory-limit 'lots'"),
    ({"nthreads": 0}, "--nthreads must be at least 1"),
    ({"devices": "tpu"}, "no OpenCL device matches 'tpu'"),
])
def test_worker_spec_errors(kwargs, message):
    devices = kwargs.pop("devices", None)
    with pytest.raises((ValueError, LookupError), match=message):
        worker_specs(devices, device_infos=_gpus(1), **kwargs)


def test_parse_resources():
    assert parse_resources("GPU=2 SSD=1,MEM=0.5") == {"GPU": 2.0, "SSD": 1.0, "MEM": 0.5}
    with pytest.raises(ValueError, match="NAME=QUANTITY"):
        parse_resources("=1")


def test_worker_command_errors():
    runner = CliRunner()
    r = runner.invoke(cli, ["worker"], env={"DASK_SCHEDULER_ADDRESS": ""})
    assert r.exit_code == 2 and "give the scheduler's address" in r.output
    r = runner.invoke(cli, ["worker", "tcp://127.0.0.1:1", "--devices", "no-such-device"])
    assert r.exit_code == 2 and "no OpenCL device matches 'no-such-device'" in r.output
    r = runner.invoke(cli, ["worker", "tcp://127.0.0.1:1", "--resources", "GPU"])
    assert r.exit_code == 2 and "NAME=QUANTITY" in r.output


# -- end to end ------------------------------------------------------------------
class Lines:
    """Read a subprocess's output line by line, with a timeout."""

    def __init__(self, proc):
        self.q: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True).start()

    def _pump(self, f):
        for line in f:
            self.q.put(line.rstrip("\n"))

    def until(self, prefix: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line starting {prefix!r} within {timeout} s; output:\n"
                                     + "\n".join(self.seen)) from None
            self.seen.append(line)
            if line.startswith(prefix):
                return line


def _stop(proc, sig=signal.SIGTERM, timeout=60) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


@pytest.fixture
def scheduler_file(tmp_path):
    """A ``dask scheduler`` subprocess; yields the path of its scheduler file."""
    sf = tmp_path / "scheduler.json"
    log = open(tmp_path / "scheduler.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sf)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not sf.exists() or not sf.read_text().strip():
            assert proc.poll() is None, (tmp_path / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.1)
        yield sf
    finally:
        _stop(proc)
        log.close()


def _stop_and_see_them_leave(proc, client) -> None:
    """Ctrl-C to a ``dgemm worker``: it exits 0 and its workers leave the scheduler within 30 s."""
    assert _stop(proc) == 0
    deadline = time.monotonic() + 30
    while client.scheduler_info()["workers"]:
        assert time.monotonic() < deadline, "the workers did not leave"
        time.sleep(0.2)


@needs_device
@pytest.mark.slow
def test_dgemm_worker_joins_a_scheduler_and_multiplies(scheduler_file, tmp_path, rng):
    from distributed import Client

    n = len(CLUSTER_DEVICES.split(","))
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "dgemm", "worker", "--scheduler-file", str(scheduler_file),
                             "--devices", CLUSTER_DEVICES, "--nthreads", "1", "--memory-limit", "2GB",
                             "--name", "node"], stdout=log, stderr=subprocess.STDOUT)
    try:
        with Client(scheduler_file=str(scheduler_file), timeout="30s") as c:
            c.wait_for_workers(n, timeout=120)
            info = c.run(lambda dask_worker: (dask_worker.name, os.environ.get("DGEMM_DEVICE"),
                                              dict(dask_worker.state.total_resources)))
            names = sorted(v[0] for v in info.values())
            assert names == ([f"node-{i}" for i in range(n)] if n > 1 else ["node"])
            assert sorted(v[1] for v in info.values()) == sorted(d.id for d in dgemm.opencl.discovery.select_devices(
                CLUSTER_DEVICES))
            assert all(v[2].get("GPU") == 1 for v in info.values())
            # the plugin is there from the start, before any dgemm call registers it
            described = c.run(describe_worker)
            assert all(d is not None and d["ok"] for d in described.values()), described
            assert "dgemm-dashboard" in c.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))

            A, B = randn(rng, (96, 80), "float32"), randn(rng, (80, 112), "float32")
            out = dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=c, block=32)
            np.testing.assert_allclose(out[:], A @ B, rtol=1e-4, atol=1e-4)
            port = c.scheduler_info()["services"]["dashboard"]
            page = urllib.request.urlopen(f"http://127.0.0.1:{port}/dgemm/data.json", timeout=10).read()
            assert json.loads(page)["matmuls"][0]["blocks_total"] == 12

            _stop_and_see_them_leave(proc, c)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "worker.log").read_text()
    assert "worker node" in text and "closing the workers" in text, text


@needs_device
@pytest.mark.slow
def test_dgemm_worker_under_worker_process_host_runs_every_device_in_one_process(scheduler_file, tmp_path, rng):
    """``DGEMM_WORKER_PROCESS=host dgemm worker``: one process, a worker per device (named as ever), each on its
    own device; a Zarr product is right; Ctrl-C closes both."""
    import zarr
    from distributed import Client

    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "dgemm", "worker", "--scheduler-file", str(scheduler_file),
                             "--devices", "cpu,cpu", "--nthreads", "1", "--memory-limit", "2GB", "--name", "node"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "DGEMM_WORKER_PROCESS": "host"})
    try:
        with Client(scheduler_file=str(scheduler_file), timeout="30s") as c:
            c.wait_for_workers(2, timeout=120)
            info = c.run(lambda dask_worker: (dask_worker.name, os.getpid(), dict(dask_worker.state.total_resources)))
            assert sorted(v[0] for v in info.values()) == ["node-0", "node-1"]
            assert len({v[1] for v in info.values()}) == 1, info
            assert all(v[2].get("GPU") == 1 for v in info.values())
            assert all(d is not None and d["ok"] for d in c.run(describe_worker).values())
            A, B = randn(rng, (96, 80), "float32"), randn(rng, (80, 112), "float32")
            a = zarr.create_array(str(tmp_path / "a.zarr"), data=A, chunks=(32, 32))
            out = dgemm.matmul(a, B, out=str(tmp_path / "c.zarr"), client=c, block=32)
            np.testing.assert_allclose(out[:], A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
            _stop_and_see_them_leave(proc, c)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


@needs_device
@pytest.mark.slow
def test_dgemm_cluster_serves_the_page_and_stops_on_ctrl_c(tmp_path):
    from distributed import Client

    proc = subprocess.Popen([sys.executable, "-m", "dgemm", "cluster", "--devices", "cpu", "--port", "0",
                             "--dashboard-address", "127.0.0.1:0", "--nthreads", "1", "--memory-limit", "2GB"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = Lines(proc)
        address = lines.until("scheduler: ").split(": ", 1)[1]
        page_url = lines.until("dgemm page: ").split(": ", 1)[1]
        lines.until("press Ctrl-C")
        assert address.startswith("tcp://127.0.0.1:")
        page = urllib.request.urlopen(page_url, timeout=10).read().decode()
        assert "static/js/bokeh" in page     # the Bokeh document of the dashboard's dgemm page
        with Client(address, timeout="30s") as c:
            c.wait_for_workers(1, timeout=120)
            [d] = c.run(describe_worker).values()
            assert d is not None and d["ok"] and d["resources"] == {"GPU": 1}
        assert _stop(proc, signal.SIGINT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def taken_port():
    """A port of 127.0.0.1 another process's socket listens on (this one's, as far as dgemm can tell)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@needs_device
@pytest.mark.parametrize("which", ["scheduler", "dashboard"])
def test_dgemm_cluster_on_a_taken_port_says_so_in_one_line(taken_port, which):
    """A taken scheduler port was distributed's traceback; a taken dashboard port given by the user was
    quietly served elsewhere (the command ran on).  Both: one line naming the port, exit 1, at once."""
    port, dashboard = (str(taken_port), "127.0.0.1:0") if which == "scheduler" else ("0", f"127.0.0.1:{taken_port}")
    proc = subprocess.Popen([sys.executable, "-m", "dgemm", "cluster", "--devices", "cpu", "--port", port,
                             "--dashboard-address", dashboard, "--nthreads", "1", "--memory-limit", "2GB"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        _stop(proc, signal.SIGINT)
        pytest.fail(f"dgemm cluster on a taken {which} port ran on")
    assert proc.returncode == 1, (out, err)
    assert "Traceback" not in err and "scheduler:" not in out, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"Error: the {which} cannot listen on 127.0.0.1:{taken_port}: another process "
                               "listens there"), err
    assert ("--port" if which == "scheduler" else "--dashboard-address") in lines[0]


def test_dgemm_cluster_refuses_a_malformed_dashboard_address():
    r = CliRunner().invoke(cli, ["cluster", "--port", "0", "--dashboard-address", "[::1]:x:y"])
    assert r.exit_code == 2 and "--dashboard-address '[::1]:x:y'" in r.output, r.output


# -- what dask worker / dask cuda worker users pass ------------------------------------
def test_specs_carry_device_memory_limit_preload_and_prefix():
    [spec] = worker_specs(None, device_infos=_gpus(1), device_memory_limit="4GiB", preload=["a.b", "/x/c.py"],
                          dashboard_prefix="node/7/")
    assert spec["env"]["DGEMM_DEVICE_MEMORY_LIMIT"] == str(4 * 2**30)
    assert spec["preload"] == ["a.b", "/x/c.py"] and spec["http_prefix"] == "/node/7"
    [plain] = worker_specs(None, device_infos=_gpus(1))
    assert "DGEMM_DEVICE_MEMORY_LIMIT" not in plain["env"] and "preload" not in plain and "http_prefix" not in plain


def test_new_worker_flags_fail_before_any_worker_starts(tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli, ["worker", "tcp://127.0.0.1:1", "--device-memory-limit", "lots"])
    assert r.exit_code == 2 and "--device-memory-limit" in r.output and "lots" in r.output, r.output
    cert = tmp_path / "node.pem"
    cert.write_text("x")
    for command in ("worker", "cluster"):
        args = ([command, "tcp://127.0.0.1:1"] if command == "worker"
                else [command, "--port", "0", "--dashboard-address", "127.0.0.1:0"])
        r = runner.invoke(cli, [*args, "--tls-cert", str(cert)])
        assert r.exit_code == 2 and "TLS needs --tls-ca-file and --tls-cert" in r.output, r.output
        r = runner.invoke(cli, [*args, "--tls-ca-file", str(tmp_path / "missing.pem"), "--tls-cert", str(cert)])
        assert r.exit_code == 2 and "missing.pem" in r.output, r.output


def test_help_lists_the_dask_worker_flags():
    text = CliRunner().invoke(cli, ["worker", "--help"]).output
    for flag in ("--preload", "--name", "--nthreads", "--memory-limit", "--device-memory-limit", "--local-directory",
                 "--pid-file", "--dashboard-prefix", "--death-timeout", "--resources", "--tls-ca-file", "--tls-cert",
                 "--tls-key", "--scheduler-file"):
        assert flag in text, flag
    text = CliRunner().invoke(cli, ["cluster", "--dashboard-address", "127.0.0.1:0", "--help"]).output
    for flag in ("--preload", "--tls-ca-file", "--tls-cert", "--tls-key", "--device-memory-limit"):
        assert flag in text, flag


PRELOAD = '''
def dask_setup(worker):
    worker.dgemm_test_preloaded = worker.name
'''


def _wait_for_file(path, proc, log, timeout=60):
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert proc.poll() is None, log.read_text() if log.exists() else "exited"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def flagged_worker(tmp_path_factory):
    """A ``dask scheduler`` and one ``dgemm worker`` given every dask-worker flag; yields what the tests need."""
    from distributed import Client

    tmp = tmp_path_factory.mktemp("flagged")
    sf, pid_file, scratch, preload = tmp / "scheduler.json", tmp / "worker.pid", tmp / "scratch", tmp / "mark.py"
    preload.write_text(PRELOAD)
    slog, wlog = open(tmp / "scheduler.log", "w"), open(tmp / "worker.log", "w")
    sched = subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                              "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sf)],
                             stdout=slog, stderr=subprocess.STDOUT)
    worker = None
    try:
        _wait_for_file(sf, sched, tmp / "scheduler.log")
        worker = subprocess.Popen(
            [sys.executable, "-m", "dgemm", "worker", "--scheduler-file", str(sf), "--devices", "cpu",
             "--name", "flagged", "--nthreads", "3", "--memory-limit", "1.5GB", "--device-memory-limit", "256MiB",
             "--local-directory", str(scratch), "--pid-file", str(pid_file), "--dashboard-address", "127.0.0.1:0",
             "--dashboard-prefix", "node/7", "--death-timeout", "45", "--resources", "SSD=2 LICENSE=1",
             "--preload", str(preload), "--preload", "json"],
            stdout=wlog, stderr=subprocess.STDOUT)
        _wait_for_file(pid_file, worker, tmp / "worker.log")
        with Client(scheduler_file=str(sf), timeout="30s") as c:
            c.wait_for_workers(1, timeout=120)
            yield {"client": c, "proc": worker, "pid_file": pid_file, "scratch": scratch, "preload": preload}
        assert _stop(worker) == 0
        assert not pid_file.exists()            # removed at exit, as dask worker does
    finally:
        for p in (worker, sched):
            if p is not None and p.poll() is None:
                _stop(p)
        slog.close()
        wlog.close()


def _on_worker(client, f):
    [value] = client.run(f).values()
    return value


@needs_device
@pytest.mark.slow
def test_worker_name_threads_memory_and_resources_reach_the_worker(flagged_worker):
    c = flagged_worker["client"]
    got = _on_worker(c, lambda dask_worker: (dask_worker.name, dask_worker.state.nthreads,
                                             dask_worker.memory_manager.memory_limit,
                                             dict(dask_worker.state.total_resources)))
    assert got == ("flagged", 3, 1_500_000_000, {"SSD": 2.0, "LICENSE": 1.0, "GPU": 1})


@needs_device
@pytest.mark.slow
def test_worker_device_memory_limit_preload_and_local_directory_reach_the_worker(flagged_worker):
    c = flagged_worker["client"]
    env, marked, preloads, local = _on_worker(c, lambda dask_worker: (
        os.environ.get("DGEMM_DEVICE_MEMORY_LIMIT"), getattr(dask_worker, "dgemm_test_preloaded", None),
        [p.name for p in dask_worker.preloads], dask_worker.local_directory))
    assert env == str(256 * 2**20)
    assert marked == "flagged" and preloads == [str(flagged_worker["preload"]), "json"]
    assert os.path.realpath(local).startswith(os.path.realpath(flagged_worker["scratch"]) + os.sep)
    # the limit is what the worker plans with
    from dgemm.cluster.readiness import describe_for_plan
    info = _on_worker(c, describe_for_plan)
    assert info["ok"] and info["memory_limit"] == 256 * 2**20 and info["memory"] <= 256 * 2**20, info


@needs_device
@pytest.mark.slow
def test_worker_pid_file_prefix_and_death_timeout_reach_the_worker(flagged_worker):
    c = flagged_worker["client"]
    assert int(flagged_worker["pid_file"].read_text()) == flagged_worker["proc"].pid
    port, death = _on_worker(c, lambda dask_worker: (dask_worker.http_server.port, dask_worker.death_timeout))
    assert float(death) == 45
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/node/7/health", timeout=10).read() == b"ok"
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10)


@needs_device
@pytest.mark.slow
def test_tls_and_preload_reach_dgemm_cluster_and_dgemm_worker(tmp_path):
    """``dgemm cluster`` on TLS with a preload; a ``dgemm worker`` joins it with the same certificates."""
    pytest.importorskip("cryptography", reason="generating certificates needs cryptography (in the test extra)")
    from distributed import Client
    from distributed.security import Security

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "deploy", "tls"))
    try:
        import make_certs
    finally:
        sys.path.pop(0)
    certs = tmp_path / "tls"
    make_certs.make_certs(certs)
    tls = ["--tls-ca-file", str(certs / "ca.pem"), "--tls-cert", str(certs / "node.pem"),
           "--tls-key", str(certs / "node-key.pem")]
    preload = tmp_path / "mark.py"
    preload.write_text(PRELOAD)
    cluster = subprocess.Popen([sys.executable, "-m", "dgemm", "cluster", "--devices", "cpu", "--port", "0",
                                "--dashboard-address", "127.0.0.1:0", "--nthreads", "1", "--memory-limit", "1GB",
                                "--preload", str(preload), *tls],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    worker = None
    try:
        address = Lines(cluster).until("scheduler: ").split(": ", 1)[1]
        assert address.startswith("tls://127.0.0.1:")
        worker = subprocess.Popen([sys.executable, "-m", "dgemm", "worker", address, "--devices", "cpu",
                                   "--name", "joined", "--nthreads", "1", "--memory-limit", "1GB",
                                   "--host", "127.0.0.1", *tls],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        security = Security(tls_ca_file=str(certs / "ca.pem"), tls_client_cert=str(certs / "client.pem"),
                            tls_client_key=str(certs / "client-key.pem"), require_encryption=True)
        with Client(address, security=security, timeout="30s") as c:
            c.wait_for_workers(2, timeout=120)
            got = c.run(lambda dask_worker: (dask_worker.name, hasattr(dask_worker, "dgemm_test_preloaded")))
            assert all(a.startswith("tls://") for a in got)        # the workers listen on TLS too
            # the cluster's own worker ran the preload; the joined one, not given --preload, did not
            assert sorted((name == "joined", preloaded) for name, preloaded in got.values()) == [
                (False, True), (True, False)], got
        assert _stop(worker) == 0
        assert _stop(cluster, signal.SIGINT) == 0
    finally:
        for p in (worker, cluster):
            if p is not None and p.poll() is None:
                p.kill()

"""The command line as Dask users expect it (issue 29): the dashboard it took, a progress bar of flops,
``dgemm random``'s float32 default and ``--storage-option``, ``--device-memory-limit`` as a fraction.

What a user sees is checked where a user sees it: ``dgemm matmul`` and
``dgemm worker`` run as processes of their own, on real workers (PoCL's CPU
device); ``dgemm random`` writes to the moto S3 server of the ``s3``
fixture, which only the options given reach.
"""
from __future__ import annotations

import contextlib
import io
import re
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from _check import wait_for
from conftest import DEFAULT_DASHBOARD_PORT, DEVICES
from dgemm.benchmarks.inputs import random_zarr
from dgemm.cli import cli
from dgemm.names import DASHBOARD_PLUGIN

needs_device = pytest.mark.skipif(not DEVICES, reason="no OpenCL device (pip install pocl-binary-distribution)")


@pytest.fixture
def ab(tmp_path, rng):
    """Two float32 Zarr matrices of several chunks, written with zarr from numpy: a (192 x 160), b (160 x 96)."""
    arrays = []
    for name, shape in (("a.zarr", (192, 160)), ("b.zarr", (160, 96))):
        data = rng.standard_normal(shape).astype(np.float32)
        zarr.create_array(tmp_path / name, shape=shape, chunks=(64, 64), dtype=np.float32)[...] = data
        arrays.append(data)
    return tmp_path / "a.zarr", tmp_path / "b.zarr", *arrays


@contextlib.contextmanager
def _taken(port: int):
    """``port`` of 127.0.0.1 taken while the block runs: by this test, or already (the session's fixture,
    another process)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            s.listen(1)   # listening: a bind to it fails even with SO_REUSEADDR (as tornado binds)
        except OSError:
            pass
        yield


# -- dgemm matmul: the dashboard's address, never distributed's port warning ------------------------------
@needs_device
@pytest.mark.slow
def test_matmul_prints_the_dashboard_it_took_and_no_port_warning(ab, tmp_path):
    """8787 taken (the test session holds it): the local cluster's dashboard moves, and the command says where
    in one line, without distributed's ``UserWarning: Port 8787 is already in use`` and its source line."""
    pa, pb, a, b = ab
    out = tmp_path / "c.zarr"
    with _taken(DEFAULT_DASHBOARD_PORT):
        r = subprocess.run([sys.executable, "-m", "dgemm", "matmul", str(pa), str(pb), str(out), "--block", "64",
                            "--no-progress"], capture_output=True, text=True, timeout=300)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    # distributed's warning and what it quotes (another warning, of a slow disk say, is not this test's)
    assert "already in use" not in text and "Perhaps you already have a cluster running" not in text, text
    [line] = [ln for ln in r.stdout.splitlines() if "dashboard" in ln]
    m = re.fullmatch(r"local cluster of \d+ workers?; dashboard: http://127\.0\.0\.1:(\d+)/status", line)
    assert m and int(m.group(1)) != DEFAULT_DASHBOARD_PORT, line
    np.testing.assert_allclose(zarr.open_array(out, mode="r")[...], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


# -- the progress bar counts flops --------------------------------------------------------------------
def _draws(text: str) -> list[int]:
    return [int(p) for p in re.findall(r"\| (\d+)% of the flops \|", text)]


@needs_device
def test_progress_bar_shows_the_share_of_flops_the_dashboard_counts(cluster, client):
    """Two blocks, one finished, the other half done by a worker's report, and 6 of its 8 GFLOP those of the
    finished one: the bar says 87 % (7 of 8 GFLOP), where a count of tasks says 50 %."""
    from distributed import Event

    from dgemm.client.progress import show_progress
    from dgemm.scheduler.dashboard import MatmulProgress

    token = "0123456789abcdef"[:12]
    big, small = (f"dgemm-gemm-{token}", 0, 0), (f"dgemm-gemm-{token}", 0, 1)
    wait_for(lambda: DASHBOARD_PLUGIN in cluster.scheduler.plugins, 60, "the workers' dashboard plugin")
    plugin = cluster.scheduler.plugins[DASHBOARD_PLUGIN]
    m = MatmulProgress(token, None, 0.0)
    m.total["gemm"] = {big, small}
    m.done["gemm"].add(big)
    m.flops[big] = 6e9
    plugin._matmuls[token] = m
    plugin.running = lambda: {small: (1e9, 2e9)}   # what the workers report of the block in flight
    release = Event(f"release-{token}", client=client)
    future = client.submit(lambda name: Event(name).wait(), release.name, pure=False)
    drawn = io.StringIO()
    bar = threading.Thread(target=show_progress, args=(client, future, token), kwargs={"interval": 0.05,
                                                                                      "out": drawn})
    try:
        bar.start()
        wait_for(lambda: _draws(drawn.getvalue()), 60, "the bar's first drawing")
        assert set(_draws(drawn.getvalue())) == {87}, drawn.getvalue()
    finally:
        release.set()
        bar.join(60)
        del plugin.running
        plugin._matmuls.pop(token, None)
    assert not bar.is_alive()
    assert _draws(drawn.getvalue())[-1] == 100 and not drawn.getvalue().endswith("\n")


def test_progress_bar_without_the_dashboard_plugin_is_distributeds(capsys):
    """A scheduler without dgemm's dashboard plugin (no dgemm worker has joined it) cannot count flops:
    distributed's bar (tasks) is shown rather than none."""
    from distributed import Client, LocalCluster

    from dgemm.client.progress import show_progress

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as c:
        future = c.submit(sum, [1, 2], pure=False)
        drawn = io.StringIO()
        show_progress(c, future, "feedfacecafe", interval=0.05, out=drawn)
        assert future.result() == 3
    assert drawn.getvalue() == "" and "% Completed" in capsys.readouterr().out


@needs_device
@pytest.mark.slow
def test_matmul_progress_bar_runs_to_100_percent_of_the_flops(ab, tmp_path):
    """A real run's bar: flops, never going back, ending at 100 %; then the figures on lines of their own."""
    pa, pb, a, b = ab
    r = CliRunner().invoke(cli, ["matmul", str(pa), str(pb), str(tmp_path / "c.zarr"), "--block", "64"])
    assert r.exit_code == 0, r.output
    draws = _draws(r.output)
    assert draws and draws == sorted(draws) and draws[-1] == 100, r.output
    assert "% Completed" not in r.output                    # distributed's bar, counting tasks
    assert "\nshape: 192 x 96 float32\n" in r.output


# -- dgemm random -----------------------------------------------------------------------------------------
def test_random_writes_float32_by_default_and_says_its_size_as_dask_does(tmp_path):
    from dask.utils import format_bytes

    path = tmp_path / "r.zarr"
    r = CliRunner().invoke(cli, ["random", str(path), "--shape", "300", "200", "--chunks", "128", "128"])
    assert r.exit_code == 0, r.output
    z = zarr.open_array(path, mode="r")
    assert z.dtype == np.float32 and z.shape == (300, 200)
    assert f"300 x 200 float32, chunks 128 x 128, {format_bytes(300 * 200 * 4)} in " in r.output
    x = z[...]
    # every element written: a chunk left unwritten reads as 16,384 zeros, while numpy's float32 normals are
    # exactly 0 about once in 7 million draws (27 in 2e8 measured): asking for no zero at all failed about one
    # run in 120 of these 60,000 elements, so a few are allowed
    assert np.count_nonzero(x == 0) <= 3 and abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1) < 0.05


def test_random_writes_to_s3_through_storage_options(s3):
    """Only the options given reach the bucket (no AWS_* in the environment): without them nothing is
    written, with them the array is there, as zarr reads it with the same options."""
    url = s3.url("random/r.zarr")
    args = ["random", url, "--shape", "70", "50", "--chunks", "32", "32", "--seed", "5"]
    options = [f"key={s3.key}", f"secret={s3.secret}", f"endpoint_url={s3.endpoint}",
               f"client_kwargs.region_name={s3.storage_options['client_kwargs']['region_name']}"]
    runner = CliRunner()
    r = runner.invoke(cli, args)
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert not s3.fs().exists(url)
    r = runner.invoke(cli, args + [x for o in options for x in ("--storage-option", o)])
    assert r.exit_code == 0, r.output
    z = zarr.open_array(url, mode="r", storage_options=s3.storage_options)
    assert z.dtype == np.float32 and z.shape == (70, 50) and z.chunks == (32, 32)
    x = z[...]
    assert np.all(x != 0) and np.all(np.isfinite(x))


def test_random_zarr_storage_options_are_not_given_to_a_local_path(tmp_path):
    z = random_zarr(tmp_path / "l.zarr", (5, 4), (2, 2), "float32", seed=1, storage_options={"anon": True})
    assert zarr.open_array(tmp_path / "l.zarr", mode="r").shape == (5, 4) == z.shape


# -- dgemm worker --device-memory-limit FRACTION --------------------------------------------------------------
@needs_device
@pytest.mark.slow
def test_worker_device_memory_limit_fraction_is_that_share_of_its_device(tmp_path):
    """``dgemm worker --device-memory-limit 0.5``, dask-cuda's form, was refused; the worker now plans with
    half of its device's memory, as the device reports it."""
    from distributed import Client, LocalCluster

    from dgemm.cluster.readiness import describe_for_plan

    log = open(tmp_path / "worker.log", "w+")
    with LocalCluster(n_workers=0, processes=False, protocol="tcp", host="127.0.0.1", scheduler_port=0,
                      dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as c:
        worker = subprocess.Popen([sys.executable, "-m", "dgemm", "worker", lc.scheduler_address, "--devices", "cpu",
                                   "--device-memory-limit", "0.5", "--dashboard-address", "127.0.0.1:0"],
                                  stdout=log, stderr=subprocess.STDOUT)
        try:
            c.wait_for_workers(1, timeout=120)
            info = wait_for(lambda: next(iter(c.run(describe_for_plan).values())), 60, "the worker's device")
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            log.close()
    assert info["ok"], info
    assert info["memory"] == int(0.5 * info["device"].global_mem), info

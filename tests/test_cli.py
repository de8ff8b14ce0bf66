"""The ``dgemm`` command line: devices, random, plan, matmul (with --report) and demo.

``dgemm worker`` and ``dgemm cluster`` are tested in test_launch.py.

Most tests run the commands in-process with click's CliRunner; the error
cases also check that nothing was written and that no cluster was started
(the checks come first).  One test runs a real matmul on a local cluster
in-process, and one runs ``dgemm demo`` end to end in a subprocess.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import dgemm
import dgemm.cluster
import dgemm.benchmarks.demo
import dgemm.benchmarks.inputs
import dgemm.opencl.discovery
import dgemm.opencl.database
import dgemm.tuning.report
from dgemm.cli import cli, main
from dgemm.accuracy import check_sample
from dgemm.benchmarks.inputs import random_zarr
from dgemm.opencl.discovery import DeviceInfo
from dgemm.storage import COMPLETE_ATTR

HAVE_DEVICE = bool(dgemm.opencl.discovery.list_devices())
needs_device = pytest.mark.skipif(not HAVE_DEVICE, reason="no OpenCL device (pip install pocl-binary-distribution)")


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail loudly if a command starts a local cluster (argument errors must come first)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a local cluster was started before the arguments were checked")
    monkeypatch.setattr(dgemm.cluster, "local_client", refuse)
    monkeypatch.setattr(dgemm.cluster.local, "local_client", refuse)     # what get_client calls


@pytest.fixture
def ab(tmp_path):
    """Two small float32 Zarr matrices with several chunks each: a (300 x 200), b (200 x 100)."""
    a = random_zarr(tmp_path / "a.zarr", (300, 200), (128, 64), "float32", seed=1)
    b = random_zarr(tmp_path / "b.zarr", (200, 100), (64, 64), "float32", seed=2)
    return tmp_path / "a.zarr", tmp_path / "b.zarr", a, b


def _fake_devices():
    gpu = DeviceInfo(0, 0, "NVIDIA CUDA", "NVIDIA H100 80GB HBM3", "NVIDIA Corporation", "GPU",
                     80 * 2**30, 48 * 1024, 1024, 132, True, "sm_90", "550.54")
    small = DeviceInfo(1, 0, "Other", "Tiny GPU", "Acme", "GPU", 2**30, 32 * 1024, 256, 4, False, None, "1")
    cpu = DeviceInfo(2, 0, "Portable Computing Language", "pthread-Some CPU", "GenuineIntel", "CPU",
                     2**34, 512 * 1024, 4096, 8, True, "pocl-cpu", "6.0")
    return [gpu, small, cpu]


# -- the command group ----------------------------------------------------------
def test_group_and_entry_points(runner):
    r = runner.invoke(cli, ["--help"])
    assert r.exit_code == 0
    for name in ("devices", "random", "plan", "matmul", "demo"):
        assert name in r.output
    assert cli.name == "dgemm"
    # `dask dgemm` finds the group through the dask_cli entry point, `dgemm` through the script.
    assert [ep.value for ep in entry_points(group="dask_cli") if ep.name == "dgemm"] == ["dgemm.cli:cli"]
    assert [ep.value for ep in entry_points(group="console_scripts") if ep.name == "dgemm"] == ["dgemm.cli:main"]
    r = runner.invoke(cli, ["--version"])
    assert dgemm.__version__ in r.output


def test_main_runs_the_group(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "matmul" in capsys.readouterr().out


# -- devices --------------------------------------------------------------------
@needs_device
def test_devices_lists_this_hosts_devices(runner):
    r = runner.invoke(cli, ["devices"])
    assert r.exit_code == 0, r.output
    for d in dgemm.opencl.discovery.list_devices():
        assert f"{d.id}  {d.name}" in r.output
        assert dgemm.opencl.database.lookup(d, "float32").describe() in r.output
    assert "fp64: " in r.output and "architecture: " in r.output
    assert "would use:" in r.output


@needs_device
def test_devices_json_matches_discovery(runner):
    r = runner.invoke(cli, ["devices", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    infos = dgemm.opencl.discovery.list_devices()
    assert [d["id"] for d in report["devices"]] == [d.id for d in infos]
    for d, info in zip(report["devices"], infos):
        assert d["name"] == info.name and d["fp64"] == info.fp64
        choice = dgemm.opencl.database.lookup(info, "float32")
        assert d["params"]["float32"]["params"] == choice.params.as_dict()
        assert d["params"]["float32"]["source"] == choice.describe()
    assert report["local_cluster"] == [d.id for d in dgemm.opencl.discovery.select_devices(None)]


def test_devices_shows_where_parameters_come_from(runner, monkeypatch, tmp_path):
    """Tuned, untuned and unsupported dtypes are told apart; independent of this host's devices."""
    devices = _fake_devices()
    monkeypatch.setattr(dgemm.opencl.discovery, "list_devices", lambda: devices)
    monkeypatch.delenv("DGEMM_DEVICES", raising=False)
    db = {"device": {"NVIDIA H100 80GB HBM3": {"float32": {
        "params": {"TSM": 128, "TSN": 128, "TSK": 16, "WPTM": 8, "WPTN": 8, "WIDTH": 4}, "tuned": True}}}}
    (tmp_path / "db.json").write_text(json.dumps(db))
    monkeypatch.setenv("DGEMM_TUNING_DB", str(tmp_path / "db.json"))
    # The shipped database without its device entries (it has tuned ones for the H100 now).
    shipped = json.loads(dgemm.opencl.database.shipped_path().read_text())
    shipped["device"] = {}
    (tmp_path / "shipped.json").write_text(json.dumps(shipped))
    monkeypatch.setattr(dgemm.opencl.database, "shipped_path", lambda: tmp_path / "shipped.json")
    r = runner.invoke(cli, ["devices"])
    assert r.exit_code == 0, r.output
    assert "user database, device entry 'NVIDIA H100 80GB HBM3' (tuned; fma kernel)" in r.output
    assert "architecture entry 'sm_90' (tuned; dmma kernel)" in r.output              # its float64
    assert "default entry 'default' (untuned default; `dgemm tune` may help; fma kernel)" in r.output  # Tiny GPU
    assert "float64: not supported (no cl_khr_fp64)" in r.output                        # Tiny GPU
    assert "fp64: no" in r.output and "architecture: sm_90" in r.output
    assert "would use: 0:0 NVIDIA H100 80GB HBM3, 1:0 Tiny GPU" in r.output              # all GPUs

    monkeypatch.setenv("DGEMM_DEVICES", "tpu")
    r = runner.invoke(cli, ["devices"])
    assert r.exit_code == 0
    assert "DGEMM_DEVICES=tpu" in r.output and "no OpenCL device matches 'tpu'" in r.output


@pytest.mark.skipif(not HAVE_DEVICE, reason="no OpenCL device to build on")
def test_devices_build_says_which_kernel_runs_and_why_one_fell_back(runner, monkeypatch):
    """--build builds each path: this host's device runs its chosen kernels; a device the database takes
    for an H100 (this host's device under that name) cannot finish the wgmma kernel's PTX route, and the
    report says so with the reason, as a worker would log it."""
    r = runner.invoke(cli, ["devices", "--build"])
    assert r.exit_code == 0, r.output
    real = dgemm.opencl.discovery.list_devices()[0]
    report = dgemm.tuning.report.device_report(build=True)["devices"][0]
    for dt, entry in report["params"].items():
        assert entry["built"]["default"]["as_chosen"], entry["built"]
        assert "fell_back" not in entry["built"]["default"]
    assert "built, default: " + report["params"]["float32"]["built"]["default"]["kernel"] in r.output
    h100 = dataclasses.replace(real, name="NVIDIA H100 80GB HBM3", architecture="sm_90", vendor="NVIDIA Corporation")
    monkeypatch.setattr(dgemm.opencl.discovery, "list_devices", lambda: [h100])
    r = runner.invoke(cli, ["devices", "--build"])
    assert r.exit_code == 0, r.output
    report = dgemm.tuning.report.device_report(build=True)["devices"][0]
    built = report["params"]["float32"]["built"]
    assert report["params"]["float32"]["kernel"] == "3xtf32" and built["default"]["fell_back"]
    assert built["tf32"]["fell_back"]
    assert f"built, default: " in r.output and f"(fell back: {built['default']['fell_back']})" in r.output


def test_devices_none_found_explains_nvidia_icd(runner, monkeypatch):
    """No platform, but NVIDIA's library is installed and unregistered: say how to register it."""
    monkeypatch.setattr(dgemm.opencl.discovery, "list_devices", lambda: [])

    def fake_glob(pattern):
        if pattern.startswith("/etc/OpenCL/vendors"):
            return []
        return ["/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1"] if "nvidia-opencl" in pattern else []
    monkeypatch.setattr(dgemm.opencl.discovery.glob, "glob", fake_glob)
    for args in (["devices"], ["devices", "--json"]):
        r = runner.invoke(cli, args)
        assert r.exit_code == 1
        assert "No OpenCL device found" in r.output
        assert "echo libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd" in r.output


# -- random ---------------------------------------------------------------------
def test_random_writes_a_standard_normal_array(runner, tmp_path):
    path = tmp_path / "r.zarr"
    r = runner.invoke(cli, ["random", str(path), "--shape", "300", "250", "--chunks", "64", "100",
                            "--dtype", "float32", "--seed", "7"])
    assert r.exit_code == 0, r.output
    assert "300 x 250 float32" in r.output
    z = zarr.open_array(path, mode="r")
    assert z.shape == (300, 250) and z.chunks == (64, 100) and z.dtype == np.float32
    x = z[:]
    assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02
    assert np.all(x != 0)  # every chunk, edges included, was written
    again = random_zarr(tmp_path / "s.zarr", (300, 250), (64, 100), "float32", seed=7)
    np.testing.assert_array_equal(again[:], x)


def test_random_writes_panels_of_whole_chunks(tmp_path, monkeypatch):
    """Never more than a panel in memory: row panels of whole chunks, wide rows cut by columns."""
    writes = []
    real = zarr.Array.__setitem__

    def spy(self, sel, value):
        writes.append((sel, np.shape(value)))
        return real(self, sel, value)
    monkeypatch.setattr(zarr.Array, "__setitem__", spy)
    monkeypatch.setattr(dgemm.benchmarks.inputs, "PANEL_BYTES", 2 * 10 * 8 * 8)   # two 10 x 8 float64 chunks
    random_zarr(tmp_path / "p.zarr", (25, 30), (10, 8), "float64", seed=0)
    shapes = [s for _, s in writes]
    assert max(r * c for r, c in shapes) <= 2 * 10 * 8
    for sel, _ in writes:
        rows, cols = sel
        assert rows.start % 10 == 0 and cols.start % 8 == 0
        assert rows.stop in (rows.start + 10, 25) and (cols.stop - cols.start) % 8 in (0, 30 % 8)
    assert sum(r * c for r, c in shapes) == 25 * 30


def test_random_refuses_an_existing_path(runner, tmp_path):
    path = tmp_path / "r.zarr"
    args = ["random", str(path), "--shape", "20", "10", "--chunks", "8", "8"]
    assert runner.invoke(cli, args + ["--seed", "1"]).exit_code == 0
    before = zarr.open_array(path, mode="r")[:]
    r = runner.invoke(cli, args + ["--seed", "2"])
    assert r.exit_code == 2
    assert "already exists" in r.output and "--overwrite" in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], before)

    r = runner.invoke(cli, args + ["--seed", "2", "--overwrite"])
    assert r.exit_code == 0, r.output
    assert not np.array_equal(zarr.open_array(path, mode="r")[:], before)


def test_random_overwrite_replaces_a_plain_file(runner, tmp_path):
    path = tmp_path / "f.zarr"
    path.write_text("not zarr")
    args = ["random", str(path), "--shape", "4", "4", "--chunks", "2", "2"]
    assert runner.invoke(cli, args).exit_code == 2
    assert path.read_text() == "not zarr"
    assert runner.invoke(cli, args + ["--overwrite"]).exit_code == 0
    assert zarr.open_array(path, mode="r").shape == (4, 4)


@pytest.mark.parametrize("args, message", [
    (["--shape", "-3", "4", "--chunks", "2", "2"], "'--shape': -3 is not in the range x>=0"),
    (["--shape", "3", "4", "--chunks", "0", "2"], "'--chunks': 0 is not in the range x>=1"),
    (["--shape", "3", "--chunks", "2", "2"], "'--shape'"),
    (["--shape", "3", "x", "--chunks", "2", "2"], "'x' is not a valid integer"),
    (["--chunks", "2", "2"], "Missing option '--shape'"),
    (["--shape", "3", "4", "--chunks", "2", "2", "--dtype", "int32"], "'int32' is not one of"),
])
def test_random_bad_arguments_write_nothing(runner, tmp_path, args, message):
    path = tmp_path / "bad.zarr"
    r = runner.invoke(cli, ["random", str(path), *args])
    assert r.exit_code == 2
    assert message in r.output
    assert not path.exists()


def test_random_zarr_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="shape must be non-negative"):
        random_zarr(tmp_path / "x.zarr", (-1, 2), (1, 1))
    with pytest.raises(ValueError, match="chunks must be two integers"):
        random_zarr(tmp_path / "x.zarr", (2, 2), (1,))
    with pytest.raises(TypeError, match="float32 or float64"):
        random_zarr(tmp_path / "x.zarr", (2, 2), (1, 1), "int8")
    assert not (tmp_path / "x.zarr").exists()
    empty = random_zarr(tmp_path / "e.zarr", (0, 5), (4, 4))
    assert empty.shape == (0, 5)


# -- plan -----------------------------------------------------------------------
def test_plan_explains_the_blocks(runner, ab):
    pa, pb, _, _ = ab
    r = runner.invoke(cli, ["plan", str(pa), str(pb)])
    assert r.exit_code == 0, r.output
    assert "C[300 x 100] = A[300 x 200] @ B[200 x 100]  (float32)" in r.output
    assert "GEMM tasks" in r.output
    r = runner.invoke(cli, ["plan", str(pa), str(pb), "--block", "64,64,32", "--dtype", "float64"])
    assert r.exit_code == 0, r.output
    assert "blocks: 64 x 64 (C), k-blocks of 32" in r.output and "(float64)" in r.output
    assert "grid: 5 x 2 C blocks, 7 k-blocks" in r.output


def _zstd_pair(tmp_path):
    """A (4096 x 2048) @ B (2048 x 1024), float32 in zstd chunks of 512 x 512 (Zarr v3's default codec)."""
    import zarr

    rng = np.random.default_rng()
    out = []
    for name, shape in (("a", (4096, 2048)), ("b", (2048, 1024))):
        arr = zarr.create_array(tmp_path / f"{name}.zarr", shape=shape, chunks=(512, 512), dtype="float32",
                                compressors=zarr.codecs.ZstdCodec(level=3))
        arr[:] = rng.standard_normal(shape, dtype=np.float32)
        out.append(tmp_path / f"{name}.zarr")
    return out


def test_plan_counts_what_the_devices_codecs_keep_as_a_run_does(runner, tmp_path, monkeypatch):
    """``dgemm plan`` on an (emulated) H100 with zstd inputs: its panel cache is the device's share less a block
    product's buffers and what the decode slots keep under the device-codecs setting read here, as a worker there
    counts them (client.codecs_room): nothing under off, the slots' bytes under auto (on for zstd on a GPU), on and
    share, nothing where the host cache serves the blocks; the command says so."""
    from dgemm.cli.data import _panel_cache
    from dgemm.client.plan import make_plan
    from dgemm.sizes import cache_budget
    from dgemm.storage import Operand
    from dgemm.worker import decoding

    gpu, _, _ = _fake_devices()
    monkeypatch.setattr(dgemm.opencl.discovery, "list_devices", lambda: [gpu])
    monkeypatch.delenv("DGEMM_DEVICES", raising=False)
    monkeypatch.delenv("DGEMM_DEVICE_MEMORY_LIMIT", raising=False)
    pa, pb = _zstd_pair(tmp_path)
    A, B = Operand(str(pa), "a"), Operand(str(pb), "b")
    p = make_plan(4096, 1024, 2048, np.dtype("float32"), (128, 128, 16), a_chunks=A.chunks, b_chunks=B.chunks,
                  target=(2048, 1024, 1024), n_workers=1, device_memory=gpu.global_mem, exact=True)
    got = {}
    for mode in ("off", "auto", "on", "share"):
        monkeypatch.setenv("DGEMM_DEVICE_CODECS", mode)
        got[mode] = _panel_cache(p, [gpu], A, B, host_cache=False)
    cache, kept = got["off"]
    assert kept == 0 and cache == 0.9 * cache_budget(gpu.global_mem, p.device_bytes(), "GPU")
    share = cache_budget(gpu.global_mem, 0, "GPU")
    for mode, shared in (("on", False), ("share", True)):
        blocks = [decoding.DeviceDecoded(A.block_refs(p.rows, p.ks)[0](0, 0), shared),     # (every block alike)
                  decoding.DeviceDecoded(B.block_refs(p.ks, p.cols)[0](0, 0), shared)]
        assert got[mode][1] == decoding.device_bytes(blocks, share) > 0, (mode, got[mode])
        assert got[mode][0] == pytest.approx(cache - 0.9 * got[mode][1], abs=1), (mode, got[mode])
    assert got["on"][1] > got["share"][1], "on's readers queue for the slots and share calls of several blocks"
    assert got["auto"] == got["on"], "auto is on for a GPU's zstd inputs (dgemm.opencl.codecs.AUTO)"
    assert _panel_cache(p, [gpu], A, B, host_cache=True)[1] == 0
    assert _panel_cache(p, [], A, B, host_cache=False) == (None, 0)
    monkeypatch.setenv("DGEMM_DEVICE_CODECS", "off")
    monkeypatch.setenv("DGEMM_DEVICE_MEMORY_LIMIT", "40GiB")     # (a device shared with other jobs, as a worker)
    assert _panel_cache(p, [gpu], A, B, host_cache=False)[0] == 0.9 * cache_budget(40 << 30, p.device_bytes(), "GPU")
    monkeypatch.setenv("DGEMM_DEVICE_CODECS", "on")
    monkeypatch.delenv("DGEMM_DEVICE_MEMORY_LIMIT")
    r = runner.invoke(cli, ["plan", str(pa), str(pb), "--block", "2048,1024,1024"])
    assert r.exit_code == 0, r.output
    assert "its codecs keep (device-codecs: on; C's encoder not counted)" in r.output, r.output


@pytest.mark.parametrize("which, block, message", [
    ("aa", None, "shapes do not match"),
    ("missing", None, "is not a Zarr array"),
    ("ab", "0", "must be one positive integer"),
    ("ab", "1,2", "must be one positive integer or three"),
    ("ab", "big", "is not an integer"),
])
def test_plan_errors(runner, ab, tmp_path, which, block, message):
    pa, pb, _, _ = ab
    x, y = {"aa": (pa, pa), "missing": (tmp_path / "nope.zarr", pb), "ab": (pa, pb)}[which]
    r = runner.invoke(cli, ["plan", str(x), str(y)] + (["--block", block] if block else []))
    assert r.exit_code == 2
    assert message in r.output and "Traceback" not in r.output


# -- matmul ---------------------------------------------------------------------
def test_matmul_refuses_an_existing_output(runner, ab, tmp_path, no_cluster):
    pa, pb, _, _ = ab
    out = tmp_path / "c.zarr"
    random_zarr(out, (300, 100), (100, 100), "float32", seed=3)
    before = zarr.open_array(out, mode="r")[:]
    r = runner.invoke(cli, ["matmul", str(pa), str(pb), str(out), "--no-progress"])
    assert r.exit_code == 2
    assert r.output.strip() == f"Error: out {str(out)!r} already exists; pass --overwrite to replace it"
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], before)


@pytest.mark.parametrize("case, message", [
    ("shapes", "shapes do not match"),
    ("missing", "is not a Zarr array"),
    ("int", "dgemm multiplies float32 and float64 only"),
    ("block", "must be one positive integer"),
    ("devices", "--devices chooses devices for a local cluster"),
    ("inplace", "OUT is the same array as B"),
])
def test_matmul_argument_errors_write_nothing(runner, ab, tmp_path, no_cluster, case, message):
    pa, pb, _, _ = ab
    out = tmp_path / "c.zarr"
    args = {"shapes": [pa, pa, out], "missing": [tmp_path / "nope.zarr", pb, out],
            "int": [pa, tmp_path / "i.zarr", out], "block": [pa, pb, out, "--block", "-4"],
            "devices": [pa, pb, out, "--scheduler", "tcp://127.0.0.1:1", "--devices", "cpu"],
            "inplace": [pa, out, out, "--overwrite"]}[case]
    if case == "int":
        zarr.create_array(tmp_path / "i.zarr", shape=(200, 100), chunks=(64, 64), dtype="int32")
    if case == "inplace":  # would be zeroed by --overwrite before being read
        (tmp_path / "c.zarr").symlink_to(pb)
    r = runner.invoke(cli, ["matmul", *map(str, args), "--no-progress"])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output
    if case != "block":  # click's own option checks add its usage lines
        assert len(r.output.strip().splitlines()) == 1
    if case == "inplace":
        np.testing.assert_array_equal(zarr.open_array(pb, mode="r")[:], ab[3][:])
    else:
        assert not out.exists()
    if case == "int":
        assert "--dtype" in r.output


def test_debug_shows_the_real_exception(runner, ab, tmp_path, no_cluster):
    pa, _, _, _ = ab
    r = runner.invoke(cli, ["--debug", "matmul", str(pa), str(pa), str(tmp_path / "c.zarr")])
    assert isinstance(r.exception, ValueError) and "shapes do not match" in str(r.exception)


def test_matmul_unreachable_scheduler(runner, ab, tmp_path, monkeypatch):
    import distributed

    def unreachable(address, **kwargs):
        raise OSError(f"Timed out trying to connect to {address}")
    monkeypatch.setattr(distributed, "Client", unreachable)
    pa, pb, _, _ = ab
    r = runner.invoke(cli, ["matmul", str(pa), str(pb), str(tmp_path / "c.zarr"), "--scheduler", "tcp://10.0.0.1:8786"])
    assert r.exit_code == 1
    assert "cannot connect to the scheduler at tcp://10.0.0.1:8786" in r.output
    assert not (tmp_path / "c.zarr").exists()


@needs_device
def test_matmul_on_the_local_cluster_with_a_cast(runner, ab, tmp_path):
    """A real run: float32 inputs cast to float64 on the way, several blocks along every axis."""
    pa, pb, a, b = ab
    out = tmp_path / "c.zarr"
    report = tmp_path / "report.html"
    r = runner.invoke(cli, ["matmul", str(pa), str(pb), str(out), "--dtype", "float64", "--block", "64",
                            "--no-progress", "--report", str(report)])
    assert r.exit_code == 0, r.output
    assert "shape: 300 x 100 float64" in r.output and "TFLOPS: " in r.output
    assert f"written to: {out}" in r.output
    # Dask's performance report of the run, from the local cluster the command started
    assert f"performance report: {report}" in r.output
    html = report.read_text()
    assert "Dask Performance Report" in html and "dgemm-gemm" in html
    c = dgemm.open_result(out)
    assert c.dtype == np.float64
    ref = a[:].astype(np.float64) @ b[:].astype(np.float64)
    np.testing.assert_allclose(c[:], ref, rtol=1e-10, atol=1e-10)


@needs_device
def test_matmul_on_a_scheduler_with_a_report_and_a_span(runner, ab, tmp_path, cluster, client):
    """--scheduler: the command's own client on a running cluster; the run is one span, dgemm-matmul."""
    pa, pb, a, b = ab
    out, report = tmp_path / "c.zarr", tmp_path / "r.html"
    r = runner.invoke(cli, ["matmul", str(pa), str(pb), str(out), "--scheduler", cluster.scheduler_address,
                            "--block", "64", "--report", str(report)])
    assert r.exit_code == 0, r.output
    np.testing.assert_allclose(dgemm.open_result(out)[:], a[:] @ b[:], rtol=1e-4, atol=1e-4)
    assert "dgemm-gemm" in report.read_text()

    def spans(dask_scheduler):
        ext = dask_scheduler.extensions["spans"]
        return [(s.name, sorted(tg.name.split("-")[1] for tg in s.groups if tg.name.startswith("dgemm-")))
                for s in ext.spans.values()]
    found = [groups for name, groups in client.run_on_scheduler(spans) if name == ("dgemm-matmul",)]
    assert found and any({"gemm", "store"} <= set(g) for g in found), found


def test_matmul_report_is_self_contained(runner, ab, tmp_path, cluster):
    """--report loaded Bokeh from its CDN, a blank page without internet: the report carries Bokeh's
    JavaScript itself and no script comes from http(s)."""
    import re

    from bokeh.resources import INLINE

    pa, pb, _, _ = ab
    report = tmp_path / "r.html"
    r = runner.invoke(cli, ["matmul", str(pa), str(pb), str(tmp_path / "c.zarr"), "--scheduler",
                            cluster.scheduler_address, "--block", "64", "--no-progress", "--report", str(report)])
    assert r.exit_code == 0, r.output
    html = report.read_text()
    remote = re.findall(r"""<script[^>]*\bsrc\s*=\s*["']?(?:https?:)?//[^"'\s>]*""", html, flags=re.I)
    assert not remote, remote
    assert "cdn.bokeh.org" not in html
    bokeh_js = INLINE.js_raw[0]          # bokeh.min.js itself
    assert len(bokeh_js) > 100_000 and bokeh_js[:2000] in html and bokeh_js[-2000:] in html
    assert "dgemm-gemm" in html


def test_matmul_report_folder_must_exist(runner, ab, tmp_path, no_cluster):
    pa, pb, _, _ = ab
    r = runner.invoke(cli, ["matmul", str(pa), str(pb), str(tmp_path / "c.zarr"),
                            "--report", str(tmp_path / "nowhere" / "r.html")])
    assert r.exit_code == 2 and "does not exist" in r.output
    assert not (tmp_path / "c.zarr").exists()


# -- demo -----------------------------------------------------------------------
def test_check_sample_reads_only_sampled_rows_and_columns(tmp_path):
    a = random_zarr(tmp_path / "a.zarr", (40, 30), (8, 8), "float32", seed=0)
    b = random_zarr(tmp_path / "b.zarr", (30, 50), (8, 8), "float32", seed=1)
    good = (a[:].astype(np.float64) @ b[:].astype(np.float64)).astype(np.float32)
    r = check_sample(a, b, good)
    assert r["passed"] and r["entries"] == 64 and r["max_rel_err"] < 1e-6
    bad = good.copy()
    bad[-1, :] = 0   # the edge row is always sampled
    assert not check_sample(a, b, bad)["passed"]
    nan = good.copy()
    nan[0, 0] = np.nan
    assert not check_sample(a, b, nan)["passed"]
    tiny = check_sample(np.ones((3, 2)), np.ones((2, 5)), np.full((3, 5), 2.0))
    assert tiny["passed"] and tiny["entries"] == 15  # fewer than 64 entries: all of them


def test_demo_refuses_a_used_keep_folder(runner, tmp_path, no_cluster):
    (tmp_path / "keep" / "c.zarr").mkdir(parents=True)
    r = runner.invoke(cli, ["demo", "--size", "8", "--keep", str(tmp_path / "keep")])
    assert r.exit_code == 2
    assert "c.zarr already exists" in r.output
    assert not (tmp_path / "keep" / "a.zarr").exists()


def test_demo_reports_a_failed_check(runner, tmp_path, monkeypatch):
    figures = {"device": "X", "devices": ["X"], "workers": 1, "date": "2026-01-01T00:00:00+00:00", "size": 8,
               "dtype": "float32", "seconds": 1.0, "tflops": 1e-9, "max_rel_err": float("nan"),
               "tolerance": 1e-6, "entries_checked": 64, "passed": False, "dashboard": "http://x/status",
               "kernel_build_seconds": 0.0, "host": "h", "dgemm_version": "0", "folder": None}
    monkeypatch.setattr(dgemm.benchmarks.demo, "run_demo", lambda **kw: dict(figures))
    path = tmp_path / "results" / "r.json"
    r = runner.invoke(cli, ["demo", "--size", "8", "--json", str(path)])
    assert r.exit_code == 1
    assert "FAILED" in r.output and "does not match numpy" in r.output
    saved = json.loads(path.read_text())
    assert saved["passed"] is False and saved["max_rel_err"] is None


def test_demo_default_size(monkeypatch):
    gpu, _, cpu = _fake_devices()
    monkeypatch.setattr(dgemm.opencl.discovery, "list_devices", lambda: [cpu])
    assert dgemm.benchmarks.demo.default_size(None) == 1024
    monkeypatch.setattr(dgemm.opencl.discovery, "list_devices", lambda: [gpu, cpu])
    assert dgemm.benchmarks.demo.default_size(None) == 16384
    assert dgemm.benchmarks.demo.default_size("cpu") == 1024


@needs_device
def test_demo_end_to_end(tmp_path):
    """``dgemm demo --size 256`` in its own process: cluster start, product, check, JSON."""
    script = Path(sys.executable).with_name("dgemm")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "dgemm.cli"]
    path = tmp_path / "bench" / "demo.json"
    p = subprocess.run(cmd + ["demo", "--size", "256", "--json", str(path)], capture_output=True, text=True,
                       timeout=180, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "TFLOPS: " in p.stdout and ": OK" in p.stdout and "dashboard: http" in p.stdout
    r = json.loads(path.read_text())
    assert r["size"] == 256 and r["dtype"] == "float32" and r["passed"] is True
    assert r["entries_checked"] >= 64 and r["max_rel_err"] <= r["tolerance"]
    assert r["tflops"] > 0 and r["seconds"] > 0 and r["device"]
    assert set(r) >= {"device", "date", "size", "dtype", "seconds", "tflops", "max_rel_err", "dashboard"}


def test_devices_lists_the_tensor_core_paths(runner, monkeypatch, tmp_path):
    """An sm_90 GPU shows DMMA (its float64 default) and the TF32 paths; the CPU device only FMA."""
    monkeypatch.setattr(dgemm.opencl.discovery, "list_devices", _fake_devices)
    monkeypatch.setenv("DGEMM_TUNING_DB", str(tmp_path / "none.json"))
    r = runner.invoke(cli, ["devices", "--json"])
    assert r.exit_code == 0, r.output
    by_name = {d["name"]: d for d in json.loads(r.output)["devices"]}
    h100, cpu = by_name["NVIDIA H100 80GB HBM3"], by_name["pthread-Some CPU"]
    assert h100["params"]["float64"]["kernel"] == "dmma" and h100["params"]["float64"]["paths"] == ["fma", "dmma"]
    # float32's default never loses accuracy: on Hopper that is 3xTF32 on wgmma, measured at least as
    # accurate as the FMA kernel (and twice as fast; README, "Kernels and precision")
    assert h100["params"]["float32"]["kernel"] == "3xtf32"
    assert h100["params"]["float32"]["paths"] == ["fma", "3xtf32", "tf32"]
    assert cpu["params"]["float32"]["paths"] == ["fma"] and cpu["params"]["float64"]["paths"] == ["fma"]
    r = runner.invoke(cli, ["devices"])
    assert "paths (precision=): fma, dmma (default)" in r.output


def test_matmul_resume_and_precision_options(runner, tmp_path, client, monkeypatch):
    """--resume finishes an output (here: already complete, so nothing runs); --precision is checked."""
    rng = np.random.default_rng(3)
    import zarr
    for name, shape in (("a", (60, 40)), ("b", (40, 30))):
        z = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=shape, chunks=(32, 32), dtype="f8")
        z[...] = rng.standard_normal(shape)
    class Borrowed:  # the command closes the client it opens; the session's must stay open
        def __enter__(self):
            return client

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr("distributed.Client", lambda *a, **k: Borrowed())
    args = ["matmul", str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), str(tmp_path / "c.zarr"),
            "--scheduler", "tcp://stand-in:0", "--no-progress"]
    r = runner.invoke(cli, args + ["--precision", "fma"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, args + ["--resume"])            # a different precision: refused, named
    assert r.exit_code == 2 and "precision was 'fma', now None" in r.output
    r = runner.invoke(cli, args + ["--resume", "--precision", "fma"])
    assert r.exit_code == 0, r.output
    a, b = (zarr.open_array(str(tmp_path / f"{n}.zarr"))[...] for n in "ab")
    np.testing.assert_allclose(zarr.open_array(str(tmp_path / "c.zarr"))[...], a @ b, rtol=1e-12, atol=1e-12)
    r = runner.invoke(cli, args + ["--overwrite", "--precision", "tf32"])
    assert r.exit_code == 2 and "precision='tf32' is not available for float64" in r.output


def test_plan_of_huge_metadata_only_arrays_answers_at_once(tmp_path):
    """Issue 14, case 10: 10**7 x 10**7 took minutes and 10 GB; now every size plans in O(workers).

    The arrays hold metadata only (no chunk is written).  ``timeout`` only guards
    against a hang; the output must describe the grid, and a shape no index can
    address must get its one-line error.
    """
    import math
    import os
    import re

    def zeros(name, shape, chunks=(1000, 1000)):
        zarr.create_array(store=str(tmp_path / name), shape=shape, chunks=chunks, dtype="float64")
        return str(tmp_path / name)

    def plan(a, b, *extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DGEMM_DEVICE")}
        return subprocess.run([sys.executable, "-m", "dgemm", "plan", a, b, "--workers", "4", *extra],
                              capture_output=True, text=True, timeout=60, env=env)

    for size in (10**7, 2**62):
        x = zeros(f"x{size}.zarr", (size, size))
        r = plan(x, x)
        assert r.returncode == 0, r.stderr
        assert f"C[{size} x {size}] = A[{size} x {size}] @ B[{size} x {size}]  (float64)" in r.stdout
        bm, bn = map(int, re.search(r"blocks: (\d+) x (\d+) \(C\)", r.stdout).groups())
        rows, cols, nk = map(int, re.search(r"grid: (\d+) x (\d+) C blocks, (\d+) k-blocks", r.stdout).groups())
        assert (rows, cols) == (math.ceil(size / bm), math.ceil(size / bn))
        assert f"{rows * cols} GEMM tasks" in r.stdout
        assert "placement: 4 worker(s)" in r.stdout and "time floor" in r.stdout
    a, b = zeros("a.zarr", (10**31, 3 * 10**31)), zeros("b.zarr", (3 * 10**31, 10**31))
    r = plan(a, b)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1
    assert "M (rows of C) is 10000000000000000000000000000000, beyond 2**63 - 1" in r.stderr


@needs_device
def test_a_worker_error_is_one_line_and_verbose_shows_its_traceback(tmp_path, cluster, rng):
    """Issue 14, case 11: a chunk no worker can read printed a 130-line traceback.

    Now: exit status 1 and one line on stderr, the worker's message (array, rows,
    columns, chunk and store key); ``-v``/``--verbose`` (and the former ``--debug``)
    print the traceback.  Run as the user runs it, in a subprocess against a cluster.
    """
    import os

    a = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(96, 64), chunks=(32, 32), dtype="float64")
    a[...] = rng.standard_normal((96, 64))
    b = zarr.create_array(store=str(tmp_path / "b.zarr"), shape=(64, 40), chunks=(32, 32), dtype="float64")
    b[...] = rng.standard_normal((64, 40))
    (tmp_path / "a.zarr" / "c" / "1" / "1").write_bytes(b"\x00not zstd at all" * 10)   # damaged, compressed
    env = {k: v for k, v in os.environ.items() if not k.startswith("DGEMM_TEST")}

    def matmul(*flags, out):
        return subprocess.run([sys.executable, "-m", "dgemm", *flags, "matmul", str(tmp_path / "a.zarr"),
                               str(tmp_path / "b.zarr"), str(tmp_path / out), "--scheduler",
                               cluster.scheduler_address, "--block", "32", "--no-progress"],
                              capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)

    r = matmul(out="c.zarr")
    assert r.returncode == 1, r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"Error: dgemm could not read Zarr array file://{tmp_path}/a.zarr rows ")
    assert "chunk (1, 1) (store key 'c/1/1')" in lines[0]
    assert zarr.open_array(str(tmp_path / "c.zarr"), mode="r").attrs[COMPLETE_ATTR]["complete"] is False
    for flag, out in (("-v", "v.zarr"), ("--verbose", "verbose.zarr"), ("--debug", "debug.zarr")):
        r = matmul(flag, out=out)
        assert r.returncode == 1 and "Traceback (most recent call last)" in r.stderr, (flag, r.stderr)
        assert r.stderr.splitlines()[-1].startswith("OSError: dgemm could not read Zarr array"), (flag, r.stderr)


def test_unexpected_errors_are_one_line_that_names_verbose(runner, ab, tmp_path, monkeypatch):
    """Not the user's mistake, not the machines': its type and message on one line, and how to see more."""
    def broken(*args, **kwargs):
        raise ZeroDivisionError("something dgemm did not expect")
    monkeypatch.setattr(dgemm, "matmul", broken)
    pa, pb, _, _ = ab
    r = runner.invoke(cli, ["matmul", str(pa), str(pb), str(tmp_path / "c.zarr"), "--no-progress"])
    assert r.exit_code == 1
    assert r.output.strip() == ("Error: ZeroDivisionError: something dgemm did not expect "
                                "(dgemm --verbose shows the traceback)")
    r = runner.invoke(cli, ["--verbose", "matmul", str(pa), str(pb), str(tmp_path / "c.zarr"), "--no-progress"])
    assert isinstance(r.exception, ZeroDivisionError)

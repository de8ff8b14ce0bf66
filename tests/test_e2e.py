"""``dgemm bench e2e`` and :mod:`dgemm.benchmarks.e2e`: the record of an end-to-end run is complete
and correct, peers that cannot run say why, a wrong result fails the run.

Runs on the session's two-worker cluster (the ``client`` fixture, never
closed here) at tiny sizes; only the scaling test starts a cluster of its
own (one worker).  The CLI tests lend the session client to ``--scheduler``.
No test asserts on speed.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import dgemm
import dgemm.cluster
from dgemm.benchmarks import e2e, peers
from dgemm.benchmarks.inputs import random_zarr
from dgemm.benchmarks.records import device_slug
from dgemm.cli import cli
from dgemm.opencl.discovery import list_devices

DEVICES = list_devices()
needs_device = pytest.mark.skipif(not DEVICES, reason="no OpenCL device (pip install pocl-binary-distribution)")
# the counters every dgemm worker has had from the start (the engine may add more)
BASE_COUNTERS = {"flops", "bytes_up", "bytes_down", "kernel_seconds", "busy_seconds", "blocks",
                 "transfer_seconds", "read_wait_seconds"}
TOP_KEYS = {"benchmark", "date", "commit", "command", "dgemm_version", "device", "devices", "workers", "driver",
            "m", "n", "k", "dtype", "chunks", "reps", "inputs", "kernel", "dgemm", "dgemm_small", "peers",
            "ratios", "scaling", "failures", "errors", "ok", "store", "kept", "host_rates"}


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def no_cuda(monkeypatch):
    """Neither torch nor cupy importable, and no nvidia-smi, whatever is installed."""
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "cupy", None)
    real_which = e2e.shutil.which
    monkeypatch.setattr(e2e.shutil, "which", lambda name, *a, **k: None if name == "nvidia-smi"
                        else real_which(name, *a, **k))


@pytest.fixture
def lend(monkeypatch, client):
    """``--scheduler`` gets the session's client; the command's ``with`` must not close it."""
    class Borrowed:
        def __enter__(self):
            return client

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr("distributed.Client", lambda *a, **k: Borrowed())
    return ["--scheduler", "tcp://stand-in:0"]


@pytest.fixture
def wrong_result(monkeypatch):
    """dgemm.matmul that stores a wrong C[0, 0] (a corner: always in the checked sample)."""
    real = dgemm.matmul

    def corrupt(*args, **kwargs):
        c = real(*args, **kwargs)
        zarr.open_array(kwargs["out"], mode="r+")[0, 0] = 1e6
        return c

    monkeypatch.setattr(dgemm, "matmul", corrupt)


def _only_json(folder: Path):
    files = sorted(folder.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text()), files[0]


# -- the benchmark on the session cluster ------------------------------------------------
@needs_device
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_record_is_complete_and_correct(client, tmp_path, dtype, no_cuda):
    rec, path = e2e.e2e_bench(256, chunks=128, dtype=dtype, client=client, out_dir=tmp_path / "out",
                              store=tmp_path / "store", log=None)
    assert json.loads(path.read_text())["dgemm"]["tflops"] == rec["dgemm"]["tflops"]
    assert TOP_KEYS <= set(rec)
    assert rec["ok"] and rec["failures"] == 0 and rec["errors"] == [], rec["errors"]
    assert (rec["m"], rec["n"], rec["k"], rec["dtype"], rec["workers"]) == (256, 256, 256, dtype, 2)
    itemsize = np.dtype(dtype).itemsize
    assert rec["inputs"]["a"]["bytes"] == rec["inputs"]["b"]["bytes"] == 256 * 256 * itemsize
    assert rec["inputs"]["a"]["chunks"] == [128, 128]

    d = rec["dgemm"]
    assert d["ok"] and d["check"]["passed"] and d["check"]["max_rel_err"] <= d["check"]["tolerance"]
    assert d["tflops"] > 0 and d["seconds"] > 0 and len(d["times"]) == 1
    total = d["counters"]["total"]
    assert BASE_COUNTERS <= set(total)
    assert total["flops"] == pytest.approx(2 * 256 ** 3)  # the timed run only: the warm-up came before
    assert total["blocks"] >= 1
    assert set(d["counters"]["per_worker"]) and all(
        w["pid"] > 0 and BASE_COUNTERS <= set(w["counters"]) for w in d["counters"]["per_worker"].values())
    split = d["split"]
    assert split["seconds"]["kernel_seconds"] > 0
    assert all(v >= 0 for v in split["seconds"].values()) and all(v >= 0 for v in split["share"].values())
    assert d["bytes"]["inputs"] == 2 * 256 * 256 * itemsize and d["bytes"]["output"] == 256 * 256 * itemsize
    assert d["memory"]["rss_total_peak_bytes"] > 0
    assert d["memory"]["gpu"] is None and "nvidia-smi" in d["memory"]["gpu_skipped"]
    assert "256" in d["plan"] and d["attrs"]["complete"] is True

    hr = rec["host_rates"]        # the host's floor, measured beside the run
    assert set(hr["read_gbps"]) == {"1", "4", "8"} and all(v > 0 for v in hr["read_gbps"].values())
    assert set(hr["write_gbps"]) == {"1", "4"} and all(v > 0 for v in hr["write_gbps"].values())
    copy = hr["copy_gbps"]
    assert hr["copy_skipped"] is None and copy["bytes"] > 0
    assert all(copy[k] > 0 for k in ("upload_pageable", "upload_pinned", "download_pageable"))
    assert "host rates, GB/s: store read" in e2e.format_table(rec)

    k = rec["kernel"]
    assert k["ok"] and k["tflops"] > 0 and (k["m"], k["n"], k["k"]) == (256, 256, 256)
    p = rec["peers"]
    assert p["dask_cupy"] is None and p["dask_cupy_skipped"] == "cupy is not installed"
    assert p["cublas"] is None and "torch is not installed" in p["cublas_skipped"]
    assert p["dask_numpy"]["check"]["passed"] and p["dask_numpy"]["tflops"] > 0
    assert rec["small_is_full"] and rec["dgemm_small"] is None  # 256 <= 4096: the main run is compared
    r = rec["ratios"]
    assert r["dgemm_to_kernel"] > 0 and r["dgemm_small_to_dask_numpy"] > 0
    assert r["dgemm_to_dask_cupy"] is None and r["dgemm_to_cublas"] is None
    assert list((tmp_path / "store").iterdir()) == []  # nothing kept
    assert "dgemm e2e (2 worker(s))" in e2e.format_table(rec)


@needs_device
def test_small_size_and_keep(client, tmp_path, no_cuda):
    """A numpy size below the full one runs dgemm there too; --keep keeps every Zarr file."""
    rec, _ = e2e.e2e_bench(shape=(192, 160, 128), chunks=64, numpy_size=96, reps=2, keep=True, client=client,
                           out_dir=tmp_path, store=tmp_path / "store", log=None)
    assert rec["ok"], rec["errors"]
    assert (rec["dgemm"]["m"], rec["dgemm"]["n"], rec["dgemm"]["k"]) == (192, 160, 128)
    assert len(rec["dgemm"]["times"]) == 2
    small = rec["dgemm_small"]
    assert (small["m"], small["n"], small["k"]) == (96, 96, 96) and small["ok"]
    assert (rec["peers"]["dask_numpy"]["m"], rec["peers"]["dask_numpy"]["k"]) == (96, 96)
    folder = Path(rec["store"])
    assert rec["kept"] and folder.parent == tmp_path / "store"
    names = {p.name for p in folder.iterdir()}
    assert {"a.zarr", "b.zarr", "a_small.zarr", "b_small.zarr", "c_dgemm.zarr", "c_dgemm_small.zarr",
            "c_numpy.zarr"} <= names
    c = zarr.open_array(str(folder / "c_dgemm.zarr"))
    a, b = zarr.open_array(str(folder / "a.zarr"))[...], zarr.open_array(str(folder / "b.zarr"))[...]
    np.testing.assert_allclose(c[...], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@needs_device
def test_scaling_table_on_one_then_two_devices(client, tmp_path, no_cuda):
    rec, _ = e2e.e2e_bench(128, chunks=64, devices="cpu,cpu", gpus=[2, 1], peers=False, client=client,
                           out_dir=tmp_path, log=None, compressors=None)
    assert rec["ok"], rec["errors"]
    assert rec["dgemm"]["output_compressors"] == [] and rec["compressors"] is None
    assert rec["dgemm_small"] is None and "inputs_small" not in rec      # only the numpy peer needs it
    rows = rec["scaling"]
    assert [r["gpus"] for r in rows] == [1, 2]
    one, two = rows
    assert not one["reused_main_run"] and two["reused_main_run"]   # the session cluster has the two
    assert one["speedup"] == 1 and one["efficiency"] == 1
    assert all(r["ok"] and r["tflops"] > 0 for r in rows)
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert rec["peers"]["dask_numpy"] is None and rec["peers"]["dask_numpy_skipped"] == "--no-peers"
    for row in rows:     # each worker's share of the work and where its time went
        assert len(row["workers"]) == row["gpus"]
        assert all(w["kernel_seconds"] > 0 and w["bytes_read"] > 0 for w in row["workers"].values() if w["blocks"])
        assert len(row["times"]) == 1 and row["best_seconds"] == row["seconds"]
    one_blocks, two_blocks = (sum(w["blocks"] for w in r["workers"].values()) for r in rows)
    assert one_blocks == two_blocks > 0                                   # the same plan, shared out
    table = e2e.format_table(rec)
    assert "speed-up" in table and " blocks; busy " in table


@needs_device
def test_a_wrong_result_fails_the_record(client, tmp_path, wrong_result, no_cuda):
    rec, path = e2e.e2e_bench(128, chunks=64, client=client, peers=False, out_dir=tmp_path, log=None)
    assert not rec["ok"] and rec["failures"] >= 1
    assert rec["dgemm"]["status"] == "FAILED" and not rec["dgemm"]["check"]["passed"]
    assert any(e["stage"] == "dgemm" and "wrong result" in e["error"] for e in rec["errors"])
    assert json.loads(path.read_text())["ok"] is False
    assert "FAILURE" in e2e.format_table(rec)


# -- the command ---------------------------------------------------------------------------
@needs_device
def test_cli_writes_the_json_record(runner, tmp_path, lend, no_cuda):
    out = tmp_path / "results"
    r = runner.invoke(cli, ["bench", "e2e", "--size", "128", "--chunks", "64", "--out", str(out),
                            "--store", str(tmp_path / "store"), *lend])
    assert r.exit_code == 0, r.output
    rec, path = _only_json(out)
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert path.name == f"{date}-{device_slug(rec['devices'][0])}-x2-e2e-128-float32.json"
    assert rec["ok"] and rec["workers"] == 2
    assert "dask.array + numpy" in r.output and "not timed: cupy is not installed" in r.output
    assert f"record written to {path}" in r.output


@needs_device
def test_cli_fails_on_a_wrong_result(runner, tmp_path, lend, wrong_result):
    r = runner.invoke(cli, ["bench", "e2e", "--size", "128", "--chunks", "64", "--no-peers", "--out", str(tmp_path),
                            *lend])
    assert r.exit_code == 1, r.output
    assert "FAILED" in r.output
    rec, _ = _only_json(tmp_path)
    assert rec["failures"] >= 1 and not rec["dgemm"]["check"]["passed"]


@pytest.mark.parametrize("args, message", [
    (["--size", "64", "--shape", "64,64,64"], "not both"),
    (["--shape", "64,64"], "three sizes"),
    (["--gpus", "1,2", "--scheduler", "tcp://x:1"], "--scheduler"),
    (["--gpus", "3", "--devices", "cpu,cpu", "--size", "64"], "give 2 device(s)"),
    (["--dtype", "float16"], "float16"),
])
def test_cli_argument_errors_start_nothing(runner, tmp_path, monkeypatch, args, message):
    if "--devices" in args and not DEVICES:
        pytest.skip("no OpenCL device")
    monkeypatch.setattr(e2e, "make_inputs", lambda *a, **k: pytest.fail("inputs written before the checks"))
    r = runner.invoke(cli, ["bench", "e2e", "--out", str(tmp_path / "out"), "--store", str(tmp_path / "s"), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not (tmp_path / "out").exists()


# -- the pieces ---------------------------------------------------------------------------
def test_counters_deltas_keep_peaks_and_sum_over_workers():
    before = {"flops": 10, "bytes_read": 5, "peak_device_bytes": 100, "cache_peak_bytes": 7, "ok": True}
    after = {"flops": 30, "bytes_read": 5, "peak_device_bytes": 80, "cache_peak_bytes": 9, "new_seconds": 1.5,
             "ok": True, "name": "x"}
    d = e2e.counter_delta(before, after)
    assert d == {"flops": 20, "bytes_read": 0, "peak_device_bytes": 80, "cache_peak_bytes": 9, "new_seconds": 1.5}
    total = e2e.sum_counters([d, {**d, "peak_device_bytes": 90}])
    assert total["flops"] == 40 and total["peak_device_bytes"] == 90 and total["cache_peak_bytes"] == 9


def test_random_zarr_is_the_same_whatever_the_threads(tmp_path, monkeypatch):
    a = random_zarr(tmp_path / "a.zarr", (50, 70), (16, 32), "float32", seed=3, threads=1)
    b = random_zarr(tmp_path / "b.zarr", (50, 70), (16, 32), "float32", seed=3, threads=4)
    monkeypatch.setattr("dgemm.benchmarks.inputs.PANEL_BYTES", 16 * 32 * 4)    # one chunk per write
    c = random_zarr(tmp_path / "c.zarr", (50, 70), (16, 32), "float32", seed=3, threads=3)
    np.testing.assert_array_equal(a[...], c[...])
    assert a.compressors == () and a.chunks == (16, 32) and a.dtype == np.float32
    np.testing.assert_array_equal(a[...], b[...])
    assert 0.5 < a[...].std() < 1.5


def test_memory_sampler_reads_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, 1200'\necho '1, 30'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with e2e.MemorySampler([os.getpid()], interval=0.01) as s:
        pass
    r = s.result()
    assert r["rss_total_peak_bytes"] > 0 and r["samples"] >= 2
    assert r["gpu"]["peak_used_mib"] == {"0": 1200.0, "1": 30.0} and r["gpu_skipped"] is None


def test_memory_sampler_without_nvidia_smi(no_cuda):
    with e2e.MemorySampler([os.getpid()], interval=0.01) as s:
        pass
    assert s.result()["gpu"] is None and "nvidia-smi not found" in s.result()["gpu_skipped"]


def test_dask_peer_with_a_stand_in_cupy(tmp_path):
    """The cupy pipeline (to the GPU, multiply, back, to Zarr) with numpy standing in for cupy."""
    freed = []
    pool = types.SimpleNamespace(free_all_blocks=lambda: freed.append(1))
    fake = types.SimpleNamespace(
        asarray=np.asarray, asnumpy=np.asarray, empty=np.empty, ones=np.ones,
        get_default_memory_pool=lambda: pool, get_default_pinned_memory_pool=lambda: pool,
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(synchronize=lambda: None)))
    random_zarr(tmp_path / "a.zarr", (64, 48), (32, 32), "float64", seed=1)
    random_zarr(tmp_path / "b.zarr", (48, 40), (32, 32), "float64", seed=2)
    r = e2e.time_dask(tmp_path / "a.zarr", tmp_path / "b.zarr", tmp_path / "c.zarr", reps=2, cupy=fake,
                      compressors=[{"name": "zstd", "configuration": {"level": 0, "checksum": False}}], keep=True)
    assert r["check"]["passed"] and (r["m"], r["n"], r["k"]) == (64, 40, 48) and len(r["times"]) == 2
    assert freed and r["chunks"] == [32, 32]
    assert [c.to_dict()["name"] for c in zarr.open_array(str(tmp_path / "c.zarr")).compressors] == ["zstd"]


def test_cupy_status_without_cupy(no_cuda):
    assert peers.cupy_status() == (None, "cupy is not installed")
    assert peers.time_cublas("float32", 64, 64, 64, None, 1)[0] is None

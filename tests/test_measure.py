""":mod:`dgemm.benchmarks.measure`: the workers' counters as deltas and sums, peak memory with and without
``nvidia-smi``, and dask.array's product (with a stand-in cupy) checked like dgemm's.

The timed dgemm runs themselves (:func:`~dgemm.benchmarks.measure.time_dgemm`) run in tests/test_e2e.py,
inside whole benchmark runs on the session cluster.
"""
from __future__ import annotations

import os
import shutil
import types

import numpy as np
import pytest
import zarr

from dgemm.benchmarks import measure
from dgemm.benchmarks.inputs import random_zarr


@pytest.fixture
def no_nvidia_smi(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "nvidia-smi"
                        else real_which(name, *a, **k))


def test_counters_deltas_keep_peaks_and_sum_over_workers():
    before = {"flops": 10, "bytes_read": 5, "peak_device_bytes": 100, "cache_peak_bytes": 7, "ok": True}
    after = {"flops": 30, "bytes_read": 5, "peak_device_bytes": 80, "cache_peak_bytes": 9, "new_seconds": 1.5,
             "ok": True, "name": "x"}
    d = measure.counter_delta(before, after)
    assert d == {"flops": 20, "bytes_read": 0, "peak_device_bytes": 80, "cache_peak_bytes": 9, "new_seconds": 1.5}
    total = measure.sum_counters([d, {**d, "peak_device_bytes": 90}])
    assert total["flops"] == 40 and total["peak_device_bytes"] == 90 and total["cache_peak_bytes"] == 9


def test_memory_sampler_reads_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, 1200'\necho '1, 30'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with measure.MemorySampler([os.getpid()], interval=0.01) as s:
        pass
    r = s.result()
    assert r["rss_total_peak_bytes"] > 0 and r["samples"] >= 2
    assert r["gpu"]["peak_used_mib"] == {"0": 1200.0, "1": 30.0} and r["gpu_skipped"] is None


def test_memory_sampler_without_nvidia_smi(no_nvidia_smi):
    with measure.MemorySampler([os.getpid()], interval=0.01) as s:
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
    r = measure.time_dask(tmp_path / "a.zarr", tmp_path / "b.zarr", tmp_path / "c.zarr", reps=2, cupy=fake,
                          compressors=[{"name": "zstd", "configuration": {"level": 0, "checksum": False}}], keep=True)
    assert r["check"]["passed"] and (r["m"], r["n"], r["k"]) == (64, 40, 48) and len(r["times"]) == 2
    assert freed and r["chunks"] == [32, 32]
    assert [c.to_dict()["name"] for c in zarr.open_array(str(tmp_path / "c.zarr")).compressors] == ["zstd"]


def test_a_wrong_stored_product_fails_the_check(tmp_path):
    """What every timed run's ``ok`` rests on: a C one entry off does not pass."""
    a = random_zarr(tmp_path / "a.zarr", (40, 30), (16, 16), "float64", seed=1)
    b = random_zarr(tmp_path / "b.zarr", (30, 20), (16, 16), "float64", seed=2)
    c = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(40, 20), chunks=(16, 16), dtype="float64")
    c[...] = a[...] @ b[...]
    assert measure.check_stored(tmp_path / "a.zarr", tmp_path / "b.zarr", tmp_path / "c.zarr")["passed"]
    c[0, 0] = 1e6
    assert not measure.check_stored(tmp_path / "a.zarr", tmp_path / "b.zarr", tmp_path / "c.zarr")["passed"]

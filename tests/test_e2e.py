"""``dgemm bench e2e`` and :mod:`dgemm.benchmarks.e2e`: options that cannot go together are refused before any
work, the record of an end-to-end run is complete and correct, peers that cannot run say why, a wrong result
fails the run; the inputs as users write them (codecs, Zarr v2, shards), ``--cold``, S3 and the first call
reach the record.

Runs on the session's two-worker cluster (the ``client`` fixture, never
closed here) at tiny sizes; only the scaling test starts a cluster of its
own (one worker).  The CLI tests lend the session client to ``--scheduler``.
No test asserts on speed.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import dgemm
import dgemm.cluster
from dgemm.benchmarks import e2e, measure
from dgemm.benchmarks.e2e import E2EOptions, e2e_bench
from dgemm.benchmarks.objectstore import open_zarr
from dgemm.benchmarks.records import device_slug
from dgemm.benchmarks.report import format_table
from dgemm.cli import cli
from dgemm.opencl.discovery import list_devices
from test_pagecache import droppable

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
    import shutil

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "cupy", None)
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "nvidia-smi"
                        else real_which(name, *a, **k))


@pytest.fixture
def lend(monkeypatch, client):
    """``--scheduler`` connects to the session's client (not closed by the command); distributed.Client stays
    itself, so dask.array's peers find no stand-in."""
    monkeypatch.setattr("dgemm.cli.bench.connect", lambda stack, scheduler: client)
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


@pytest.fixture
def no_work(monkeypatch):
    """Writing inputs or starting an S3 server fails the test: the checks come first."""
    monkeypatch.setattr(e2e, "make_inputs", lambda *a, **k: pytest.fail("inputs written before the checks"))
    monkeypatch.setattr(e2e, "LocalS3", lambda *a, **k: pytest.fail("server started before the checks"))


def _only_json(folder: Path):
    files = sorted(folder.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text()), files[0]


# -- the options ---------------------------------------------------------------------------
def test_options_are_frozen_and_normalised():
    opts = E2EOptions(shape=[96, 64, 32], dtype=np.float64, gpus=[4, 1, 2, 1], store=Path("/x/y"))
    assert (opts.shape, opts.dtype, opts.gpus, opts.store) == ((96, 64, 32), "float64", (1, 2, 4), "/x/y")
    assert opts.mnk() == (96, 64, 32) and not opts.remote and not opts.local_server
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.reps = 3
    assert dataclasses.replace(opts, reps=3).reps == 3
    s3 = E2EOptions(store="s3://bench/x")
    assert s3.remote and s3.local_server
    assert not E2EOptions(store="s3://bench/x", s3_server="http://127.0.0.1:9000").local_server


@pytest.mark.parametrize("kwargs, error, message", [
    ({"size": 64, "shape": (64, 64, 64)}, ValueError, "not both"),
    ({"shape": (64, 64)}, ValueError, "three positive integers"),
    ({"dtype": "float16"}, TypeError, "float16"),
    ({"reps": 0}, ValueError, "reps must be positive"),
    ({"gpus": [0, 1]}, ValueError, "positive"),
    ({"shards": 32, "input_zarr_format": 2}, ValueError, "Zarr v3"),
    ({"shards": 24, "chunks": 16}, ValueError, "multiple of chunks"),
    ({"input_codec": "lz4"}, ValueError, "input codec"),
    ({"input_zarr_format": 4}, ValueError, "2 or 3"),
    ({"first_call": True, "compressors": ["a codec object"]}, ValueError, "first-call script"),
    ({"store": "s3://bench/x", "cold": True}, ValueError, "not local files"),
    ({"store": "s3://bench/x", "keep": True}, ValueError, "local S3 server's objects go"),
    ({"s3_server": "local"}, ValueError, "needs a store on S3"),
    ({"store": "s3:///x"}, ValueError, "names no bucket"),
    ({"store": "gs://bench/x"}, ValueError, "local folder or an s3:// URL"),
    ({"store": "s3://bench/x", "s3_server": "bench:9000"}, ValueError, r"http\(s\):// endpoint URL"),
])
def test_options_that_cannot_go_together_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        E2EOptions(**kwargs)


def test_what_this_host_cannot_do_is_refused_before_any_work(tmp_path, no_work):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        e2e_bench(E2EOptions(64, chunks=16, out_dir=tmp_path / "out", store=tmp_path / "file"), log=None)
    if DEVICES:
        with pytest.raises(ValueError, match=r"the devices 'cpu,cpu' give 2 device\(s\)"):
            e2e_bench(E2EOptions(64, chunks=16, devices="cpu,cpu", gpus=[3], out_dir=tmp_path / "out",
                                 store=tmp_path / "store"), log=None)
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists()


# -- the benchmark on the session cluster ------------------------------------------------
@needs_device
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_record_is_complete_and_correct(client, tmp_path, dtype, no_cuda):
    rec, path = e2e_bench(E2EOptions(256, chunks=128, dtype=dtype, out_dir=tmp_path / "out",
                                     store=tmp_path / "store"), client=client, log=None)
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
    assert "host rates, GB/s: store read" in format_table(rec)

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
    assert "dgemm e2e (2 worker(s))" in format_table(rec)


@needs_device
def test_small_size_and_keep(client, tmp_path, no_cuda):
    """A numpy size below the full one runs dgemm there too; --keep keeps every Zarr file."""
    rec, _ = e2e_bench(E2EOptions(shape=(192, 160, 128), chunks=64, numpy_size=96, reps=2, keep=True,
                                  out_dir=tmp_path, store=tmp_path / "store"), client=client, log=None)
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
    rec, _ = e2e_bench(E2EOptions(128, chunks=64, devices="cpu,cpu", gpus=[2, 1], peers=False, out_dir=tmp_path,
                                  compressors=None), client=client, log=None)
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
    table = format_table(rec)
    assert "speed-up" in table and " blocks; busy " in table


@needs_device
def test_a_wrong_result_fails_the_record(client, tmp_path, wrong_result, no_cuda):
    rec, path = e2e_bench(E2EOptions(128, chunks=64, peers=False, out_dir=tmp_path), client=client, log=None)
    assert not rec["ok"] and rec["failures"] >= 1
    assert rec["dgemm"]["status"] == "FAILED" and not rec["dgemm"]["check"]["passed"]
    assert any(e["stage"] == "dgemm" and "wrong result" in e["error"] for e in rec["errors"])
    assert json.loads(path.read_text())["ok"] is False
    assert "FAILURE" in format_table(rec)


@needs_device
def test_e2e_on_sharded_default_codec_inputs_with_a_first_call(client, tmp_path, monkeypatch):
    """The users' case: zstd inputs in shards, timed warm and from a fresh script; both checked and recorded."""
    from zarr.codecs import ShardingCodec, ZstdCodec

    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    rec, path = e2e_bench(E2EOptions(96, chunks=16, input_codec="default", shards=32, first_call=True, devices="cpu",
                                     peers=False, keep=True, out_dir=tmp_path / "out", store=tmp_path / "store"),
                          client=client, log=None)
    assert rec["ok"] and rec["failures"] == 0, rec["errors"]
    assert path.name.endswith("-e2e-96-float32-default-shards32.json")
    saved = json.loads(path.read_text())
    assert (saved["input_codec"], saved["input_zarr_format"], saved["shards"]) == ("default", 3, 32)
    folder = Path(rec["store"])
    a, b = (zarr.open_array(str(folder / f"{x}.zarr"), mode="r") for x in "ab")
    for arr, entry in ((a, saved["inputs"]["a"]), (b, saved["inputs"]["b"])):
        assert arr.shards == (32, 32) and arr.chunks == (16, 16)
        sharding = arr.metadata.codecs[0]
        assert isinstance(sharding, ShardingCodec) and any(isinstance(c, ZstdCodec) for c in sharding.codecs)
        assert entry["zarr"]["compressors"] == [{"name": "zstd", "configuration": {"level": 0, "checksum": False}}]
    want = a[...].astype(np.float64) @ b[...].astype(np.float64)

    assert saved["dgemm"]["check"]["passed"]
    fc = saved["first_call"]
    assert fc["ok"] and fc["check"]["passed"] and fc["devices"] == "cpu" and fc["status"] == "ok"
    assert fc["seconds"] > fc["matmul_seconds"] > 0 and fc["import_seconds"] > 0
    assert fc["minus_warm_seconds"] == pytest.approx(fc["seconds"] - saved["dgemm"]["seconds"])
    assert fc["output_compressors"] == saved["dgemm"]["output_compressors"]  # the default codec, as the warm run
    c = zarr.open_array(str(folder / "c_first_call.zarr"), mode="r")      # kept: what the script wrote
    np.testing.assert_allclose(c[...], want, rtol=1e-4, atol=1e-3)
    assert "dgemm.matmul(sys.argv[1], sys.argv[2], out=sys.argv[3])" in fc["script"]
    table = format_table(rec)
    assert "dgemm first call (script)" in table and "zarr's default codec, Zarr v3, shards 32" in table


def _floor_checks(rec: dict) -> None:
    """``dgemm plan``'s floor is recorded beside the time, for the blocks the run used, and printed."""
    f = rec["dgemm"]["floor"]
    assert f["same_blocks_as_run"] is True
    for key in ("defaults", "measured"):
        assert f[key]["floor_seconds"] > 0 and f[key]["bound"] in f[key]["busiest"]["seconds"]
        assert f[key]["measured_over_floor"] == pytest.approx(rec["dgemm"]["seconds"] / f[key]["floor_seconds"])
    assert f["defaults"]["rates"]["read"] is None           # dgemm plan's defaults: the store binds nothing
    assert f["measured"]["rates"]["flops"] == pytest.approx(rec["kernel"]["tflops"] * 1e12)
    assert "dgemm plan's floor: " in format_table(rec)


@needs_device
def test_e2e_on_a_local_s3_server(client, tmp_path, monkeypatch):
    """Inputs and outputs on the moto server the bench starts: dgemm's product and dask's are right, the
    server's raw GET rate read every chunk object, and the server is gone afterwards."""
    import psutil

    from _check import check_product

    for module in ("moto.server", "s3fs", "boto3"):
        pytest.importorskip(module, reason=f"the S3 bench needs {module}: pip install -e '.[test]'")
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    products = {}
    real_check = measure.check_stored

    def whole_check(a, b, c, storage_options=None, op="matmul"):   # the whole of C, read back from the server
        products[os.fspath(c).rsplit("/", 1)[-1]] = [open_zarr(p, storage_options)[...] for p in (a, b, c)]
        return real_check(a, b, c, storage_options, op)

    monkeypatch.setattr(measure, "check_stored", whole_check)
    rec, path = e2e_bench(E2EOptions(48, chunks=16, input_codec="default", store="s3://bench/t", devices="cpu",
                                     out_dir=tmp_path / "out"), client=client, log=None)
    assert rec["ok"] and rec["failures"] == 0, rec["errors"]
    assert path.name.endswith("-e2e-48-float32-default-s3.json")
    assert rec["store"].startswith("s3://bench/t/dgemm-e2e-") and rec["store_kind"] == "s3"
    assert all(rec["inputs"][x]["path"].startswith(rec["store"]) for x in "ab")
    assert set(products) == {"c_dgemm.zarr", "c_numpy.zarr"}
    for a, b, c in products.values():
        assert a.shape == (48, 48) and np.isfinite(a).all() and a.std() > 0.5    # fresh normals
        check_product(c, a, b, dtype="float32")
    obj = rec["object_store"]
    assert obj["server"]["endpoint"].startswith("http://127.0.0.1:")
    stored = sum(rec["inputs"][x]["bytes_on_disk"] for x in "ab")     # chunk objects and metadata
    reads = obj["get"]["reads"]
    assert set(reads) == {"1", "4", "16"} and all(v > 0 for v in obj["get"]["gbps"].values())
    assert all(r["objects"] == 2 * 9 for r in reads.values())     # every chunk object (3 x 3 each) once
    assert len({r["bytes"] for r in reads.values()}) == 1 and 0 < reads["1"]["bytes"] < stored   # not metadata
    assert obj["put"]["best_gbps"] > 0
    assert rec["host_rates"]["read_gbps"] == {}          # no local store to time
    assert rec["dgemm"]["floor"]["measured"]["rates"]["read"] == pytest.approx(obj["get"]["best_gbps"] * 1e9)
    _floor_checks(rec)
    assert rec["peers"]["dask_numpy"]["check"]["passed"]
    assert not psutil.pid_exists(obj["server"]["pid"])   # stopped with the run, objects and all
    table = format_table(rec)
    assert "object store, GB/s (raw whole objects, boto3): GET " in table and "S3 at http://127.0.0.1:" in table


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


@needs_device
def test_bench_e2e_cli_on_v2_blosc_inputs(runner, tmp_path, lend, no_cuda):
    """The options reach the record; dgemm and the dask.array peer read Zarr v2 Blosc/LZ4 inputs right."""
    out = tmp_path / "results"
    r = runner.invoke(cli, ["bench", "e2e", "--size", "64", "--chunks", "16", "--input-codec", "blosc-lz4",
                            "--input-zarr-format", "2", "--out", str(out), "--store", str(tmp_path / "store"), *lend])
    assert r.exit_code == 0, r.output
    rec, path = _only_json(out)
    assert path.name.endswith("-e2e-64-float32-blosc-lz4-v2.json")
    assert (rec["input_codec"], rec["input_zarr_format"], rec["shards"]) == ("blosc-lz4", 2, None)
    assert rec["inputs"]["a"]["zarr"]["compressors"][0]["id"] == "blosc"
    assert rec["inputs"]["a"]["zarr"]["compressors"][0]["cname"] == "lz4"
    assert rec["ok"] and rec["dgemm"]["check"]["passed"] and rec["first_call"] is None
    assert rec["peers"]["dask_numpy"] and rec["peers"]["dask_numpy"]["check"]["passed"], rec["errors"]
    assert "blosc-lz4, Zarr v2" in r.output


@needs_device
def test_e2e_cold_drops_the_inputs_before_each_timed_run(runner, tmp_path, lend, no_cuda):
    why = droppable(tmp_path)
    if why:
        pytest.skip(why)
    out = tmp_path / "results"
    r = runner.invoke(cli, ["bench", "e2e", "--size", "64", "--input-chunks", "16", "--codec", "default", "--cold",
                            "--reps", "2", "--no-peers", "--out", str(out), "--store", str(tmp_path / "store"),
                            *lend])
    assert r.exit_code == 0, r.output
    rec, path = _only_json(out)
    assert path.name.endswith("-e2e-64-float32-default-cold.json")
    assert rec["cold"] is True and rec["ok"] and rec["dgemm"]["check"]["passed"]
    drops = rec["dgemm"]["cold"]
    assert len(drops) == 2                                  # one per repetition
    files = rec["inputs"]["a"]["bytes_on_disk"] + rec["inputs"]["b"]["bytes_on_disk"]
    for d in drops:
        assert d["bytes"] == files and d["files"] >= 2 * 16 + 2   # 4 x 4 chunks + metadata, each of A and B
        assert d["cached_after"] == 0 and d["dropped_bytes"] == d["cached_before"]
    assert drops[0]["cached_before"] > 0                   # written just before: cached until dropped
    assert drops[1]["cached_before"] > 0                   # the first repetition read them back in
    hr = rec["host_rates"]
    assert set(hr["reader_cold_gbps"]) == set(hr["reader_gbps"]) and all(hr["reader_cold_gbps"].values())
    assert rec["dgemm"]["floor"]["measured"]["rates"]["read"] == pytest.approx(
        max(hr["reader_cold_gbps"].values()) * 1e9)         # the floor reads at the cold rate
    _floor_checks(rec)
    assert "were dropped from the page cache" in r.output


@pytest.mark.parametrize("args", [["--codec", "blosc-lz4", "--input-chunks", "32"],
                                  ["--input-codec", "blosc-lz4", "--chunks", "32"]])
def test_bench_e2e_options_reach_the_options_object(runner, tmp_path, monkeypatch, args):
    """--codec and --input-codec, --chunks and --input-chunks are one option each; the rest keep their value."""
    seen = {}

    def fake(options, **kw):
        seen.update(options=options, **kw)
        raise RuntimeError("stop here")

    monkeypatch.setattr(e2e, "e2e_bench", fake)
    r = runner.invoke(cli, ["bench", "e2e", "--size", "64", "--cold", "--out", str(tmp_path / "out"), *args])
    assert "stop here" in r.output
    assert seen["options"] == E2EOptions(64, input_codec="blosc-lz4", chunks=32, cold=True, numpy_size=4096,
                                         out_dir=str(tmp_path / "out"))
    assert seen["client"] is None and seen["log"] is not None


@pytest.mark.parametrize("args, message", [
    (["--size", "64", "--shape", "64,64,64"], "not both"),
    (["--shape", "64,64"], "three sizes"),
    (["--gpus", "1,2", "--scheduler", "tcp://x:1"], "--scheduler"),
    (["--gpus", "3", "--devices", "cpu,cpu", "--size", "64"], "give 2 device(s)"),
    (["--dtype", "float16"], "float16"),
    (["--size", "64", "--shards", "32", "--input-zarr-format", "2"], "Zarr v2 has no shards"),
    (["--size", "64", "--shards", "24", "--chunks", "16"], "multiple of --chunks"),
    (["--size", "64", "--input-codec", "lz4"], "'lz4' is not one of 'raw', 'default', 'blosc-lz4'"),
    (["--size", "64", "--input-zarr-format", "4"], "'4' is not one of '2', '3'"),
])
def test_cli_argument_errors_start_nothing(runner, tmp_path, no_work, args, message):
    if "--devices" in args and not DEVICES:
        pytest.skip("no OpenCL device")
    r = runner.invoke(cli, ["bench", "e2e", "--out", str(tmp_path / "out"), "--store", str(tmp_path / "s"), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "s").exists()


@pytest.mark.parametrize("args, message", [
    (["--store", "s3://bench/x", "--cold"], "not with an s3:// --store"),
    (["--store", "s3://bench/x", "--keep"], "local S3 server's objects go"),
    (["--s3-server", "local"], "--s3-server needs an s3:// --store"),
    (["--store", "s3://bench/x", "--s3-server", "bench:9000"], "http(s):// URL"),
    (["--store", "gs://bench/x"], "local folder or an s3:// URL"),
])
def test_bench_e2e_store_option_errors_start_nothing(runner, tmp_path, no_work, args, message):
    r = runner.invoke(cli, ["bench", "e2e", "--size", "64", "--out", str(tmp_path / "out"), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not (tmp_path / "out").exists()

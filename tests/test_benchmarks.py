"""``dgemm bench kernel`` and :mod:`dgemm.benchmarks` (kernel, peers, records): the JSON record,
correctness checks that decide what counts, and peers that are skipped with a reason.

Runs on the device use tiny sizes (64, 100) and two repetitions; the database
is a fresh path under tmp_path, so the shipped entries choose the parameters.
No test asserts on speed.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dgemm.accuracy import sampled_error, tolerance
from dgemm.benchmarks import kernel as bm
from dgemm.benchmarks import peers, records
from dgemm.opencl import database as tuning
from dgemm.cli import cli
from dgemm.opencl.discovery import DeviceInfo, list_devices
from dgemm.tuning.timing import KernelBench, Timing
from dgemm.opencl.params import KernelParams

DEVICES = list_devices()
needs_device = pytest.mark.skipif(not DEVICES, reason="no OpenCL device (pip install pocl-binary-distribution)")
ROOT = Path(__file__).resolve().parent.parent
ROW_KEYS = {"size", "m", "n", "k", "status", "ok", "tflops", "seconds", "rel_err", "tolerance", "cublas",
            "numpy", "ratio_to_cublas", "ratio_to_numpy"}
TOP_KEYS = {"benchmark", "device", "driver", "date", "commit", "command", "dgemm_version", "reps", "sizes",
            "peers", "dtypes", "failures"}


def _pick():
    cpus = [d for d in DEVICES if d.type == "CPU"]
    return (cpus or DEVICES)[0]


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def fresh_db(tmp_path, monkeypatch):
    """An empty user database: the shipped entries decide."""
    monkeypatch.setenv("DGEMM_TUNING_DB", str(tmp_path / "no-user-tuning.json"))


@pytest.fixture
def no_cuda(monkeypatch):
    """Neither torch nor cupy importable, whatever is installed."""
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "cupy", None)


def _only_json(folder: Path) -> dict:
    files = sorted(folder.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text()), files[0]


# -- the command ------------------------------------------------------------------
@needs_device
def test_bench_kernel_writes_the_record(runner, tmp_path, fresh_db, no_cuda):
    info = _pick()
    out = tmp_path / "results"
    r = runner.invoke(cli, ["bench", "kernel", "--device", info.id, "--dtypes", "float32,float64",
                            "--sizes", "64,100", "--reps", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rec, path = _only_json(out)
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert path.name == f"{date}-{records.device_slug(info.name)}-kernel.json"
    assert TOP_KEYS <= set(rec)
    assert rec["device"] == info.name and rec["driver"] == info.driver
    assert datetime.datetime.fromisoformat(rec["date"]).utcoffset() == datetime.timedelta(0)
    assert isinstance(rec["commit"], str) and rec["commit"]
    assert rec["sizes"] == [64, 100] and rec["reps"] == 2 and rec["failures"] == 0
    for dtype in ("float32", "float64") if info.fp64 else ("float32",):
        e = rec["dtypes"][dtype]
        c = tuning.lookup(info, dtype)
        assert KernelParams.from_dict(e["params"]) == c.params
        assert e["source"] == c.describe() and e["level"] == c.level and e["tuned"] == c.tuned
        assert [row["size"] for row in e["sizes"]] == [64, 100]
        for row in e["sizes"]:
            assert ROW_KEYS <= set(row)
            assert row["status"] == "ok" and row["ok"], row                 # nothing FAILED on this device
            assert row["tflops"] > 0 and row["seconds"] > 0
            assert 0 <= row["rel_err"] <= row["tolerance"]
            assert row["cublas"] is None and row["ratio_to_cublas"] is None
            assert row["cublas_skipped"] == rec["peers"]["cublas"]["reason"]
            assert row["numpy"]["tflops"] > 0 and row["ratio_to_numpy"] > 0  # sizes <= 4096: numpy timed
    cub = rec["peers"]["cublas"]
    assert cub["available"] is False and cub["via"] is None
    assert "torch" in cub["reason"] and "cupy" in cub["reason"]
    assert rec["peers"]["numpy"]["available"] is True
    assert "FAILED" not in r.output
    assert str(path) in r.output and "TFLOPS" in r.output


@needs_device
def test_no_peers_and_numpy_size_limit(tmp_path, fresh_db, monkeypatch):
    monkeypatch.setattr(bm, "NUMPY_MAX_SIZE", 64)
    rec, path = bm.kernel_bench(_pick().id, dtypes=["float32"], sizes=[64, 100], reps=1, out_dir=tmp_path,
                                command="test", log=None)
    rows = rec["dtypes"]["float32"]["sizes"]
    assert rows[0]["numpy"] is not None
    assert rows[1]["numpy"] is None and "64" in rows[1]["numpy_skipped"]
    assert json.loads(path.read_text())["command"] == "test"

    rec, path2 = bm.kernel_bench(_pick().id, dtypes=["float32"], sizes=[64], reps=1, out_dir=tmp_path,
                                 peers=False, log=None)
    assert path2 != path and path2.name.endswith("-2.json")               # earlier records are kept
    assert rec["peers"]["cublas"]["reason"] == rec["peers"]["numpy"]["reason"] == "--no-peers"
    row = rec["dtypes"]["float32"]["sizes"][0]
    assert row["cublas"] is None and row["numpy"] is None and row["numpy_skipped"] == "--no-peers"


@needs_device
def test_a_failed_check_is_reported_and_not_counted(runner, tmp_path, fresh_db, no_cuda, monkeypatch):
    def wrong(self, params, reps=5, warmup=1):
        return Timing(params, self.m, self.n, self.k, 1e-3, float("inf"), False)
    monkeypatch.setattr(KernelBench, "run", wrong)
    r = runner.invoke(cli, ["bench", "kernel", "--device", _pick().id, "--dtypes", "float32", "--sizes", "64",
                            "--reps", "1", "--out", str(tmp_path)])
    assert r.exit_code == 1
    assert "FAILED" in r.output and "Error: 1 run(s) FAILED" in r.output
    rec, _ = _only_json(tmp_path)                                          # written all the same
    row = rec["dtypes"]["float32"]["sizes"][0]
    assert (row["status"], row["ok"], row["tflops"], row["seconds"], row["ratio_to_numpy"]) == \
        ("FAILED", False, None, None, None)
    assert row["rel_err"] is None                                          # inf is not JSON: null
    assert rec["failures"] == 1


@needs_device
def test_a_run_that_raises_is_an_error_not_a_crash(tmp_path, fresh_db, no_cuda, monkeypatch):
    def boom(self, params, reps=5, warmup=1):
        raise RuntimeError("out of device memory")
    monkeypatch.setattr(KernelBench, "run", boom)
    rec, _ = bm.kernel_bench(_pick().id, dtypes=["float32"], sizes=[64, 100], reps=1, out_dir=tmp_path, log=None)
    rows = rec["dtypes"]["float32"]["sizes"]
    assert [r["status"] for r in rows] == ["ERROR", "ERROR"] and rec["failures"] == 2
    assert "out of device memory" in rows[0]["error"] and rows[0]["tflops"] is None


def test_bench_is_a_group(runner):
    r = runner.invoke(cli, ["bench", "--help"])
    assert r.exit_code == 0 and "kernel" in r.output
    assert "bench" in runner.invoke(cli, ["--help"]).output


@pytest.mark.parametrize("bad", [["--dtypes", "float16"], ["--dtypes", ""], ["--sizes", "0"],
                                 ["--sizes", "64,x"], ["--reps", "0"], ["--device", "no-such-device-xyz"]])
def test_bench_kernel_argument_errors(runner, tmp_path, bad):
    r = runner.invoke(cli, ["bench", "kernel", "--out", str(tmp_path / "out"), *bad])
    assert r.exit_code == (2 if DEVICES or bad[0] != "--device" else 1), r.output
    assert not (tmp_path / "out").exists()


# -- peers ---------------------------------------------------------------------------
def test_cublas_is_skipped_with_a_reason_without_torch_or_cupy(no_cuda):
    backend, why = peers.cublas_backend()
    assert backend is None
    assert "torch is not installed" in why and "cupy is not installed" in why
    assert peers.cublas("float32", 64, 64, 64) is None


def test_cublas_is_skipped_when_torch_sees_no_cuda(monkeypatch):
    fake = types.SimpleNamespace(__version__="0.0-test", cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "cupy", None)
    backend, why = peers.cublas_backend()
    assert backend is None and "torch 0.0-test sees no CUDA device" in why


def test_numpy_matmul():
    a = np.ones((32, 16), np.float32)
    r = peers.numpy_matmul(a, a.T.copy(), reps=2)
    assert r["seconds"] >= 0 and set(r) == {"seconds", "tflops"}


def test_result_path_does_not_overwrite(tmp_path):
    p = records.result_path(tmp_path, "2026-11-22T10:00:00+00:00", "NVIDIA H100 80GB HBM3", "kernel")
    assert p.name == "2026-11-22-nvidia-h100-80gb-hbm3-kernel.json"
    p.write_text("{}")
    assert records.result_path(tmp_path, "2026-11-22T11:00:00+00:00", "NVIDIA H100 80GB HBM3", "kernel").name == \
        "2026-11-22-nvidia-h100-80gb-hbm3-kernel-2.json"


def test_existing_results_follow_the_naming_scheme():
    """Every record the writers make is named <date>-<device>-<benchmark>[-<detail>]; so are most kept ones."""
    import re
    names = [p.name for p in (ROOT / "bench" / "results").glob("*.json")]
    scheme = re.compile(r"^\d{4}-\d\d-\d\d-[a-z0-9-]+\.json$")
    assert sum(bool(scheme.match(n)) for n in names) > len(names) / 2, names


def test_default_sizes():
    gpu = DeviceInfo(0, 0, "P", "g", "v", "GPU", 1, 1, 1, 1, True, None, "")
    cpu = DeviceInfo(0, 0, "P", "c", "v", "CPU", 1, 1, 1, 1, True, None, "")
    assert bm.default_sizes(gpu) == [1024, 2048, 4096, 8192, 16384, 10000]
    assert max(bm.default_sizes(cpu)) <= 1024


# -- correctness checks ----------------------------------------------------------------
@pytest.mark.parametrize("precision", ["fma", "tf32"])
def test_the_check_catches_a_lost_k_tile(precision):
    """Every timed run is checked with dgemm.accuracy: a kernel that skips one k-tile of 8 must fail."""
    rng = np.random.default_rng(0)
    k = 4096
    a, b = rng.standard_normal((64, k)).astype("f4"), rng.standard_normal((k, 64)).astype("f4")
    rows, cols = rng.choice(64, 24, replace=False), rng.choice(64, 24, replace=False)
    good = (a.astype("f8") @ b.astype("f8")).astype("f4")
    lost = (a[:, 8:].astype("f8") @ b[8:].astype("f8")).astype("f4")
    assert sampled_error(a, b, good, rows, cols) <= tolerance("float32", k, precision)
    assert sampled_error(a, b, lost, rows, cols) > 2 * tolerance("float32", k, precision)
    nan = good.copy()
    nan[rows[0], 0] = np.nan
    assert sampled_error(a, b, nan, rows, cols) == float("inf")


# -- the command line and the scripts -------------------------------------------------------
@needs_device
def test_bench_kernel_in_a_subprocess_records_its_command(tmp_path):
    env = {**os.environ, "DGEMM_TUNING_DB": str(tmp_path / "none.json")}
    r = subprocess.run([sys.executable, "-m", "dgemm", "bench", "kernel", "--device", _pick().id, "--dtypes",
                        "float32", "--sizes", "64", "--reps", "1", "--no-peers", "--out", str(tmp_path / "out")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    rec, _ = _only_json(tmp_path / "out")
    assert rec["command"].startswith("python -m dgemm bench kernel --device")
    assert rec["dtypes"]["float32"]["sizes"][0]["status"] == "ok"


SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_scripts_run_against_the_installed_package(script, tmp_path):
    """No script edits sys.path: each imports dgemm as installed (--help imports it and exits)."""
    assert "sys.path" not in (ROOT / "bench" / script).read_text()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cublas_peer_checks_its_product(dtype):
    """The peer's own product is checked like dgemm's (bench/NOTES.md has the H100's figures)."""
    backend, why = peers.cublas_backend()
    if backend is None:
        pytest.skip(f"no cuBLAS here: {why}")
    r = peers.cublas(dtype, 1000, 3000, 500, reps=2, backend=backend)
    assert r["ok"] and 0 <= r["rel_err"] <= r["tolerance"] and r["tflops"] > 0
    if dtype == "float32":   # beside dgemm's tf32 path: cuBLAS with TF32, checked against TF32's bound
        r = peers.cublas(dtype, 1000, 3000, 500, reps=2, backend=backend, tf32=True)
        assert r["ok"] and r["tf32"] and r["tolerance"] > tolerance("float32", 500)


# -- dgemm bench e2e on inputs as users write them (issue 15) ------------------------------------
@pytest.mark.parametrize("codec, fmt, shards", [("default", 3, None), ("default", 3, 32), ("default", 2, None),
                                                ("blosc-lz4", 3, None), ("blosc-lz4", 2, None)])
def test_inputs_are_encoded_as_asked(tmp_path, codec, fmt, shards):
    """zarr reads back the codec, the format and the shards asked for; the numbers are the raw inputs' own."""
    import numcodecs
    import zarr
    from zarr.codecs import BloscCodec, ShardingCodec, ZstdCodec

    from dgemm.benchmarks import e2e

    (tmp_path / "raw").mkdir()
    (tmp_path / "enc").mkdir()
    raw = e2e.make_inputs(tmp_path / "raw", 64, 48, 80, 16, "float32", seed=5)
    ins = e2e.make_inputs(tmp_path / "enc", 64, 48, 80, 16, "float32", seed=5, codec=codec, zarr_format=fmt,
                          shards=shards)
    assert (ins["codec"], ins["zarr_format"], ins["shards"]) == (codec, fmt, shards)
    for name in ("a", "b"):
        arr = zarr.open_array(ins[name]["path"], mode="r")
        assert arr.metadata.zarr_format == fmt and arr.chunks == (16, 16)
        np.testing.assert_array_equal(arr[...], zarr.open_array(raw[name]["path"], mode="r")[...])
        assert ins[name]["zarr"]["zarr_format"] == fmt and ins[name]["zarr"]["chunks"] == [16, 16]
        (comp,) = arr.compressors
        if fmt == 2:
            assert (Path(ins[name]["path"]) / ".zarray").is_file()
            want = numcodecs.Zstd if codec == "default" else numcodecs.Blosc
            assert isinstance(comp, want) and (codec == "default" or comp.cname == "lz4")
        else:
            assert isinstance(comp, ZstdCodec if codec == "default" else BloscCodec)
            assert codec == "default" or comp.cname.value == "lz4"
        if shards:
            assert arr.shards == (32, 32) and ins[name]["shards"] == [32, 32]
            assert isinstance(arr.metadata.codecs[0], ShardingCodec)
            # one object per shard, not per chunk: 64 x 80 in 32 x 32 shards is 2 x 3 of them
            files = [p for p in (Path(ins[name]["path"]) / "c").rglob("*") if p.is_file()]
            assert len(files) == {"a": 6, "b": 6}[name]
            assert ins[name]["zarr"]["codecs"][0]["name"] == "sharding_indexed"
        else:
            assert arr.shards is None and ins[name]["zarr"]["shards"] is None
    json.dumps(ins)                     # the record's entry is JSON


@pytest.mark.parametrize("kwargs, message", [
    ({"shards": 32, "input_zarr_format": 2}, "Zarr v3"),
    ({"shards": 24}, "multiple of chunks"),
    ({"input_codec": "lz4"}, "input codec"),
    ({"input_zarr_format": 4}, "2 or 3"),
    ({"first_call": True, "compressors": ["a codec object"]}, "first-call script"),
])
def test_e2e_refuses_bad_input_options_before_any_work(tmp_path, monkeypatch, kwargs, message):
    from dgemm.benchmarks import e2e

    monkeypatch.setattr(e2e, "make_inputs", lambda *a, **k: pytest.fail("inputs written before the checks"))
    with pytest.raises(ValueError, match=message):
        e2e.e2e_bench(64, chunks=16, out_dir=tmp_path / "out", store=tmp_path / "store", log=None, **kwargs)
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists()


@pytest.mark.parametrize("args, message", [
    (["--shards", "32", "--input-zarr-format", "2"], "Zarr v2 has no shards"),
    (["--shards", "24", "--chunks", "16"], "multiple of --chunks"),
    (["--input-codec", "lz4"], "'lz4' is not one of 'raw', 'default', 'blosc-lz4'"),
    (["--input-zarr-format", "4"], "'4' is not one of '2', '3'"),
])
def test_bench_e2e_input_option_errors_start_nothing(runner, tmp_path, monkeypatch, args, message):
    from dgemm.benchmarks import e2e

    monkeypatch.setattr(e2e, "make_inputs", lambda *a, **k: pytest.fail("inputs written before the checks"))
    r = runner.invoke(cli, ["bench", "e2e", "--size", "64", "--out", str(tmp_path / "out"), "--store",
                            str(tmp_path / "s"), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "s").exists()


def test_a_first_call_that_fails_says_why(tmp_path):
    """The script's own error comes back (here dgemm refuses a missing input before starting a cluster)."""
    from dgemm.benchmarks import e2e

    with pytest.raises(RuntimeError, match=r"first-call script exited with 1:.*no-such-input"):
        e2e.time_first_call(tmp_path / "no-such-input.zarr", tmp_path / "b.zarr", tmp_path / "c.zarr", 8, 8, 8,
                            timeout=120)
    assert not (tmp_path / "c.zarr").exists()


@needs_device
def test_e2e_on_sharded_default_codec_inputs_with_a_first_call(client, tmp_path, monkeypatch):
    """The users' case: zstd inputs in shards, timed warm and from a fresh script; both checked and recorded."""
    import zarr
    from zarr.codecs import ShardingCodec, ZstdCodec

    from dgemm.benchmarks import e2e

    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    rec, path = e2e.e2e_bench(96, chunks=16, input_codec="default", shards=32, first_call=True, devices="cpu",
                              peers=False, keep=True, client=client, out_dir=tmp_path / "out",
                              store=tmp_path / "store", log=None)
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
    table = e2e.format_table(rec)
    assert "dgemm first call (script)" in table and "zarr's default codec, Zarr v3, shards 32" in table


@pytest.fixture
def lend(monkeypatch, client):
    """``--scheduler`` connects to the session's client (not closed by the command); distributed.Client stays
    itself, so dask.array's peers find no stand-in."""
    monkeypatch.setattr("dgemm.cli.bench.connect", lambda stack, scheduler: client)
    return ["--scheduler", "tcp://stand-in:0"]


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


# -- dgemm bench e2e: --codec, --input-chunks, --cold, --store s3://, the plan's floor (issue 15) ------
def _droppable(folder: Path) -> str | None:
    """None where files under ``folder`` can leave the page cache; else why not (tmpfs, no fadvise)."""
    from dgemm.benchmarks import pagecache

    why = pagecache.supported()
    if why:
        return why
    probe = folder / "probe.bin"
    probe.write_bytes(os.urandom(1 << 20))
    r = pagecache.drop([probe])
    probe.unlink()
    if r["cached_before"] is None or r["cached_after"] is None:
        return "mincore cannot tell what is cached here"
    return None if r["cached_after"] < r["cached_before"] else f"{folder}'s filesystem keeps its pages (tmpfs?)"


def test_drop_says_what_left_the_page_cache(tmp_path):
    from dgemm.benchmarks import pagecache

    why = _droppable(tmp_path)
    if why:
        pytest.skip(why)
    data = os.urandom(3 * 2**20 + 123)                 # not a whole number of pages
    (tmp_path / "d").mkdir()
    for name in ("x.bin", "d/y.bin"):
        (tmp_path / name).write_bytes(data)
    (tmp_path / "d" / "y.bin").read_bytes()
    r = pagecache.drop([tmp_path / "x.bin", tmp_path / "d"])
    assert r["files"] == 2 and r["bytes"] == 2 * len(data)
    assert r["cached_before"] == 2 * len(data)          # just written (dirty) and read: every byte cached
    assert r["cached_after"] == 0 and r["dropped_bytes"] == r["cached_before"]
    assert (tmp_path / "x.bin").read_bytes() == data    # dropped from the cache, not from the disk
    assert pagecache.cached_bytes(tmp_path / "x.bin") == len(data)


@pytest.mark.parametrize("args", [["--codec", "blosc-lz4", "--input-chunks", "32"],
                                  ["--input-codec", "blosc-lz4", "--chunks", "32"]])
def test_bench_e2e_codec_and_input_chunks_have_both_names(runner, tmp_path, monkeypatch, args):
    from dgemm.benchmarks import e2e

    seen = {}

    def fake(size, **kw):
        seen.update(kw, size=size)
        raise RuntimeError("stop here")

    monkeypatch.setattr(e2e, "e2e_bench", fake)
    r = runner.invoke(cli, ["bench", "e2e", "--size", "64", "--cold", "--out", str(tmp_path / "out"), *args])
    assert "stop here" in r.output
    assert (seen["size"], seen["input_codec"], seen["chunks"], seen["cold"]) == (64, "blosc-lz4", 32, True)
    assert seen["s3_server"] is None


@pytest.mark.parametrize("args, message", [
    (["--store", "s3://bench/x", "--cold"], "not with an s3:// --store"),
    (["--store", "s3://bench/x", "--keep"], "local S3 server's objects go"),
    (["--s3-server", "local"], "--s3-server needs an s3:// --store"),
    (["--store", "s3://bench/x", "--s3-server", "bench:9000"], "http(s):// URL"),
    (["--store", "gs://bench/x"], "local folder or an s3:// URL"),
])
def test_bench_e2e_store_option_errors_start_nothing(runner, tmp_path, monkeypatch, args, message):
    from dgemm.benchmarks import e2e

    monkeypatch.setattr(e2e, "make_inputs", lambda *a, **k: pytest.fail("inputs written before the checks"))
    monkeypatch.setattr(e2e, "LocalS3", lambda *a, **k: pytest.fail("server started before the checks"))
    r = runner.invoke(cli, ["bench", "e2e", "--size", "64", "--out", str(tmp_path / "out"), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"store": "s3://bench/x", "cold": True}, "not local files"),
    ({"store": "s3://bench/x", "keep": True}, "local S3 server's objects go"),
    ({"s3_server": "local"}, "needs a store on S3"),
    ({"store": "s3:///x"}, "names no bucket"),
])
def test_e2e_refuses_bad_store_options_before_any_work(tmp_path, monkeypatch, kwargs, message):
    from dgemm.benchmarks import e2e

    monkeypatch.setattr(e2e, "make_inputs", lambda *a, **k: pytest.fail("inputs written before the checks"))
    monkeypatch.setattr(e2e, "LocalS3", lambda *a, **k: pytest.fail("server started before the checks"))
    with pytest.raises(ValueError, match=message):
        e2e.e2e_bench(64, chunks=16, out_dir=tmp_path / "out", log=None, **kwargs)
    assert not (tmp_path / "out").exists()


def _floor_checks(rec: dict) -> None:
    """``dgemm plan``'s floor is recorded beside the time, for the blocks the run used, and printed."""
    from dgemm.benchmarks import e2e

    f = rec["dgemm"]["floor"]
    assert f["same_blocks_as_run"] is True
    for key in ("defaults", "measured"):
        assert f[key]["floor_seconds"] > 0 and f[key]["bound"] in f[key]["busiest"]["seconds"]
        assert f[key]["measured_over_floor"] == pytest.approx(rec["dgemm"]["seconds"] / f[key]["floor_seconds"])
    assert f["defaults"]["rates"]["read"] == 5e9            # dgemm plan's defaults
    assert f["measured"]["rates"]["flops"] == pytest.approx(rec["kernel"]["tflops"] * 1e12)
    assert "dgemm plan's floor: " in e2e.format_table(rec)


@needs_device
def test_e2e_cold_drops_the_inputs_before_each_timed_run(runner, tmp_path, lend, no_cuda):
    why = _droppable(tmp_path)
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


@needs_device
def test_e2e_on_a_local_s3_server(client, tmp_path, monkeypatch):
    """Inputs and outputs on the moto server the bench starts: dgemm's product and dask's are right, the
    server's raw GET rate read every chunk object, and the server is gone afterwards."""
    import psutil

    from _check import check_product
    from dgemm.benchmarks import e2e

    for module in ("moto.server", "s3fs", "boto3"):
        pytest.importorskip(module, reason=f"the S3 bench needs {module}: pip install -e '.[test]'")
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    products = {}
    real_check = e2e._check

    def whole_check(a, b, c, storage_options=None):   # the whole of C, read back from the server
        products[os.fspath(c).rsplit("/", 1)[-1]] = [e2e._open(p, storage_options)[...] for p in (a, b, c)]
        return real_check(a, b, c, storage_options)

    monkeypatch.setattr(e2e, "_check", whole_check)
    rec, path = e2e.e2e_bench(48, chunks=16, input_codec="default", store="s3://bench/t", devices="cpu",
                              client=client, out_dir=tmp_path / "out", log=None)
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
    table = e2e.format_table(rec)
    assert "object store, GB/s (raw whole objects, boto3): GET " in table and "S3 at http://127.0.0.1:" in table

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
import re
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


def test_cupy_status_without_cupy(no_cuda):
    assert peers.cupy_status() == (None, "cupy is not installed")
    assert peers.time_cublas("float32", 64, 64, 64, None, 1)[0] is None


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


BENCH = ROOT / "bench"


def _bench_files(pattern: str) -> list[str]:
    """bench/'s files matching ``pattern`` at any depth (the tools and bench/notes/), records left out."""
    return sorted(str(p.relative_to(BENCH)) for p in BENCH.rglob(pattern)
                  if p.is_file() and p.relative_to(BENCH).parts[0] != "results" and "__pycache__" not in p.parts)


SCRIPTS = _bench_files("*.py")
SHELL_SCRIPTS = _bench_files("*.sh")
# where another machine's files were: the GPU machine's site folder, home folders, a checkout's own place
MACHINE_PATHS = re.compile(r"/tmp/|/home/|/root/|/Users/|/work/|\.\./shared")


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_scripts_run_against_the_installed_package(script, tmp_path):
    """No script edits sys.path: each imports dgemm as installed (--help imports it and exits)."""
    assert "sys.path" not in (BENCH / script).read_text()
    r = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stderr


# Scripts that import another version of dgemm on purpose (an A/B of versions in one device call)
VERSIONS_ON_PURPOSE = {"notes/issue-28/gpu_session_ab.sh", "notes/issue-28/gpu_session_async.sh",
                       "notes/issue-28/gpu_session_gil.sh", "notes/issue-28/gpu_session_kernels.sh",
                       "notes/issue-28/gpu_session_decodefirst24.sh", "notes/issue-28/gpu_session_26b.sh",
                       "notes/issue-28/gpu_session_28c.sh", "notes/issue-28/gpu_session_ab_x2.sh",
                       "notes/issue-28/gpu_session_33b.sh", "notes/issue-28/gpu_session_33c.sh"}


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_bench_shell_scripts_parse_and_find_the_project_themselves(script):
    """Run from anywhere: each script finds the project from its own path and writes under $OUT."""
    text = (BENCH / script).read_text()
    assert 'dirname "$0"' in text and '"$OUT"' in text
    if script in VERSIONS_ON_PURPOSE:    # another version's package first, the environment's path kept after it
        assert all("${PYTHONPATH:+:$PYTHONPATH}" in line for line in text.splitlines() if "PYTHONPATH=" in line)
    else:
        assert "PYTHONPATH" not in text
    r = subprocess.run(["bash", "-n", str(BENCH / script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_nothing_in_bench_assumes_a_path_on_another_machine():
    """Scripts and their inputs take paths from their own place, $OUT, $STORE or their arguments."""
    found = [f"{name}:{i}: {line.strip()}" for pattern in ("*.py", "*.sh", "*.txt", "*.json")
             for name in _bench_files(pattern)
             for i, line in enumerate((BENCH / name).read_text().splitlines(), 1) if MACHINE_PATHS.search(line)]
    assert not found, "\n".join(found)


def test_bench_readme_names_every_file():
    """bench/README.md says what each file of bench/ is for (a notes/ folder's files in its row)."""
    readme = (BENCH / "README.md").read_text()

    def named(name: str) -> bool:
        folder, _, base = name.rpartition("/")
        return name in readme or (f"`{folder}/`" in readme and f"`{base}`" in readme)

    missing = [name for name in _bench_files("*") if name != "README.md" and not name.startswith("variants/")
               and not named(name)]
    assert not missing, missing


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

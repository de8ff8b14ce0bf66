"""The autotuner and ``dgemm tune``: the search space's restrictions, that only
correct candidates can win, and that a tuned entry is stored and then used.

Searches on the real device use tiny products (64) and two or three
candidates; the rules of the search itself are checked with a stand-in for
:class:`~dgemm.tuning.timing.KernelBench` whose timings and errors are chosen
by the test.  No test asserts on speed.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json

import numpy as np
import pytest
from click.testing import CliRunner

import dgemm
import dgemm.accuracy
import dgemm.tuning.search
from dgemm.tuning import database as tuning
from dgemm.cli import cli
from dgemm.opencl.discovery import DeviceInfo, list_devices
from dgemm.tuning.timing import Timing
from dgemm.tuning.params import KernelParams
from dgemm.tuning.search import candidates, databases, default_size, search, tune

DEVICES = list_devices()
needs_device = pytest.mark.skipif(not DEVICES, reason="no OpenCL device (pip install pocl-binary-distribution)")

H100 = DeviceInfo(0, 0, "NVIDIA CUDA", "NVIDIA H100 80GB HBM3", "NVIDIA Corporation", "GPU",
                  80 * 2**30, 48 * 1024, 1024, 132, True, "sm_90", "550.54")
SMALL_GPU = DeviceInfo(1, 0, "Other", "Tiny GPU", "Acme", "GPU", 2**30, 16 * 1024, 256, 4, False, None, "1")
CPU = DeviceInfo(2, 0, "Portable Computing Language", "pthread-Some CPU", "GenuineIntel", "CPU",
                 2**34, 512 * 1024, 4096, 8, True, "pocl-cpu", "6.0")


def _pick():
    """The first CPU device (cheapest to build for), else the first device."""
    cpus = [d for d in DEVICES if d.type == "CPU"]
    return (cpus or DEVICES)[0]


@functools.cache
def _candidates(info, dtype, min_threads=64, max_threads=512):
    """candidates(), computed once per test session (it walks the whole space: seconds)."""
    return tuple(candidates(info, dtype, min_threads=min_threads, max_threads=max_threads))


@pytest.fixture
def small_space(monkeypatch):
    """Let search() draw from the first 20 candidates (the real list, cached) instead of recomputing."""
    def fake(info, dtype, **kw):
        return list(_candidates(info, dtype)[:20])
    monkeypatch.setattr(dgemm.tuning.search, "candidates", fake)


@pytest.fixture(scope="module")
def device():
    if not DEVICES:
        pytest.skip("no OpenCL device (pip install pocl-binary-distribution)")
    from dgemm.opencl.device import Device
    return Device(_pick())


@pytest.fixture
def runner():
    return CliRunner()


# -- the search space -------------------------------------------------------------
@pytest.mark.parametrize("info,dtype", [(H100, "float32"), (H100, "float64"), (SMALL_GPU, "float32"),
                                        (CPU, "float64")], ids=["h100-f32", "h100-f64", "small-f32", "cpu-f64"])
def test_candidates_respect_the_restrictions(info, dtype):
    itemsize = np.dtype(dtype).itemsize
    cands = _candidates(info, dtype)
    assert cands, "the space must not be empty"
    assert len(set(cands)) == len(cands)
    max_acc = 128 if itemsize == 4 else 64
    min_acc = 16 if info.type == "GPU" else 1
    for p in cands:
        assert p.problems(itemsize, info.max_work_group_size, info.local_mem) == [], p
        assert 64 <= p.threads <= min(512, info.max_work_group_size), p
        assert p.local_mem_bytes(itemsize) <= info.local_mem, p
        assert min_acc <= p.WPTM * p.WPTN <= max_acc, p
        for f, values in dgemm.tuning.search.SPACE.items():
            if f != "PAD":
                assert getattr(p, f) in values, (f, p)


def test_candidates_thread_limits_are_parameters():
    cands = _candidates(H100, "float32", min_threads=128, max_threads=256)
    assert cands and all(128 <= p.threads <= 256 for p in cands)
    # A tighter window only removes candidates.
    assert set(cands) <= set(_candidates(H100, "float32"))
    # The device's own limit wins over a generous max_threads.
    assert all(p.threads <= SMALL_GPU.max_work_group_size
               for p in _candidates(SMALL_GPU, "float32", max_threads=4096))


def test_default_size():
    assert default_size(H100) == 4096
    assert default_size(CPU) == 1024     # the CPU kernel's cache blocking needs more than 256 to matter


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cpu_candidates_respect_the_restrictions(dtype):
    from dgemm.tuning.search import CPU_ACC_BYTES, CPU_SPACE, cpu_candidates
    itemsize = np.dtype(dtype).itemsize
    cands = cpu_candidates(CPU, dtype)
    assert cands and len(set(cands)) == len(cands)
    lo, hi = CPU_ACC_BYTES
    for p in cands:
        assert p.GEMMK == 1 and p.threads == 1, p
        assert p.problems(itemsize, CPU.max_work_group_size, CPU.local_mem) == [], p
        assert lo <= p.WPTM * p.WPTN * itemsize <= hi, p
        for f, values in CPU_SPACE.items():
            assert getattr(p, f) in values, (f, p)
    # the device's local memory bounds the packed blocks: a smaller one rules out the large tiles
    small = dataclasses.replace(CPU, local_mem=32 * 1024)
    fewer = cpu_candidates(small, dtype)
    assert fewer and set(fewer) < set(cands)
    assert all(p.local_mem_bytes(itemsize) <= 32 * 1024 for p in fewer)


def test_search_space_follows_the_device_type():
    """A CPU device searches the CPU kernel's space, a GPU the local-memory kernel's, a precision its shapes."""
    from dgemm.tuning.search import cpu_candidates, mma_candidates, space_for
    assert space_for(CPU, "float32") == cpu_candidates(CPU, "float32")
    assert {p.GEMMK for p in space_for(SMALL_GPU, "float32")} == {0}
    assert space_for(H100, "float64", "dmma") == mma_candidates(H100, "float64", "dmma")


def test_cpu_neighbours_stay_cpu_kernels():
    from dgemm.tuning.search import CPU_DEFAULT, neighbours
    near = neighbours([CPU_DEFAULT], CPU, "float32")
    assert near and CPU_DEFAULT not in near
    assert all(p.GEMMK == 1 and p.problems(4, CPU.max_work_group_size, CPU.local_mem) == [] for p in near)
    assert {p.TSK for p in near} >= {CPU_DEFAULT.TSK // 2, CPU_DEFAULT.TSK * 2}


# -- the search's rules, with a stand-in bench ------------------------------------
class FakeDevice:
    def __init__(self, info):
        self.info = info


def _fake_bench(monkeypatch, outcomes):
    """Make KernelBench.run answer from ``outcomes``: params -> (seconds, ok) or an exception."""
    runs = []

    class FakeBench:
        def __init__(self, device, dtype, m, n, k, seed=0):
            self.m, self.n, self.k = m, n, k

        def run(self, params, reps=5, warmup=1):
            runs.append(params)
            out = outcomes.get(params, (1.0, True))
            if isinstance(out, Exception):
                raise out
            seconds, ok = out
            return Timing(params, self.m, self.n, self.k, seconds, 1e-7 if ok else 0.5, ok)

    monkeypatch.setattr(dgemm.tuning.search, "KernelBench", FakeBench)
    return runs


def test_search_never_picks_an_incorrect_candidate(monkeypatch, small_space):
    space = _candidates(CPU, "float32")
    wrong_fast, right_slow, broken = space[0], space[1], space[2]
    runs = _fake_bench(monkeypatch, {wrong_fast: (1e-6, False), right_slow: (0.5, True),
                                     broken: RuntimeError("build failed")})
    reports = []
    best, results = search(FakeDevice(CPU), "float32", size=64, budget=60, first=[wrong_fast, right_slow, broken],
                           max_candidates=5, report=lambda *a: reports.append(a))
    assert runs[:3] == [wrong_fast, right_slow, broken]          # `first` goes first
    assert len(runs) == 5
    assert best is not None and best.ok and best.params == right_slow
    assert best.seconds == min(t.seconds for t in results if t.ok)
    assert wrong_fast in [t.params for t in results if not t.ok]  # incorrect runs are kept, not chosen
    assert broken not in [t.params for t in results]
    errors = [a[4] for a in reports if a[2] is None]
    assert len(errors) == 1 and "build failed" in errors[0]
    assert [a[1] for a in reports] == [5] * 5


def test_search_with_nothing_correct_returns_none(monkeypatch, small_space):
    space = _candidates(CPU, "float32")
    _fake_bench(monkeypatch, {p: (0.1, False) for p in space[:3]})
    best, results = search(FakeDevice(CPU), "float32", size=64, budget=60, seed=1, first=space[:3],
                           max_candidates=3)
    assert best is None
    assert len(results) == 3 and not any(t.ok for t in results)


def test_tune_stores_nothing_when_nothing_is_correct(monkeypatch, tmp_path, device, small_space):
    monkeypatch.setattr(dgemm.tuning.search, "KernelBench", _always_wrong())
    db = tmp_path / "tuning.json"
    out = tune(device, "float32", size=64, budget=30, max_candidates=2, database=db)
    assert out.best is None and out.stored is None
    assert len(out.incorrect) == 2 and out.failed == 2
    assert not db.exists()
    assert out.choice.database != "user"   # nothing of this run reached a database


def _always_wrong():
    class WrongBench:
        def __init__(self, device, dtype, m, n, k, seed=0):
            self.m, self.n, self.k = m, n, k

        def run(self, params, reps=5, warmup=1):
            return Timing(params, self.m, self.n, self.k, 1e-3, float("inf"), False)
    return WrongBench


# -- on the device ------------------------------------------------------------------
@needs_device
def test_search_on_the_device_returns_a_correct_best(device):
    first = [tuning.lookup(device.info, "float32").params]
    best, results = search(device, "float32", size=64, budget=30, seed=0, first=first, max_candidates=2)
    assert results and best is not None
    assert best.ok and best in results
    assert best.rel_err <= dgemm.accuracy.tolerance("float32", 64)
    assert best.seconds == min(t.seconds for t in results if t.ok)
    assert results[0].params == first[0]


@needs_device
def test_tune_library_stores_an_entry_that_lookup_uses(device, tmp_path, small_space):
    db = tmp_path / "tuning.json"
    out = tune(device, "float32", size=64, budget=30, seed=3, max_candidates=2, database=db)
    assert out.best is not None and out.best.ok
    assert out.stored == db
    c = out.choice
    assert (c.level, c.key, c.database, c.tuned, c.params) == ("device", device.info.name, "user", True,
                                                               out.best.params)
    entry = json.loads(db.read_text())["device"][device.info.name]["float32"]
    assert entry["generated_by"] == "dgemm tune" and entry["size"] == 64
    assert entry["dgemm_version"] == dgemm.__version__ and entry["driver"] == device.info.driver
    assert entry["tflops"] > 0
    assert datetime.datetime.fromisoformat(entry["date"]).utcoffset() == datetime.timedelta(0)


# -- the command ----------------------------------------------------------------------
@needs_device
def test_tune_command_stores_and_reports_the_entry(runner, tmp_path, monkeypatch):
    db = tmp_path / "user-tuning.json"
    monkeypatch.setenv("DGEMM_TUNING_DB", str(db))    # the user database, so runs use the entry
    info = _pick()
    report = tmp_path / "tune.json"
    r = runner.invoke(cli, ["tune", "--device", info.id, "--dtype", "float32", "--size", "64", "--budget", "30",
                            "--max-candidates", "2", "--json", str(report)])
    assert r.exit_code == 0, r.output
    assert "[1/2" in r.output and "[2/2" in r.output          # a progress line per candidate
    assert "best" in r.output and "failed" in r.output
    c = tuning.lookup(info, "float32")                          # reads $DGEMM_TUNING_DB
    assert (c.level, c.tuned, c.database) == ("device", True, "user")
    assert c.describe() in r.output
    assert "note:" not in r.output                              # it is the database runs read
    data = json.loads(report.read_text())
    f32 = data["dtypes"]["float32"]
    assert f32["best"]["ok"] and KernelParams.from_dict(f32["best"]["params"]) == c.params
    assert f32["stored"] == str(db) and f32["tried"] == 2
    assert "float64" not in data["dtypes"]
    stored = json.loads(db.read_text())["device"][info.name]["float32"]
    assert stored["generated_by"] == "dgemm tune" and stored["size"] == 64


@needs_device
def test_tune_command_database_option(runner, tmp_path, monkeypatch, small_space):
    monkeypatch.setenv("DGEMM_TUNING_DB", str(tmp_path / "untouched.json"))
    db = tmp_path / "elsewhere" / "tuning.json"
    info = _pick()
    r = runner.invoke(cli, ["tune", "--device", info.id, "--dtype", "float32", "--size", "64", "--budget", "30",
                            "--max-candidates", "1", "--database", str(db)])
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "untouched.json").exists()
    c = tuning.lookup(info, "float32", databases(db))
    assert (c.level, c.tuned) == ("device", True)
    assert c.describe() in r.output
    assert f"DGEMM_TUNING_DB={db}" in r.output                 # how to make runs read it


@needs_device
def test_tune_command_without_a_correct_candidate_fails_and_stores_nothing(runner, tmp_path, monkeypatch,
                                                                          small_space):
    monkeypatch.setattr(dgemm.tuning.search, "KernelBench", _always_wrong())
    db = tmp_path / "tuning.json"
    r = runner.invoke(cli, ["tune", "--device", _pick().id, "--dtype", "float32", "--size", "64",
                            "--budget", "30", "--max-candidates", "2", "--database", str(db)])
    assert r.exit_code == 1
    assert "no correct candidate" in r.output and "FAILED" in r.output
    assert "Error: no correct kernel parameters found for float32" in r.output
    assert not db.exists()


def test_tune_command_argument_errors(runner, tmp_path):
    db = tmp_path / "tuning.json"
    r = runner.invoke(cli, ["tune", "--device", "no-such-device-xyz", "--database", str(db)])
    assert r.exit_code == (2 if DEVICES else 1)
    assert r.output.startswith("Error: ") and len(r.output.strip().splitlines()) == 1
    for bad in (["--budget", "0"], ["--size", "0"], ["--dtype", "float16"]):
        r = runner.invoke(cli, ["tune", "--database", str(db), *bad])
        assert r.exit_code == 2, (bad, r.output)
    assert not db.exists()


def test_mma_candidates_respect_the_rules():
    from dgemm.opencl.discovery import DeviceInfo
    from dgemm.tuning.search import mma_candidates
    h100 = DeviceInfo(0, 0, "NVIDIA CUDA", "H", "NVIDIA Corporation", "GPU", 80 << 30, 49152, 1024, 132, True,
                      "sm_90", "")
    a100 = DeviceInfo(0, 0, "NVIDIA CUDA", "A", "NVIDIA Corporation", "GPU", 40 << 30, 49152, 1024, 108, True,
                      "sm_80", "")
    for prec, dt, itemsize in (("dmma", "float64", 8), ("3xtf32", "float32", 4), ("tf32", "float32", 4)):
        space = mma_candidates(h100, dt, prec)
        assert space and all(p.precision == prec and not p.problems(itemsize, 1024, 49152) for p in space)
    assert {p.MMA for p in mma_candidates(h100, "float64", "dmma")} == {1, 2, 3, 4}
    assert {p.MMA for p in mma_candidates(a100, "float64", "dmma")} == {1}     # m16 f64 shapes need sm_90


def test_tune_refuses_a_tensor_core_precision_the_device_lacks(device, tmp_path):
    if device.info.dmma:
        pytest.skip(f"{device.info.name} has tensor cores; the refusal is for devices without")
    with pytest.raises(ValueError, match="has no 3xtf32 path"):
        tune(device, "float32", size=64, budget=5, database=tmp_path / "db.json", precision="3xtf32")
    assert not (tmp_path / "db.json").exists()


def test_tune_tries_earlier_winners_and_their_neighbours_first(monkeypatch, tmp_path, device, small_space):
    """``around`` (dgemm tune --around REPORT) puts earlier winners right after the current choice and defaults."""
    from dgemm.tuning.search import CPU_DEFAULT, earlier_winners, neighbours
    runs = _fake_bench(monkeypatch, {})
    winner = _candidates(device.info, "float32")[5]
    report = {"dtypes": {"float32": {"top": [{"params": winner.as_dict()}]}}}
    around = earlier_winners(report, "float32")
    assert around == [winner]
    tune(device, "float32", size=64, budget=30, max_candidates=4, database=tmp_path / "db.json", around=around)
    current = tuning.lookup(device.info, "float32", databases(tmp_path / "none.json")).params
    default = CPU_DEFAULT if device.info.type == "CPU" else KernelParams()
    expected = list(dict.fromkeys([current, default, winner] + neighbours([winner], device.info, "float32")))
    assert runs == expected[:4]


@needs_device
def test_tune_command_several_precisions_in_one_call(runner, tmp_path, monkeypatch):
    """--precision given twice: one search each, in one call, named dtype:precision in the report."""
    from dgemm.tuning.search import TuneOutcome
    info = _pick()
    runs = []

    def fake_tune(dev, dt, precision=None, **kw):
        runs.append((dt, precision))
        return TuneOutcome(dt, precision, 64, None, [], [], None, tuning.lookup(info, dt), 0.0)

    monkeypatch.setattr(dgemm.tuning.search, "tune", fake_tune)
    report = tmp_path / "tune.json"
    r = runner.invoke(cli, ["tune", "--device", info.id, "--precision", "3xtf32", "--precision", "dmma",
                            "--database", str(tmp_path / "db.json"), "--json", str(report)])
    assert r.exit_code == 1 and "no correct kernel parameters found for float32:3xtf32" in r.output
    wanted = [("float32", "3xtf32")] + ([("float64", "dmma")] if info.fp64 else [])
    assert runs == wanted
    assert set(json.loads(report.read_text())["dtypes"]) == {f"{d}:{p}" for d, p in wanted}
    r = runner.invoke(cli, ["tune", "--dtype", "float64", "--precision", "tf32", "--database", str(tmp_path / "d")])
    assert r.exit_code == 2 and "--precision tf32 is not available for float64" in r.output

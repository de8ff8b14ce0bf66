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
from dgemm.opencl import database as tuning
from dgemm.cli import cli
from dgemm.opencl.discovery import DeviceInfo, list_devices
from dgemm.tuning.timing import Timing
from dgemm.opencl.params import KernelParams
from dgemm.tuning.search import candidates, databases, default_size, search, tune

DEVICES = list_devices()
needs_device = pytest.mark.skipif(not DEVICES, reason="no OpenCL device (pip install pocl-binary-distribution)")

H100 = DeviceInfo(0, 0, "NVIDIA CUDA", "NVIDIA H100 80GB HBM3", "NVIDIA Corporation", "GPU",
                  80 * 2**30, 48 * 1024, 1024, 132, True, "sm_90", "550.54")
A100_LIKE_OLD = DeviceInfo(4, 0, "NVIDIA CUDA", "Tesla V100", "NVIDIA Corporation", "GPU", 16 * 2**30, 48 * 1024,
                           1024, 80, True, "sm_70", "550.54")   # no cp.async before sm_80
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


def test_the_fma_space_has_cp_async_rings_where_the_device_has_cp_async():
    """NVIDIA sm_80+: each set also as a ring of 3 and 4 local tiles (the FMA kernel's Hopper winner is one);
    elsewhere only the register prefetch, which every device runs."""
    from dgemm.tuning.search import neighbours, stage_choices
    h100 = _candidates(H100, "float32")
    assert {p.STAGES for p in h100} == {0, 3, 4} and stage_choices(H100) == (0, 3, 4)
    assert all(p.local_mem_bytes(4) <= H100.local_mem and p.min_compute_capability == 80 for p in h100 if p.STAGES)
    shipped = tuning.lookup(H100, "float32", precision="fma").params
    assert shipped.STAGES == 4 and dataclasses.replace(shipped, GROUPM=0) in h100   # (GROUPM: neighbours vary it)
    assert {q.STAGES for q in neighbours([shipped], H100, "float32") if q.TSM == shipped.TSM and q.WIDTH == shipped.WIDTH
            and q.TSK == shipped.TSK and q.GROUPM == shipped.GROUPM and q.PADA == shipped.PADA} >= {0, 3}
    for info in (SMALL_GPU, A100_LIKE_OLD):
        assert {p.STAGES for p in _candidates(info, "float32")} == {0}, info.name
        assert {q.STAGES for q in neighbours([KernelParams()], info, "float32")} == {0}


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


# -- the wgmma kernels (sm_90): their space, storage and failed builds ----------------
A100 = DeviceInfo(3, 0, "NVIDIA CUDA", "NVIDIA A100", "NVIDIA Corporation", "GPU", 40 * 2**30, 48 * 1024, 1024,
                  108, True, "sm_80", "550.54")
B200 = dataclasses.replace(A100, name="NVIDIA B200", architecture="sm_100")
# the shipped sm_90 entries: the fastest wgmma sets measured (bench/NOTES.md, issue 16)
TF32_WG = tuning.lookup(H100, "float32", precision="tf32").params
X3_WG = tuning.lookup(H100, "float32", precision="3xtf32").params
assert (TF32_WG.MMA, X3_WG.MMA) == (7, 8)


@pytest.mark.parametrize("precision,mma", [("tf32", 7), ("3xtf32", 8)])
def test_wgmma_candidates_on_sm_90(precision, mma):
    from dgemm.opencl.params import WGMMA_LOCAL_MEM
    from dgemm.tuning.search import WGMMA_MAX_ACC, WGMMA_SPACE, wgmma_accumulators, wgmma_candidates
    space = wgmma_candidates(H100, "float32", precision)
    assert space and len(set(space)) == len(space)
    for p in space:
        assert p.MMA == mma and p.k_major and p.precision == precision, p
        # the kernel's rules; H100.local_mem is the 48 KiB NVIDIA's OpenCL reports, not the limit here
        assert p.problems(4, H100.max_work_group_size, H100.local_mem) == [], p
        assert p.local_mem_bytes(4) <= WGMMA_LOCAL_MEM, p
        assert wgmma_accumulators(p) <= WGMMA_MAX_ACC, p
        assert (p.TSK, p.TSM, p.WARPSN) == (32, 64 * p.WARPSM, 1), p
        assert p.STAGES in WGMMA_SPACE["STAGES"] and p.GROUPM in WGMMA_SPACE["GROUPM"], p
    shipped = TF32_WG if mma == 7 else X3_WG
    assert shipped in space                                  # the measured winner is in the space
    assert {p.WARPSM for p in space} == set(WGMMA_SPACE["WARPSM"])
    if mma == 7:
        assert {p.PROMOTE for p in space} == {1}             # a 3xTF32 macro only
        assert max(p.TSN for p in space) == 256              # 128 accumulators: 254 registers, measured
    else:
        assert {p.PROMOTE for p in space} == set(WGMMA_SPACE["PROMOTE"])
        assert max(p.TSN for p in space) == 128              # two sets of TSN/2: more would spill
        # [big; small] halves double the stages: 128 x 128 fits 3 of them in 227 KiB, not 4
        assert dataclasses.replace(X3_WG, STAGES=4) not in space and X3_WG.STAGES == 3
    assert dataclasses.replace(shipped, STAGES=8) not in space   # 8 stages of 128 x 128: over 227 KiB


def test_wgmma_candidates_only_on_sm_90():
    from dgemm.tuning.search import space_for, wgmma_candidates
    for info in (A100, B200, CPU, SMALL_GPU):                # Ampere, a later chip, PoCL, no NVIDIA
        for prec in ("tf32", "3xtf32"):
            assert wgmma_candidates(info, "float32", prec) == [], (info.name, prec)
    assert wgmma_candidates(H100, "float64", "dmma") == [] and wgmma_candidates(H100, "float32", "fma") == []
    assert not any(p.k_major for p in space_for(A100, "float32", "tf32"))
    both = space_for(H100, "float32", "tf32")                # sm_90: one search over both kinds
    assert {p.MMA for p in both} == {5, 7}
    assert {p.MMA for p in space_for(H100, "float32", "3xtf32")} == {6, 8}


@pytest.mark.parametrize("start", [TF32_WG, X3_WG, KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2,
                                                                   WARPSN=1, STAGES=5, GROUPM=8)],
                         ids=["tf32", "3xtf32", "tf32-bn128"])
def test_wgmma_neighbours(start):
    from dgemm.tuning.search import WGMMA_SPACE, neighbours, wgmma_candidates
    near = neighbours([start], H100, "float32")
    assert near and start not in near and len(set(near)) == len(near)
    space = set(wgmma_candidates(H100, "float32", start.precision))
    assert set(near) <= space                                # the same restrictions as the space
    def varied(q):
        return {f for f in ("STAGES", "GROUPM", "PROMOTE", "TSN", "WARPSM") if getattr(q, f) != getattr(start, f)}
    assert all(len(varied(q)) == 1 for q in near), near      # one parameter at a time (TSM follows WARPSM)
    stages = {q.STAGES for q in near if varied(q) == {"STAGES"}}
    assert stages == {s for s in (start.STAGES - 1, start.STAGES + 1) if dataclasses.replace(start, STAGES=s) in space}
    assert {q.GROUPM for q in near if varied(q) == {"GROUPM"}} == {0, 4, 8, 16} - {start.GROUPM}
    assert {q.TSN for q in near if varied(q) == {"TSN"}} <= {96, 160, 192} and any(varied(q) == {"TSN"} for q in near)
    assert any(varied(q) == {"WARPSM"} for q in near)
    promote = {q.PROMOTE for q in near if varied(q) == {"PROMOTE"}}
    assert promote == (set(WGMMA_SPACE["PROMOTE"]) - {start.PROMOTE} if start.MMA == 8 else set())


class FakeHopper:
    """A Device on an sm_90 info whose kernels() builds nothing: a wgmma set in ``broken`` fails as
    Device.kernels' PTX route fails (recorded in ``failed``) and stands in the mma.sync entry."""

    def __init__(self, info=H100, broken=(), stand_in=None):
        self.info, self.broken, self.stand_in = info, set(broken), stand_in
        self.failed: dict[KernelParams, str] = {}

    def check_dtype(self, dtype):
        return np.dtype(dtype)

    def kernels(self, dtype, params, extra_options=()):
        if params.k_major and params in self.broken:
            self.failed[params] = "RuntimeError: ptxas refused the wgmma site"
            params = self.stand_in
        return type("Kernels", (), {"params": params})()


def _device_bench(monkeypatch, outcomes):
    """A KernelBench stand-in that, like the real one, times whatever device.kernels() built."""
    runs = []

    class Bench:
        def __init__(self, device, dtype, m, n, k, seed=0):
            self.device, self.dtype, self.m, self.n, self.k = device, dtype, m, n, k

        def run(self, params, reps=5, warmup=1):
            params = self.device.kernels(self.dtype, params).params
            runs.append(params)
            seconds, ok = outcomes.get(params, (1.0, True))
            return Timing(params, self.m, self.n, self.k, seconds, 1e-7 if ok else 0.5, ok)

    monkeypatch.setattr(dgemm.tuning.search, "KernelBench", Bench)
    return runs


def test_search_on_sm_90_tries_the_wgmma_sets_before_the_mma_sync_ones(monkeypatch):
    """After ``first``, the random order puts the wgmma sets (lookup's choice there) before the mma.sync
    ones, which are only their stand-in; within each kind the order is the seeded shuffle."""
    from dgemm.tuning.search import space_for
    runs = _fake_bench(monkeypatch, {})
    n_wg = sum(p.k_major for p in space_for(H100, "float32", "tf32"))
    search(FakeHopper(), "float32", size=64, budget=60, seed=2, first=[], max_candidates=n_wg + 3,
           precision="tf32")
    assert all(p.k_major for p in runs[:n_wg]) and not any(p.k_major for p in runs[n_wg:])
    assert runs[:n_wg] != sorted(runs[:n_wg], key=lambda p: (p.WARPSM, p.TSN, p.STAGES))   # shuffled


def test_a_failed_wgmma_build_is_a_failed_candidate_not_its_stand_in(monkeypatch, tmp_path):
    """Device.kernels builds the mma.sync stand-in where the PTX route fails; the search must count
    that wgmma set as failed, with the reason, and never time the stand-in under its name."""
    stand_in = tuning.lookup(H100, "float32", precision="tf32", wgmma=False).params
    assert stand_in.MMA == 5
    broken = dataclasses.replace(TF32_WG, STAGES=TF32_WG.STAGES - 1)
    runs = _device_bench(monkeypatch, {stand_in: (1e-6, True)})          # the stand-in would win
    dev = FakeHopper(broken=[broken], stand_in=stand_in)
    out = tune(dev, "float32", size=64, budget=30, max_candidates=3, precision="tf32",
               database=tmp_path / "db.json", around=[broken])
    assert broken in dev.failed
    assert broken not in [t.params for t in out.results] and broken not in runs
    assert runs.count(stand_in) == 1                         # timed once, as itself (the current choice)
    assert len(out.errors) == 1 and "ptxas refused the wgmma site" in out.errors[0]
    assert out.failed == 1
    wg = out.entries["float32:tf32"].params
    assert wg.k_major and wg != broken                       # the wgmma entry holds a wgmma kernel that ran
    assert out.entries["float32:tf32/mma.sync"].params == stand_in


@needs_device
def test_search_on_a_real_device_counts_a_wgmma_set_it_cannot_build_as_failed():
    """The real Device.kernels: off sm_90 the wgmma kernel cannot build and it builds a stand-in;
    the search reports the wgmma set as failed, with the device's reason, and times nothing for it."""
    from dgemm.opencl.device import Device
    dev = Device(_pick())               # its own: the session's device keeps no failure
    if dev.info.compute_capability == 90:
        pytest.skip(f"{dev.info.name} builds the wgmma kernel; this is about a device that cannot")
    reports = []
    best, results = search(dev, "float32", size=64, budget=30, first=[TF32_WG], max_candidates=1,
                           report=lambda *a: reports.append(a))
    assert best is None and results == []
    assert TF32_WG in dev.failed
    assert len(reports) == 1 and reports[0][2] is None
    assert "WgmmaBuildFailed" in reports[0][4] and "wgmma is sm_90's" in reports[0][4]


def _stored(db, name=H100.name):
    return {k: KernelParams.from_dict(v["params"]) for k, v in json.loads(db.read_text())["device"][name].items()}


@pytest.mark.parametrize("precision,sync", [("tf32", 5), ("3xtf32", 6)])
def test_tune_stores_each_kind_under_the_name_lookup_reads(monkeypatch, tmp_path, precision, sync):
    """On sm_90 the best wgmma set goes to float32:PREC, the best mma.sync one to float32:PREC/mma.sync;
    lookup(wgmma=True/False) then finds each.  3xTF32 on wgmma is float32's default there: its winner is too."""
    from dgemm.tuning.search import mma_candidates, neighbours
    shipped_wg = tuning.lookup(H100, "float32", precision=precision).params
    wg = neighbours([shipped_wg], H100, "float32")[0]
    sync_p = next(p for p in mma_candidates(H100, "float32", precision)
                  if p != tuning.lookup(H100, "float32", precision=precision, wgmma=False).params)
    assert wg.k_major and sync_p.MMA == sync
    _fake_bench(monkeypatch, {wg: (0.1, True), sync_p: (0.2, True)})
    db = tmp_path / "db.json"
    out = tune(FakeHopper(), "float32", size=64, budget=30, max_candidates=4, precision=precision, database=db,
               around=[wg, sync_p])
    assert out.best.params == wg
    names = {f"float32:{precision}": wg, f"float32:{precision}/mma.sync": sync_p}
    if precision == "3xtf32":
        names["float32"] = wg
    assert _stored(db) == names and {k: t.params for k, t in out.entries.items()} == names
    dbs = databases(db)
    assert tuning.lookup(H100, "float32", dbs, precision=precision).params == wg
    assert tuning.lookup(H100, "float32", dbs, precision=precision, wgmma=False).params == sync_p
    default = tuning.lookup(H100, "float32", dbs)
    assert default.params == (wg if precision == "3xtf32" else tuning.lookup(H100, "float32").params)


def test_an_mma_sync_winner_never_replaces_the_wgmma_entry(monkeypatch, tmp_path):
    """Every wgmma set fails (or is slower): only float32:tf32/mma.sync is written, and the wgmma
    entry (the shipped one here) still answers lookup, with the tuned stand-in behind it."""
    from dgemm.tuning.search import mma_candidates
    sync_p = mma_candidates(H100, "float32", "tf32")[0]
    _fake_bench(monkeypatch, {p: (0.1, False) for p in [TF32_WG]} | {sync_p: (1e-3, True)})
    db = tmp_path / "db.json"
    out = tune(FakeHopper(), "float32", size=64, budget=30, max_candidates=3, precision="tf32", database=db,
               around=[sync_p])
    shipped_sync = tuning.lookup(H100, "float32", precision="tf32", wgmma=False).params
    # the current choices first, both kinds: the shipped wgmma set ran (incorrect) and its stand-in (slower)
    assert [t.params for t in out.results] == [TF32_WG, shipped_sync, sync_p]
    assert _stored(db) == {"float32:tf32/mma.sync": sync_p}
    dbs = databases(db)
    c = tuning.lookup(H100, "float32", dbs, precision="tf32")
    assert c.params == TF32_WG and c.database == "shipped"
    assert out.choice == c
    assert tuning.lookup(H100, "float32", dbs, precision="tf32", wgmma=False).params == sync_p
    # elsewhere (no wgmma) the mma.sync winner is the precision's entry itself
    out = tune(FakeHopper(A100), "float32", size=64, budget=30, max_candidates=1, precision="tf32",
               database=db, around=[sync_p])
    assert list(out.entries) == ["float32:tf32"]
    assert tuning.lookup(A100, "float32", databases(db), precision="tf32").params == out.best.params


def test_tune_without_precision_leaves_a_tensor_core_default_alone(monkeypatch, tmp_path, small_space):
    """float32's default on sm_90 is 3xTF32 on wgmma: a search without a precision tunes the FMA kernel
    as float32:fma; float64 with DMMA likewise; where the default is the FMA kernel it is the default."""
    from dgemm.tuning.search import tuned_path
    db = tmp_path / "db.json"
    assert tuned_path(H100, "float32", None, db) == "fma" and tuned_path(H100, "float64", None, db) == "fma"
    assert tuned_path(A100, "float32", None, db) is None and tuned_path(CPU, "float32", None, db) is None
    assert tuned_path(H100, "float32", "tf32", db) == "tf32"
    _fake_bench(monkeypatch, {})
    default = tuning.lookup(H100, "float32", databases(db)).params
    assert default.k_major and default.precision == "3xtf32"
    out = tune(FakeHopper(), "float32", size=64, budget=30, max_candidates=2, database=db)
    assert out.precision == "fma" and out.best.params.precision == "fma"
    assert _stored(db) == {"float32:fma": out.best.params}
    assert tuning.lookup(H100, "float32", databases(db)).params == default
    assert tuning.lookup(H100, "float32", databases(db), precision="fma").params == out.best.params
    assert out.choice.params == out.best.params
    # an FMA default (PoCL) is tuned in place, as before
    out = tune(FakeHopper(CPU), "float32", size=64, budget=30, max_candidates=1, database=db)
    assert out.precision is None and list(out.entries) == ["float32"]


def test_tune_command_on_sm_90(runner, tmp_path, monkeypatch, small_space):
    """dgemm tune --dtype float32 on an H100 says it tunes the FMA kernel as float32:fma and leaves the
    default alone; --precision 3xtf32 tunes the default, and lists every entry it wrote."""
    import dgemm.cli.tune
    import dgemm.opencl.device
    monkeypatch.setattr(dgemm.cli.tune, "one_device", lambda spec: H100)
    monkeypatch.setattr(dgemm.opencl.device, "Device", lambda info: FakeHopper(info))
    _fake_bench(monkeypatch, {})
    db = tmp_path / "db.json"
    common = ["tune", "--size", "64", "--max-candidates", "2", "--database", str(db)]
    r = runner.invoke(cli, common + ["--dtype", "float32"])
    assert r.exit_code == 0, r.output
    assert ("float32's default on NVIDIA H100 80GB HBM3 is the 3xtf32 kernel (wgmma.m64nNk8): tuning the FMA "
            "kernel as float32:fma, the default is left alone (--precision 3xtf32 tunes it)") in r.output
    assert "float32:fma [1/2" in r.output and "\n  float32:fma: " in r.output
    assert set(_stored(db)) == {"float32:fma"}
    r = runner.invoke(cli, common + ["--precision", "3xtf32", "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    assert "'s default" not in r.output
    stored = _stored(db)
    assert set(stored) == {"float32:fma", "float32:3xtf32", "float32:3xtf32/mma.sync", "float32"}
    for name in ("float32:3xtf32", "float32:3xtf32/mma.sync", "float32"):
        assert f"\n  {name}: " in r.output
    report = json.loads((tmp_path / "r.json").read_text())["dtypes"]["float32:3xtf32"]
    assert {k: KernelParams.from_dict(v["params"]) for k, v in report["entries"].items()} == \
        {k: v for k, v in stored.items() if k != "float32:fma"}

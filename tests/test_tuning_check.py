"""The tuner's acceptance check against kernels that are subtly wrong, on the device (issue 30).

:mod:`tests.test_search` checks the search's rules with stand-in benches
whose ``ok`` the test chooses; here the real check
(:class:`dgemm.tuning.timing.KernelBench` and the tolerance of
:mod:`dgemm.accuracy`) meets real wrong kernels on PoCL.  The wrong kernels
are the CPU kernel (``gemm_cpu.cl``) with one bug planted behind a macro: a
copy of the kernel folder (the fixture :func:`planted`) where each bug sits
in ``#if defined(PLANT_...)``, and a :class:`PlantedDevice` that adds the
macro to the compiler options of chosen parameter sets, the way the tuner
receives them.  Every other set builds the unchanged kernel.  The bugs:

* ``PLANT_LOST_TILE``: the K loop stops one k-tile early (``k0 < K - TSK``).
* ``PLANT_SHORT_A``: A's packed panel keeps 8 of float32's 24 significand bits
  (bfloat16): about 12 times the tolerance at k = 1024 (the tuner's size on
  a CPU device) and 23 times at 512 (this test's), which a tolerance 100
  times too loose passes.  A lost k-tile is hundreds of times the tolerance there; at the
  GPU's size (4096, TSK 8) about 60 times (:mod:`dgemm.accuracy`).
* ``PLANT_CORNER_LOST_TILE``: the last work-group (the bottom-right tile of C)
  loses its last k-tile; every other tile is right.
* ``PLANT_SKIP_TILE``: work-group (1, 1) writes nothing: its tile keeps the
  NaN the bench fills C with.

No test asserts on speed; one makes sure (as its premise) that a wrong
kernel was timed faster than the correct one, so that only the check keeps
it out.
"""
from __future__ import annotations

import functools
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import dgemm.opencl.device
import dgemm.opencl.sources
from dgemm.accuracy import tolerance
from dgemm.cli import cli
from dgemm.opencl import database as tuning
from dgemm.opencl.device import Device
from dgemm.opencl.discovery import list_devices
from dgemm.opencl.params import KernelParams
from dgemm.tuning.search import CPU_DEFAULT, databases
from dgemm.tuning.timing import KernelBench

CPUS = [d for d in list_devices() if d.type == "CPU"]
pytestmark = pytest.mark.skipif(not CPUS, reason="no CPU OpenCL device (pip install pocl-binary-distribution)")

_LOOP = "    for (int k0 = 0; k0 < K; k0 += TSK) {\n"
_PACK_A = "                    Ap[(i * TSK + k) * WPTM + r] = a[i * WPTM + r];\n"
_ORIGIN = "    TILE_ORIGIN(offsetM, offsetN);\n"
# macro -> (the line of gemm_cpu.cl it replaces, what replaces it)
PLANTS = {
    "PLANT_LOST_TILE": (_LOOP, "    for (int k0 = 0; k0 < K - TSK; k0 += TSK) {\n"),
    "PLANT_SHORT_A": (_PACK_A, ("                    Ap[(i * TSK + k) * WPTM + r] = "
                                "as_float(as_uint(a[i * WPTM + r]) & 0xFFFF0000u);\n")),
    "PLANT_CORNER_LOST_TILE": (_LOOP, ("    const int lost_ = offsetM + TSM == M && offsetN + TSN == N ? TSK : 0;\n"
                                       "    for (int k0 = 0; k0 < K - lost_; k0 += TSK) {\n")),
    "PLANT_SKIP_TILE": (_ORIGIN, _ORIGIN + "    if (offsetM == TSM && offsetN == TSN) return;\n"),
}

# A correct set much slower than the tuned ones on a CPU (a 1 x 1 register block of 8 x 8 tiles: about
# 20 times the time of the CPU default at 512^3 on PoCL, 2 cores), so that a wrong kernel on a fast set
# is the fastest candidate.
SLOW = KernelParams(GEMMK=1, TSM=8, TSN=8, TSK=16, WPTM=1, WPTN=1, VWN=1, WIDTH=1)
# A fast set besides the database's choice and the CPU default (which may be the same set on a device
# the shipped database does not name): the CPU default in bands of 8 tile rows.
FAST = KernelParams(GEMMK=1, TSM=48, TSN=64, TSK=64, WPTM=6, WPTN=16, VWN=8, WIDTH=1, GROUPM=8)


def _plant(source: str) -> str:
    """``source`` (gemm_cpu.cl) with each bug of :data:`PLANTS` behind its macro."""
    for macro, (line, bug) in PLANTS.items():
        assert source.count(line) == 1, f"{macro}: gemm_cpu.cl changed; update PLANTS ({line.strip()!r})"
        source = source.replace(line, f"#if defined({macro})\n{bug}#else\n{line}#endif\n")
    return source


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """Devices build from a copy of the kernels with the bugs of :data:`PLANTS` planted behind macros."""
    real = dgemm.opencl.sources.kernel_dir()
    folder = tmp_path / "kernels"
    shutil.copytree(real, folder)
    (folder / "gemm_cpu.cl").write_text(_plant((real / "gemm_cpu.cl").read_text()))
    monkeypatch.setattr(dgemm.opencl.sources, "kernel_dir", lambda: folder)
    return folder


class PlantedDevice(Device):
    """A Device that builds the parameter sets of ``plants`` with a bug's macro (:data:`PLANTS`)."""

    def __init__(self, info, plants: dict[KernelParams, str]):
        super().__init__(info)
        self.plants = dict(plants)

    def kernels(self, dtype, params=None, extra_options=()):
        macro = self.plants.get(params)
        return super().kernels(dtype, params, (*extra_options, f"-D{macro}") if macro else tuple(extra_options))


def test_tune_command_refuses_subtly_wrong_kernels_and_stores_the_correct_one(planted, tmp_path, monkeypatch):
    """``dgemm tune`` at a CPU device's size: the fast candidates (the database's choice, the CPU
    default, :data:`FAST`) are built wrong, losing a k-tile or with A cut to bfloat16 (within 100 times
    the tolerance); the slow correct one beside them must be the one stored and reported best, the
    wrong ones refused in the report, with their error."""
    info, size = CPUS[0], 512
    db, around, report = tmp_path / "tuning.json", tmp_path / "earlier.json", tmp_path / "tune.json"
    current = tuning.lookup(info, "float32", databases(db)).params
    # (the CPU default gets the bfloat16 bug even where it is the database's choice too)
    plants = {current: "PLANT_LOST_TILE", FAST: "PLANT_LOST_TILE", CPU_DEFAULT: "PLANT_SHORT_A"}
    assert SLOW not in plants
    monkeypatch.setattr(dgemm.opencl.device, "Device", functools.partial(PlantedDevice, plants=plants))
    # the search tries the database's choice and the CPU default, then the earlier winners (FAST, SLOW)
    around.write_text(json.dumps({"dtypes": {"float32": {"top": [{"params": p.as_dict()} for p in (FAST, SLOW)]}}}))
    tried = len(plants) + 1
    r = CliRunner().invoke(cli, ["tune", "--device", info.id, "--dtype", "float32", "--size", str(size),
                                 "--budget", "600", "--max-candidates", str(tried), "--around", str(around),
                                 "--database", str(db), "--json", str(report)])
    assert r.exit_code == 0, r.output
    tol = tolerance("float32", size)
    out = json.loads(report.read_text())["dtypes"]["float32"]
    assert out["tried"] == tried and not out["errors"]
    incorrect = {KernelParams.from_dict(t["params"]): t for t in out["incorrect"]}
    assert set(incorrect) == set(plants), r.output                  # every wrong kernel refused ...
    for t in incorrect.values():
        assert not t["ok"] and t["rel_err"] > tol                    # ... for its error
    assert r.output.count("FAILED (rel_err") == len(plants)
    short = incorrect[CPU_DEFAULT]["rel_err"]
    assert short < 100 * tol, f"the bfloat16 bug should be subtle: {short / tol:.0f} x the tolerance"
    # the correct one beside them is accepted, and is all that is stored
    assert [KernelParams.from_dict(t["params"]) for t in out["top"]] == [SLOW]
    assert KernelParams.from_dict(out["best"]["params"]) == SLOW and out["best"]["rel_err"] <= tol
    stored = json.loads(db.read_text())["device"][info.name]
    assert list(stored) == ["float32"]
    assert KernelParams.from_dict(stored["float32"]["params"]) == SLOW and stored["float32"]["rel_err"] <= tol
    assert tuning.lookup(info, "float32", databases(db)).params == SLOW
    # the premise: a wrong kernel was timed faster, so that only the check kept it out
    assert min(t["seconds"] for t in incorrect.values()) < out["best"]["seconds"], out


@pytest.mark.parametrize("macro", ["PLANT_CORNER_LOST_TILE", "PLANT_SKIP_TILE"])
def test_the_check_refuses_a_kernel_wrong_in_one_tile_whatever_it_samples(planted, macro):
    """One wrong tile of C (8 x 8 of 1000 x 1000): the check reads 24 whole rows and columns, which
    miss a given tile about 2 times in 3 when drawn at random.  It must refuse the kernel with every
    seed: the last row and column are always checked (edge tiles are where kernels go wrong), and no
    entry may keep the NaN C is filled with.  The same kernel without the bug passes."""
    info = CPUS[0]
    dev = PlantedDevice(info, {SLOW: macro})
    plain = Device(info)
    m = n = 1000
    for seed in range(6):
        bench = KernelBench(dev, "float32", m, n, 32, seed=seed)
        wrong = bench.run(SLOW, reps=1, warmup=0)
        assert wrong.params == SLOW and not wrong.ok, f"seed {seed}: rel_err {wrong.rel_err:.3g} passed"
        assert wrong.rel_err > tolerance("float32", 32)
    right = KernelBench(plain, "float32", m, n, 32, seed=0).run(SLOW, reps=1, warmup=0)
    assert right.ok and right.rel_err <= tolerance("float32", 32)
    # (the bug really is in one tile only: C, checked whole against numpy, is wrong there alone)
    c = _whole_c(dev, bench, SLOW)
    ref = bench.a.astype(np.float64) @ bench.b.astype(np.float64)
    bad = ~np.isclose(c, ref, rtol=1e-4, atol=1e-3)
    rows, cols = np.nonzero(bad)
    assert bad.sum() == 64 and np.ptp(rows) == 7 and np.ptp(cols) == 7, (rows, cols)


def _whole_c(dev, bench, params) -> np.ndarray:
    """The whole C ``params`` computes on ``bench``'s inputs, through the same device kernels."""
    import pyopencl as cl

    kern = dev.kernels(bench.dtype, params)
    (at, bp, c), (mp, np_, kp) = bench._inputs(params.tiles)
    cl.enqueue_fill_buffer(dev.queue, c, bench.dtype.type(np.nan), 0, mp * np_ * bench.dtype.itemsize)
    gsize, lsize = params.launch(mp, np_)
    real = bench.dtype.type
    kern.gemm(dev.queue, gsize, lsize, np.int32(mp), np.int32(np_), np.int32(kp), real(1), real(0),
              at, bp, c).wait()
    out = np.empty((mp, np_), bench.dtype)
    cl.enqueue_copy(dev.queue, out, c, is_blocking=True)
    return out[:bench.m, :bench.n]

"""The autotuner: search the kernel's parameter space on one device.

The search space and its restrictions live here (as in CLBlast, the kernel
only declares defaults).  Each candidate is built, run on device-resident
random inputs, checked against float64 numpy on sampled rows and columns,
and timed with OpenCL profiling events; only correct candidates count.
:func:`tune` (behind ``dgemm tune``) searches and stores the best correct
candidate in the tuning database.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dgemm.dtypes import check_precision
from dgemm.opencl.database import Choice, usable
from dgemm.opencl.device import Device
from dgemm.opencl.params import CPU_VWN, MMA_KINDS, KernelParams, min_compute_capability, mma_values
from dgemm.tuning.timing import KernelBench, Timing

SPACE = {
    "TSM": (32, 64, 96, 128, 192, 256),
    "TSN": (32, 64, 96, 128, 192, 256),
    "TSK": (8, 16, 32),
    "WPTM": (2, 4, 6, 8, 12, 16),
    "WPTN": (2, 4, 6, 8, 12, 16),
    "WIDTH": (1, 2, 4, 8),
    "VWM": (1, 2, 4),
    "VWN": (1, 2, 4),
    "PAD": (False, True),   # pad local rows by one vector
}


def stage_choices(device_info) -> tuple[int, ...]:
    """The tile pipelines to search on this device: through registers (0) everywhere, and where the
    device has cp.async (NVIDIA sm_80+) rings of 3 and 4 local tiles (the FMA kernel's Hopper winner
    is a ring of 4: bench/NOTES.md, issue 16)."""
    return (0, 3, 4) if device_info.compute_capability >= 80 else (0,)


def candidates(device_info, dtype, *, min_threads: int = 64, max_threads: int = 512,
               min_acc: int | None = None) -> list[KernelParams]:
    """Every parameter set of :data:`SPACE` that the device can run and that is worth timing.

    Restrictions: the kernel's own rules (:meth:`KernelParams.problems`), the
    device's work-group and local-memory limits, a work-group of
    ``min_threads..max_threads`` items, and at most 128 (float32) or 64
    (float64) accumulators per work-item so they can stay in registers.
    On NVIDIA sm_80+ each set also comes with a cp.async ring
    (:func:`stage_choices`).
    """
    itemsize = np.dtype(dtype).itemsize
    max_acc = 128 if itemsize == 4 else 64
    if min_acc is None:
        # GPUs need a large register block to feed the FMA units from local memory.
        min_acc = 16 if device_info.type == "GPU" else 1
    out = []
    rings = [s for s in stage_choices(device_info) if s]
    for tsm, tsn, tsk, wm, wn, w, vwm, vwn, pad in itertools.product(*SPACE.values()):
        if not (min_acc <= wm * wn <= max_acc):
            continue
        p = KernelParams(TSM=tsm, TSN=tsn, TSK=tsk, WPTM=wm, WPTN=wn, WIDTH=w, VWM=vwm, VWN=vwn,
                         PADA=math.lcm(w, vwm) if pad else 0, PADB=math.lcm(w, vwn) if pad else 0)
        if not (min_threads <= p.threads <= max_threads):
            continue
        if p.problems(itemsize, device_info.max_work_group_size, device_info.local_mem):
            continue
        out.append(p)
        # a ring changes only the local memory the set needs (problems() says the same, 3x slower)
        out += [q for q in (dataclasses.replace(p, STAGES=s) for s in rings)
                if q.local_mem_bytes(itemsize) <= device_info.local_mem]
    return out


# The CPU kernel's space (GEMMK=1, kernels/gemm_cpu.cl): the C tile of a work-item, the depth of its
# packed K blocks, the register block and its vector width, the work-group order.
CPU_SPACE = {
    "TSM": (24, 48, 96, 192),
    "TSN": (32, 64, 128, 256),
    "TSK": (64, 128, 256, 512),
    "WPTM": (2, 4, 6, 8, 12),
    "WPTN": (4, 8, 16, 32),
    "VWN": (4, 8, 16),
    "GROUPM": (0, 8),
}
# The CPU kernel's first candidate in a search on a CPU device, after the database's choice: a BLAS
# micro-kernel's 6 x 16 register block (tuning.json's float32 default for CPU devices).
CPU_DEFAULT = KernelParams(GEMMK=1, TSM=48, TSN=64, TSK=64, WPTM=6, WPTN=16, VWN=8, WIDTH=1)
# Bytes of accumulators in a CPU register block: 12 AVX registers is 384 (6 x 16 floats); AVX-512
# has room for more, and a block that spills loses to the others.
CPU_ACC_BYTES = (128, 1024)


def cpu_candidates(device_info, dtype) -> list[KernelParams]:
    """Every parameter set of :data:`CPU_SPACE` that the device can run and that is worth timing.

    Restrictions: the kernel's rules (:meth:`KernelParams.problems`, among
    them that the packed blocks fit the device's local memory) and
    :data:`CPU_ACC_BYTES` of accumulators per work-item.
    """
    itemsize = np.dtype(dtype).itemsize
    lo, hi = CPU_ACC_BYTES
    out = []
    for tsm, tsn, tsk, wm, wn, vwn, gm in itertools.product(*CPU_SPACE.values()):
        if not (lo <= wm * wn * itemsize <= hi) or vwn not in CPU_VWN:
            continue
        p = KernelParams(GEMMK=1, TSM=tsm, TSN=tsn, TSK=tsk, WPTM=wm, WPTN=wn, VWN=vwn, WIDTH=1, VWM=1,
                         GROUPM=gm)
        if p.problems(itemsize, device_info.max_work_group_size, device_info.local_mem):
            continue
        out.append(p)
    return out


def space_for(device_info, dtype, precision: str | None = None) -> list[KernelParams]:
    """The space :func:`search` draws from: tensor-core shapes for a named precision, the CPU
    kernel's on a CPU device, else the GPU FMA kernel's.

    A float32 tensor-core precision on sm_90 searches the ``mma.sync`` and the
    ``wgmma`` kernels together (:func:`mma_candidates` + :func:`wgmma_candidates`):
    one search, one budget; :func:`tune` stores the best of each under its own entry.
    """
    if precision not in (None, "fma"):
        return mma_candidates(device_info, dtype, precision) + wgmma_candidates(device_info, dtype, precision)
    if device_info.type == "CPU":
        return cpu_candidates(device_info, dtype)
    return candidates(device_info, dtype)


def mma_candidates(device_info, dtype, precision: str) -> list[KernelParams]:
    """The tensor-core kernels' space: instruction shape, tile, warps, grouping.

    ``precision`` is ``"dmma"`` (float64: m8n8k4, m16n8k4/k8/k16),
    ``"3xtf32"`` or ``"tf32"`` (float32; their ``wgmma`` kernels are
    :func:`wgmma_candidates`').  Restrictions: the kernel's rules,
    the device's compute capability and limits, at least 64 work-items, and
    a warp tile of 4..32 (64 for plain TF32) 8x8 fragments so the
    accumulators stay in registers.  Local rows are padded so the four
    k-rows a half-warp reads fall in distinct banks (8 words).
    """
    itemsize = np.dtype(dtype).itemsize
    # largest k first, as the seeded shuffle of the search has always received them
    mmas = sorted((v for v in mma_values(precision) if not MMA_KINDS[v].wgmma), reverse=True)
    if precision == "dmma":
        pad, width, max_frag = 4, 2, 32
    else:
        pad, width, max_frag = 8, 4, (32 if precision == "3xtf32" else 64)
    out = []
    for mma, tsm, tsn, tsk, wm, wn, gm in itertools.product(
            mmas, (32, 64, 128, 256), (32, 64, 128, 256), (8, 16, 32), (1, 2, 4), (1, 2, 4), (0, 8)):
        p = KernelParams(MMA=mma, TSM=tsm, TSN=tsn, TSK=tsk, WARPSM=wm, WARPSN=wn, WIDTH=width,
                         PADA=pad, PADB=pad, GROUPM=gm)
        frags = (tsm // wm // 8) * (tsn // wn // 8)
        if not (4 <= frags <= max_frag) or p.threads < 64:
            continue
        if device_info.compute_capability < p.min_compute_capability:
            continue
        if p.problems(itemsize, device_info.max_work_group_size, device_info.local_mem):
            continue
        out.append(p)
    return out


# The wgmma kernels' space (MMA 7 and 8, kernels/gemm_wgmma.cl, sm_90 only).  TSM is 64 per
# warpgroup and TSK 32 (a 128-byte swizzled row), so the free choices are these: warpgroups, the
# tile's width (wgmma's n, multiples of 8 up to 256: a spread of them), the cp.async stages in
# flight, the work-group order, and for 3xTF32 (MMA=8) the tiles summed per IEEE add.
WGMMA_SPACE = {
    "WARPSM": (1, 2, 3),
    "TSN": (64, 96, 128, 160, 192, 256),
    "STAGES": (3, 4, 5, 6, 7, 8),
    "GROUPM": (0, 4, 8, 16),
    "PROMOTE": (1, 2, 4, 8),
}
# Accumulator floats per thread a wgmma kernel may hold (wgmma_accumulators): TSN 256 on MMA=7 is
# 128 of them and ptxas gave it 254 registers, still without spills (bench/NOTES.md, "Issue 16");
# 3xTF32's second set would take TSN > 128 past the 255-register limit.
WGMMA_MAX_ACC = 128


def wgmma_accumulators(p: KernelParams) -> int:
    """Accumulator floats per thread of a wgmma kernel: a TSM x TSN tile over 128 WARPSM threads is
    TSN/2 each; 3xTF32 (two parts) sums each tile in a second set of the same size."""
    return p.TSN // 2 * p.parts


def _wgmma_worth(p: KernelParams, device_info, dtype) -> bool:
    """The restrictions of :func:`wgmma_candidates` (and of their :func:`neighbours`)."""
    # usable() is lookup's own test (the kernel's rules within WGMMA_LOCAL_MEM, not the 48 KiB
    # NVIDIA's OpenCL reports; sm_90 exactly), so lookup chooses whatever the tuner stores
    return usable(p, device_info, np.dtype(dtype).name) and wgmma_accumulators(p) <= WGMMA_MAX_ACC


def wgmma_candidates(device_info, dtype, precision: str) -> list[KernelParams]:
    """The ``wgmma`` kernels' space (:data:`WGMMA_SPACE`) for ``"tf32"`` (MMA=7) or ``"3xtf32"`` (MMA=8).

    Empty for any other precision and on any device but sm_90 (Hopper; wgmma
    is sm_90a's, not a later chip's).  Restrictions: the kernel's rules
    (:meth:`KernelParams.problems`: at most ``WGMMA_LOCAL_MEM`` of stages,
    the B tile split in 16-byte copies over the work-group), at most
    :data:`WGMMA_MAX_ACC` accumulators per thread so they stay in registers,
    and PROMOTE only where it means something (MMA=8).
    """
    out = []
    for mma in (v for v in mma_values(precision) if MMA_KINDS[v].wgmma):
        for wg, tsn, stages, gm, promote in itertools.product(*WGMMA_SPACE.values()):
            if promote != 1 and MMA_KINDS[mma].precision != "3xtf32":   # a 3xTF32 macro; 1 elsewhere
                continue
            p = KernelParams(MMA=mma, TSM=64 * wg, TSN=tsn, TSK=32, WARPSM=wg, WARPSN=1, STAGES=stages,
                             GROUPM=gm, PROMOTE=promote)
            if _wgmma_worth(p, device_info, dtype):
                out.append(p)
    return out


def neighbours(params: list[KernelParams], device_info, dtype) -> list[KernelParams]:
    """Variants of good parameter sets: vector widths, local padding, TSK and group order.

    Used to focus a search around earlier winners before sampling the rest
    of the space.  A CPU kernel's set (GEMMK=1) varies its tile, K depth,
    vector width and group order instead; a wgmma kernel's (MMA 7, 8) its
    stages, group order, tiles per add, tile width and warpgroups
    (:func:`_wgmma_neighbours`), within :func:`wgmma_candidates`' restrictions.
    """
    itemsize = np.dtype(dtype).itemsize
    out: list[KernelParams] = []
    for p in params:
        if p.k_major:
            out += [q for q in _wgmma_neighbours(p) if q not in out and _wgmma_worth(q, device_info, dtype)]
            continue
        if p.GEMMK:
            variants = _cpu_neighbours(p)
            for q in variants:
                if q not in out and not q.problems(itemsize, device_info.max_work_group_size, device_info.local_mem):
                    out.append(q)
            continue
        variants = [dataclasses.replace(p, WIDTH=w, VWM=vwm, VWN=vwn,
                                        PADA=math.lcm(w, vwm) if pad else 0, PADB=math.lcm(w, vwn) if pad else 0)
                    for w, vwm, vwn, pad in itertools.product((1, 2, 4), (1, 2, 4), (1, 2, 4), (False, True))]
        variants += [dataclasses.replace(p, TSK=tsk) for tsk in (8, 16, 32) if tsk != p.TSK]
        variants += [dataclasses.replace(p, GROUPM=g) for g in (4, 8, 16) if g != p.GROUPM]
        variants += [dataclasses.replace(p, STAGES=st) for st in stage_choices(device_info) if st != p.STAGES]
        for q in variants:
            if q not in out and not q.problems(itemsize, device_info.max_work_group_size, device_info.local_mem):
                out.append(q)
    return out


def _wgmma_neighbours(p: KernelParams) -> list[KernelParams]:
    """Variants of a wgmma kernel's parameters: STAGES +-1, the other group orders and (MMA=8) tiles
    per add, TSN one step either way in :data:`WGMMA_SPACE`, the other warpgroup counts."""
    out = [dataclasses.replace(p, STAGES=s) for s in (p.STAGES - 1, p.STAGES + 1)]
    out += [dataclasses.replace(p, GROUPM=g) for g in WGMMA_SPACE["GROUPM"] if g != p.GROUPM]
    if p.precision == "3xtf32":
        out += [dataclasses.replace(p, PROMOTE=v) for v in WGMMA_SPACE["PROMOTE"] if v != p.PROMOTE]
    widths = sorted(set(WGMMA_SPACE["TSN"]) | {p.TSN})   # (a hand-made entry's width may be off the list)
    i = widths.index(p.TSN)
    out += [dataclasses.replace(p, TSN=widths[j]) for j in (i - 1, i + 1) if 0 <= j < len(widths)]
    out += [dataclasses.replace(p, WARPSM=w, TSM=64 * w) for w in WGMMA_SPACE["WARPSM"] if w != p.WARPSM]
    return out


def _cpu_neighbours(p: KernelParams) -> list[KernelParams]:
    """Variants of a CPU kernel's parameters: half and twice its tile and K depth, other vector widths."""
    out = [dataclasses.replace(p, TSM=p.TSM * 2), dataclasses.replace(p, TSN=p.TSN * 2)]
    out += [dataclasses.replace(p, TSM=p.TSM // 2)] if p.TSM % (2 * p.WPTM) == 0 else []
    out += [dataclasses.replace(p, TSN=p.TSN // 2)] if p.TSN % (2 * p.WPTN) == 0 else []
    out += [dataclasses.replace(p, TSK=t) for t in (p.TSK // 2, p.TSK * 2) if t >= 1]
    out += [dataclasses.replace(p, VWN=v) for v in CPU_VWN if v != p.VWN]
    out += [dataclasses.replace(p, GROUPM=g) for g in (0, 8) if g != p.GROUPM]
    return out


def search(device: Device, dtype, *, size: int = 4096, budget: float = 60.0, seed: int = 0,
           first: list[KernelParams] | None = None, max_candidates: int | None = None,
           report: Callable[[int, int, Timing | None, Timing | None, str], None] | None = None,
           precision: str | None = None) -> tuple[Timing | None, list[Timing]]:
    """Random search within ``budget`` seconds; returns the best correct timing and all results.

    ``first`` candidates (e.g. the current database entry and the defaults)
    are tried before the random ones.  The space is :func:`space_for`'s:
    ``precision`` names a tensor-core space (:func:`mma_candidates`), a CPU
    device searches the CPU kernel's (:func:`cpu_candidates`), others the
    GPU FMA kernel's (:func:`candidates`); where it holds wgmma and
    mma.sync kernels, the wgmma ones come first.  A wgmma candidate the device
    cannot build is a failed one (:func:`_check_built`), never timed as the
    stand-in :meth:`Device.kernels` builds in its place.
    """
    space = space_for(device.info, dtype, precision)
    rng = random.Random(seed)
    rng.shuffle(space)
    # wgmma sets first (sm_90): lookup chooses them there; the mma.sync ones are their stand-in only
    space.sort(key=lambda p: not p.k_major)
    order = list(first or []) + [p for p in space if p not in (first or [])]
    if max_candidates:
        order = order[:max_candidates]
    bench = KernelBench(device, dtype, size, size, size, seed=seed)
    t_end = time.monotonic() + budget
    best: Timing | None = None
    results: list[Timing] = []
    for i, p in enumerate(order):
        if time.monotonic() > t_end:
            break
        try:
            if p.k_major:
                _check_built(device, dtype, p)
            t = bench.run(p, reps=3)
            if t.params != p:    # (safety net: the kernel timed must be the one asked for)
                raise RuntimeError(f"{t.params} ran instead")
        except Exception as e:  # a build or launch failure rules the candidate out
            if report:   # (the device's reason for a wgmma failure is short already, and is the point)
                why = str(e) if isinstance(e, WgmmaBuildFailed) else str(e)[:200]
                report(i, len(order), None, best, f"{p}: {type(e).__name__}: {why}")
            continue
        results.append(t)
        if t.ok and (best is None or t.seconds < best.seconds):
            best = t
        if report:
            report(i, len(order), t, best, "")
    return best, results


class WgmmaBuildFailed(RuntimeError):
    """A wgmma candidate's PTX-route build failed: a failed candidate, never its stand-in's timing."""


def _check_built(device: Device, dtype, p: KernelParams) -> None:
    """Raise :class:`WgmmaBuildFailed` unless ``device`` builds the wgmma kernel ``p`` itself.

    Where the PTX route fails, :meth:`Device.kernels` builds the database's
    mma.sync stand-in instead (so that a product still runs) and keeps the
    reason in :attr:`Device.failed`; timing that under ``p`` would store the
    stand-in's speed as the wgmma kernel's.
    """
    kern = device.kernels(dtype, p)
    if kern.params != p:
        why = device.failed.get(p, f"the device built {kern.params} instead")
        raise WgmmaBuildFailed(f"the wgmma kernel did not build: {why}")


# -- tune and store ---------------------------------------------------------------
TUNE_GPU_SIZE = 4096
# A CPU device is slower: 1024^3 takes 0.05-0.2 s with the CPU kernel, and is large enough for its
# cache blocking to matter (a 256 product fits in L2 whatever the parameters).
TUNE_CPU_SIZE = 1024


def default_size(info) -> int:
    """Side of the product the tuner times: 4096, or 1024 on a CPU device."""
    return TUNE_CPU_SIZE if info.type == "CPU" else TUNE_GPU_SIZE


def databases(path=None) -> list[tuple[str, dict]]:
    """The databases :func:`dgemm.opencl.database.lookup` reads, with ``path`` as the user database if given."""
    from dgemm.opencl import database as tuning
    user = Path(path) if path is not None else tuning.user_path()
    return [("user", tuning.load(user)), ("shipped", tuning.load(tuning.shipped_path()))]


@dataclass
class TuneOutcome:
    """What :func:`tune` found for one dtype, and what the database chooses afterwards."""

    dtype: str
    precision: str | None        # the path tuned (None: the dtype's default entry)
    size: int
    best: Timing | None          # the fastest correct candidate
    results: list[Timing]        # every candidate that ran (correct or not)
    errors: list[str]            # candidates that failed to build or launch
    stored: Path | None          # the database written, None when nothing was correct
    choice: Choice               # the entry lookup now picks for this device and dtype
    seconds: float
    entries: dict[str, Timing] = dataclasses.field(default_factory=dict)   # what each entry written now holds

    @property
    def incorrect(self) -> list[Timing]:
        return [t for t in self.results if not t.ok]

    @property
    def failed(self) -> int:
        return len(self.errors) + len(self.incorrect)

    def as_dict(self, top: int = 10) -> dict:
        """Plain data for a JSON report: counts, the best, the ``top`` correct ones, failures, the choice now."""
        ranked = sorted((t for t in self.results if t.ok), key=lambda t: t.seconds)
        return {"dtype": self.dtype, "precision": self.precision, "size": self.size,
                "tried": len(self.results) + len(self.errors), "failed": self.failed, "seconds": self.seconds,
                "best": timing_dict(self.best) if self.best else None,
                "top": [timing_dict(t) for t in ranked[:top]],
                "incorrect": [timing_dict(t) for t in self.incorrect[:top]], "errors": self.errors[:top],
                "stored": str(self.stored) if self.stored else None,
                "entries": {name: timing_dict(t) for name, t in self.entries.items()},
                "now_used": {"params": self.choice.params.as_dict(), "source": self.choice.describe(),
                             "level": self.choice.level, "tuned": self.choice.tuned}}


def timing_dict(t: Timing) -> dict:
    """One timed candidate as plain data."""
    return {"params": t.params.as_dict(), "tflops": t.tflops if t.seconds > 0 else None,
            "seconds": t.seconds, "rel_err": t.rel_err, "ok": t.ok}


def earlier_winners(report: dict, dtype: str, precision: str | None = None, count: int = 4) -> list[KernelParams]:
    """The ``count`` fastest correct parameter sets of an earlier search (a ``dgemm tune --json`` report).

    >>> r = {"dtypes": {"float32": {"top": [{"params": {"TSM": 32}}, {"params": {"TSM": 64}}]}}}
    >>> [p.TSM for p in earlier_winners(r, "float32", count=1)], earlier_winners(r, "float64")
    ([32], [])
    """
    runs = report.get("dtypes", {})
    # (an FMA search on a device whose default is a tensor-core kernel was named after the dtype
    # before it was named dtype:fma; tune() keeps only sets of the path it searches)
    entry = runs.get(tune_key(dtype, precision)) or (runs.get(dtype) if precision == "fma" else None) or {}
    return [KernelParams.from_dict(t["params"]) for t in entry.get("top", [])[:count]]


def tune_key(dtype: str, precision: str | None) -> str:
    """How a tuning run is named in reports and the database: ``float32``, or ``float32:3xtf32``."""
    return dtype if precision is None else f"{dtype}:{precision}"


def tuned_path(info, dtype: str, precision: str | None, database=None) -> str | None:
    """The path a search for ``precision`` tunes: ``precision``, except None where the dtype's default is not FMA.

    Without a precision the tuner searches the FMA kernel (as it always
    has).  Where the dtype's default on this device is a tensor-core kernel
    (float32 on sm_90: 3xTF32 on wgmma; float64 with DMMA) that search is
    the ``"fma"`` path, stored as ``<dtype>:fma``, so that it never replaces
    the default with a slower kernel; ``precision=<the default's>`` tunes the default.
    """
    if precision is not None:
        return precision
    from dgemm.opencl import database as tuning
    default = tuning.lookup(info, dtype, databases(database))
    return None if default.params.precision == "fma" else "fma"


def entry_names(dtype: str, precision: str | None, params: KernelParams, default: KernelParams,
                split: bool) -> list[str]:
    """The database entries a winner of a search for ``precision`` is stored under.

    ``<dtype>:<precision>`` (the dtype alone for precision None), except that
    where the search covered the wgmma kernels too (``split``: sm_90, a float32
    tensor-core precision) an ``mma.sync`` winner is ``<dtype>:<precision>/mma.sync``:
    :func:`dgemm.opencl.database.lookup` reads the plain name as the wgmma
    kernel's entry and this one as its stand-in (``wgmma=False``), so
    neither kernel's entry is ever replaced by the other's.  The winner also
    becomes the dtype's default entry for ``"dmma"`` (exact, as before), and
    where the current ``default`` is that same kernel (precision and
    wgmma or not): 3xTF32 on wgmma is float32's default on sm_90.

    >>> wg = KernelParams(MMA=8, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=3)
    >>> sync = KernelParams(MMA=6, TSM=128, TSN=64, TSK=16, WARPSM=4, WARPSN=1, WIDTH=4, PADA=8, PADB=8)
    >>> entry_names("float32", "3xtf32", wg, wg, True), entry_names("float32", "3xtf32", sync, wg, True)
    (['float32:3xtf32', 'float32'], ['float32:3xtf32/mma.sync'])
    """
    name = tune_key(dtype, precision) + ("/mma.sync" if split and not params.k_major else "")
    same = default.precision == params.precision and default.k_major == params.k_major
    return [name] + ([dtype] if precision is not None and (precision == "dmma" or same) else [])


def tune(device: Device, dtype, *, size: int | None = None, budget: float = 60.0, seed: int = 0,
         max_candidates: int | None = None, database=None,
         report: Callable[[int, int, Timing | None, Timing | None, str], None] | None = None,
         precision: str | None = None, around: list[KernelParams] | None = None) -> TuneOutcome:
    """Search (:func:`search`) and store the best correct candidates as this device's entries.

    Without ``precision`` the FMA kernel is searched (:func:`tuned_path`: as
    ``"fma"`` where the dtype's default is a tensor-core kernel).  The
    current choices of the database (for a float32 tensor-core precision on
    sm_90 both the wgmma kernel's and its mma.sync stand-in's) and the
    kernel's defaults (:data:`CPU_DEFAULT` on a CPU device) are tried first,
    then ``around`` (earlier winners, e.g. :func:`earlier_winners`) and
    their :func:`neighbours`, then the rest of the space (:func:`space_for`)
    in random order.  The best correct candidate is stored under the names
    :func:`entry_names` gives; where the search covered wgmma and mma.sync
    kernels, the best of each kind under its own name.  Entries go to the
    user database (``database`` instead when given) with their provenance:
    TFLOPS and size of the timed product, date, dgemm version and driver.
    Nothing is stored when no candidate was correct.
    """
    import datetime

    from dgemm import __version__
    from dgemm.opencl import database as tuning

    dtype = device.check_dtype(dtype).name
    info = device.info
    size = size or default_size(info)
    dbs = databases(database)
    precision = tuned_path(info, dtype, check_precision(dtype, precision), database)
    mma = precision not in (None, "fma")
    if mma and not space_for(info, dtype, precision):
        need = min_compute_capability(precision)
        raise ValueError(f"{info.name} has no {precision} path (needs an NVIDIA GPU of compute capability "
                         f">= {need // 10}.{need % 10})")
    default = tuning.lookup(info, dtype, dbs).params
    split = bool(wgmma_candidates(info, dtype, precision)) if mma else False
    current = [tuning.lookup(info, dtype, dbs, precision=precision, wgmma=w).params for w in (True, False)]
    around = list(around or [])
    defaults = [] if mma else [CPU_DEFAULT if info.type == "CPU" else KernelParams()]
    first = [p for p in dict.fromkeys(current + defaults + around + neighbours(around, info, dtype))
             if p.precision == (precision or "fma") and usable(p, info, dtype)]
    errors: list[str] = []

    def _report(i, n, t, best, msg):
        if t is None and msg:
            errors.append(msg)
        if report:
            report(i, n, t, best, msg)

    t0 = time.monotonic()
    best, results = search(device, dtype, size=size, budget=budget, seed=seed, first=first,
                           max_candidates=max_candidates, report=_report, precision=precision)
    seconds = time.monotonic() - t0
    stored = None
    entries: dict[str, Timing] = {}
    correct = sorted((t for t in results if t.ok), key=lambda t: t.seconds)
    # the best correct candidate; where the search covered both, the best of each kind (wgmma, mma.sync)
    winners = [next((t for t in correct if t.params.k_major == kind), None) for kind in (True, False)]
    winners = [t for t in winners if t is not None] if split else correct[:1]
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for t in winners:
        extra = {"tflops": t.tflops, "size": size, "date": date, "generated_by": "dgemm tune",
                 "dgemm_version": __version__, "driver": info.driver, "rel_err": t.rel_err,
                 "candidates_tried": len(results) + len(errors)}
        for key in entry_names(dtype, precision, t.params, default, split):
            stored = tuning.store(info, key, t.params, extra, path=Path(database) if database else None)
            entries[key] = t
    choice = tuning.lookup(info, dtype, databases(database), precision=precision)
    return TuneOutcome(dtype, precision, size, best, results, errors, stored, choice, seconds, entries)


def plan_runs(dtypes, precisions=()) -> list[tuple[str, str | None]]:
    """The ``(dtype, precision)`` searches asked for: each precision with the dtype it belongs to.

    No precision: one search per dtype, of its default path.

    >>> plan_runs(["float32", "float64"], ["dmma", "3xtf32", "tf32"])
    [('float32', '3xtf32'), ('float32', 'tf32'), ('float64', 'dmma')]
    >>> plan_runs(["float64"], ["tf32"])
    Traceback (most recent call last):
    ...
    ValueError: --precision tf32 is not available for float64
    """
    from dgemm.dtypes import PRECISIONS

    if not precisions:
        return [(dt, None) for dt in dtypes]
    runs = [(dt, p) for dt in dtypes for p in precisions if p in PRECISIONS[dt]]
    orphans = [p for p in precisions if not any(p == q for _, q in runs)]
    if orphans:
        raise ValueError(f"--precision {', '.join(orphans)} is not available for {' or '.join(dtypes)}")
    return runs


def report_header(info, *, size: int, budget: float, seed: int, database: str) -> dict:
    """The provenance of a ``dgemm tune --json`` report: device, date, commit, command and the search's settings."""
    from dgemm import __version__
    from dgemm.provenance import command_line, git_commit, utc_now

    return {"device": info.name, "device_id": info.id, "driver": info.driver, "architecture": info.architecture,
            "date": utc_now(), "commit": git_commit()[0], "command": command_line(),
            "dgemm_version": __version__, "size": size, "budget": budget, "seed": seed,
            "database": database, "dtypes": {}}

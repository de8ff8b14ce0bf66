"""The autotuner: search the kernel's parameter space on one device.

The search space and its restrictions live here (as in CLBlast, the kernel
only declares defaults).  Each candidate is built, run on device-resident
random inputs, checked against float64 numpy on sampled rows and columns,
and timed with OpenCL profiling events; only correct candidates count.
"""
from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator

import numpy as np

from .device import Device
from .kernelbench import KernelBench, Timing
from .params import KernelParams

SPACE = {
    "TSM": (32, 64, 96, 128, 192, 256),
    "TSN": (32, 64, 96, 128, 192, 256),
    "TSK": (8, 16, 32),
    "WPTM": (2, 4, 6, 8, 12, 16),
    "WPTN": (2, 4, 6, 8, 12, 16),
    "WIDTH": (1, 2, 4, 8),
    "PAD": (False, True),   # pad local rows by one vector
}


def candidates(device_info, dtype, *, min_threads: int = 64, max_threads: int = 512,
               min_acc: int | None = None) -> list[KernelParams]:
    """Every parameter set of :data:`SPACE` that the device can run and that is worth timing.

    Restrictions: the kernel's own rules (:meth:`KernelParams.problems`), the
    device's work-group and local-memory limits, a work-group of
    ``min_threads..max_threads`` items, and at most 128 (float32) or 64
    (float64) accumulators per work-item so they can stay in registers.
    """
    itemsize = np.dtype(dtype).itemsize
    max_acc = 128 if itemsize == 4 else 64
    if min_acc is None:
        # GPUs need a large register block to feed the FMA units from local memory.
        min_acc = 16 if device_info.type == "GPU" else 1
    out = []
    for tsm, tsn, tsk, wm, wn, w, pad in itertools.product(*SPACE.values()):
        if not (min_acc <= wm * wn <= max_acc):
            continue
        p = KernelParams(TSM=tsm, TSN=tsn, TSK=tsk, WPTM=wm, WPTN=wn, WIDTH=w,
                         PADA=w if pad else 0, PADB=w if pad else 0)
        if not (min_threads <= p.threads <= max_threads):
            continue
        if p.problems(itemsize, device_info.max_work_group_size, device_info.local_mem):
            continue
        out.append(p)
    return out


def search(device: Device, dtype, *, size: int = 4096, budget: float = 60.0, seed: int = 0,
           first: list[KernelParams] | None = None, max_candidates: int | None = None,
           report: Callable[[int, int, Timing | None, Timing | None, str], None] | None = None
           ) -> tuple[Timing | None, list[Timing]]:
    """Random search within ``budget`` seconds; returns the best correct timing and all results.

    ``first`` candidates (e.g. the current database entry and the defaults)
    are tried before the random ones.
    """
    space = candidates(device.info, dtype)
    rng = random.Random(seed)
    rng.shuffle(space)
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
            t = bench.run(p, reps=3)
        except Exception as e:  # a build or launch failure rules the candidate out
            if report:
                report(i, len(order), None, best, f"{p}: {type(e).__name__}: {str(e)[:200]}")
            continue
        results.append(t)
        if t.ok and (best is None or t.seconds < best.seconds):
            best = t
        if report:
            report(i, len(order), t, best, "")
    return best, results


def iter_sizes(sizes: str) -> Iterator[int]:
    for s in sizes.split(","):
        yield int(s)

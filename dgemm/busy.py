"""Where a device's busy time went: exclusive parts that add up to it.

A worker is *busy* while it runs a block product (a ``dgemm-gemm`` task's
call into its engine).  Reading, uploading and the GEMM kernels overlap in
that time (:mod:`dgemm.opencl.engine` reads and uploads ahead on other
threads and a second queue), so their own durations add up to more than
the busy time.  Here each instant of a product's busy time goes to the first
of these parts that holds at that instant:

============  ==================================================================
``kernel``    a GEMM kernel runs on the device (what overlaps it is hidden)
``transfer``  no GEMM kernel runs; an upload, padding or transposing kernel,
              unpadding or download is in flight on the device
``read``      neither; the product waits for its next A/B blocks (reading and
              decoding them from the store)
``other``     none of these: launching, setting up, Python
============  ==================================================================

The parts are measured by a sweep over intervals: the device's commands from
their OpenCL profiling events, the waits from host timestamps, both on the
host's clock (:func:`clock_offset`).  They are exclusive, so they add up to
the busy time exactly (up to float rounding).

A leaf module: the worker computes the parts, the scheduler's page and the
Prometheus series name them.

>>> split(0.0, 10.0, kernel=[(1, 4), (6, 8)], transfer=[(0, 2), (3, 7)], read=[(0, 9)])
{'kernel': 5.0, 'transfer': 3.0, 'read': 1.0, 'other': 1.0}
"""
from __future__ import annotations

from collections.abc import Iterable

PARTS = ("kernel", "transfer", "read", "other")
# The snapshot key (and counter) of each part: seconds of busy time, summed over products.
KEYS = {part: f"busy_{part}_seconds" for part in PARTS}
# How the page and the series label each part.
LABELS = {"kernel": "kernel running", "transfer": "waiting for transfers", "read": "waiting for reads",
          "other": "other"}


def union(intervals: Iterable, lo: float, hi: float) -> list[tuple[float, float]]:
    """The ``intervals`` clipped to ``[lo, hi]`` and merged: sorted, disjoint ``(start, end)`` pairs.

    >>> union([(5, 7), (1, 3), (2, 4), (9, 20), (-3, -1)], 0, 10)
    [(1, 4), (5, 7), (9, 10)]
    """
    out: list = []
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def measure(intervals: list) -> float:
    """The total length of disjoint intervals."""
    return float(sum(e - s for s, e in intervals))


def split(start: float, end: float, kernel: Iterable = (), transfer: Iterable = (),
          read: Iterable = ()) -> dict[str, float]:
    """The parts (see the module doc) of the busy window ``[start, end]``.

    Each argument is ``(start, end)`` intervals on the same clock as the
    window; what lies outside the window is not counted.  A part is what its
    intervals add to the time the parts before it already cover, so time
    covered twice counts once, for the first part that covers it.

    Returns
    -------
    dict
        ``{part: seconds}`` for every part of :data:`PARTS`; the values add
        up to ``end - start``.
    """
    out: dict = {}
    covered: list = []
    for part, intervals in (("kernel", kernel), ("transfer", transfer), ("read", read)):
        grown = union([*covered, *intervals], start, end)
        out[part] = measure(grown) - measure(covered)
        covered = grown
    out["other"] = max(0.0, end - start) - measure(covered)
    return out


def clock_offset(brackets: Iterable) -> float | None:
    """Seconds to add to a device timestamp to read it on the host's clock; None without brackets.

    Each bracket is ``(before, after, queued)``: host times taken just
    before a command was enqueued and just after it was flushed, and the
    device's ``CL_PROFILING_COMMAND_QUEUED`` time of it (seconds), which the
    runtime takes between the two for a command that waits for nothing (a
    marker; NVIDIA stamps a kernel waiting for events when they are done).
    Every bracket bounds the offset; the middle of their intersection is the
    best estimate.  Where they do not intersect (clocks that drift), the
    median of their middles.

    >>> round(clock_offset([(10.0, 10.2, 1.1), (20.0, 20.1, 11.05)]), 9)   # within [8.95, 9.05]
    9.0
    >>> clock_offset([]) is None
    True
    """
    lows, highs = [], []
    for before, after, queued in brackets:
        lows.append(before - queued)
        highs.append(after - queued)
    if not lows:
        return None
    lo, hi = max(lows), min(highs)
    if lo <= hi:
        return (lo + hi) / 2
    middles = sorted((a + b) / 2 for a, b in zip(lows, highs))
    return middles[len(middles) // 2]

"""The time floor of a plan: bytes moved, work per worker, and what bounds it.

:func:`estimate` predicts the bytes each worker reads and writes and the
time floor of the whole product when its blocks are placed by
:func:`dgemm.client.plan.assign`; :func:`explain_estimate` says it in words
(``dgemm plan``).  :meth:`dgemm.client.plan.Plan.estimate` calls them with the
plan's shares (:func:`dgemm.client.plan.loads`); this module imports nothing
of the plan's, so the plan may.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rates:
    """Per-worker rates a plan's time floor assumes (bytes/s; flop/s, None when unknown).

    The defaults are conservative guesses for a local NVMe disk (or the page
    cache) and PCIe 4/5 with pageable host memory; ``dgemm plan`` takes
    measured ones.
    """

    read: float = 5e9
    write: float = 2e9
    pcie: float = 20e9
    flops: float | None = None


def estimate(plan, shares, rates: Rates | None = None, cache_bytes: float | None = None) -> dict:
    """Predict bytes moved and the time floor when the blocks are placed by :func:`~dgemm.client.plan.assign`.

    Each worker reads an A or B block once while its panel cache
    (``cache_bytes``, default unlimited) holds every block it touches;
    otherwise its A panels once (it runs a row at a time) and its B
    blocks once per task.  The floor of a worker is its slowest resource
    (store reads, PCIe, kernel, store writes), all overlapped, plus the
    pipeline's fill (the first k step read and uploaded) and drain (the
    last C block downloaded and written).  The run's floor is its
    slowest worker's.  Costs O(workers), whatever the plan's size
    (see :func:`loads`).
    """
    rates = rates or Rates()
    item = plan.dtype.itemsize
    bk = plan.block_shape[2]
    per = []
    for load in shares:
        if not load.tasks:
            continue
        once = (load.a + load.b) * item
        read = once if cache_bytes is None or once <= cache_bytes else (load.a + load.b_each) * item
        flops = 2.0 * load.flop_terms
        write = load.area * item
        (i, j, _), (li, lj, _) = load.first, load.last
        first = (plan.rows.total(i, i + 1) + plan.cols.total(j, j + 1)) * bk * item
        last = plan.rows.total(li, li + 1) * plan.cols.total(lj, lj + 1) * item
        times = {"read": read / rates.read, "upload": read / rates.pcie, "download": write / rates.pcie,
                 "write": write / rates.write}
        if rates.flops:
            times["kernel"] = flops / rates.flops
        fill = first / rates.read + first / rates.pcie
        drain = last / rates.pcie + last / rates.write
        per.append({"tasks": load.tasks, "bytes_read": read, "bytes_written": write, "flops": flops,
                    "seconds": times, "fill": fill, "drain": drain,
                    "floor": max(times.values()) + fill + drain, "bound": max(times, key=times.get)})
    slow = max(per, key=lambda w: w["floor"], default={"floor": 0.0, "bound": None})
    return {"workers": per, "floor_seconds": slow["floor"], "bound": slow["bound"],
            "bytes_read": sum(w["bytes_read"] for w in per),
            "bytes_written": sum(w["bytes_written"] for w in per),
            "tflops_ceiling": plan.flops / slow["floor"] / 1e12 if slow["floor"] else None,
            "rates": vars(rates)}

def explain_estimate(plan, shares, rates: Rates | None = None, cache_bytes: float | None = None) -> str:
    """:func:`estimate` as text."""
    e = estimate(plan, shares, rates, cache_bytes)
    if not e["workers"]:
        return "placement: no GEMM tasks (C is empty)"
    r = e["rates"]
    w = max(e["workers"], key=lambda x: x["floor"])
    split = ", ".join(f"{k} {_num(v, 2)} s" for k, v in w["seconds"].items())
    assumed = (f"assuming per worker: store reads {r['read'] / 1e9:.1f} GB/s, writes {r['write'] / 1e9:.1f} GB/s, "
               f"PCIe {r['pcie'] / 1e9:.1f} GB/s, kernel " +
               (f"{r['flops'] / 1e12:.3g} TFLOPS" if r["flops"] else "rate unknown (not counted)"))
    return "\n".join([
        f"placement: {len(e['workers'])} worker(s), up to {max(x['tasks'] for x in e['workers'])} tasks each; "
        f"reads {_num(e['bytes_read'] / 1e9, 2)} GB from the store in all (each block once per worker while the "
        f"device cache holds it), writes {_num(e['bytes_written'] / 1e9, 2)} GB",
        f"busiest worker: {split}; fill {w['fill']:.2f} s, drain {w['drain']:.2f} s",
        f"time floor {_num(e['floor_seconds'], 2)} s ({e['bound']}-bound)"
        + (f", at most {e['tflops_ceiling']:.3g} TFLOPS end to end" if e["tflops_ceiling"] else ""),
        assumed,
    ])



def _num(x: float, places: int) -> str:
    """``x`` with ``places`` decimals, or in scientific notation once that would print a wall of digits.

    >>> _num(1234.5678, 2), _num(6e93, 2)
    ('1234.57', '6e+93')
    """
    return f"{x:.{places}f}" if abs(x) < 1e12 else f"{x:.4g}"

"""Plots of benchmark records (``dgemm bench plot``); needs matplotlib (``pip install dgemm[plot]``)."""
from __future__ import annotations

import json
import os
from pathlib import Path


def scaling_points(record: dict) -> list[tuple[int, float, float]]:
    """``(gpus, TFLOPS, efficiency)`` of each measured row of an e2e record's scaling table.

    >>> scaling_points({"scaling": [{"gpus": 1, "tflops": 40.0, "efficiency": 1.0},
    ...                             {"gpus": 2, "tflops": None, "efficiency": None}]})
    [(1, 40.0, 1.0)]
    """
    return [(r["gpus"], r["tflops"], r["efficiency"]) for r in record.get("scaling") or []
            if r.get("tflops") is not None and r.get("efficiency") is not None]


def _label(record: dict) -> str:
    return f"{record['dtype']} {record['m']}x{record['n']}x{record['k']}"


def scaling_plot(records: list[dict], path) -> Path:
    """TFLOPS (with the ideal line from one device) and parallel efficiency against the device count.

    Parameters
    ----------
    records : list of dict
        e2e records (:func:`dgemm.benchmarks.e2e.e2e_bench`) with a scaling table; one
        line each.
    path : path
        The PNG to write.

    Raises
    ------
    ValueError
        When no record has a measured scaling row.
    """
    import matplotlib
    matplotlib.use("Agg")          # files only: no display on a cluster node or in CI
    import matplotlib.pyplot as plt

    series = [(rec, scaling_points(rec)) for rec in records]
    series = [(rec, pts) for rec, pts in series if pts]
    if not series:
        raise ValueError("no record has a measured scaling row (run dgemm bench e2e with --gpus)")
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
    counts = sorted({g for _, pts in series for g, _, _ in pts})
    for rec, pts in series:
        g, t, e = zip(*pts)
        line, = ax_t.plot(g, t, "o-", label=_label(rec))
        one = dict(zip(g, t)).get(1)
        if one is not None:
            ax_t.plot(counts, [one * c for c in counts], ":", color=line.get_color(), label=f"ideal ({rec['dtype']})")
        ax_e.plot(g, e, "o-", color=line.get_color(), label=_label(rec))
    ax_t.set(xlabel="GPUs (one worker each)", ylabel="TFLOPS, Zarr to Zarr", xticks=counts, title="Throughput")
    ax_e.set(xlabel="GPUs (one worker each)", ylabel="parallel efficiency", xticks=counts, ylim=(0, 1.05),
             title="Efficiency against one GPU")
    ax_e.axhline(1.0, color="grey", lw=0.5)
    for ax in (ax_t, ax_e):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    first = series[0][0]
    fig.suptitle(f"dgemm.matmul on {first.get('device')}; commit {first.get('commit')}, {first.get('date', '')[:10]}",
                 fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def load_records(paths) -> list[dict]:
    """The JSON records at ``paths``."""
    out = []
    for p in paths:
        with open(os.fspath(p)) as f:
            out.append(json.load(f))
    return out

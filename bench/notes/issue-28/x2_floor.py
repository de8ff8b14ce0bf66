"""Two GPUs' floor from the inputs' reads, and the read rate two GPUs' 1.8x needs (issue 28, thirty-second session).

    python bench/notes/issue-28/x2_floor.py OUT.json RECORD... [--rate 26.3] [--probe PROBE.json]
        [--c-block 8192] [--k-block 4096] [--target 1.8]

RECORD: ``device_codecs_onoff.py`` records (``runs``), or a session's record of a call that holds them (``records``,
as ``bench/results/...-ab-*.json`` do; ``--version v0`` keeps one version's).  Each two-GPU run (``devices`` 0,1)
is modelled from its own figures: a worker's products in the order the client gives them
(:func:`dgemm.client.order.grow` over its rectangle of C blocks: all of A's block rows, half of B's block columns),
its kernels' time a product (``kernel_seconds`` over the products), a block's bytes over the bus (``bytes_up`` over
the blocks read), the time to its first GEMM task and from its last one to the end.  With the host's inputs
reaching the devices at RATE GB/s (half a worker), product ``p`` cannot end before the ``N(p)`` blocks it and the
products before it read are in, and the kernels of the products after it take their time after that:

    T2 >= first + max_p (N(p) * bytes / (RATE / 2) + (P - p - 1) * g + g / K) + (wall - last GEMM task)

a floor (C's own download and writes, which share the host, left out).  Beside it, ``traffic_floor_s``: the run's
floor if every byte between the files and the devices (the inputs up, C's frames down and into their files)
shared RATE alike, order aside: first GEMM + max(kernels, bytes / RATE) + drain (whether C's bytes cost the
host what the inputs' do is what ``upload_paths_probe.py --beside down`` measures).  RATE is given, or read from a
``upload_paths_probe.py`` record: the staged path at its most threads (summed over the processes of a
``--start-at`` run, averaged over its rounds).  Printed and recorded: each two-GPU run's wall against its floor,
the rate at which its floor would be its wall (the inputs' rate it ran as if it had), the one-GPU runs' mean wall,
the ratio measured and the ratio's ceiling at RATE, and the rate the ``--target`` ratio needs (bisection on the
same floor).
"""
import argparse
import json
import os
import sys
import time

from dgemm.client.order import grow


def runs_of(path: str, version: str | None) -> list:
    """The runs of a record (``runs``) or of the records a session's record holds (``records``)."""
    d = json.load(open(path))
    if "runs" in d:
        return list(d["runs"])
    out = []
    for name, rec in sorted(d.get("records", {}).items()):
        if version is not None and f"-{version}-" not in os.path.basename(name):
            continue
        out += rec.get("runs", [])
    return out


def probe_rate(path: str) -> float:
    """The staged path's GB/s at its most threads in a probe record (processes summed, rounds averaged)."""
    d = json.load(open(path))
    recs = d.get("records", {"": d})
    rounds: dict = {}
    for name, rec in recs.items():
        rows = [r for r in rec.get("rows", []) if r["path"] == "staged"]
        if not rows:
            continue
        most = max(r["threads"] for r in rows)
        key = name.split("-process")[0] if "-process" in name else name
        rounds[key] = rounds.get(key, 0.0) + max(r["gb_s"] for r in rows if r["threads"] == most)
    if not rounds:
        raise SystemExit(f"{path}: no staged rows")
    return sum(rounds.values()) / len(rounds)


def needs(order: list, k: int) -> list:
    """Blocks read by the time each product of ``order`` has its inputs: ``k`` a new block row or column."""
    rows, cols, out = set(), set(), []
    for i, j, _ in order:
        rows.add(i)
        cols.add(j)
        out.append(k * (len(rows) + len(cols)))
    return out


def floor(run: dict, rate: float, n: list, k: int) -> float:
    """The run's floor at ``rate`` GB/s for the host's inputs (see the module's notes)."""
    products = len(n)
    g = max(run["per_worker"]["kernel_seconds"]) / products
    per_block = sum(run["per_worker"]["bytes_up"]) / len(run["per_worker"]["bytes_up"]) / n[-1]
    worker = rate * 1e9 / 2
    inner = max(n[p] * per_block / worker + (products - p - 1) * g + g / k for p in range(products))
    return run["first_gemm_start"] + inner + (run["wall_s"] - run["last_gemm_stop"])


def traffic_floor(run: dict, rate: float) -> float:
    """The run's floor if every byte between the files and the devices (the inputs up, C's frames down and into
    its files) shared the host's RATE: first GEMM + max(a worker's kernels, bytes / RATE) + drain."""
    moved = run["bytes_up"] + run["bytes_down"] + run["c_stored_bytes"]
    busy = max(max(run["per_worker"]["kernel_seconds"]), moved / (rate * 1e9))
    return run["first_gemm_start"] + busy + (run["wall_s"] - run["last_gemm_stop"])


def rate_for(runs: list, goal: float, floor_at) -> float | None:
    """The rate (GB/s) at which the runs' mean ``floor_at(run, rate)`` is ``goal`` seconds (bisection); None: not
    below 1000 GB/s."""
    def mean(rate):
        return sum(floor_at(r, rate) for r in runs) / len(runs)
    lo, hi = 0.1, 1000.0
    if mean(hi) > goal:
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if mean(mid) <= goal else (mid, hi)
    return hi


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("records", nargs="+")
    p.add_argument("--version", default=None, help="a session record's version to keep (v0)")
    p.add_argument("--rate", type=float, default=None, help="the host's inputs to the devices, GB/s")
    p.add_argument("--probe", default=None, help="an upload_paths_probe.py record to read the rate from")
    p.add_argument("--c-block", type=int, default=8192)
    p.add_argument("--k-block", type=int, default=4096)
    p.add_argument("--target", type=float, default=1.8)
    args = p.parse_args()
    rate = args.rate if args.rate is not None else probe_rate(args.probe)
    runs = [r for path in args.records for r in runs_of(path, args.version)]
    two = [r for r in runs if r.get("devices") == "0,1"]
    one = [r for r in runs if r.get("devices") == "0"]
    if not two:
        raise SystemExit("no two-GPU runs (devices 0,1) in the records")
    size = two[0]["size"]
    grid, k = size // args.c_block, size // args.k_block
    order = grow([(i, j, 0) for i in range(grid) for j in range(grid // 2)], 1, 2)
    n = needs(order, k)

    def ordered(run, rate):
        return floor(run, rate, n, k)
    rows = []
    for r in two:
        f = floor(r, rate, n, k)
        seen = rate_for([r], r["wall_s"], ordered)
        rows.append({"wall_s": r["wall_s"], "floor_s": round(f, 3), "over_floor": round(r["wall_s"] / f, 3),
                     "rate_as_if_gb_s": None if seen is None else round(seen, 2),
                     "traffic_floor_s": round(traffic_floor(r, rate), 3),
                     "traffic_gb": round((r["bytes_up"] + r["bytes_down"] + r["c_stored_bytes"]) / 1e9, 2),
                     "first_gemm_start": r["first_gemm_start"],
                     "after_last_gemm": round(r["wall_s"] - r["last_gemm_stop"], 3),
                     "kernel_s_a_product": round(max(r["per_worker"]["kernel_seconds"]) / len(n), 4)})
        print(json.dumps(rows[-1]))
    out = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rate_gb_s": round(rate, 2),
                    "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
                    "blocks_by_product": n, "order": [t[:2] for t in order]}, "two_gpus": rows}
    if one:
        t1 = sum(r["wall_s"] for r in one) / len(one)
        t2 = sum(r["wall_s"] for r in two) / len(two)
        f2 = sum(x["floor_s"] for x in rows) / len(rows)
        need = rate_for(two, t1 / args.target, ordered)
        shared = rate_for(two, t1 / args.target, traffic_floor)
        out["traffic_rate_for_target_gb_s"] = None if shared is None else round(shared, 2)
        out["traffic_ratio_ceiling_at_rate"] = round(t1 / (sum(traffic_floor(r, rate) for r in two) / len(two)), 3)
        out["one_gpu_wall_s"] = round(t1, 3)
        out["ratio_measured"] = round(t1 / t2, 3)
        out["ratio_ceiling_at_rate"] = round(t1 / f2, 3)
        out["rate_for_target_gb_s"] = None if need is None else round(need, 2)
        print(json.dumps({key: out[key] for key in ("one_gpu_wall_s", "ratio_measured", "ratio_ceiling_at_rate",
                                                    "rate_for_target_gb_s", "traffic_ratio_ceiling_at_rate",
                                                    "traffic_rate_for_target_gb_s")}))
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()

"""Each product of a ``timeline.py`` record: when its inputs were in, its GEMMs, its unpadding (issue 28, 32nd session).

    python bench/notes/issue-28/products.py TIMELINE.json [--out OUT.json]

For each run and worker, each product in the order it ran: its task's first blocks, when the last of the A and B
blocks it reads had been read (``inputs``: the latest read end among them, a deferred decode's enqueue), how many
blocks the worker had read by then against how many the products so far need (reads in the order of need give
equal counts; more: the read-ahead took later products' blocks first), its first and last GEMM on the device, when
its unpadding was enqueued (after the last GEMM: the host held the product back), the time from its last GEMM to
the next product's first, and, where the record times them (``timeline.py`` from the thirty-second session on),
its deferred decode checks on its thread (``checks_s``).  Then per worker: the gaps' sum, the unpadding's holds
(over 5 ms), and the last product whose GEMMs ended within a product's time of its inputs (``read_bound_until``,
roughly where the reads stopped setting the pace).  Blocks are named as ``timeline.py`` names them (``a r,c``:
A's chunk row and column; a product reads A's block row ``r`` over every k chunk, B's block column over every
k chunk).
"""
import argparse
import json


def products(run: dict) -> tuple[list, dict]:
    """The run's products (see the module's notes) and the worker's totals."""
    log = run["log"]
    reads = sorted((e for e in log if e[0] == "read"), key=lambda e: e[3])
    tasks = [e for e in log if e[0] == "task"]
    prods = sorted((e for e in log if e[0] == "product"), key=lambda e: e[2])
    gemms = sorted((e for e in log if e[0] == "gemm"), key=lambda e: e[1])
    unpads = sorted((e for e in log if e[0] == "cmd" and e[2] == "engine" and e[3] == "kernel"), key=lambda e: e[4])
    ends: dict = {}
    for e in reads:
        ends.setdefault(e[4], e[3])
    ks = sorted({int(name.split()[1].split(",")[1]) for name in ends if name.startswith("a ")})
    rows, seen = [], set()
    for task, prod in zip(tasks, prods):
        a_row = task[2].split()[1].split(",")[0]
        b_col = task[3].split()[1].split(",")[1]
        need = {f"a {a_row},{k}" for k in ks} | {f"b {k},{b_col}" for k in ks}
        seen |= need
        got = [ends[n] for n in need if n in ends]
        inputs = max(got) if got else None
        mine = [g for g in gemms if prod[2] <= g[1] <= prod[3] + 0.001]
        unpad = [u[4] for u in unpads if prod[2] <= u[4] <= prod[3] + 0.001]
        checks = [e for e in log if e[0] == "check" and e[1] == prod[1] and prod[2] <= e[2] <= prod[3]]
        rows.append({"a": task[2], "b": task[3], "start": round(prod[2], 4), "end": round(prod[3], 4),
                     "checks_s": round(sum(e[3] - e[2] for e in checks), 4) if checks else None,
                     "inputs": None if inputs is None else round(inputs, 4),
                     "reads_by_then": None if inputs is None else sum(1 for e in reads if e[3] <= inputs),
                     "needed": len(seen),
                     "first_gemm": round(mine[0][1], 4) if mine else None,
                     "last_gemm": round(mine[-1][2], 4) if mine else None,
                     "unpad": round(unpad[0], 4) if unpad else None})
    for this, nxt in zip(rows, rows[1:] + [None]):
        this["gap_to_next"] = (round(nxt["first_gemm"] - this["last_gemm"], 4)
                               if nxt and nxt["first_gemm"] is not None and this["last_gemm"] is not None else None)
        this["unpad_hold"] = (round(this["unpad"] - this["last_gemm"], 4)
                              if this["unpad"] is not None and this["last_gemm"] is not None else None)
    waited = [r for r in rows if r["inputs"] is not None and r["first_gemm"] is not None
              and r["last_gemm"] - r["inputs"] < 0.069]     # its GEMMs ended within a product's time of its inputs
    totals = {"worker": run.get("worker"), "wall_s": run.get("wall_s"), "products": len(rows),
              "first_read": round(min(e[2] for e in reads), 4) if reads else None,
              "gaps_s": round(sum(r["gap_to_next"] or 0 for r in rows), 3),
              "unpad_holds": [r["unpad_hold"] for r in rows if (r["unpad_hold"] or 0) > 0.005],
              "read_bound_until": waited[-1]["last_gemm"] if waited else None}
    return rows, totals


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("timeline")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    out = []
    for run in json.load(open(args.timeline))["runs"]:
        rows, totals = products(run)
        for r in rows:
            print(json.dumps(r))
        print(json.dumps(totals))
        out.append({"totals": totals, "products": rows})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"source": args.timeline, "runs": out}, f, indent=1)


if __name__ == "__main__":
    main()

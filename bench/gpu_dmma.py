"""Float64 on the tensor cores from OpenCL: time DMMA kernel variants against cuBLAS DGEMM.

Usage (GPU machine): python3 bench/gpu_dmma.py OUTDIR [--budget S]
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dgemm.benchmarks import cublas  # noqa: E402
from dgemm.device import Device  # noqa: E402
from dgemm.discovery import select_devices  # noqa: E402
from dgemm.kernelbench import KernelBench  # noqa: E402
from dgemm.params import KernelParams  # noqa: E402
from dgemm.tune import search  # noqa: E402


def dmma_candidates(info):
    out = []
    for mma, tsm, tsn, tsk, wm, wn, w, pad, gm in itertools.product(
            (4, 3, 2, 1), (32, 64, 128), (32, 64, 128), (8, 16, 32), (1, 2, 4), (1, 2, 4), (2,), (4,), (0, 8)):
        p = KernelParams(MMA=mma, TSM=tsm, TSN=tsn, TSK=tsk, WARPSM=wm, WARPSN=wn, WIDTH=w,
                         PADA=pad, PADB=pad, GROUPM=gm)
        mt, nt = tsm // wm // 8, tsn // wn // 8
        if mt * nt > 32 or mt * nt < 4 or p.threads < 64:
            continue
        if p.problems(8, info.max_work_group_size, info.local_mem):
            continue
        out.append(p)
    # likely-good first: more fragments per warp, padding on, no grouping
    # interleave the shapes so each gets tried within the budget; bigger warp tiles first
    out.sort(key=lambda p: (-(p.TSM // p.WARPSM // 8) * (p.TSN // p.WARPSN // 8), p.GROUPM, -p.TSK, -p.MMA))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=150)
    args = ap.parse_args()
    info = select_devices("gpu")[0]
    dev = Device(info)
    cands = dmma_candidates(info)
    # run 1's best m8n8k4 set (64x64x16, 1x4 warps) in every shape first
    prev = KernelParams(MMA=1, TSM=64, TSN=64, TSK=16, WARPSM=1, WARPSN=4, WIDTH=2, PADA=4, PADB=4, GROUPM=8)
    first = [__import__("dataclasses").replace(prev, MMA=m) for m in (4, 3, 2, 1)]
    first += [__import__("dataclasses").replace(p, WARPSM=2, WARPSN=2) for p in first]
    cands = first + [c for c in cands if c not in first]
    print(f"{len(cands)} DMMA candidates", flush=True)

    def report(i, n, t, best, msg):
        if msg:
            print(f"[{i}/{n}] FAILED {msg[:300]}", flush=True)
        elif t is not None and (i < 3 or i % 10 == 0 or best is t):
            print(f"[{i}/{n}] {t.tflops:6.2f} TF ok={t.ok} err={t.rel_err:.1e} {t.params}", flush=True)

    best, results = search(dev, "float64", size=4096, budget=args.budget, first=cands,
                           max_candidates=len(cands), report=report)
    ranked = sorted((r for r in results if r.ok), key=lambda r: r.seconds)
    rec = {"device": info.name, "driver": info.driver, "commit": os.environ.get("DGEMM_COMMIT", "unknown"),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(sys.argv), "tried": len(results), "incorrect": sum(not r.ok for r in results),
           "incorrect_examples": [{"params": r.params.as_dict(), "rel_err": r.rel_err}
                                  for r in results if not r.ok][:5],
           "top": [{"params": r.params.as_dict(), "tflops": r.tflops, "rel_err": r.rel_err} for r in ranked[:10]],
           "sizes": []}
    fma = dev.choice("float64").params if not dev.choice("float64").params.MMA else KernelParams()
    for n in (8192, 16384, 10000):
        kb = KernelBench(dev, "float64", n, n, n, seed=n)
        rows = []
        for p in [r.params for r in ranked[:2]] + [fma]:
            t = kb.run(p, reps=3)
            rows.append({"params": p.as_dict(), "tflops": t.tflops, "rel_err": t.rel_err, "ok": t.ok})
        del kb
        peer = cublas("float64", n, n, n)
        rec["sizes"].append({"n": n, "dgemm": rows, "cublas": peer})
        b = max((r for r in rows if r["ok"] and r["params"]["MMA"]), key=lambda r: r["tflops"], default=None)
        print(f"float64 {n}^3: DMMA best {b['tflops'] if b else float('nan'):.2f} TF (err {b['rel_err'] if b else 0:.1e}),"
              f" FMA {rows[-1]['tflops']:.2f} TF, cuBLAS {peer['tflops'] if peer else float('nan'):.2f} TF", flush=True)
        with open(os.path.join(args.out, "dmma.json"), "w") as f:
            json.dump(rec, f, indent=1)
    if ranked:
        print("best", ranked[0].params, f"{ranked[0].tflops:.2f} TF at 4096^3")
        print(dev.build_log("float64", ranked[0].params)[-600:])


if __name__ == "__main__":
    main()

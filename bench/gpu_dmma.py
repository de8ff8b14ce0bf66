"""Float64 on the tensor cores from OpenCL: time DMMA kernel variants against cuBLAS DGEMM.

Usage (GPU machine): python3 bench/gpu_dmma.py OUTDIR [--budget S]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dgemm.benchmarks import cublas  # noqa: E402
from dgemm.opencl.device import Device  # noqa: E402
from dgemm.opencl.discovery import select_devices  # noqa: E402
from dgemm.tuning.timing import KernelBench  # noqa: E402
from dgemm.tuning.params import KernelParams  # noqa: E402
from dgemm.tuning.search import mma_candidates, search  # noqa: E402


def tf32_candidates(info):
    """3xTF32 candidates (the space lives in dgemm.tuning.search; plain TF32 is dgemm.tuning.search.mma_candidates(..., "tf32"))."""
    return mma_candidates(info, "float32", "3xtf32")


def cublas_tf32(n, reps=5):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        a @ b
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); a @ b; e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
        ts.sort()
        return {"seconds": ts[len(ts) // 2], "tflops": 2 * n**3 / ts[len(ts) // 2] / 1e12}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def dmma_candidates(info):
    return mma_candidates(info, "float64", "dmma")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=150)
    ap.add_argument("--dtype", default="float64")
    args = ap.parse_args()
    if args.dtype == "float32":
        return main_tf32(args)
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


def main_tf32(args):
    """3xTF32 and TF32 kernels vs cuBLAS SGEMM (TF32 off) and cuBLAS TF32; accuracy on normal and wide-range data."""
    import numpy as np
    info = select_devices("gpu")[0]
    dev = Device(info)
    cands = tf32_candidates(info)
    print(f"{len(cands)} TF32 candidates", flush=True)

    def report(i, n, t, best, msg):
        if msg:
            print(f"[{i}/{n}] FAILED {msg[:400]}", flush=True)

    best, results = search(dev, "float32", size=4096, budget=args.budget, first=cands,
                           max_candidates=len(cands), report=report)
    rec = {"device": info.name, "driver": info.driver, "commit": os.environ.get("DGEMM_COMMIT", "unknown"),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(sys.argv), "tried": len(results), "incorrect": sum(not r.ok for r in results),
           "incorrect_examples": [{"params": r.params.as_dict(), "rel_err": r.rel_err}
                                  for r in results if not r.ok][:5], "modes": {}}
    fma = dev.choice("float32").params
    for mode, mma in (("3xtf32", 6),):
        ranked = sorted((r for r in results if r.ok and r.params.MMA == mma), key=lambda r: r.seconds)
        entry = {"top": [{"params": r.params.as_dict(), "tflops": r.tflops, "rel_err": r.rel_err}
                         for r in ranked[:6]], "sizes": []}
        rec["modes"][mode] = entry
        if not ranked:
            continue
        p = ranked[0].params
        for n in (8192, 16384):
            kb = KernelBench(dev, "float32", n, n, n, seed=n)
            t, tf = kb.run(p, reps=3), kb.run(fma, reps=3)
            peer = cublas("float32", n, n, n)
            peer_tf32 = cublas_tf32(n)
            entry["sizes"].append({"n": n, "tflops": t.tflops, "rel_err": t.rel_err, "ok": t.ok,
                                   "fma_tflops": tf.tflops, "fma_rel_err": tf.rel_err, "cublas_sgemm": peer,
                                   "cublas_tf32": peer_tf32})
            print(f"{mode} {n}^3: {t.tflops:.1f} TF err {t.rel_err:.1e} | FMA {tf.tflops:.1f} err {tf.rel_err:.1e}"
                  f" | cuBLAS SGEMM {peer['tflops']:.1f}, TF32 {peer_tf32['tflops']:.1f}", flush=True)
            del kb
        # wide dynamic range: entries scaled by 2^U(-16, 16)
        kb = KernelBench(dev, "float32", 4096, 4096, 4096, seed=7)
        rng = np.random.default_rng(7)
        kb.a = (kb.a * np.exp2(rng.uniform(-16, 16, kb.a.shape))).astype(np.float32)
        kb.b = (kb.b * np.exp2(rng.uniform(-16, 16, kb.b.shape))).astype(np.float32)
        kb._cache.clear()
        t, tf = kb.run(p, reps=1), kb.run(fma, reps=1)
        entry["wide_range_4096"] = {"rel_err": t.rel_err, "fma_rel_err": tf.rel_err}
        print(f"{mode} wide-range 4096^3: err {t.rel_err:.1e} (FMA {tf.rel_err:.1e})", flush=True)
        with open(os.path.join(args.out, "tf32.json"), "w") as f:
            json.dump(rec, f, indent=1)
    print("incorrect:", rec["incorrect"], rec["incorrect_examples"][:2])


if __name__ == "__main__":
    main()

"""One GPU-machine session for the kernel: tune, then time the best against cuBLAS.

Usage (on the GPU machine): python bench/gpu_kernels.py OUTDIR [--budget S]
Writes OUTDIR/kernels.json and prints a table.  cuBLAS is timed through
torch in the same process (TF32 off for float32; dgemm.benchmarks.cublas).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dgemm.benchmarks import cublas  # noqa: E402
from dgemm.opencl.device import Device  # noqa: E402
from dgemm.opencl.discovery import list_devices, select_devices  # noqa: E402
from dgemm.tuning.timing import KernelBench  # noqa: E402
from dgemm.tuning.params import KernelParams  # noqa: E402
from dgemm.tuning.search import neighbours, search  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=100.0)
    ap.add_argument("--tune-size", type=int, default=4096)
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--store", action="store_true",
                    help="record the best correct candidate per dtype in the user tuning database")
    ap.add_argument("--seed-from", default=None,
                    help="earlier kernels.json: its best parameter sets and their neighbours go first")
    ap.add_argument("--shapes", default="8192x8192x8192,10000x10000x10000,10240x10240x10240,"
                    "16384x16384x16384,16384x16384x256,256x16384x16384")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    devs = list_devices()
    info = select_devices(args.device, devs)[0]
    dev = Device(info)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"device": info.name, "driver": info.driver, "architecture": info.architecture,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit or os.environ.get("DGEMM_COMMIT", "unknown"),
              "command": " ".join(sys.argv), "devices": [d.name for d in devs], "dtypes": {}}
    for dtype in args.dtypes.split(","):
        t0 = time.time()

        def report(i, n, t, best, msg):
            if t is not None and (i % 10 == 0 or (best is t)):
                print(f"[{dtype} {i}/{n} {time.time() - t0:.0f}s] {t.tflops:6.2f} TF ok={t.ok} "
                      f"{t.params} best={best.tflops if best else 0:.2f}", flush=True)
            elif msg:
                print(f"[{dtype} {i}/{n}] FAILED {msg}", flush=True)

        first = [dev.choice(dtype).params, KernelParams()]
        if args.seed_from:
            prev = json.load(open(args.seed_from))["dtypes"].get(dtype, {}).get("top", [])[:4]
            first += neighbours([KernelParams.from_dict(t["params"]) for t in prev], info, dtype)
        best, results = search(dev, dtype, size=args.tune_size, budget=args.budget, first=first, report=report)
        ranked = sorted((r for r in results if r.ok), key=lambda r: r.seconds)
        if args.store and ranked:
            from dgemm.tuning import database as tuning
            where = tuning.store(info, dtype, ranked[0].params, {
                "tflops": ranked[0].tflops, "size": args.tune_size, "date": record["date"],
                "generated_by": "bench/gpu_kernels.py (dgemm.tuning.search.search)", "commit": record["commit"],
                "driver": info.driver})
            print(f"stored {ranked[0].params} ({ranked[0].tflops:.2f} TF) in {where}", flush=True)
        bad = [r for r in results if not r.ok]
        entry = {"tune_size": args.tune_size, "tried": len(results), "incorrect": len(bad),
                 "incorrect_examples": [{"params": r.params.as_dict(), "rel_err": r.rel_err} for r in bad[:5]],
                 "top": [{"params": r.params.as_dict(), "tflops": r.tflops, "rel_err": r.rel_err}
                         for r in ranked[:10]], "sizes": []}
        for r in ranked[:1]:
            if info.short_vendor == "NVIDIA":
                entry["build_log_best"] = dev.build_log(dtype, r.params)[-3000:]
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
        for (m, n, k) in shapes:
            kb = KernelBench(dev, dtype, m, n, k, seed=m + n + k)
            rows = []
            for r in ranked[:args.top]:
                try:
                    t = kb.run(r.params, reps=3)
                    rows.append({"params": t.params.as_dict(), "tflops": t.tflops, "seconds": t.seconds,
                                 "rel_err": t.rel_err, "ok": t.ok})
                except Exception as e:
                    rows.append({"params": r.params.as_dict(), "error": str(e)[:300]})
            del kb
            peer = cublas(dtype, m, n, k)
            best_ok = max((x for x in rows if x.get("ok")), key=lambda x: x["tflops"], default=None)
            entry["sizes"].append({"m": m, "n": n, "k": k, "dgemm": rows, "cublas": peer,
                                   "ratio_best_to_cublas": (best_ok["tflops"] / peer["tflops"])
                                   if (best_ok and peer) else None})
            print(f"{dtype} {m}x{n}x{k}: dgemm best {best_ok['tflops'] if best_ok else float('nan'):.2f} TF, "
                  f"cuBLAS {peer['tflops'] if peer else float('nan'):.2f} TF", flush=True)
        record["dtypes"][dtype] = entry
        with open(os.path.join(args.out, "kernels.json"), "w") as f:
            json.dump(record, f, indent=1)
    print(json.dumps({d: [(s["m"], s["n"], s["k"], s["ratio_best_to_cublas"]) for s in e["sizes"]]
                      for d, e in record["dtypes"].items()}))


if __name__ == "__main__":
    main()

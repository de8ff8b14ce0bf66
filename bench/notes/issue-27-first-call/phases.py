"""The first call's phases, process by process (issue 27): ``time_first_call`` on fresh inputs, as a table.

    python bench/notes/issue-27-first-call/phases.py FOLDER [--size N] [--devices SPEC] [--reps R] [--json OUT]

Writes A and B (N x N float32, Zarr's default codec, 4096-element chunks or N/2) in FOLDER once, then runs the
first-call script R times (each a fresh process, so a fresh cluster) and prints, for each, the seconds from
the spawn of the script to each phase's start and end in the script, the fork server and each worker.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import zarr

from dgemm.benchmarks.first_call import time_first_call

ROWS = [("script", "site"), ("script", "import dask"), ("script", "prestart"), ("script", "import dgemm.client.request"),
        ("script", "import dgemm.client.steps"), ("script", "import distributed"), ("script", "checks"),
        ("script", "import zarr"), ("script", "cluster"), ("script", "list_devices"), ("script", "import pyopencl"),
        ("script", "scheduler_init"), ("script", "import distributed.dashboard.scheduler"),
        ("script", "scheduler_start"), ("script", "nanny_process_start"), ("script", "dashboard_import"),
        ("script", "dashboard_connect"), ("script", "client_init"),
        ("script", "prepare"), ("script", "plan"), ("script", "open_output"), ("script", "compute"),
        ("script", "complete"),
        ("fork_server", "site"), ("fork_server", "preload"), ("fork_server", "import distributed"),
        ("fork_server", "import pyopencl"), ("fork_server", "import zarr"),
        ("worker", "worker_process"), ("worker", "import dgemm.worker.plugin"), ("worker", "import pyopencl"),
        ("worker", "plugin_setup"), ("worker", "device_open"), ("worker", "list_devices"), ("worker", "register"),
        ("worker", "warm"), ("worker", "import zarr"), ("worker", "first_gemm"), ("worker", "first_store")]


def table(r: dict) -> str:
    p = r["phases"]
    out = [f"total {r['seconds']:.3f} s: process start {r['process_start_seconds']:.3f}, import "
           f"{r['import_seconds']:.3f}, matmul {r['matmul_seconds']:.3f} (done at {r['seconds']:.3f})"]
    for role, name in ROWS:
        procs = p["workers"] if role == "worker" else [p[role] or {}]
        for i, proc in enumerate(procs):
            span = proc.get(name)
            if span:
                who = f"worker {i}" if role == "worker" else role
                s, e = (f"{x:8.3f}" if x is not None else "       -" for x in span)
                out.append(f"  {who:<12} {name:<40} {s} {e}")
    return "\n".join(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--devices")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--warm", action="store_true", help="also time a warm call (the second on a local cluster here)")
    args = ap.parse_args()
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    n = args.size
    rng = np.random.default_rng(27)
    for name in ("a", "b"):
        path = folder / f"{name}_{n}.zarr"
        if not path.exists():
            c = min(4096, max(n // 2, 1))
            arr = zarr.create_array(store=str(path), shape=(n, n), chunks=(c, c), dtype="float32")
            for i in range(0, n, c):
                arr[i:i + c] = rng.standard_normal((min(c, n - i), n), dtype="float32")
    runs = []
    for rep in range(args.reps):
        r = time_first_call(folder / f"a_{n}.zarr", folder / f"b_{n}.zarr", folder / "c.zarr", n, n, n,
                            devices=args.devices, timeout=600)
        runs.append({k: r[k] for k in ("seconds", "process_start_seconds", "import_seconds", "matmul_seconds",
                                       "exit_seconds", "ok", "workers", "phases")})
        print(f"--- rep {rep}: ok={r['ok']}")
        print(table(r), flush=True)
        print("  warm seconds:", [w.get("warm_seconds") for w in r["workers"]], flush=True)
    if args.warm:
        import time

        import dgemm
        from dgemm.cluster import local_client

        client = local_client(args.devices)
        warm = []
        for i in range(3):
            t = time.perf_counter()
            dgemm.matmul(str(folder / f"a_{n}.zarr"), str(folder / f"b_{n}.zarr"), out=str(folder / "c_warm.zarr"),
                         client=client, overwrite=True)
            warm.append(time.perf_counter() - t)
        print(f"warm calls: {', '.join(f'{x:.3f}' for x in warm)} s")
        runs.append({"warm_seconds": warm})
    if args.json and args.json.endswith(".jsonl"):   # one line per run, labelled with $VARIANT
        import os

        with open(args.json, "a") as f:
            for r in runs:
                f.write(json.dumps({"variant": os.environ.get("VARIANT"), **r}) + "\n")
    elif args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    sys.exit(0 if all(r.get("ok", True) for r in runs) else 1)

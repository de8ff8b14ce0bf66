#!/usr/bin/env python3
"""Scheduler overhead per task of a matmul cut into many small blocks.

    python bench/overhead.py [--size 1024] [--k 32] [--block 32] [--devices cpu,cpu] [--out FILE]

Multiplies a ``size x k`` by a ``k x size`` Zarr matrix in ``block x block``
C blocks on a local DeviceCluster (one GEMM and one store task per block,
plus one "done" task), with the work per task kept tiny so the time is
mostly overhead, and writes a JSON record (device, date, commit, command)
to ``bench/results/<date>-<device>-overhead.json`` unless ``--out`` says
otherwise.  Runs against the installed dgemm (``pip install -e .``).  Figures:

``wall_per_task_ms``      wall time / tasks: what a task costs in throughput.
``compute_per_task_ms``   mean time inside the task functions (dask's task stream).
``overhead_per_task_ms``  ``wall x threads / tasks - compute_per_task``: per task, the time a
                          worker thread is not running task code (scheduling, messages,
                          serialisation, waiting for the GPU resource, CPU contention).
``null_task_ms``          wall time per trivial task (``client.map`` of a no-op) on the same
                          cluster: the scheduler's own floor here.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import platform
import tempfile
import time


def _noop(x):
    return x


def _prefix(key) -> str:
    from dask.utils import key_split
    return key_split(key)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="M = N (default 1024)")
    parser.add_argument("--k", type=int, default=32, help="K (default 32: tiny products, overhead-bound)")
    parser.add_argument("--block", type=int, default=32, help="C block size (default 32: 1024 blocks)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--devices", default=os.environ.get("DGEMM_DEVICES", "cpu,cpu"),
                        help="devices of the local cluster (default cpu,cpu)")
    parser.add_argument("--scheduler", default=None, help="use the running cluster at this address instead")
    parser.add_argument("--null-tasks", type=int, default=2000)
    parser.add_argument("--out", default=None, help="JSON file (default bench/results/<date>-<device>-overhead.json)")
    args = parser.parse_args(argv)

    import dask
    import distributed
    import numpy as np
    import zarr
    from distributed import Client, get_task_stream

    import dgemm
    from dgemm.benchmarks.records import command_line, git_commit, result_path, utc_now, write_json
    from dgemm.cluster import describe_for_plan

    size, k, blk = args.size, args.k, args.block
    rng = np.random.default_rng(0)
    folder = tempfile.mkdtemp(prefix="dgemm-overhead-")
    A = rng.standard_normal((size, k)).astype(args.dtype)
    B = rng.standard_normal((k, size)).astype(args.dtype)
    a = zarr.create_array(store=f"{folder}/a.zarr", shape=A.shape, chunks=(blk, k), dtype=A.dtype)
    a[...] = A
    b = zarr.create_array(store=f"{folder}/b.zarr", shape=B.shape, chunks=(k, blk), dtype=B.dtype)
    b[...] = B
    with contextlib.ExitStack() as stack:
        if args.scheduler:
            client = stack.enter_context(Client(args.scheduler, set_as_default=False))
        else:
            cluster = stack.enter_context(dgemm.DeviceCluster(args.devices, dashboard_address=":0"))
            client = stack.enter_context(Client(cluster, set_as_default=False))
        # warm up: kernels built, plugin set up, inputs' metadata cached
        dgemm.matmul(a, b[:, :blk], out=f"{folder}/warm.zarr", client=client, block=blk)
        infos = client.run(describe_for_plan)
        threads = sum(w["nthreads"] for w in client.scheduler_info()["workers"].values())

        t0 = time.perf_counter()
        client.gather(client.map(_noop, range(args.null_tasks), pure=False))
        null_wall = time.perf_counter() - t0

        with get_task_stream(client=client) as ts:
            t0 = time.perf_counter()
            out = dgemm.matmul(a, b, out=f"{folder}/c.zarr", client=client, block=blk)
            wall = time.perf_counter() - t0
        compute = collections.defaultdict(float)
        counts = collections.Counter()
        for rec in ts.data:
            p = _prefix(rec["key"])
            counts[p] += 1
            compute[p] += sum(s["stop"] - s["start"] for s in rec["startstops"] if s["action"] == "compute")
        got = out[...]
        err = float(np.abs(got.astype("f8") - A.astype("f8") @ B.astype("f8")).max())
    tasks = sum(counts.values())
    busy = sum(compute.values())
    device = next(iter(infos.values()))["device"]
    date = utc_now()
    commit, dirty = git_commit()
    record = {
        "benchmark": "scheduler overhead per task",
        "device": device.name, "devices": sorted(d["device"].name for d in infos.values()),
        "workers": len(infos), "threads": threads, "cpu_count": os.cpu_count(),
        "date": date, "commit": commit, "commit_dirty": dirty, "command": command_line(),
        "host": platform.node(), "dask": dask.__version__, "distributed": distributed.__version__,
        "m": size, "n": size, "k": k, "block": blk, "dtype": args.dtype,
        "blocks": (size // blk) * (size // blk) if size % blk == 0 else None,
        "tasks": tasks, "tasks_by_layer": dict(counts),
        "wall_s": wall, "compute_s": busy, "compute_s_by_layer": dict(compute),
        "wall_per_task_ms": 1e3 * wall / tasks,
        "compute_per_task_ms": 1e3 * busy / tasks,
        "overhead_per_task_ms": 1e3 * (wall * threads - busy) / tasks,
        "null_tasks": args.null_tasks, "null_task_ms": 1e3 * null_wall / args.null_tasks,
        "max_abs_err": err,
    }
    record["cluster"] = args.scheduler or f"DeviceCluster({args.devices!r})"
    path = args.out or result_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"), date,
                                   device.name, "overhead")
    write_json(path, record)
    print(f"{tasks} tasks ({dict(counts)}) in {wall:.2f} s on {len(infos)} workers x {threads // len(infos)} "
          f"threads ({os.cpu_count()} CPUs): {record['wall_per_task_ms']:.2f} ms/task wall, "
          f"{record['compute_per_task_ms']:.2f} ms/task in task code, overhead {record['overhead_per_task_ms']:.2f} "
          f"ms/task; trivial tasks {record['null_task_ms']:.2f} ms each; max error {err:.2e}")
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()

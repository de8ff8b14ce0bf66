"""Two device workers of one host reading a product's input blocks, with and without the host cache (issue 27).

    python bench/notes/issue-27/hostcache_readers.py OUTDIR [--size 8192] [--chunks 1024] [--threads 8]
        [--modes off,all,marked] [--rounds 2] [--gemm-ms 0] [--store /dev/shm]

No device: each of two processes (spawned, as dgemm's workers are) walks its own tasks of the real graph
(``dgemm.client.graph.build`` for two workers of one host: its placement, order and read-ahead lists) and
reads every block it needs once, as its device's panel cache would, on ``--threads`` reader threads (one
staging buffer each), as fast as they go (``--gemm-ms``: a pause per task instead, as a device's GEMM
paces the reads).  Modes: ``off`` reads every block where it is needed (the default setting);
``all`` sends every Zarr block through the host cache (the cache before the placement marked blocks);
``marked`` only the blocks both workers read (``ZarrBlock.host_shared``).  Records per process and mode the
wall time, reader thread-seconds, bytes decoded on the host, written to the cache and served from it, and
beside each its floor: those bytes at one thread's rates measured first in the same run (decode, write to
the cache, serve from it), over the readers' cores.  The modes alternate for ``--rounds`` rounds.  Writes
OUTDIR/hostcache-readers.json.
"""
import argparse
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def tasks_of(a, b, w, size, chunks):
    """Worker ``w``'s GEMM tasks of the graph for 2 workers of one host, in its order: ``(a_refs, b_refs, ahead)``."""
    import numpy as np

    from dgemm.client import graph
    from dgemm.client.plan import make_plan
    from dgemm.storage import Operand

    workers = ["tcp://127.0.0.1:40001", "tcp://127.0.0.1:40002"]
    plan = make_plan(size, size, size, np.float32, (128, 128, 32), a_chunks=(chunks, chunks),
                     b_chunks=(chunks, chunks), target=chunks, n_workers=2)
    g = graph.build(plan, Operand(a, "a"), Operand(b, "b"), None, alpha=1.0, beta=0.0, token="bench",
                    workers=workers)
    layer = g.layers[g.result_name]
    ann = layer.annotations
    mine = sorted((k for k in layer if ann["workers"](k) == [workers[w]]), key=lambda k: -ann["priority"](k))
    return [(layer[k][1], layer[k][2], [r for r, _, _ in layer[k][14] or ()]) for k in mine]


def worker(w, paths, size, chunks, threads, mode, gemm_ms, cache_dir, barrier, results):
    import dataclasses

    import numpy as np
    import zarr

    from dgemm.storage import ZarrBlock, hostcache

    a, b = zarr.open_array(paths[0], mode="r"), zarr.open_array(paths[1], mode="r")
    tasks = tasks_of(a, b, w, size, chunks)
    cache = hostcache.HostCache(cache_dir, 1 << 40) if mode != "off" else None

    def route(ref):
        if mode == "all" and isinstance(ref, ZarrBlock):
            ref = dataclasses.replace(ref, host_shared=True)
        elif mode == "off" and isinstance(ref, ZarrBlock):
            ref = dataclasses.replace(ref, host_shared=False)
        return hostcache.through(cache, "bench", ref)

    import threading
    local = threading.local()
    stats = {"read_seconds": 0.0, "bytes_host_read": 0, "hits": 0, "bytes_served": 0, "reads": 0,
             "bytes_published": 0}
    lock = threading.Lock()

    def read(ref):
        out = getattr(local, "out", None)
        if out is None or out.shape != ref.shape:
            out = local.out = np.empty(ref.shape, ref.dtype)
        t0 = time.perf_counter()
        served = ref.fill_into(out)
        dt = time.perf_counter() - t0
        with lock:
            stats["read_seconds"] += dt
            stats["reads"] += 1
            if served:
                stats["hits"] += 1
                stats["bytes_served"] += out.nbytes
            else:
                stats["bytes_host_read"] += out.nbytes
                if served is False:   # decoded here and written to the cache for the other worker
                    stats["bytes_published"] += out.nbytes
        return float(out[0, 0])

    futures = {}
    barrier.wait()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for a_refs, b_refs, ahead in tasks:
            for ref in (*a_refs, *b_refs, *ahead):
                ref = route(ref)
                if ref.key() not in futures:
                    futures[ref.key()] = pool.submit(read, ref)
            for ref in (*a_refs, *b_refs):
                futures[ref.key()].result()
            if gemm_ms:
                time.sleep(gemm_ms / 1e3)
    stats["wall_seconds"] = time.perf_counter() - t0
    stats["tasks"] = len(tasks)
    results.put((w, stats))


def run_mode(paths, size, chunks, threads, mode, gemm_ms, store):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    cache_dir = tempfile.mkdtemp(prefix="dgemm-bench-hostcache-", dir=store)
    try:
        procs = [ctx.Process(target=worker, args=(w, paths, size, chunks, threads, mode, gemm_ms, cache_dir,
                                                  barrier, results)) for w in range(2)]
        for p in procs:
            p.start()
        got = dict(results.get(timeout=3600) for _ in procs)
        for p in procs:
            p.join()
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return {"mode": mode, "wall_seconds": max(s["wall_seconds"] for s in got.values()),
            "read_thread_seconds": sum(s["read_seconds"] for s in got.values()),
            "bytes_host_read": sum(s["bytes_host_read"] for s in got.values()),
            "bytes_served": sum(s["bytes_served"] for s in got.values()),
            "bytes_published": sum(s["bytes_published"] for s in got.values()),
            "per_worker": got}


def rates(path, chunks, store, blocks=4):
    """One thread's rates on ``blocks`` chunks of array ``path``, in GB/s of decoded bytes: decoding a chunk
    (dgemm's reader), writing a decoded block to a host cache (its crc included) and serving one from it."""
    import numpy as np
    import zarr

    from dgemm.storage import ZarrBlock, hostcache

    arr = zarr.open_array(path, mode="r")
    refs = [ZarrBlock(arr, (i * chunks, (i + 1) * chunks), (0, chunks)) for i in range(blocks)]
    out = np.empty((chunks, chunks), arr.dtype)
    folder = tempfile.mkdtemp(prefix="dgemm-bench-rates-", dir=store)
    try:
        cache = hostcache.HostCache(folder, 1 << 40)
        for scope in ("warm-up", "timed"):   # the first pass opens files, contexts and buffers: not timed
            t = {"decode": 0.0, "publish": 0.0, "serve": 0.0}
            for i, ref in enumerate(refs):
                t0 = time.perf_counter()
                ref.fill_into(out)
                t1 = time.perf_counter()
                cache.fetch(scope, i, out, lambda o: None)          # a miss: the decode is the one above
                t2 = time.perf_counter()
                cache.fetch(scope, i, out, lambda o: None)          # a hit
                t3 = time.perf_counter()
                t["decode"] += t1 - t0
                t["publish"] += t2 - t1
                t["serve"] += t3 - t2
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {k: blocks * out.nbytes / v / 1e9 for k, v in t.items()}


def floor(run, rate, cores):
    """The run's host floor: its decoding, writing to the cache and serving from it at one thread's
    measured rates, spread over ``cores``."""
    decoded = run["bytes_host_read"] / (rate["decode"] * 1e9)
    published = run["bytes_published"] / (rate["publish"] * 1e9)
    served = run["bytes_served"] / (rate["serve"] * 1e9)
    return (decoded + published + served) / cores


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--chunks", type=int, default=1024)
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--modes", default="off,all,marked")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--gemm-ms", type=float, default=0.0)
    p.add_argument("--store", default="/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    args = p.parse_args()

    import subprocess

    import numpy as np

    from dgemm.benchmarks.inputs import random_zarr

    folder = tempfile.mkdtemp(prefix="dgemm-bench-inputs-", dir=args.store)
    try:
        paths = []
        for name, seed in (("a", 1), ("b", 2)):
            path = os.path.join(folder, f"{name}.zarr")
            random_zarr(path, (args.size, args.size), (args.chunks, args.chunks), np.float32, seed=seed,
                        compressors="auto")   # Zarr's default, zstd
            paths.append(path)
        inputs = 2 * args.size * args.size * 4
        rate = rates(paths[0], args.chunks, args.store)
        cores = min(2 * args.threads, os.cpu_count() or 1)
        print("one thread, GB/s: " + ", ".join(f"{k} {v:.2f}" for k, v in rate.items()), flush=True)
        runs = []
        for r in range(args.rounds):
            for mode in args.modes.split(","):
                res = run_mode(paths, args.size, args.chunks, args.threads, mode, args.gemm_ms, args.store)
                res["round"] = r
                res["decoded_per_input"] = res["bytes_host_read"] / inputs
                res["floor_seconds"] = floor(res, rate, cores)
                runs.append(res)
                print(f"round {r} {mode:6s} wall {res['wall_seconds']:.3f} s (floor {res['floor_seconds']:.3f} s on "
                      f"{cores} cores), readers {res['read_thread_seconds']:.2f} thread-s, decoded "
                      f"{res['decoded_per_input']:.3f}x the inputs, served {res['bytes_served'] / 1e9:.3f} GB",
                      flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    record = {"benchmark": "hostcache-readers", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(),
              "commit": os.environ.get("DGEMM_COMMIT") or commit, "command": "python " + " ".join(
                  [os.path.relpath(__file__)] + [a for a in os.sys.argv[1:]]),
              "size": args.size, "chunks": args.chunks, "threads_per_worker": args.threads, "gemm_ms": args.gemm_ms,
              "one_thread_gbps": rate, "floor_cores": cores,
              "store": args.store, "inputs_bytes": inputs, "runs": runs}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hostcache-readers.json"), "w") as f:
        json.dump(record, f, indent=1)

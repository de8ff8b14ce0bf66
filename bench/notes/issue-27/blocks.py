"""Block size against per-product overhead, warm, on one cluster (issue 27).

    python bench/notes/issue-27/blocks.py OUTDIR [--size 49152] [--chunks 4096] [--blocks 4096,8192] [--reps 2]

Writes zstd (Zarr's default) float32 A and B in --store, starts one local cluster on every device, runs one
untimed product, then alternates the block sizes ``--reps`` times (dgemm.matmul(block=...), C zstd) and records
for each product its time and each worker's counter deltas (busy, kernel, read waits, reads, stores), so the
per-product overhead (busy - kernel) can be read beside the block count. Prints and writes blocks.json.
"""
import argparse
import json
import os
import shutil
import time

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", type=int, default=49152)
    p.add_argument("--chunks", type=int, default=4096)
    p.add_argument("--blocks", default="4096,8192")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--store", default="/dev/shm")
    args = p.parse_args()
    from distributed import Client

    import dgemm
    from dgemm.benchmarks.inputs import random_zarr
    from dgemm.benchmarks.measure import counter_delta, worker_probe
    from dgemm.cluster.local import DeviceCluster

    n, c = args.size, args.chunks
    folder = os.path.join(args.store, "dgemm-blocks")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    a, b = f"{folder}/a.zarr", f"{folder}/b.zarr"
    random_zarr(a, (n, n), (c, c), "float32", seed=1, compressors="auto")
    random_zarr(b, (n, n), (c, c), "float32", seed=2, compressors="auto")
    keys = ("busy_seconds", "busy_kernel_seconds", "busy_read_seconds", "busy_transfer_seconds",
            "busy_other_seconds", "read_wait_seconds", "read_seconds", "bytes_read", "store_seconds", "blocks")
    runs = []
    with DeviceCluster(dashboard_address=":0") as cluster, Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
        dgemm.matmul(a, b, out=f"{folder}/c.zarr", overwrite=True, client=client)
        for rep in range(args.reps):
            for block in map(int, args.blocks.split(",")):
                before = client.run(worker_probe, workers=workers)
                t0 = time.perf_counter()
                dgemm.matmul(a, b, out=f"{folder}/c.zarr", overwrite=True, client=client, block=block)
                seconds = time.perf_counter() - t0
                after = client.run(worker_probe, workers=workers)
                per = {w: {k: v for k, v in counter_delta(before[w]["counters"], after[w]["counters"]).items() if k in keys}
                       for w in workers}
                runs.append({"rep": rep, "block": block, "seconds": seconds, "workers": per})
                print(json.dumps({"block": block, "seconds": round(seconds, 3),
                                  "per_worker": {w[-5:]: {k: round(v, 2) for k, v in d.items()} for w, d in per.items()}}),
                      flush=True)
    os.makedirs(args.out, exist_ok=True)
    record = {"benchmark": "blocks", "size": n, "chunks": c, "cpus": os.cpu_count(), "workers": len(workers),
              "commit": os.environ.get("DGEMM_COMMIT"), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": "python3 bench/notes/issue-27/blocks.py " + " ".join(
                  f"--{k} {v}" for k, v in vars(args).items() if k != "out"), "runs": runs}
    with open(os.path.join(args.out, "blocks.json"), "w") as f:
        json.dump(record, f, indent=1)
    shutil.rmtree(folder, ignore_errors=True)

"""One dgemm.matmul on Blosc-LZ4 inputs with the ``device-codecs`` setting off and on, on one local device (issue 28).

    python bench/notes/issue-28/device_codecs_onoff.py [OUT.json] [--size 16384] [--chunk 4096]
        [--dtype float32] [--devices gpu] [--store /dev/shm] [--repeats 2]

Writes A and B (SIZE x SIZE, a random walk along rows: smooth floats) as Zarr v2 arrays with numcodecs'
``Blosc("lz4", 5, SHUFFLE)`` (Zarr v2's default compressor) in CHUNK² chunks under STORE, starts a local
cluster on DEVICES, runs the product once on and once off to build the kernels, then REPEATS times off and on
(C uncompressed, overwritten), and reports each run's wall time and what the workers' counters grew by:
``device_decoded_bytes``, ``host_decoded_bytes``, ``bytes_up`` (compressed bytes under on) and
``read_seconds`` (summed over reader threads).  Prints one JSON line per run and writes them all to
OUT.json if given.  This is what ``auto`` (dgemm.opencl.codecs.AUTO_ON) should follow.
"""
import argparse
import json
import os
import shutil
import time

COUNTERS = ("device_decoded_bytes", "host_decoded_bytes", "bytes_up", "read_seconds")


def configure(value, dask_worker=None):
    import dask

    dask.config.set({"dgemm.device-codecs": value})


def counters(dask_worker):
    snap = dask_worker.plugins["dgemm"].metric(dask_worker)
    return {k: snap.get(k, 0) for k in COUNTERS}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="write the JSON records here too")
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--devices", default="gpu", help="the local cluster's devices (DGEMM_DEVICES' syntax)")
    p.add_argument("--store", default="/dev/shm", help="folder for the Zarr arrays (removed afterwards)")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    import numcodecs
    import numpy as np
    import zarr
    from distributed import Client

    import dgemm
    from dgemm.cluster import DeviceCluster

    n, chunk = args.size, args.chunk
    folder = os.path.join(args.store, f"dgemm-device-codecs-{os.getpid()}")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    records = []
    try:
        arrays = []
        for name in ("a", "b"):
            arr = zarr.create_array(os.path.join(folder, f"{name}.zarr"), shape=(n, n), chunks=(chunk, chunk),
                                    dtype=args.dtype, zarr_format=2,
                                    compressors=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE))
            for i in range(0, n, chunk):
                rows = min(chunk, n - i)
                arr[i:i + rows] = np.cumsum(rng.standard_normal((rows, n)), axis=1).astype(args.dtype)
            arrays.append(arr)
        out = os.path.join(folder, "c.zarr")
        with DeviceCluster(args.devices, dashboard_address=":0") as cluster, Client(cluster) as client:
            client.wait_for_workers(len(cluster.device_ids), timeout=120)
            for mode in ("on", "off"):   # the GEMM kernels and lz4.cl built before any timed run
                client.run(configure, mode)
                dgemm.matmul(*arrays, out=out, client=client, overwrite=True, compressors=None)
            for mode in ("off", "on") * args.repeats:
                client.run(configure, mode)
                before = client.run(counters)
                t0 = time.perf_counter()
                dgemm.matmul(*arrays, out=out, client=client, overwrite=True, compressors=None)
                wall = time.perf_counter() - t0
                after = client.run(counters)
                grew = {k: sum(after[w][k] - before[w][k] for w in after) for k in COUNTERS}
                record = {"mode": mode, "size": n, "chunk": chunk, "dtype": args.dtype, "devices": args.devices,
                          "wall_s": round(wall, 3), **grew}
                print(json.dumps(record), flush=True)
                records.append(record)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()

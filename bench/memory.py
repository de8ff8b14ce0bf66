"""A cluster that stays up: products of mixed dtypes back to back on one worker, and what each leaves behind.

After every product: the seconds it took, the worker's live OpenCL buffers and
their bytes (device and page-locked, :meth:`dgemm.opencl.device.Device.live_buffers`),
its panel cache, its RSS, and the device memory the driver reports in use
(``nvidia-smi``, where there is one); then the same after the worker's idle
release.  Inputs are raw Zarr arrays in ``--store`` (float32 N², float64 N64²
and a tall-skinny X for the Gram matrix X^T X), written once.

    source .whl/gpu-env.sh && python3 bench/memory.py --store /dev/shm --out "$OUT"
    python bench/memory.py --size 1024 --size64 768 --tall 8192,256     # PoCL
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def device_used_mib() -> int | None:
    """Device memory in use on the first NVIDIA GPU (MiB), None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def probe(dask_worker=None) -> dict:
    """On the worker: its device's live buffers, panel cache and RSS."""
    import psutil

    state = dask_worker.plugins["dgemm"].state
    return dict(state.device.live_buffers(), cache_bytes=state.device.cache.bytes,
                rss=psutil.Process().memory_info().rss)


def release_idle(dask_worker=None) -> None:
    """On the worker: what its idle timer does after a while without a product, now."""
    dask_worker.plugins["dgemm"].state.release_idle(0.0)


def write(path: str, shape, dtype, chunks: int, seed: int) -> str:
    from dgemm.benchmarks.inputs import random_zarr

    random_zarr(path, shape, (min(chunks, shape[0]), min(chunks, shape[1])), dtype=dtype, seed=seed)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=32768, help="side of the float32 square product")
    p.add_argument("--size64", type=int, default=24576, help="side of the float64 square product")
    p.add_argument("--tall", default="1048576,2048", help="rows,columns of X for the Gram matrix X^T X (float32)")
    p.add_argument("--chunks", type=int, default=4096, help="chunk side of the inputs")
    p.add_argument("--rounds", type=int, default=2, help="times the sequence (f32, Gram, f64) runs")
    p.add_argument("--devices", default=None, help="the worker's device (default: the first GPU, else the CPU)")
    p.add_argument("--store", default=None, help="folder of the Zarr files (default: the temporary folder)")
    p.add_argument("--out", default=None, help="folder of the JSON record (default: print only)")
    args = p.parse_args(argv)

    import dgemm
    from distributed import Client

    from dgemm.benchmarks.records import result_path, utc_now, write_json
    from dgemm.opencl.discovery import list_devices
    from dgemm.provenance import command_line, git_commit

    rows, cols = (int(x) for x in args.tall.split(","))
    devices = args.devices or ("gpu" if any(d.type == "GPU" for d in list_devices()) else "cpu")
    first = devices.split(",")[0]
    steps = []
    with tempfile.TemporaryDirectory(dir=args.store, prefix="dgemm-memory-") as folder:
        a32 = write(os.path.join(folder, "a32.zarr"), (args.size, args.size), "float32", args.chunks, 0)
        a64 = write(os.path.join(folder, "a64.zarr"), (args.size64, args.size64), "float64", args.chunks, 1)
        x = write(os.path.join(folder, "x.zarr"), (rows, cols), "float32", args.chunks, 2)
        out = os.path.join(folder, "c.zarr")
        sequence = [("float32 square", lambda c: dgemm.matmul(a32, a32, out=out, overwrite=True, client=c,
                                                             compressors=None), 2.0 * args.size ** 3),
                    ("Gram X^T X", lambda c: dgemm.gemm(x, x, trans_a=True, out=out, overwrite=True, client=c,
                                                        compressors=None), 2.0 * rows * cols * cols),
                    ("float64 square", lambda c: dgemm.matmul(a64, a64, out=out, overwrite=True, client=c,
                                                             compressors=None), 2.0 * args.size64 ** 3)]
        with dgemm.DeviceCluster(first, dashboard_address=":0") as cluster, Client(cluster) as client:
            client.wait_for_workers(1)
            idle = dict(next(iter(client.run(probe).values())), device_used_mib=device_used_mib())
            print(f"idle: {idle}", flush=True)
            for r in range(args.rounds):
                for name, run, flop in sequence:
                    t0 = time.perf_counter()
                    run(client)
                    seconds = time.perf_counter() - t0
                    time.sleep(1)   # the worker's end-of-run release runs on its event loop
                    after = dict(next(iter(client.run(probe).values())), device_used_mib=device_used_mib())
                    steps.append({"round": r, "product": name, "seconds": seconds, "tflops": flop / seconds / 1e12,
                                  **after})
                    print(f"round {r} {name}: {seconds:.2f} s, {after}", flush=True)
            client.run(release_idle)
            time.sleep(1)
            released = dict(next(iter(client.run(probe).values())), device_used_mib=device_used_mib())
            print(f"after the idle release: {released}", flush=True)
    info = [d for d in list_devices() if (d.type == "GPU") == (devices == "gpu")] or list_devices()
    record = {"benchmark": "memory", "date": utc_now(), "commit": git_commit()[0], "command": command_line(),
              "cpus": os.cpu_count(), "device": info[0].name, "sizes": {"float32": args.size, "float64": args.size64,
                                                                          "gram_x": [rows, cols]},
              "chunks": args.chunks, "idle": idle, "steps": steps, "after_idle_release": released}
    if args.out:
        path = result_path(args.out, record["date"], record["device"], "memory")
        write_json(path, record)
        print(f"record written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

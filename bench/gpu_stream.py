"""Issue 5 probe on the GPU machine: the streaming engine end to end, with its floor measured.

Writes one JSON to $OUT: the host's store read/write rates and PCIe upload
rate (measured here), dgemm Zarr -> Zarr with its counters, and the
dask.array + cupy peer on the same inputs.

Usage there: source .whl/gpu-env.sh && python3 bench/gpu_stream.py OUT_DIR STORE_DIR SIZE [DEVICES] [--no-peer]
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Output codecs for dgemm and the peer alike: raw unless --zstd (zarr's default codec).
COMPRESSORS = "auto" if "--zstd" in sys.argv else None


def write_random(path, n, chunk, seed):
    import zarr
    arr = zarr.create_array(store=path, shape=(n, n), chunks=(chunk, chunk), dtype="f4", compressors=None,
                            fill_value=0, overwrite=True)

    def panel(i):
        rng = np.random.default_rng([seed, i])
        arr[i * chunk:(i + 1) * chunk, :] = rng.random((chunk, n), dtype=np.float32) - 0.5
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(panel, range(n // chunk)))
    return arr


def read_rate(arr, chunk, threads):
    nb = arr.shape[0] // chunk
    cells = [(i, j) for i in range(nb) for j in range(nb)][:max(threads, 4)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(lambda ij: np.asarray(arr[ij[0] * chunk:(ij[0] + 1) * chunk,
                                                       ij[1] * chunk:(ij[1] + 1) * chunk]).nbytes, cells))
    return total / (time.perf_counter() - t0)


def write_rate(path, chunk, threads, count=8):
    import zarr
    arr = zarr.create_array(store=path, shape=(chunk * count, chunk), chunks=(chunk, chunk), dtype="f4",
                            compressors=None, overwrite=True)
    block = np.ones((chunk, chunk), np.float32)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: arr.__setitem__((slice(i * chunk, (i + 1) * chunk), slice(None)), block),
                      range(count)))
    r = block.nbytes * count / (time.perf_counter() - t0)
    shutil.rmtree(path, ignore_errors=True)
    return r


def pcie_rate():
    """Pageable and pinned host -> device upload through NVIDIA's OpenCL, one thread."""
    import pyopencl as cl
    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices
    dev = Device(select_devices("gpu")[0])
    host = np.ones(64 << 20, np.float32)     # 256 MB
    buf = dev.buffer(host.nbytes)
    out = {}
    for name in ("pageable",):
        cl.enqueue_copy(dev.transfer_queue, buf, host, is_blocking=True)
        t0 = time.perf_counter()
        for _ in range(4):
            cl.enqueue_copy(dev.transfer_queue, buf, host, is_blocking=True)
        out[name] = 4 * host.nbytes / (time.perf_counter() - t0)
    pinned = cl.Buffer(dev.context, cl.mem_flags.ALLOC_HOST_PTR | cl.mem_flags.READ_ONLY, host.nbytes)
    mapped, _ = cl.enqueue_map_buffer(dev.transfer_queue, pinned, cl.map_flags.WRITE, 0, host.shape, host.dtype)
    mapped[...] = 1
    cl.enqueue_copy(dev.transfer_queue, buf, mapped, is_blocking=True)
    t0 = time.perf_counter()
    for _ in range(4):
        cl.enqueue_copy(dev.transfer_queue, buf, mapped, is_blocking=True)
    out["pinned"] = 4 * host.nbytes / (time.perf_counter() - t0)
    down = np.empty_like(host)
    t0 = time.perf_counter()
    for _ in range(4):
        cl.enqueue_copy(dev.transfer_queue, down, buf, is_blocking=True)
    out["download_pageable"] = 4 * host.nbytes / (time.perf_counter() - t0)
    del dev
    return out


def gpu_memory_sampler(stop, peak):
    import subprocess
    while not stop.is_set():
        try:
            used = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=5).stdout
            for line in used.strip().splitlines():
                i, mib = (int(x) for x in line.split(","))
                peak[i] = max(peak.get(i, 0), mib)
        except Exception as e:  # noqa: BLE001 - reported
            peak["error"] = str(e)
            return
        time.sleep(0.2)


def run_dgemm(a, b, out_path, devices, n):
    import dgemm
    from dgemm.cluster import DeviceCluster
    from dgemm.worker import device_state
    from distributed import Client

    with DeviceCluster(devices, threads_per_worker=4) as cluster, Client(cluster) as client:
        import zarr
        wa = zarr.create_array(store=out_path + ".wa", shape=(1024, 1024), chunks=(512, 512), dtype="f4",
                               overwrite=True)
        wa[...] = 1
        dgemm.matmul(wa, wa, out=out_path + ".wc", overwrite=True, client=client)   # builds the kernels
        totals = lambda: device_state().totals()  # noqa: E731
        before = client.run(totals)
        rss_peak, gpu_peak, stop = {}, {}, threading.Event()
        pids = client.run(os.getpid)
        import psutil

        def rss():
            while not stop.is_set():
                for w, pid in pids.items():
                    try:
                        rss_peak[w] = max(rss_peak.get(w, 0), psutil.Process(pid).memory_info().rss)
                    except Exception:
                        pass
                time.sleep(0.2)
        threads = [threading.Thread(target=rss, daemon=True),
                   threading.Thread(target=gpu_memory_sampler, args=(stop, gpu_peak), daemon=True)]
        for t in threads:
            t.start()
        cold = None
        if "--cold" in sys.argv:   # also time a first run on fresh workers (pinned staging allocated in it)
            t0 = time.perf_counter()
            dgemm.matmul(a, b, out=out_path, overwrite=True, client=client, compressors=COMPRESSORS)
            cold = time.perf_counter() - t0
            before = client.run(totals)
        t0, wall0 = time.perf_counter(), time.time()
        c = dgemm.matmul(a, b, out=out_path, overwrite=True, client=client, compressors=COMPRESSORS)
        seconds = time.perf_counter() - t0
        stop.set()
        after = client.run(totals)
        events = client.run(lambda: [list(e) for e in device_state().events])
        timeline = {w: [(round(s - wall0, 3), round(e - wall0, 3)) for _, s, e, f, _ in ev if s >= wall0]
                    for w, ev in events.items()}
        delta = {w: {k: (after[w][k] - before[w].get(k, 0)) if not k.startswith("cache_") else after[w][k]
                     for k in after[w]} for w in after}
        attrs = dict(c.attrs.get("dgemm", {}))
    from dgemm.benchmarks.demo import check_sample
    err = check_sample(a, b, c, n_rows=6, n_cols=6)
    return {"seconds": seconds, "tflops": 2 * n ** 3 / seconds / 1e12, "cold_seconds": cold, "workers": delta, "check": err,
            "peak_rss": rss_peak, "peak_gpu_mib": gpu_peak, "plan": attrs.get("plan"), "timeline": timeline}


def run_cupy(a_path, b_path, out_path, n):
    import cupy
    import dask
    import dask.array as da
    A = da.from_zarr(a_path).map_blocks(cupy.asarray)
    B = da.from_zarr(b_path).map_blocks(cupy.asarray)
    C = (A @ B).map_blocks(cupy.asnumpy)
    import zarr
    target = zarr.create_array(store=out_path, shape=C.shape, chunks=A.chunksize, dtype=C.dtype,
                               compressors=COMPRESSORS, overwrite=True)
    t0 = time.perf_counter()
    with dask.config.set(scheduler="threads"):
        da.store(C, target, lock=False)
    seconds = time.perf_counter() - t0
    cupy.get_default_memory_pool().free_all_blocks()
    return {"seconds": seconds, "tflops": 2 * n ** 3 / seconds / 1e12}


def main():
    out_dir, store, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    devices = sys.argv[4] if len(sys.argv) > 4 and not sys.argv[4].startswith("--") else "gpu"
    peer = "--no-peer" not in sys.argv
    chunk = min(8192, n // 4)
    os.makedirs(store, exist_ok=True)
    rec = {"output_compressors": str(COMPRESSORS), "size": n, "chunk": chunk, "devices": devices, "store": store, "date": time.strftime("%Y-%m-%d"),
           "commit": os.environ.get("DGEMM_COMMIT"), "command": " ".join(sys.argv)}
    t0 = time.perf_counter()
    a = write_random(os.path.join(store, "a.zarr"), n, chunk, 1)
    b = write_random(os.path.join(store, "b.zarr"), n, chunk, 2)
    rec["generate_seconds"] = time.perf_counter() - t0
    rec["read_GBps"] = {t: read_rate(a, chunk, t) / 1e9 for t in (1, 4, 8)}
    rec["write_GBps"] = {t: write_rate(os.path.join(store, "w.zarr"), chunk, t) / 1e9 for t in (1, 4)}
    try:
        rec["pcie_GBps"] = {k: v / 1e9 for k, v in pcie_rate().items()}
    except Exception as e:  # noqa: BLE001 - no GPU (a local smoke run)
        rec["pcie_GBps"] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(rec), flush=True)
    rec["dgemm"] = run_dgemm(a, b, os.path.join(store, "c_dgemm.zarr"), devices, n)
    print(json.dumps(rec["dgemm"], default=str)[:3000], flush=True)
    if peer:
        try:
            rec["dask_cupy"] = run_cupy(os.path.join(store, "a.zarr"), os.path.join(store, "b.zarr"),
                                        os.path.join(store, "c_cupy.zarr"), n)
            rec["ratio_vs_dask_cupy"] = rec["dask_cupy"]["seconds"] / rec["dgemm"]["seconds"]
        except Exception as e:  # noqa: BLE001 - recorded
            rec["dask_cupy"] = {"error": f"{type(e).__name__}: {e}"}
    with open(os.path.join(out_dir, f"stream-{n}-{devices.replace(',', '_').replace(':', '-')}.json"), "w") as f:
        json.dump(rec, f, indent=1, default=str)
    print(json.dumps({k: v for k, v in rec.items() if k != "dgemm"}, default=str), flush=True)
    shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()

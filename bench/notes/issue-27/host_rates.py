"""The host's codec rates on this machine, chunk by chunk, the ways dgemm could decode (issue 27).

    python bench/notes/issue-27/host_rates.py OUTDIR [--size 16384] [--chunks 4096] [--store /dev/shm]

Writes a zstd (Zarr's default) float32 array of normal values, then measures, each on 1 thread and on every
core: numcodecs' zstd decode and encode of one chunk's bytes (the library alone); dgemm's chunk reader
(``ZarrBlock.fill_into``: file read + decode into the caller's buffer); zarr-python reading the whole array with
its default codec pipeline, and with the zarrs (Rust) pipeline where the ``zarrs`` package is installed.
Prints one JSON object and writes it to OUTDIR/host-rates.json.
"""
import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor


def rate(fn, items, threads, nbytes):
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, items[:threads]))          # warm every thread once
        t0 = time.perf_counter()
        list(pool.map(fn, items))
        return nbytes * len(items) / (time.perf_counter() - t0) / 1e9


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--chunks", type=int, default=4096)
    p.add_argument("--store", default="/dev/shm")
    args = p.parse_args()
    import numpy as np
    import zarr
    from numcodecs import Zstd

    from dgemm.benchmarks.inputs import random_zarr
    from dgemm.storage import ZarrBlock

    cores = os.cpu_count()
    n, c = args.size, args.chunks
    path = os.path.join(args.store, "dgemm-host-rates.zarr")
    random_zarr(path, (n, n), (c, c), "float32", seed=1, compressors="auto", overwrite=True)
    arr = zarr.open_array(path, mode="r")
    chunk_bytes = c * c * 4
    raw = np.random.default_rng(0).standard_normal((c, c), dtype=np.float32)
    codec = Zstd(level=3)
    enc = codec.encode(raw)
    out = {"cores": cores, "chunk_bytes": chunk_bytes, "ratio": chunk_bytes / len(enc), "gbps": {}}
    g = out["gbps"]
    jobs = list(range(max(64, 4 * cores)))
    bufs = {}

    def buf():
        import threading
        t = threading.get_ident()
        if t not in bufs:
            bufs[t] = np.empty((c, c), np.float32)
        return bufs[t]

    for threads in (1, cores):
        g[f"numcodecs_decode_{threads}"] = rate(lambda _: codec.decode(enc, out=buf()), jobs, threads, chunk_bytes)
        g[f"numcodecs_encode_{threads}"] = rate(lambda _: codec.encode(raw), jobs[:max(16, threads * 2)], threads,
                                                chunk_bytes)
        blocks = [ZarrBlock(arr, (i * c, (i + 1) * c), (j * c, (j + 1) * c)) for i in range(n // c)
                  for j in range(n // c)]
        blocks = blocks * max(1, (2 * threads) // len(blocks) + 1)
        g[f"dgemm_reader_{threads}"] = rate(lambda b: b.fill_into(buf()), blocks, threads, chunk_bytes)
        print(json.dumps(g), flush=True)
    for name, pipeline in (("zarr_default", None), ("zarrs", "zarrs.ZarrsCodecPipeline")):
        try:
            if pipeline:
                import zarrs  # noqa: F401
            with zarr.config.set({"codec_pipeline.path": pipeline} if pipeline else {}):
                a = zarr.open_array(path, mode="r")
                a[:c, :c]
                t0 = time.perf_counter()
                a[...]
                g[f"{name}_whole_array"] = n * n * 4 / (time.perf_counter() - t0) / 1e9
        except Exception as e:   # noqa: BLE001 - the record says why
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host-rates.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    import shutil
    shutil.rmtree(path, ignore_errors=True)

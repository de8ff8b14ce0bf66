"""Does zstd encode scale with threads, and what holds it back (issue 27)?

    python bench/notes/issue-27/encode_scaling.py [--chunk 4096] [--threads 1,8,32]

Times, on one chunk of normal float32 values: numcodecs' Zstd encode and decode (a new output buffer and
context each call), and libzstd through ctypes with one compression/decompression context and one output buffer
per thread, reused (no allocation per chunk). Run it twice, once with MALLOC_MMAP_THRESHOLD_=1073741824 in the
environment, to see the page faults of a fresh 64 MiB buffer per call. Prints one JSON line per setting.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def lib():
    name = ctypes.util.find_library("zstd")
    if not name:
        return None
    z = ctypes.CDLL(name)
    z.ZSTD_createCCtx.restype = ctypes.c_void_p
    z.ZSTD_createDCtx.restype = ctypes.c_void_p
    z.ZSTD_compressCCtx.restype = ctypes.c_size_t
    z.ZSTD_compressCCtx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                    ctypes.c_size_t, ctypes.c_int]
    z.ZSTD_decompressDCtx.restype = ctypes.c_size_t
    z.ZSTD_decompressDCtx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                      ctypes.c_size_t]
    z.ZSTD_compressBound.restype = ctypes.c_size_t
    z.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
    z.ZSTD_isError.argtypes = [ctypes.c_size_t]
    return z


def rate(fn, n, threads, nbytes):
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, range(threads)))
        t0 = time.perf_counter()
        list(pool.map(fn, range(n)))
        return round(nbytes * n / (time.perf_counter() - t0) / 1e9, 3)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--threads", default=f"1,8,{os.cpu_count()}")
    args = p.parse_args()
    from numcodecs import Zstd

    c = args.chunk
    raw = np.random.default_rng(0).standard_normal((c, c), dtype=np.float32)
    nbytes = raw.nbytes
    z = lib()
    local = threading.local()

    def state():
        if not hasattr(local, "cctx"):
            local.cctx, local.dctx = z.ZSTD_createCCtx(), z.ZSTD_createDCtx()
            local.dst = np.empty(z.ZSTD_compressBound(nbytes), np.uint8)
            local.out = np.empty_like(raw)
        return local

    out = {"malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"), "cores": os.cpu_count(),
           "chunk_bytes": nbytes, "gbps": {}}
    for level in (3, 1, -1):
        codec = Zstd(level=level)
        enc = codec.encode(raw)
        out[f"ratio_{level}"] = round(nbytes / len(enc), 4)
        for threads in map(int, args.threads.split(",")):
            n = max(16, 3 * threads)
            g = out["gbps"]
            g[f"numcodecs_encode_l{level}_{threads}"] = rate(lambda _: codec.encode(raw), n, threads, nbytes)
            g[f"numcodecs_decode_fresh_l{level}_{threads}"] = rate(lambda _: codec.decode(enc), n, threads, nbytes)
            if z is not None:
                def cz(_):
                    s = state()
                    r = z.ZSTD_compressCCtx(s.cctx, s.dst.ctypes.data, s.dst.nbytes, raw.ctypes.data, nbytes, level)
                    assert not z.ZSTD_isError(r)

                def dz(_):
                    s = state()
                    r = z.ZSTD_decompressDCtx(s.dctx, s.out.ctypes.data, nbytes, enc_arr.ctypes.data, enc_arr.nbytes)
                    assert r == nbytes

                enc_arr = np.frombuffer(enc, np.uint8)
                g[f"libzstd_ctx_encode_l{level}_{threads}"] = rate(cz, n, threads, nbytes)
                g[f"libzstd_ctx_decode_l{level}_{threads}"] = rate(dz, n, threads, nbytes)
            print(json.dumps(g), flush=True)
    print(json.dumps(out))

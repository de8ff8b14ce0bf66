"""The host's rates that bound an end-to-end product: store reads and writes, encoding C, host-device copies.

``dgemm bench e2e`` records them beside its timings, so that a run can be
read against its floor (:func:`dgemm.client.estimate.estimate` takes the
same rates: the reader's per thread is the inputs' decode rate per core).  Each is measured the way dgemm moves data: whole Zarr
chunks by several threads, and one device buffer copied by one thread from
ordinary (pageable) and from page-locked (pinned) host memory.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

READ_THREADS = (1, 4, 8)
READER_THREADS = (1, 4, 8, 16)   # dgemm's own chunk reader (dgemm.storage.chunks), which scales further
WRITE_THREADS = (1, 4)
WRITE_CHUNKS = 8                 # chunks written per write-rate measurement
ENCODE_SIDE = 2048               # chunk side of the encode rate: 16 MiB of float32, large enough to time the codec
COPY_BYTES = 256 * 2**20         # the host-device copy (capped to an eighth of the device's memory)
COPY_REPS = 4


def _gbps(nbytes: int, seconds: float) -> float | None:
    return nbytes / seconds / 1e9 if seconds > 0 else None


def store_read_rate(path, threads: int) -> float | None:
    """GB/s reading whole chunks of the Zarr array at ``path`` with ``threads`` threads (at least 4 chunks)."""
    import zarr

    arr = zarr.open_array(os.fspath(path), mode="r")
    (m, n), (cr, cc) = arr.shape, arr.chunks
    cells = [(i, j) for i in range(0, m, cr) for j in range(0, n, cc)][:max(threads, 4)]

    def read(ij):
        i, j = ij
        return np.asarray(arr[i:i + cr, j:j + cc]).nbytes

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(read, cells))
    return _gbps(total, time.perf_counter() - t0)


def reader_rate(path, threads: int) -> float | None:
    """GB/s reading whole chunks of the Zarr array at ``path`` through dgemm's reader, ``threads`` threads.

    Reads ``2 * threads`` chunks (at least 8) into reused buffers, as the
    workers do into their page-locked staging; None when the reader leaves
    the array to zarr.
    """
    import zarr

    from dgemm.storage.blocks import ZarrBlock

    arr = zarr.open_array(os.fspath(path), mode="r")
    (m, n), (cr, cc) = arr.shape, arr.chunks
    cells = [(i, j) for i in range(0, m, cr) for j in range(0, n, cc)][:max(2 * threads, 8)]
    dtype = np.dtype(arr.dtype).newbyteorder("=")
    bufs = {}

    def read(ij):
        i, j = ij
        block = ZarrBlock(arr, (i, min(i + cr, m)), (j, min(j + cc, n)))
        out = bufs.setdefault(threading.get_ident(), np.empty((cr, cc), dtype))[:block.shape[0], :block.shape[1]]
        return out.nbytes if block.read_into(np.ascontiguousarray(out)) else None

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        got = list(pool.map(read, cells))
    return None if None in got else _gbps(sum(got), time.perf_counter() - t0)


def store_write_rate(folder, chunks, dtype, threads: int, count: int = WRITE_CHUNKS) -> float | None:
    """GB/s writing ``count`` uncompressed chunks into a scratch array in ``folder`` (removed after)."""
    import zarr

    cr, cc = chunks
    path = os.path.join(os.fspath(folder), f"write-rate-{threads}.zarr")
    arr = zarr.create_array(store=path, shape=(cr * count, cc), chunks=(cr, cc), dtype=dtype, compressors=None,
                            overwrite=True)
    block = np.ones((cr, cc), dtype)
    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda i: arr.__setitem__((slice(i * cr, (i + 1) * cr), slice(None)), block),
                          range(count)))
        return _gbps(block.nbytes * count, time.perf_counter() - t0)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def encode_rate(compressors, chunks, dtype, threads: int) -> float | None:
    """GB/s encoding chunks of normal values with ``compressors`` ("auto": zarr's default) on ``threads`` threads.

    As C's blocks are encoded: by dgemm's own steps where its store path
    encodes the codec (:func:`dgemm.storage.chunks.write_region`: libzstd with
    each thread's reused context, 1.3x numcodecs' rate on two H200s' host),
    else through zarr into memory; no disk either way.  ``2 * threads``
    chunks (at least 4) of at most :data:`ENCODE_SIDE` a side.
    """
    import zarr

    cr, cc = (min(int(c), ENCODE_SIDE) for c in chunks)
    count = max(2 * threads, 4)
    arr = zarr.create_array(store=zarr.storage.MemoryStore(), shape=(cr * count, cc), chunks=(cr, cc),
                            dtype=dtype, compressors=compressors)
    block = np.random.default_rng(0).standard_normal((cr, cc)).astype(dtype)
    steps = _own_steps(arr)

    def own(_):
        buf = block.reshape(-1).view(np.uint8)
        for step in reversed(steps):
            buf = step.encode(buf)

    def through_zarr(i):
        arr[i * cr:(i + 1) * cr] = block

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(through_zarr if steps is None else own, range(count)))
    return _gbps(block.nbytes * count, time.perf_counter() - t0)


def _own_steps(array):
    """The steps dgemm's store path encodes ``array``'s chunks with, or None where zarr encodes them."""
    from dgemm.storage import chunks

    try:
        steps = chunks.layout(array).steps
    except chunks.Unsupported:
        return None
    return steps if steps and all(getattr(s, "encodes", False) for s in steps) else None


def copy_rates() -> dict:
    """Run on a worker (a task): GB/s of its device's copies, from one thread.

    ``upload_pageable``, ``upload_pinned`` and ``download_pageable``, each the
    mean over :data:`COPY_REPS` copies of one buffer after a first, untimed one.
    """
    import pyopencl as cl

    from dgemm.worker import device_state

    dev = device_state().device
    if dev is None:
        raise RuntimeError(f"the worker has no usable OpenCL device ({device_state().error})")
    nbytes = int(min(COPY_BYTES, dev.info.global_mem // 8))
    q = dev.transfer_queue
    buf = dev.buffer(nbytes)
    host = np.ones(nbytes, np.uint8)
    pinned = cl.Buffer(dev.context, cl.mem_flags.ALLOC_HOST_PTR | cl.mem_flags.READ_ONLY, nbytes)
    mapped, _ = cl.enqueue_map_buffer(q, pinned, cl.map_flags.WRITE, 0, (nbytes,), np.uint8, is_blocking=True)
    mapped[...] = 1

    def rate(dst, src):
        cl.enqueue_copy(q, dst, src, is_blocking=True)
        t0 = time.perf_counter()
        for _ in range(COPY_REPS):
            cl.enqueue_copy(q, dst, src, is_blocking=True)
        return _gbps(COPY_REPS * nbytes, time.perf_counter() - t0)

    try:
        return {"bytes": nbytes, "upload_pageable": rate(buf, host), "upload_pinned": rate(buf, mapped),
                "download_pageable": rate(host, buf)}
    finally:
        del mapped
        buf.release()
        pinned.release()


def host_rates(a_path, folder, chunks, dtype, client=None, worker: str | None = None, compressors="auto") -> dict:
    """The store's read and write rates (GB/s by thread count) and, on ``worker``, its device's copy rates.

    Parameters
    ----------
    a_path : path
        A Zarr array to read (the benchmark's input A).
    folder : path
        Where a scratch array is written and removed.
    chunks : (int, int)
        Chunk shape of the scratch array.
    dtype : str
    client, worker : optional
        The worker whose device's copies are timed (a task holding its ``GPU``
        resource); without them, no copy rates.
    compressors : "auto", None or list, optional
        C's codecs (zarr's ``compressors=``): their encode rate on one thread
        and on every core (:func:`encode_rate`); a codec given as anything
        else (a repr) is not timed.

    Returns
    -------
    dict
        ``read_gbps`` (through zarr), ``reader_gbps`` (dgemm's chunk reader)
        ``write_gbps`` and ``encode_gbps`` (``{threads: GB/s}``), ``copy_gbps``
        (:func:`copy_rates`, or None with ``copy_skipped`` saying why).
    """
    out = {"read_gbps": {str(t): store_read_rate(a_path, t) for t in READ_THREADS},
           "reader_gbps": {str(t): reader_rate(a_path, t) for t in READER_THREADS},
           "write_gbps": {str(t): store_write_rate(folder, chunks, dtype, t) for t in WRITE_THREADS},
           "copy_gbps": None, "copy_skipped": "no worker given"}
    if compressors is None or compressors == "auto" or isinstance(compressors, list):
        out["encode_gbps"] = {str(t): encode_rate(compressors, chunks, dtype, t)
                              for t in sorted({1, os.cpu_count() or 1})}
    if client is not None and worker is not None:
        try:
            out["copy_gbps"] = client.submit(copy_rates, workers=[worker], allow_other_workers=False,
                                             resources={"GPU": 1}, pure=False).result()
            out["copy_skipped"] = None
        except Exception as e:  # a device without page-locked memory...: reported, not fatal
            out["copy_skipped"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return out

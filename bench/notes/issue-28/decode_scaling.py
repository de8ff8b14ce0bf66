"""How the host's zstd decode of a 64 MiB float32 chunk scales with threads on this machine (issue 28).

    python bench/notes/issue-28/decode_scaling.py OUT.json [--threads 1,4,8,16] [--seconds 2]

Under ``device-codecs: share`` a host decode took 127 ms of CPU per 64 MiB chunk against 61 ms alone (seventeenth
session): this says how much of that a machine's threads cost each other with nothing else running.  Each thread
decodes the same Zarr-default frame (numcodecs' zstd level 3 of normal float32) into a buffer of its own, through
dgemm's libzstd path (:mod:`dgemm.storage.zstd`), for ``--seconds``; writes each count's GB/s in all and per thread,
with CPU seconds per chunk, and libzstd's version.  ``--into pinned`` decodes into page-locked memory as a worker's
readers do (an ``ALLOC_HOST_PTR`` buffer of the first OpenCL device, mapped, as ``Device.staging``), and times
one thread's plain copies into and out of such a buffer against ordinary memory (write-combined memory would read
back slowly, and a zstd decode reads its output back for every match).  ``--dma``: each count also with the
device copying page-locked host memory to itself back to back meanwhile (as a worker's uploads do, about 50 GB/s on
an H100), its rate written beside.
"""
import argparse
import functools
import json
import os
import sys
import threading
import time

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--threads", default="1,4,8,16")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--into", default="numpy", help="numpy, pinned or both (comma separated)")
    p.add_argument("--dma", action="store_true", help="each count also beside host-to-device copies")
    args = p.parse_args()

    import numcodecs

    from dgemm.storage import zstd

    lib = zstd.library()
    codec = zstd.codec(3, False)
    chunk = np.random.default_rng(0).standard_normal(4096 * 4096).astype(np.float32)
    frame = np.frombuffer(numcodecs.Zstd(level=3).encode(chunk), np.uint8)
    rows, copies = [], {}
    pinned = None
    if "pinned" in args.into or args.dma:
        import pyopencl as cl

        dev = next((d for pf in cl.get_platforms() for d in pf.get_devices() if d.type & cl.device_type.GPU), None) \
            or cl.get_platforms()[0].get_devices()[0]
        ctx = cl.Context([dev])
        queue = cl.CommandQueue(ctx)
        kept = {}   # each use's page-locked buffer, allocated once (a thread's output, the copies' source)

        def pinned(nbytes, use):
            if use not in kept:
                buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
                host, _ = cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, (nbytes,),
                                                np.uint8, is_blocking=True)
                kept[use] = (buf, host)
            return kept[use][1][:nbytes]

        @functools.cache
        def device_target():
            return cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 256 << 20)

        plain = np.empty(chunk.nbytes, np.uint8)
        pin = pinned(chunk.nbytes, "copies")
        src = chunk.view(np.uint8)
        for name, dst, frm in (("write ordinary", plain, src), ("write pinned", pin, src),
                               ("read ordinary", plain.copy(), plain), ("read pinned", plain, pin)):
            best = min(_timed(np.copyto, dst, frm) for _ in range(5))
            copies[name] = round(chunk.nbytes / best / 1e9, 2)
        print(json.dumps({"copy_gb_s": copies}), flush=True)
    for into, n, dma in [(i, int(t), d) for i in args.into.split(",") for t in args.threads.split(",")
                         for d in ((False, True) if args.dma else (False,))]:
        counts, cpu = [0] * n, [0.0] * n
        start = threading.Barrier(n + 1)

        def work(i, into=into):
            out = np.empty_like(chunk) if into == "numpy" else pinned(chunk.nbytes, i).view(chunk.dtype)
            codec.decode(frame, out, "warm")
            start.wait()
            c0, end = time.thread_time(), time.perf_counter() + args.seconds
            while time.perf_counter() < end:
                codec.decode(frame, out, "chunk")
                counts[i] += 1
            cpu[i] = time.thread_time() - c0
            if not np.array_equal(out, chunk):
                raise SystemExit("decoded bytes differ")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        copied, stop = [0], threading.Event()

        def uploads():
            src, dst = pinned(256 << 20, "dma"), device_target()
            while not stop.is_set():
                cl.enqueue_copy(queue, dst, src, is_blocking=False).wait()
                copied[0] += 256 << 20

        mover = threading.Thread(target=uploads) if dma else None
        if mover is not None:
            mover.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        stop.set()
        if mover is not None:
            mover.join()
        done = sum(counts)
        rows.append({"into": into, "threads": n, "dma_gb_s": round(copied[0] / wall / 1e9, 1) if dma else None, "chunks": done, "gb_s": round(done * chunk.nbytes / wall / 1e9, 2),
                     "gb_s_per_thread": round(done * chunk.nbytes / wall / 1e9 / n, 3),
                     "cpu_ms_per_chunk": round(1e3 * sum(cpu) / max(done, 1), 1)})
        print(json.dumps(rows[-1]), flush=True)
    record = {"meta": {"what": __doc__.splitlines()[0], "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "host_cores": os.cpu_count(), "libzstd": int(lib.ZSTD_versionNumber()) if lib else None,
                       "ratio": round(chunk.nbytes / frame.nbytes, 4), "commit": os.environ.get("DGEMM_COMMIT"),
                       "command": " ".join([os.path.basename(sys.executable)] + sys.argv)},
              "copy_gb_s": copies, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


if __name__ == "__main__":
    main()

"""Blosc-LZ4 decode on the device (dgemm/kernels/lz4.cl) against numcodecs on every host thread (issue 28).

    python bench/notes/issue-28/blosc_decode.py [OUT.json] [--mib 64] [--chunks 4] [--clevel 5]
        [--shuffle shuffle] [--data walk] [--lanes 8,32,64] [--repeats 5] [--device gpu]

Encodes CHUNKS float32 chunks of MIB MiB each with numcodecs ``Blosc("lz4", CLEVEL, SHUFFLE)`` (Zarr v2's
default compressor), then decodes them, REPEATS times each way, and checks the device's bytes against the
originals:

* device, kernels only: the LZ4 and unshuffle kernels' profiled time (frames already on the device), and the
  LZ4 kernel's alone, for each lane count asked for;
* device, with upload: the whole ``decode_blosc`` call (host planning, upload of the frames from ordinary
  memory, kernels, error flags read back);
* host: numcodecs decoding the chunks on a pool of every core, one chunk per thread (blosc's own threads off),
  and one chunk at a time with blosc's threads on every core; and the host's planning alone (frame checks and
  stream table, which the device path adds on the host).

Rates are decoded bytes per second (GB/s, 1e9).  Prints one JSON object, and writes it to OUT.json if given.
``--data``: ``walk`` (a random walk: smooth floats, the kind that compresses), ``normal`` (standard normal
values: little to compress but the exponents), ``zeros``.
"""
import argparse
import json
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def make_chunk(kind, n, rng):
    import numpy as np
    if kind == "walk":
        return np.cumsum(rng.standard_normal(n, dtype=np.float32), dtype=np.float32)
    if kind == "normal":
        return rng.standard_normal(n, dtype=np.float32)
    if kind == "zeros":
        return np.zeros(n, np.float32)
    raise SystemExit(f"--data: unknown {kind!r}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="write the JSON here too")
    p.add_argument("--mib", type=float, default=64, help="chunk size in MiB (default 64)")
    p.add_argument("--chunks", type=int, default=4, help="chunks decoded per call (default 4)")
    p.add_argument("--clevel", type=int, default=5)
    p.add_argument("--shuffle", choices=("shuffle", "noshuffle"), default="shuffle")
    p.add_argument("--data", choices=("walk", "normal", "zeros"), default="walk")
    p.add_argument("--lanes", default=None, help="work-items per LZ4 stream (LZ4_WG), or several: 1,8,32,64 "
                                                 "(default: 32 on a GPU, 1 on a CPU device)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default=None, help="an OpenCL device as DGEMM_DEVICES names one (default: "
                                                  "the first GPU, else the first CPU device)")
    args = p.parse_args()

    import numpy as np
    import pyopencl as cl
    from numcodecs import Blosc
    from numcodecs import blosc as ncblosc

    from dgemm.opencl.codecs import blosc
    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices

    cores = os.cpu_count()
    info = select_devices(args.device)[0]
    device = Device(info)
    n = int(args.mib * 2**20) // 4
    rng = np.random.default_rng(1)
    chunks = [make_chunk(args.data, n, rng) for _ in range(args.chunks)]
    codec = Blosc("lz4", args.clevel, Blosc.SHUFFLE if args.shuffle == "shuffle" else Blosc.NOSHUFFLE)
    frames = [codec.encode(c) for c in chunks]
    total = sum(c.nbytes for c in chunks)
    lane_counts = [int(x) for x in args.lanes.split(",")] if args.lanes else [blosc.default_lanes(device)]
    plan = blosc.plan(frames[0])
    streams = len(plan.direct) + len(plan.shuffled)
    plan_s = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for f in frames:
            blosc.plan(f)
        plan_s.append(time.perf_counter() - t0)

    out = device.buffer(total, "decoded chunks")
    device_runs = {}
    for lanes in lane_counts:
        kernel_s, call_s, lz4_s = [], [], []
        for r in range(args.repeats + 1):
            events = []
            t0 = time.perf_counter()
            blosc.decode_blosc(device, frames, out, lanes=lanes, events=events)
            t = time.perf_counter() - t0
            if r == 0:      # the first call builds the program
                got = np.empty(total, np.uint8)
                cl.enqueue_copy(device.queue, got, out).wait()
                if got.tobytes() != b"".join(c.tobytes() for c in chunks):
                    raise SystemExit(f"LZ4_WG={lanes}: the device's bytes differ from the chunks")
                continue
            call_s.append(t)
            times = [(what, (e.profile.end - e.profile.start) * 1e-9) for what, e in events]
            kernel_s.append(sum(t for what, t in times if what != "upload"))
            lz4_s.append(sum(t for what, t in times if what == "lz4"))
        device_runs[lanes] = (kernel_s, lz4_s, call_s)
    out.release()

    ncblosc.use_threads = False
    local = threading.local()
    jobs = 2 * max(cores, len(frames))     # chunks decoded per repeat, every core busy

    def one(i):
        if not hasattr(local, "dest"):
            local.dest = np.empty_like(chunks[0])
        codec.decode(frames[i % len(frames)], out=local.dest)
    pool_s = []
    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(one, range(cores)))
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            list(pool.map(one, range(jobs)))
            pool_s.append(time.perf_counter() - t0)
    ncblosc.use_threads = True
    ncblosc.set_nthreads(cores)
    dest = np.empty_like(chunks[0])
    one_s = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for f in frames:
            codec.decode(f, out=dest)
        one_s.append(time.perf_counter() - t0)

    def gbps(nbytes, seconds):
        return round(nbytes / statistics.median(seconds) / 1e9, 3)
    result = {
        "device": info.name, "device_type": info.type, "host_cores": cores,
        "chunk_mib": args.mib, "chunks": args.chunks, "clevel": args.clevel, "shuffle": args.shuffle,
        "data": args.data, "ratio": round(total / sum(len(f) for f in frames), 3),
        "blocksize": int(np.frombuffer(frames[0][8:12], "<i4")[0]),
        "streams_per_chunk": streams, "repeats": args.repeats,
        "gbps": {"host_plan": gbps(total, plan_s),
                 "host_pool_all_cores": gbps(jobs * chunks[0].nbytes, pool_s),
                 "host_blosc_threads_all_cores": gbps(total, one_s)},
        "device_gbps_by_lanes": {str(lanes): {"kernels": gbps(total, k), "lz4_kernel": gbps(total, z),
                                              "call_with_upload": gbps(total, c)}
                                 for lanes, (k, z, c) in device_runs.items()},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

"""Whether one thread's OpenCL calls wait inside the driver while other threads copy, with Python's lock held (issue 28).

    python bench/notes/issue-28/driver_waits.py OUT.json [--seconds 2] [--uploaders 8] [--mib 64]

The fifteenth session's py-spy found a share run's worker holding Python's
lock inside kernel launches, buffer creations, releases and markers
(``bench/NOTES.md``).  This times those calls from one thread, on the first
GPU (else the first device), alone and while ``--uploaders`` threads copy
``--mib`` MiB blocks from page-locked memory to the device back to back, as
a worker's readers do: blocking copies on one shared queue (the engine's
transfer queue), then copies enqueued without blocking and waited for by
event.  Each call is timed through pyopencl (the lock held) and, for
launches and releases, through :mod:`dgemm.opencl.nogil` (the lock let go);
a probe thread counts how many times it gets the lock meanwhile (pure
Python, 1 ms sleeps between counts: how long other threads hold it).
Writes, per load: each call's median, 90th percentile and largest time in
milliseconds, and the probe's count and longest gap.  The loads: alone; the
device kept busy by long kernels on a queue of their own (as GEMMs keep
it); the uploads blocking; the uploads by event; busy and uploads blocking.
"""
import argparse
import json
import os
import sys
import threading
import time

import numpy as np

from dgemm.opencl import nogil

KERNEL = """
__kernel void touch(__global int *x) { if (get_global_id(0) == 0) x[0] += 1; }
__kernel void spin(__global float *x, const int iters) {   /* keeps every lane busy, as a GEMM does */
    float a = x[get_global_id(0)];
    for (int i = 0; i < iters; ++i) a = a * 0.9999f + 1.0f;
    x[get_global_id(0)] = a;
}
"""


def stats(ms) -> dict:
    a = np.sort(np.asarray(ms, float))
    if not a.size:
        return {"n": 0}
    return {"n": int(a.size), "p50_ms": round(float(np.median(a)), 3),
            "p90_ms": round(float(a[int(0.9 * (a.size - 1))]), 3), "max_ms": round(float(a[-1]), 3)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--uploaders", type=int, default=8)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--busy-items", type=int, default=270336, help="the busy load's work-items (an H100's lanes)")
    p.add_argument("--busy-iters", type=int, default=400000, help="its loop (about 1 ms a launch on an H100)")
    args = p.parse_args()

    import pyopencl as cl

    devices = [d for pl in cl.get_platforms() for d in pl.get_devices()]
    dev = next((d for d in devices if d.type & cl.device_type.GPU), devices[0])
    ctx = cl.Context([dev])
    props = cl.command_queue_properties.PROFILING_ENABLE
    q_kernel, q_transfer = cl.CommandQueue(ctx, properties=props), cl.CommandQueue(ctx, properties=props)
    program = cl.Program(ctx, KERNEL).build()
    kernel, spin = cl.Kernel(program, "touch"), cl.Kernel(program, "spin")
    q_busy = cl.CommandQueue(ctx, properties=props)
    spun = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * args.busy_items)
    counter = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4)
    nbytes = args.mib << 20
    mf = cl.mem_flags

    def pinned():
        buf = cl.Buffer(ctx, mf.READ_WRITE | mf.ALLOC_HOST_PTR, nbytes)
        host, _ = cl.enqueue_map_buffer(q_transfer, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, (nbytes,),
                                        np.uint8, is_blocking=True)
        host[:] = 1
        return buf, host
    sources = [pinned() for _ in range(args.uploaders)]
    targets = [cl.Buffer(ctx, mf.READ_WRITE, nbytes) for _ in range(args.uploaders)]

    def uploader(i, stop, blocking, done):
        n = 0
        while not stop.is_set():
            if blocking == "polled":
                nogil.copied(q_transfer, targets[i], sources[i][1])
            elif blocking:
                cl.enqueue_copy(q_transfer, targets[i], sources[i][1], is_blocking=True)
            else:
                cl.enqueue_copy(q_transfer, targets[i], sources[i][1], is_blocking=False).wait()
            n += 1
        done.append(n)

    def busy(stop, out):     # the device kept running long kernels on a queue of its own, two in flight
        last, n = None, 0
        while not stop.is_set():
            ev = spin(q_busy, (args.busy_items,), None, spun, np.int32(args.busy_iters))
            q_busy.flush()
            if last is not None:
                last.wait()
            last, n = ev, n + 1
        q_busy.finish()
        out["busy_kernels"] = n

    def probe(stop, out):
        gaps, last = [], time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        out.update(count=len(gaps), longest_gap_ms=round(1e3 * max(gaps, default=0.0), 2),
                   p90_gap_ms=round(1e3 * float(np.quantile(gaps, 0.9)) if gaps else 0.0, 2))

    def timed(fn, seconds):
        ms, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            fn()
            ms.append(1e3 * (time.perf_counter() - t0))
            time.sleep(0.0005)      # (paced: a full queue would make a launch wait for its own reasons)
        return stats(ms)

    def launch_py():
        kernel(q_kernel, (64,), None, counter)
        q_kernel.flush()

    def launch_nogil():
        nogil.enqueue_kernel(q_kernel, kernel, (64,), None, (counter,))
        nogil.flush(q_kernel)

    def marker_py():
        cl.enqueue_marker(q_kernel)
        q_kernel.flush()

    def create_release_py():
        cl.Buffer(ctx, mf.READ_WRITE, nbytes).release()

    def create_release_nogil():
        b = cl.Buffer(ctx, mf.READ_WRITE, nbytes)
        nogil.release(b, b.release)

    calls = {"launch (pyopencl)": launch_py, "launch (nogil)": launch_nogil, "marker (pyopencl)": marker_py,
             "create + release (pyopencl)": create_release_py, "create + release (nogil release)": create_release_nogil}
    loads = []
    for load, blocking, keep_busy in (("alone", None, False), ("device busy", None, True),
                                      ("uploads blocking", True, False), ("uploads by event", False, False),
                                      ("uploads polled (nogil.copied)", "polled", False),
                                      ("device busy, uploads blocking", True, True)):
        stop, done, probed = threading.Event(), [], {}
        threads = [threading.Thread(target=uploader, args=(i, stop, blocking, done), daemon=True)
                   for i in range(args.uploaders if blocking is not None else 0)]
        if keep_busy:
            threads.append(threading.Thread(target=busy, args=(stop, probed), daemon=True))
        threads.append(threading.Thread(target=probe, args=(stop, probed), daemon=True))
        for t in threads:
            t.start()
        t0, cpu0 = time.perf_counter(), time.process_time()
        record = {"load": load, "calls": {name: timed(fn, args.seconds / len(calls)) for name, fn in calls.items()}}
        q_kernel.finish()
        stop.set()
        for t in threads:
            t.join(30)
        wall = time.perf_counter() - t0
        record["process_cores"] = round((time.process_time() - cpu0) / wall, 2)   # (a spinning wait shows here)
        record["probe"] = probed
        record["uploads"] = sum(done)
        record["upload_gb_s"] = round(sum(done) * nbytes / wall / 1e9, 2)
        loads.append(record)
        print(json.dumps(record), flush=True)
    # How a thread waits for a command that takes a while: its own CPU time against the wall's, per way of waiting.
    waits = {}
    for how in ("clWaitForEvents", "nogil.wait", "blocking read behind it"):
        cpu, wall, n = 0.0, 0.0, 0
        small = np.empty(1, np.float32)
        while wall < max(args.seconds / 2, 0.2):
            ev = None
            for _ in range(20):     # a chain of about 20 busy launches (a GEMM's time)
                ev = spin(q_busy, (args.busy_items,), None, spun, np.int32(args.busy_iters))
            q_busy.flush()
            c0, w0 = time.thread_time(), time.perf_counter()
            if how == "clWaitForEvents":
                ev.wait()
            elif how == "nogil.wait":
                nogil.wait(ev)
            else:
                cl.enqueue_copy(q_busy, small, spun, is_blocking=True)
            cpu += time.thread_time() - c0
            wall += time.perf_counter() - w0
            n += 1
        q_busy.finish()
        waits[how] = {"n": n, "wall_ms_each": round(1e3 * wall / n, 2), "cpu_per_wall": round(cpu / wall, 3)}
    print(json.dumps({"waits": waits}), flush=True)
    meta = {"what": "OpenCL calls' times from one thread, alone and while other threads copy blocks to the device "
                    "(blocking on one shared queue; by event): through pyopencl (Python's lock held) and nogil",
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": dev.name, "cores": os.cpu_count(),
            "host_cores": os.cpu_count(), "commit": os.environ.get("DGEMM_COMMIT", "unknown"),
            "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:])}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "loads": loads, "waits": waits}, f, indent=1)


if __name__ == "__main__":
    main()

"""The host's part of a device zstd decode, piece by piece, from one thread and from many at once (issue 28).

    python bench/notes/issue-28/host_part.py OUT.json [--frames 8] [--size 64] [--threads 1,12] [--seconds 2]

Under ``device-codecs: on`` every block's frames are planned on the host (``zstd_fastplan.plan``, in the
reader that read them) and a call's tables made (``zstd_decode.Batch``, by the call's leader) before the
device decodes anything.  Kept from one run to the next (experiment ``x-call-cache``) they took a 32768²
product under ``on`` from 1.80 s to 1.52 (bench/NOTES.md, issue 28, twenty-second session), far more than
their own time on an idle host would say.  This times each piece on the device machine's own cores:

* ``plan``: one 64 MiB float32 frame of Zarr's default zstd planned, read from the thread's page-locked
  staging (where a reader's frames are) and from ordinary memory (whether staging is slow to read);
* ``batch``: ``Batch`` of FRAMES frames (a call of ``on``'s four blocks of two chunks);
* ``enqueue``: ``decode_zstd`` with its plans given, until its commands are enqueued (``pending``), then
  waited for apart; ``enqueue (device plan)``: the same given the frames' heads (``zstd_devplan``: the call
  plans them on the device first, and waits for that, without Python's lock).

Each from one thread alone and from THREADS threads at once (each with its own staging and queue, all
planning or building at the same time, as a worker's readers do): per operation, the mean wall time and the
thread's CPU time (``time.thread_time``): where wall exceeds CPU, the thread waited (for Python's lock, the
driver or cores).  Every call's output is checked against libzstd's bytes once per thread.
"""
import argparse
import threading
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the JSON record to write")
    p.add_argument("--frames", type=int, default=8, help="frames a call (default 8: four blocks of two chunks)")
    p.add_argument("--size", type=float, default=64, help="chunk size in MiB (default 64)")
    p.add_argument("--threads", default="1,12", help="threads at once, comma separated (default 1,12)")
    p.add_argument("--seconds", type=float, default=2.0, help="each phase's length (default 2)")
    p.add_argument("--device", default=None, help="an OpenCL device as DGEMM_DEVICES names one")
    args = p.parse_args()

    import numpy as np
    import pyopencl as cl
    from numcodecs import Zstd

    from dgemm.benchmarks.records import write_json
    from dgemm.opencl.codecs import zstd_decode as zd
    from dgemm.opencl.codecs import zstd_devplan, zstd_fastplan
    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices
    from dgemm.provenance import command_line, git_commit, utc_now
    from zstd_decode import pack_staging      # (this folder's: run as a script, it is on the path)

    device = Device(select_devices(args.device)[0])
    rng = np.random.default_rng(1)
    count = int(args.size * 2**20) // 4
    chunks = [rng.standard_normal(count, dtype=np.float32) for _ in range(args.frames)]
    frames = [Zstd(level=3).encode(x) for x in chunks]
    want = b"".join(x.tobytes() for x in chunks)
    nbytes = len(want)

    def op_plan_staging(state):
        zstd_fastplan.plan(state["views"][state["i"] % args.frames])
        state["i"] += 1

    def op_plan_memory(state):
        zstd_fastplan.plan(frames[state["i"] % args.frames])
        state["i"] += 1

    def op_batch(state):
        zd.Batch(state["plans"], state["offsets"], state["starts"])

    def op_enqueue(state, heads=False):
        pending = []
        t = time.perf_counter(), time.thread_time()
        plans = [zstd_devplan.head(v) for v in state["views"]] if heads else state["plans"]
        zd.decode_zstd(device, state["views"], state["out"], queue=state["queue"], plans=plans,
                       packed=(state["host"], state["starts"]), keep=True, pending=pending)
        state["enqueue"] = (time.perf_counter() - t[0], time.thread_time() - t[1])
        pending[0][1]()

    ops = {"plan (staging)": op_plan_staging, "plan (memory)": op_plan_memory, "batch": op_batch,
           "enqueue": op_enqueue, "enqueue (device plan)": lambda state: op_enqueue(state, heads=True)}

    def worker(name, stop, start, got, check):
        with device.reading():
            host, starts, views = pack_staging(device, frames)
            out = device.scratch.buffer("host_part output", nbytes)
            state = {"i": 0, "host": host, "starts": starts, "views": views, "out": out,
                     "queue": device.scratch.queue(), "offsets": [k * count * 4 for k in range(args.frames)],
                     "plans": [zstd_fastplan.plan(v) for v in views]}
            if check:
                op_enqueue(state)
                back = np.empty(nbytes, np.uint8)
                cl.enqueue_copy(state["queue"], back, out).wait()
                if back.tobytes() != want:
                    raise SystemExit("the device's decode differs from libzstd's")
            start.wait()
            n = wall = cpu = ewall = ecpu = 0.0
            while not stop.is_set():
                t0, c0 = time.perf_counter(), time.thread_time()
                ops[name](state)
                wall += time.perf_counter() - t0
                cpu += time.thread_time() - c0
                if name.startswith("enqueue"):
                    ewall += state["enqueue"][0]
                    ecpu += state["enqueue"][1]
                n += 1
            got.append((n, wall, cpu, ewall, ecpu))

    rows, checked = [], False
    for nthreads in (int(x) for x in args.threads.split(",")):
        for name in ops:
            stop, got = threading.Event(), []
            start = threading.Barrier(nthreads + 1)
            threads = [threading.Thread(target=worker, args=(name, stop, start, got, not checked))
                       for _ in range(nthreads)]
            for t in threads:
                t.start()
            start.wait()
            time.sleep(args.seconds)
            stop.set()
            for t in threads:
                t.join()
            checked = True
            n = sum(g[0] for g in got)
            row = {"op": name, "threads": nthreads, "ops": int(n),
                   "wall_ms": 1e3 * sum(g[1] for g in got) / max(n, 1),
                   "cpu_ms": 1e3 * sum(g[2] for g in got) / max(n, 1)}
            if name.startswith("enqueue"):
                row["enqueue_wall_ms"] = 1e3 * sum(g[3] for g in got) / max(n, 1)
                row["enqueue_cpu_ms"] = 1e3 * sum(g[4] for g in got) / max(n, 1)
                row["decoded_gbps"] = n * nbytes / args.seconds / 1e9
            rows.append(row)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    write_json(args.out, {
        "benchmark": "zstd-decode-host-part", "device": device.info.name, "device_type": device.info.type,
        "cores": len(__import__("os").sched_getaffinity(0)), "date": utc_now(), "commit": git_commit()[0],
        "command": command_line(), "frames": args.frames, "chunk_mib": args.size, "seconds": args.seconds,
        "rows": rows})


if __name__ == "__main__":
    main()

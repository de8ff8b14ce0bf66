"""What a device zstd decode costs the GEMM kernels running beside it, per decoded byte (issue 28).

    python bench/notes/issue-28/beside_gemm.py OUT.json [--seconds 2] [--threads 1,4] [--host-threads 0]
        [--variants 1,8] [--priority high,normal] [--try-priority] [--gemm 8192,8192,4096] [--size 64] [--frames 2]

The end-to-end runs say the device's decode kernels slow the GEMMs by about what they save the host's
readers (bench/NOTES.md, issue 28, eighteenth and nineteenth sessions), and that they decode at 17-27 GB/s
beside the GEMMs against 63-91 alone.  What the GEMMs lose is what matters, not how fast the decode goes:
a kernel whose work-groups sit on every multiprocessor for long, at a few busy lanes each, keeps the GEMM's
work-groups (which need most of a multiprocessor's local memory) off all of them for that long.

For each Huffman layout (``--variants``: N, reader 5 with ZSTD_HUF_BLOCKS N, blocks a work-group decodes; sN,
reader 6 with ZSTD_HUF_SPLIT N, work-items a stream), queue priority and count of decoding threads, three
phases of ``--seconds`` each, on one device:

* ``gemm``: the engine's GEMM kernel (the tuning database's float32 choice, M x N x K of ``--gemm``, as a
  product's k step) launched back to back on the GEMM queue, alone: its rate;
* ``decode``: THREADS threads, as share's readers do (frames in page-locked staging, plans made, the
  thread's buffers kept, its own feeding queue, FRAMES 64 MiB float32 frames of Zarr's default zstd a
  call, waited for), alone: decoded GB/s;
* ``both``: the two at once.

``--host-threads``: threads decoding the same frames with libzstd on the host during the decode phases (share's
other readers), their rate in ``host_gbps``; each row's ``ms_a_call`` has the host's part of a call too (``plan
(host)``: the frames' plans, ``call (host)``: ``decode_zstd`` until its commands have run).

``gemm_lost_s_per_gb``: the GEMMs' time lost per decoded GB, (1 - both's GEMM rate / alone's) over
both's decoded GB/s; ``alone_s_per_gb``: 1 / the decode's rate alone (what it would cost if it took the
device's time and nothing more).  Every variant's first call is checked against libzstd's bytes, and the
GEMM's result against numpy (KernelBench's sampled check).  Prints each row and writes one JSON record.
"""
import argparse
import json
import os
import threading
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the JSON record to write")
    p.add_argument("--seconds", type=float, default=2.0, help="each phase's length (default 2)")
    p.add_argument("--threads", default="1,4", help="decoding threads, comma separated (default 1,4)")
    p.add_argument("--variants", default="1,s8", help="Huffman layouts: N, reader 5 with ZSTD_HUF_BLOCKS N; sN, "
                                                       "reader 6 with ZSTD_HUF_SPLIT N (default 1,s8)")
    p.add_argument("--priority", default="high,normal", help="the decode queues' priority: high (the default "
                                                            "where the driver offers it; NVIDIA's offers none, "
                                                            "so both are ordinary queues there), normal")
    p.add_argument("--try-priority", action="store_true", help="ask for high-priority decode queues even where the "
                                                                 "driver lists no cl_khr_priority_hints (whether "
                                                                 "it refuses, ignores or honours the property)")
    p.add_argument("--gemm", default="8192,8192,4096", help="M,N,K of each GEMM launch")
    p.add_argument("--size", type=float, default=64, help="chunk size in MiB (default 64)")
    p.add_argument("--frames", type=int, default=2, help="frames a decode call (default 2: a default block)")
    p.add_argument("--host-threads", default="0", help="threads decoding the same frames with libzstd on the host "
                                                       "meanwhile, as share's other readers do (default 0)")
    p.add_argument("--device", default=None, help="an OpenCL device as DGEMM_DEVICES names one")
    p.add_argument("--summary", action="store_true", help="print a line a row of the record OUT.json, run nothing")
    args = p.parse_args()
    if args.summary:
        summary(args.out)
        return

    import numpy as np
    import pyopencl as cl
    from numcodecs import Zstd

    from dgemm.opencl.codecs import zstd_decode as zd
    from dgemm.opencl.codecs import zstd_fastplan
    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices
    from dgemm.provenance import command_line, git_commit, utc_now
    from dgemm.tuning.timing import KernelBench
    from zstd_decode import pack_staging      # (this folder's: run as a script, it is on the path)

    device = Device(select_devices(args.device)[0])
    m, n, k = (int(x) for x in args.gemm.split(","))
    choice = device.choice(np.float32)
    bench = KernelBench(device, np.float32, m, n, k)
    checked = bench.run(choice.params, reps=2)
    if not checked.ok:
        raise SystemExit(f"the GEMM kernel's result is wrong (relative error {checked.rel_err})")
    kern = device.kernels(np.float32, choice.params)
    (at, bp, c), (mp, np_, kp) = next(iter(bench._cache.values()))
    gsize, lsize = kern.params.launch(mp, np_)
    flops = 2.0 * m * n * k

    def gemms(stop, got):
        """GEMMs back to back on the GEMM queue (two in flight) until ``stop``; ``got`` gets (GEMMs, seconds) from
        the first one's end to the last one's, by the host's clock (NVIDIA's driver keeps no profiling times
        for some kernels that ran beside another queue's)."""
        q, evs, t0 = device.queue, [], None
        while not stop.is_set():
            evs.append(kern.gemm(q, gsize, lsize, np.int32(mp), np.int32(np_), np.int32(kp),
                                 np.float32(1.0), np.float32(0.0), at, bp, c))
            if len(evs) > 1:
                evs[-2].wait()
                if t0 is None:
                    t0, first = time.perf_counter(), len(evs) - 1
        q.finish()
        got.append((len(evs) - first, time.perf_counter() - t0))

    rng = np.random.default_rng(1)
    count = int(args.size * 2**20) // 4
    chunks = [rng.standard_normal(count, dtype=np.float32) for _ in range(args.frames)]
    codec = Zstd(level=3)
    frames = [codec.encode(x) for x in chunks]
    want = b"".join(x.tobytes() for x in chunks)
    total = len(want)

    def decoder(stop, queue, out, got, check=False):
        """Decode calls of the frames, waited for each, until ``stop``; ``got`` gets (calls, seconds, each kind's
        time summed)."""
        with device.reading():
            host, starts, views = pack_staging(device, frames)
            calls, t0, kinds = 0, time.perf_counter(), {"plan (host)": 0.0, "call (host)": 0.0}
            while True:
                t1 = time.perf_counter()
                plans = [zstd_fastplan.plan(v) for v in views]
                t2 = time.perf_counter()
                evs = []
                zd.decode_zstd(device, views, out, queue=queue, plans=plans, packed=(host, starts), keep=True,
                               events=evs)
                kinds["plan (host)"] += t2 - t1
                kinds["call (host)"] += time.perf_counter() - t2
                calls += 1
                for what, e in evs:
                    try:
                        kinds[what] = kinds.get(what, 0.0) + (e.profile.end - e.profile.start) * 1e-9
                    except (cl.Error, RuntimeError):     # (a command the driver kept no times for)
                        kinds[what + " (no times)"] = kinds.get(what + " (no times)", 0.0) + 1
                if check:
                    back = np.empty(total, np.uint8)
                    cl.enqueue_copy(queue, back, out).wait()
                    if back.tobytes() != want:
                        raise SystemExit("the device's decode differs from libzstd's")
                    return
                if stop.is_set():
                    break
            got.append((calls, time.perf_counter() - t0, kinds))

    from dgemm.storage import zstd as host_zstd

    def hoster(stop, got):
        """libzstd decoding the frames on the host (as share's host-decoded blocks are) until ``stop``."""
        lib, into = host_zstd.codec(3, False), np.empty(count, np.float32)
        n, t0 = 0, time.perf_counter()
        while not stop.is_set():
            for f in frames:
                lib.decode(f, into, "a frame")
                n += 1
        got.append((n * into.nbytes, time.perf_counter() - t0))

    def phase(nthreads, with_gemm, with_decode, queues, outs, hosts=0):
        stop, spans, done, errors, hosted = threading.Event(), [], [], [], []

        def guarded(fn, *a):
            try:
                fn(*a)
            except BaseException as e:     # noqa: BLE001  (reported after the phase)
                errors.append(e)
                stop.set()
        threads = []
        if with_gemm:
            threads.append(threading.Thread(target=guarded, args=(gemms, stop, spans)))
        if with_decode:
            threads += [threading.Thread(target=guarded, args=(decoder, stop, queues[i], outs[i], done))
                        for i in range(nthreads)]
        threads += [threading.Thread(target=guarded, args=(hoster, stop, hosted)) for _ in range(hosts)]
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        row = {}
        if hosts:
            row["host_gbps"] = round(sum(b for b, _ in hosted) / max(t for _, t in hosted) / 1e9, 3)
        if with_gemm:
            count, seconds = spans[0]
            row["gemm_tflops"] = round(count * flops / seconds / 1e12, 4)
            row["gemms"] = count
        if with_decode:
            calls = sum(c for c, _, _ in done)
            row["decode_gbps"] = round(calls * total / max(s for _, s, _ in done) / 1e9, 3)
            row["calls"] = calls
            kinds = {}
            for _, _, mine in done:
                for what, s in mine.items():
                    kinds[what] = kinds.get(what, 0.0) + s
            # each kind's profiled time a call (start to end: beside the GEMMs, what it waited counts too)
            row["ms_a_call"] = {what: round(s / calls * 1e3, 3) for what, s in sorted(kinds.items())}
        return row

    offered = device.priority or args.try_priority      # (high-priority queues, where the driver offers them)
    variants = [(6, 1, int(x[1:])) if x.startswith("s") else (5, int(x), 1) for x in args.variants.split(",")]
    priorities = args.priority.split(",")
    counts = [int(x) for x in args.threads.split(",")]
    host_counts = [int(x) for x in args.host_threads.split(",")]
    outs = [device.buffer(total, "decoded frames") for _ in range(max(counts))]
    rows, alone = [], phase(0, True, False, [], [])
    print("gemm alone", json.dumps(alone), flush=True)
    hosts_alone = {h: phase(0, False, False, [], [], hosts=h) for h in host_counts if h}
    print("host decode alone", json.dumps(hosts_alone), flush=True)
    for reader, blocks, split in variants:
        zd.HUF_READER, zd.HUF_BLOCKS, zd.HUF_SPLIT = reader, blocks, split
        for priority in priorities:
            device.priority = offered and priority == "high"
            queues = [device.feeding_queue() for _ in range(max(counts))]
            decoder(None, queues[0], outs[0], [], check=True)       # builds the program; checked
            for nthreads, hosts in ((t, h) for t in counts for h in host_counts):
                solo = phase(nthreads, False, True, queues, outs, hosts)
                gemm = phase(0, True, False, [], [])
                both = phase(nthreads, True, True, queues, outs, hosts)
                lost = 1 - both["gemm_tflops"] / gemm["gemm_tflops"]
                row = {"huf_reader": reader, "huf_blocks": blocks, "huf_split": split, "priority": priority,
                       "queue_priority_used": bool(device.priority),
                       "threads": nthreads, "host_threads": hosts, "decode_alone": solo, "gemm_alone": gemm,
                       "both": both,
                       "gemm_lost_fraction": round(lost, 4),
                       "gemm_lost_s_per_gb": round(lost / both["decode_gbps"], 5) if both["decode_gbps"] else None,
                       "alone_s_per_gb": round(1 / solo["decode_gbps"], 5) if solo["decode_gbps"] else None}
                rows.append(row)
                print(json.dumps(row), flush=True)
            for q in queues:
                q.finish()
            device.trim()
    info = device.info
    record = {"meta": {"what": "what a device zstd decode costs the GEMMs beside it, per decoded GB",
                       "device": info.name, "cores": os.cpu_count(), "date": utc_now(),
                       "commit": git_commit()[0], "command": command_line(),
                       "driver": device.cl_device.driver_version, "priority_hints_listed": "cl_khr_priority_hints"
                       in (device.cl_device.extensions or "").split(), "priority_tried": args.try_priority,
                       "gemm": {"m": m, "n": n, "k": k, "params": choice.params.as_dict(),
                                "checked_rel_err": checked.rel_err},
                       "frames_a_call": args.frames, "chunk_mib": args.size, "ratio": round(
                           sum(len(f) for f in frames) / total, 4), "seconds": args.seconds},
              "gemm_first": alone, "host_decode_alone": hosts_alone, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


def summary(path: str) -> None:
    """A line a row of a record: its Huffman layout, priority and threads, the decode's and the GEMMs' rates alone
    and beside each other, the GEMMs' time lost a decoded GB, and the Huffman kernel's time a call."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    for r in rows:
        print("beside", "reader", r.get("huf_reader", 5), "blocks", r["huf_blocks"], "split", r.get("huf_split", 1),
              r["priority"], "threads", r["threads"], "decode alone", r["decode_alone"]["decode_gbps"],
              "beside", r["both"]["decode_gbps"], "gemm", r["gemm_alone"]["gemm_tflops"], "->",
              r["both"]["gemm_tflops"], "lost s/GB", r["gemm_lost_s_per_gb"], "alone s/GB", r["alone_s_per_gb"],
              "huffman ms", r["decode_alone"]["ms_a_call"].get("huffman"), "->", r["both"]["ms_a_call"].get("huffman"))

if __name__ == "__main__":
    main()

"""zstd decode on the device (dgemm/kernels/zstd_decode.cl) against libzstd (issue 28).

    python bench/notes/issue-28/zstd_decode.py [--out DIR] [--size 64] [--chunks 4] [--levels 3,1,-1]
        [--data normal] [--repeats 5] [--lanes 32] [--threads 1,8] [--device gpu]

Encodes CHUNKS float32 chunks of SIZE MiB each with numcodecs ``Zstd(level)`` (Zarr's default compressor is
zstd level 3) for each level, checks that the device decodes them to the bytes libzstd (numcodecs) gives, then
times REPEATS decodes of all the chunks in one call:

* ``kernel_gbps``: decoded bytes over the kernels' profiled time (frames already uploaded), and per kernel
  (``trees``: Huffman tree descriptions decoded into lookup tables, ``huffman``: literal streams, ``sequences``: FSE bitstreams, ``copy``: the blocks
  before a frame's first block with sequences; the execution of the sequences: ``block_scan``: each block's size and
  repeat-offset function, ``frame_scan``: each block's position and repeat offsets, ``blocks``: a work-group per block
  checks it and copies its literals and the matches that read only its own bytes, ``origins``: the bytes of the matches
  that wait for earlier blocks, copied from their origins, ``execute``: per frame, the error and the checksum);
* ``wall_gbps``: the whole ``decode_zstd`` call (host parsing, uploads from ordinary memory, kernels, error
  rows read back);
* ``host_parse_gbps_per_core``: decoded bytes per second of the host's part alone (``zstd_fastplan.plan``, one
  thread: headers, sequence tables, where each Huffman tree description is; the trees themselves are
  decoded on the device since the commit after 6749e24), what each chunk costs a host core on the device path;
* ``libzstd_gbps_per_core``: numcodecs decoding the same chunks on one thread, for comparison;
* ``staged``: per count of THREADS calling at once (as a worker's readers do: frames in page-locked staging,
  plans made, device buffers kept per thread, each thread its own queue), the median call's rate,
  all threads' decoded bytes over the wall time (the first call of each thread included), and over the
  time from every thread's first call done to the last call's end (``warm_aggregate_gbps``).

Rates are decoded bytes per second (GB/s, 1e9).  On PoCL (no GPU), use a small ``--size`` (e.g. 1).
Prints one JSON object and writes ``zstd_decode-<date>.json`` into ``--out`` if given.
"""
import argparse
import json
import os
import statistics
import time


def make_chunk(kind, n, rng):
    import numpy as np
    if kind == "normal":
        return rng.standard_normal(n, dtype=np.float32)
    if kind == "walk":
        return np.cumsum(rng.standard_normal(n, dtype=np.float32), dtype=np.float32)
    if kind == "product":
        a = rng.standard_normal((n // 64, 64), dtype=np.float32)
        return (a @ rng.standard_normal((64, 64), dtype=np.float32)).reshape(-1)
    if kind == "zeros":
        return np.zeros(n, np.float32)
    raise SystemExit(f"--data: unknown {kind!r}")


def pack_staging(device, frames):
    """``(host, starts, views)``: ``frames`` packed into this thread's page-locked staging (each 16-byte aligned, as
    a worker's reader packs them), where each starts, and a view of each there."""
    import numpy as np

    host = device.staging(sum(len(f) + 16 for f in frames))
    starts, pos = [], 0
    for f in frames:
        host[pos:pos + len(f)] = np.frombuffer(f, np.uint8)
        starts.append(pos)
        pos = (pos + len(f) + 15) & ~15
    return host, starts, [host[st:st + len(f)] for st, f in zip(starts, frames)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="a folder to write the JSON record into")
    p.add_argument("--size", type=float, default=64, help="chunk size in MiB (default 64)")
    p.add_argument("--chunks", type=int, default=4, help="chunks decoded per call (default 4)")
    p.add_argument("--levels", default="3,1,-1", help="zstd levels, comma separated (default 3,1,-1)")
    p.add_argument("--data", choices=("normal", "walk", "product", "zeros"), default="normal")
    p.add_argument("--checksum", action="store_true", help="frames with checksums (verified on the device)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--lanes", type=int, default=None, help="work-items per frame in zstd_execute "
                                                           "(default: 32 on a GPU, 1 on a CPU device)")
    p.add_argument("--threads", default="1,8", help="reader threads calling at once, as a worker's do, "
                                                   "with staged frames (default 1,8)")
    p.add_argument("--huf-variants", default=None,
                   help="Huffman kernels to time, READER:LANES[:LOCAL[:FAST[:ILP[:BLOCKS[:AHEAD]]]]],... (zstd_decode.cl's "
                        "ZSTD_HUF_READER, ZSTD_HUF_LANES, 0 lanes: the default, ZSTD_HUF_LOCAL, ZSTD_HUF_FAST, and "
                        "reader 5's ZSTD_HUF_ILP, ZSTD_HUF_BLOCKS and ZSTD_HUF_AHEAD; reader 6's LANES: 4 x "
                        "ZSTD_HUF_SPLIT, its work-items a stream); staged threads for the first only")
    p.add_argument("--device", default=None, help="an OpenCL device as DGEMM_DEVICES names one (default: "
                                                  "the first GPU, else the first CPU device)")
    args = p.parse_args()

    import numpy as np
    import pyopencl as cl
    from numcodecs import Zstd

    from dgemm.opencl.codecs import zstd_decode as zd
    from dgemm.opencl.codecs import zstd_fastplan
    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices
    from dgemm.provenance import command_line, git_commit, utc_now

    device = Device(select_devices(args.device)[0])
    lanes = args.lanes or zd.default_lanes(device)
    n = int(args.size * 2**20) // 4
    rng = np.random.default_rng(1)
    chunks = [make_chunk(args.data, n, rng) for _ in range(args.chunks)]
    total = sum(c.nbytes for c in chunks)
    runs = {}
    out = device.buffer(total, "decoded chunks")
    variants = [tuple(int(x) for x in v.split(":")) for v in args.huf_variants.split(",")] if args.huf_variants \
        else [(zd.HUF_READER, 0, zd.HUF_LOCAL, zd.HUF_FAST, zd.HUF_ILP, zd.HUF_BLOCKS, zd.HUF_AHEAD)]
    variants = [(v + (1, 1, 1, 1, 1, 1, 1))[:7] if len(v) >= 2 else v for v in variants]
    for (reader, hlanes, local, fast, ilp, hblocks, ahead), level in ((v, int(x)) for x in args.levels.split(",")
                                                                      for v in variants):
        zd.HUF_READER, zd.HUF_LANES, zd.HUF_LOCAL, zd.HUF_FAST = reader, hlanes or None, local, fast
        zd.HUF_ILP, zd.HUF_BLOCKS, zd.HUF_AHEAD = ilp, hblocks, ahead
        first = (reader, hlanes, local, fast, ilp, hblocks, ahead) == variants[0]
        key = str(level) if first else (f"{level}-reader{reader}-lanes{hlanes}-local{local}-fast{fast}"
                                        + (f"-ilp{ilp}-blocks{hblocks}-ahead{ahead}" if reader >= 3 else ""))
        codec = Zstd(level=level, checksum=args.checksum)
        frames = [codec.encode(c) for c in chunks]
        want = np.frombuffer(b"".join(bytes(codec.decode(f)) for f in frames), np.uint8)   # the reference
        if want.tobytes() != b"".join(c.tobytes() for c in chunks):
            raise SystemExit("numcodecs does not give the chunks back")
        plans = [zstd_fastplan.plan(f) for f in frames]
        shape = {"blocks": int(sum(len(p.blocks) for p in plans)),
                 "huffman_streams": int(sum(len(p.streams) for p in plans)),
                 "huffman_trees": int(sum(len(p.trees) for p in plans)),
                 "sequences": int(sum(p.nseq for p in plans)),
                 "literal_bytes": int(sum(p.literals for p in plans)),
                 "compressed_bytes": int(sum(len(f) for f in frames))}
        parse_s, lib_s, call_s, kernel_s, per = [], [], [], [], {}
        cl.enqueue_fill_buffer(device.queue, out, np.uint8(0xFF), 0, total).wait()
        for r in range(args.repeats + 1):
            events = []
            t0 = time.perf_counter()
            zd.decode_zstd(device, frames, out, lanes=lanes, events=events)
            t = time.perf_counter() - t0
            if r == 0:      # the first call builds the program: checked, not timed
                got = np.empty(total, np.uint8)
                cl.enqueue_copy(device.queue, got, out).wait()
                wrong = np.nonzero(got != want)[0]
                if wrong.size:
                    raise SystemExit(f"level {level}: {wrong.size} bytes differ from libzstd's "
                                     f"(the first at {wrong[0]})")
                continue
            call_s.append(t)
            times = [(what, (e.profile.end - e.profile.start) * 1e-9) for what, e in events]
            kernel_s.append(sum(s for what, s in times if what != "upload"))
            for what, s in times:
                per.setdefault(what, [0.0] * args.repeats)[r - 1] += s
            t0 = time.perf_counter()
            for f in frames:
                zstd_fastplan.plan(f)
            parse_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for f in frames:
                codec.decode(f)
            lib_s.append(time.perf_counter() - t0)

        def rate(seconds):
            return round(total / statistics.median(seconds) / 1e9, 3)

        # as a worker's reader thread calls it: the frames already in its page-locked staging, their
        # plans made (the check that picks the device path makes them), buffers kept, its own queue;
        # then THREADS readers at once, each its own frames (the device shared, as in a product)
        staged = {}
        for nthreads in (int(x) for x in args.threads.split(",")) if first else ():
            outs = [out] + [device.buffer(total, "decoded chunks") for _ in range(nthreads - 1)]

            def reader(k, times):
                with device.reading():
                    host, starts, views = pack_staging(device, frames)
                    q = device.scratch.queue()
                    for r in range(args.repeats + 1):
                        if r == 1:           # every thread's first call (pinning, buffers) done: timed from here
                            start.wait()
                            marks.append(time.perf_counter())
                        t0 = time.perf_counter()
                        ps = [zstd_fastplan.plan(v) for v in views]
                        t1 = time.perf_counter()
                        evs = []
                        zd.decode_zstd(device, views, outs[k], lanes=lanes, queue=q, plans=ps,
                                       packed=(host, starts), keep=True, events=evs)
                        times.append(time.perf_counter() - t0)
                        if r:
                            spans.append((t1 - t0, time.perf_counter() - t1,
                                          [(w, e.profile.start, e.profile.end) for w, e in evs]))
                    ends.append(time.perf_counter())

            import threading
            times = [[] for _ in range(nthreads)]
            start, marks, ends, spans = threading.Barrier(nthreads), [], [], []
            t0 = time.perf_counter()
            threads = [threading.Thread(target=reader, args=(k, times[k])) for k in range(nthreads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            got = np.empty(total, np.uint8)
            for o in outs:
                cl.enqueue_copy(device.queue, got, o).wait()
                if not np.array_equal(got, want):
                    raise SystemExit(f"level {level}: the staged path's bytes differ from libzstd's")
            for o in outs[1:]:
                o.release()
            warm = [t for ts in times for t in ts[1:]]
            def busy(kind):     # the device's time covered by these commands, overlaps counted once
                iv = sorted((a, b) for _, _, evs in spans for w, a, b in evs if (w == "upload") == (kind == "up"))
                total, end = 0, None
                for a, b in iv:
                    if end is None or a > end:
                        total += b - a
                        end = b
                    elif b > end:
                        total += b - end
                        end = b
                return total * 1e-9
            allev = [x for _, _, evs in spans for x in evs]
            window = (max(b for _, _, b in allev) - min(a for _, a, _ in allev)) * 1e-9 if allev else 0
            staged[str(nthreads)] = {"call_gbps": rate(warm),
                                     "plan_s": round(statistics.median(s[0] for s in spans), 5),
                                     "decode_call_s": round(statistics.median(s[1] for s in spans), 5),
                                     "device_window_s": round(window, 4),
                                     "kernels_busy_s": round(busy("kernels"), 4),
                                     "uploads_busy_s": round(busy("up"), 4),
                                     "aggregate_gbps": round(nthreads * (args.repeats + 1) * total / wall / 1e9, 3),
                                     "warm_aggregate_gbps": round(nthreads * args.repeats * total
                                                                  / (max(ends) - min(marks)) / 1e9, 3)}
        device.trim()

        runs[key] = {
            "ratio": round(shape["compressed_bytes"] / total, 4), **shape,
            "kernel_gbps": rate(kernel_s), "wall_gbps": rate(call_s),
            "per_kernel_gbps": {what: rate(s) for what, s in per.items() if what != "upload"},
            "upload_s": round(statistics.median(per.get("upload", [0.0])), 6),
            "host_parse_gbps_per_core": rate(parse_s), "libzstd_gbps_per_core": rate(lib_s),
            "staged": staged, "correct": True}
        print(f"level {key}: {json.dumps(runs[key])}", flush=True)
    out.release()
    info = device.info
    record = {"benchmark": "zstd-decode", "device": info.name, "device_type": info.type,
              "cores": os.cpu_count(), "date": utc_now(), "commit": git_commit()[0], "command": command_line(),
              "chunk_mib": args.size, "chunks": args.chunks, "data": args.data, "checksum": args.checksum,
              "lanes": lanes, "repeats": args.repeats, "runs": runs}
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"zstd_decode-{record['date'].replace(':', '')}.json")
        with open(path, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

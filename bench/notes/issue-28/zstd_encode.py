"""zstd encode on the device (dgemm/kernels/zstd_encode.cl) against libzstd on every host core (issue 28, item 3).

    python bench/notes/issue-28/zstd_encode.py [--size 4096] [--inner 512] [--blocks 4] [--repeats 5]
        [--lanes 256] [--device gpu] [--out DIR]

Makes BLOCKS float32 products of SIZE x SIZE (``A_i @ B``, A_i SIZE x INNER and B INNER x SIZE of standard
normal values: 64 MiB each at the default size), puts them in one device buffer, and encodes each as one
zstd frame with ``encode_zstd`` (literal-only blocks, one Huffman table per product), REPEATS times after a
first call that builds the program.  Every frame is decoded with libzstd and checked against its product.

Reports (rates in GB/s of input, 1e9 bytes):

* per kernel and all kernels together, from the profiling events (products already on the device);
* the whole call's wall time: kernels, the two small downloads the host waits on (histograms, stream
  sizes), the host's table building and layout, and the download of the compressed bytes: into fresh
  ``bytes`` (what ``encode_zstd`` returns by default), and into a page-locked host buffer (``host=``,
  memoryviews returned, no copy);
* the host's seconds for the Huffman tables (and their FSE-compressed descriptions) and for the layout;
* the ratio (input bytes / frame bytes) against libzstd level 3 and level 1 on the same products, and
  what per-block Huffman tables would give (estimated exactly on the host: each block its own table and
  tree description, the same headers) against the one table per product used here;
* libzstd level 3 encoding the products on a pool of every host core (one product per thread at a time,
  contexts reused: what the host path does without the device).

Prints one JSON object (device, cores, date, commit, command, results) and writes it to
DIR/<date>-zstd-encode.json with ``--out DIR``.  ``--size 512 --inner 64`` runs in seconds on PoCL.
"""
import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def per_block_table_bytes(data, huffman, ze):
    """The frame size if every 128 KiB block had its own Huffman table (same block choices otherwise)."""
    import numpy as np
    total = len(ze.frame_header(data.size))
    for start in range(0, max(data.size, 1), ze.BLOCK):
        block = data[start:start + ze.BLOCK]
        n = block.size
        raw = 3 + n
        hist = np.bincount(block, minlength=256)
        if np.count_nonzero(hist) == 1 and n >= 2:
            total += 4
            continue
        table = huffman.table(hist)
        if table is None or n <= ze.SINGLE_STREAM_MAX:
            total += raw
            continue
        lens = table[2].astype(np.int64)
        seg = (n + 3) // 4
        streams = sum(int(lens[block[k * seg:(k + 1) * seg]].sum()) // 8 + 1 for k in range(4))
        csize = len(table[1]) + 6 + streams
        most = max(n, csize)
        lh = 3 if most < 1024 else 4 if most < 16384 else 5
        total += min(raw, 3 + lh + csize + 1)
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=4096, help="each product is SIZE x SIZE float32 (default 4096: 64 MiB)")
    p.add_argument("--inner", type=int, default=512, help="the products' inner dimension (default 512)")
    p.add_argument("--blocks", type=int, default=4, help="products encoded per call (default 4)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--lanes", type=int, default=None, help="work-items per stream, ZE_WG (default: 256 on a GPU, "
                                                           "16 on a CPU device)")
    p.add_argument("--device", default=None, help="an OpenCL device as DGEMM_DEVICES names one (default: "
                                                  "the first GPU, else the first CPU device)")
    p.add_argument("--out", type=Path, default=None, help="write DIR/<date>-zstd-encode.json too")
    args = p.parse_args()

    import numpy as np
    import pyopencl as cl

    from dgemm.opencl.codecs import huffman
    from dgemm.opencl.codecs import zstd_encode as ze
    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices
    from dgemm.provenance import command_line, git_commit, utc_now
    from dgemm.storage import zstd

    cores = os.cpu_count()
    info = select_devices(args.device)[0]
    device = Device(info)
    rng = np.random.default_rng(1)
    b = rng.standard_normal((args.inner, args.size), dtype=np.float32)
    products = [rng.standard_normal((args.size, args.inner), dtype=np.float32) @ b for _ in range(args.blocks)]
    nbytes = products[0].nbytes
    total = nbytes * args.blocks
    buf = device.buffer(total, "products")
    for i, c in enumerate(products):
        cl.enqueue_copy(device.queue, buf, c, dst_offset=i * nbytes)
    device.queue.finish()
    offsets = [i * nbytes for i in range(args.blocks)]
    lanes = args.lanes or ze.default_lanes(device)

    z3, z1 = zstd.codec(3, False), zstd.codec(1, False)
    if z3 is None:
        raise SystemExit("no libzstd 1.4 or later here: the frames cannot be checked")
    room = args.blocks * ze.frame_bound(nbytes)
    pinned = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, room)
    host, _ = cl.enqueue_map_buffer(device.queue, pinned, cl.map_flags.READ | cl.map_flags.WRITE, 0, (room,),
                                    np.uint8, is_blocking=True)
    wall, wall_pinned, kernel, per_kernel, tables_s, layout_s = [], [], [], {}, [], []
    frames = None
    for r in range(args.repeats + 1):
        t0 = time.perf_counter()
        ze.encode_zstd(device, buf, offsets, [nbytes] * args.blocks, lanes=lanes, host=host)
        t_pinned = time.perf_counter() - t0
        events, timings = [], {}
        t0 = time.perf_counter()
        frames = ze.encode_zstd(device, buf, offsets, [nbytes] * args.blocks, events=events, lanes=lanes,
                                timings=timings)
        t = time.perf_counter() - t0
        if r == 0:          # the first call builds the program
            for i, (f, c) in enumerate(zip(frames, products)):
                got = np.empty_like(c)
                z3.decode(f, got.view(np.uint8), f"product {i}")
                if got.tobytes() != c.tobytes():
                    raise SystemExit(f"product {i}: the frame decodes to other bytes")
            continue
        wall.append(t)
        wall_pinned.append(t_pinned)
        times = {}
        for what, e in events:
            times[what] = times.get(what, 0.0) + (e.profile.end - e.profile.start) * 1e-9
        for what, s in times.items():
            per_kernel.setdefault(what, []).append(s)
        kernel.append(sum(s for what, s in times.items() if what not in ("upload", "download")))
        tables_s.append(timings.get("tables", 0.0))
        layout_s.append(timings.get("layout", 0.0))
    buf.release()
    del host
    pinned.release()

    ours = sum(len(f) for f in frames)
    level3 = sum(len(bytes(z3.encode(c))) for c in products)
    level1 = sum(len(bytes(z1.encode(c))) for c in products)
    first = products[0].reshape(-1).view(np.uint8)
    per_block = per_block_table_bytes(first, huffman, ze)

    jobs = 2 * max(cores, args.blocks)
    pool_s = []
    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(lambda i: z3.encode(products[i % args.blocks]).nbytes, range(cores)))
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            list(pool.map(lambda i: z3.encode(products[i % args.blocks]).nbytes, range(jobs)))
            pool_s.append(time.perf_counter() - t0)

    def gbps(n, seconds):
        return round(n / statistics.median(seconds) / 1e9, 3)
    commit, dirty = git_commit()
    result = {
        "device": info.name, "device_type": info.type, "cores": cores, "date": utc_now(), "commit": commit,
        "dirty": dirty, "command": command_line(),
        "size": args.size, "inner": args.inner, "blocks": args.blocks, "block_mib": nbytes / 2**20,
        "lanes": lanes, "repeats": args.repeats,
        "gbps": {"kernels": gbps(total, kernel), "call_wall_with_download": gbps(total, wall),
                 "call_wall_page_locked_download": gbps(total, wall_pinned),
                 "per_event_kind": {k: gbps(total, v) for k, v in per_kernel.items()},
                 "host_libzstd_level3_all_cores": gbps(jobs * nbytes, pool_s)},
        "host_seconds_per_call": {"tables": round(statistics.median(tables_s), 6),
                                  "layout": round(statistics.median(layout_s), 6)},
        "ratio": {"device": round(total / ours, 5), "libzstd_level3": round(total / level3, 5),
                  "libzstd_level1": round(total / level1, 5),
                  "device_vs_level3_size": round(ours / level3, 5),
                  "first_product_one_table": round(nbytes / len(frames[0]), 5),
                  "first_product_per_block_tables": round(nbytes / per_block, 5)},
        "bytes": {"input": total, "device": ours, "libzstd_level3": level3, "libzstd_level1": level1},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{result['date'][:10]}-zstd-encode.json"
        path.write_text(text + "\n")
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

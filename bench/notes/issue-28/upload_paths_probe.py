"""Chunk files uploaded to the device three ways: the rate and the host's CPU a GB (issue 28, thirty-first session).

    python bench/notes/issue-28/upload_paths_probe.py OUT.json [--devices 0,1] [--threads 1,12] [--mib 128]
        [--seconds 1.5] [--paths staged,pageable,hostptr]

On two H200s of a 32-core host a worker's readers copy its chunk files into page-locked staging at 2.4 GB/s a
thread (52 ms of CPU a 124 MB block), and the uploads read that staging again: per host about 27 GB read from the
page cache, written and read again for 216 blocks, while tmpfs files read at 43-47 GB/s on 24-32 threads at most
(membw_probe.py, NOTES, thirty-first session).  Here each thread uploads a MIB-MiB tmpfs file of its own to a
device buffer of its own, over and over for SECONDS, threads spread over the devices (a context each, as dgemm's
workers have):
- ``staged``: ``os.preadv`` into page-locked memory (``ALLOC_HOST_PTR``, mapped), then the upload (dgemm's path);
- ``pageable``: the upload straight from the file's ``mmap`` (the driver stages it);
- ``hostptr``: a buffer over the file's ``mmap`` (``USE_HOST_PTR``), copied on the device into the device buffer:
  whether the driver reads the page cache without a copy on the CPU;
- ``piecesN`` (thirty-second session): the file read in N-MiB pieces into two page-locked pieces in turn, each
  piece's upload enqueued at its offset as soon as it is read, a piece reused once its last upload is done: whether
  staging that stays in the CPU's cache (two pieces a thread) moves more than a whole block's staging, which is
  written to memory and read from it again by the upload;
- ``mapped`` (thirty-second session): the file's ``mmap`` (``MAP_POPULATE``) copied into the page-locked staging by
  ``numpy.copyto``, then the upload: whether a copy from the page cache's pages mapped beats ``preadv``'s (on two
  H200s' host one thread copies memory at 11 GB/s and reads tmpfs at 4.7, membw_probe.py); ``mapped-lazy``
  without ``MAP_POPULATE`` (the pages faulted in by the copy).
Each row: bytes uploaded a second (all threads), and the process's CPU seconds a GB.  Every path's first upload is
read back and compared with the file.  ``--start-at``: processes started with the same epoch second (one per device,
as dgemm's workers are) time each row from the same moment.
"""
import argparse
import json
import mmap
import os
import sys
import tempfile
import threading
import time

import numpy as np


def _device_list(devices: str):
    import pyopencl as cl

    gpus = [d for p in cl.get_platforms() for d in p.get_devices() if d.type & cl.device_type.GPU]
    found = gpus or [d for p in cl.get_platforms() for d in p.get_devices()]
    return [found[int(i)] for i in devices.split(",")]


def _wait(event):
    from dgemm.opencl import nogil

    nogil.wait(event)


BURN = """__kernel void burn(__global float *x, const int n) {
    float a = x[get_global_id(0)];
    for (int k = 0; k < n; k++) a = a * 1.0000001f + 0.5f;
    x[get_global_id(0)] = a;
}"""


def _beside(kind: str, ctx, folder: str, tag: str, stop, moved: list, down_rate: float, burn: tuple, ready):
    """What else a worker's host and device do while its readers upload: ``down``, C's blocks downloaded into
    page-locked memory and written to new files (each moved into place, as dgemm's stores write chunks) at
    ``down_rate`` GB/s; ``gemm``, a compute kernel launched back to back on a queue of its own.  Adds the bytes
    written (``down``) or the launches (``gemm``) to ``moved``; sets ``ready`` after its first round, so that the
    uploads are timed beside it running (a kernel's build, the first pages of a file, are not in the window)."""
    import pyopencl as cl

    q = cl.CommandQueue(ctx)
    if kind == "gemm":
        items, iterations = burn
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * items)
        cl.enqueue_fill_buffer(q, buf, np.float32(1), 0, 4 * items)
        k = cl.Program(ctx, BURN).build().burn
        while not stop.is_set():
            events = [k(q, (items,), None, buf, np.int32(iterations)) for _ in range(4)]
            _wait(events[-1])
            moved.append(len(events))
            ready.set()
        ready.set()
        return
    nbytes = 256 << 20
    dev = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes)
    cl.enqueue_fill_buffer(q, dev, np.uint8(7), 0, nbytes)
    pinned = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
    host, _ = cl.enqueue_map_buffer(q, pinned, cl.map_flags.WRITE | cl.map_flags.READ, 0, (nbytes,), np.uint8,
                                    is_blocking=True)
    t0, total, name = time.perf_counter(), 0, os.path.join(folder, f"c-{tag}")
    while not stop.is_set():
        _wait(cl.enqueue_copy(q, host, dev, is_blocking=False))
        with open(name + ".partial", "wb", buffering=0) as f:
            f.write(memoryview(host))
        os.replace(name + ".partial", name)
        total += nbytes
        moved.append(nbytes)
        ready.set()
        time.sleep(max(0.0, t0 + total / (down_rate * 1e9) - time.perf_counter()))


def run(path_kind: str, threads: int, devices, nbytes: int, seconds: float, folder: str, begin=None,
        beside: str = "none", down_rate: float = 2.3, burn: tuple = (1 << 22, 4096)) -> dict:
    import pyopencl as cl

    contexts = [cl.Context([d]) for d in devices]
    done, checked, errors = [0] * threads, [None] * threads, []
    start, stop = threading.Barrier(threads + 1), threading.Event()
    others, moved, ready = [], {kind: [] for kind in ("down", "gemm")}, []
    for kind in (x for x in ("down", "gemm") if x in beside.split("+")):
        for n, ctx in enumerate(contexts):
            ready.append(threading.Event())
            others.append(threading.Thread(target=_beside, args=(kind, ctx, folder, f"{kind}{n}", stop, moved[kind],
                                                                  down_rate, burn, ready[-1]), daemon=True))
            others[-1].start()
    for r in ready:
        r.wait(60)

    def work(i):
        try:
            ctx = contexts[i % len(contexts)]
            q = cl.CommandQueue(ctx)
            name = os.path.join(folder, f"f{i}")
            fd = os.open(name, os.O_RDONLY)
            dev = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes)
            piece = int(path_kind[len("pieces"):]) << 20 if path_kind.startswith("pieces") else nbytes
            if path_kind in ("staged", "mapped", "mapped-lazy") or piece < nbytes:
                stages = []
                for _ in range(1 if piece == nbytes else 2):
                    pinned = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, piece)
                    mapped, _ = cl.enqueue_map_buffer(q, pinned, cl.map_flags.WRITE | cl.map_flags.READ, 0,
                                                      (piece,), np.uint8, is_blocking=True)
                    stages.append(mapped)
                stage = stages[0]
            first = True
            start.wait()
            while not stop.is_set() or first:
                if path_kind.startswith("mapped"):
                    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0x8000) if path_kind == "mapped" else 0)
                    with mmap.mmap(fd, nbytes, flags=flags, prot=mmap.PROT_READ) as m:
                        view = np.frombuffer(m, np.uint8)
                        np.copyto(stage, view)
                        del view
                    _wait(cl.enqueue_copy(q, dev, stage, is_blocking=False))
                elif path_kind == "staged":
                    got = os.preadv(fd, [memoryview(stage)], 0)
                    assert got == nbytes
                    _wait(cl.enqueue_copy(q, dev, stage, is_blocking=False))
                elif piece < nbytes:
                    pending = [None, None]
                    for n, offset in enumerate(range(0, nbytes, piece)):
                        size = min(piece, nbytes - offset)
                        if pending[n % 2] is not None:
                            _wait(pending[n % 2])
                        got = os.preadv(fd, [memoryview(stages[n % 2])[:size]], offset)
                        assert got == size
                        pending[n % 2] = cl.enqueue_copy(q, dev, stages[n % 2][:size], dst_offset=offset,
                                                         is_blocking=False)
                    for e in pending:
                        if e is not None:
                            _wait(e)
                else:
                    with mmap.mmap(fd, nbytes, prot=mmap.PROT_READ) as m:
                        view = np.frombuffer(m, np.uint8)
                        if path_kind == "pageable":
                            _wait(cl.enqueue_copy(q, dev, view, is_blocking=False))
                        else:
                            host = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.USE_HOST_PTR, hostbuf=view)
                            _wait(cl.enqueue_copy(q, dev, host, byte_count=nbytes))
                            host.release()
                            del host        # (it holds the view, which holds the map)
                        del view
                if first:
                    back = np.empty(1 << 20, np.uint8)
                    _wait(cl.enqueue_copy(q, back, dev, is_blocking=False,
                                          src_offset=nbytes - len(back)))
                    checked[i] = bool((back == i % 251).all())
                    first = False
                    continue
                done[i] += nbytes
            os.close(fd)
        except Exception as e:      # noqa: BLE001  (reported in the row)
            errors.append(f"{type(e).__name__}: {e}")
            if not start.broken:
                start.abort()

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    if begin is not None:   # (another process times the same path from the same moment: --start-at)
        time.sleep(max(0.0, begin - time.time()))
    try:
        start.wait()
    except threading.BrokenBarrierError:
        pass
    c0, t0 = time.process_time(), time.perf_counter()
    marks = {kind: len(v) for kind, v in moved.items()}
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    after = {kind: sum(v[marks[kind]:]) for kind, v in moved.items()}   # (rounds ended in the window: roughly)
    for t in others:
        t.join(30)
    total = sum(done)
    return {"path": path_kind, "threads": threads, "devices": len(devices), "beside": beside,
            "gb_s": round(total / wall / 1e9, 2), "cpu_s_a_gb": round(cpu / (total / 1e9), 3) if total else None,
            "down_gb_s": round(after["down"] / wall / 1e9, 2), "gemm_launches_s": round(after["gemm"] / wall, 1),
            "checked": all(checked), "errors": errors[:2]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--devices", default="0")
    p.add_argument("--threads", default="1,12")
    p.add_argument("--mib", type=int, default=128)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--paths", default="staged,pageable,hostptr", help="also piecesN: N-MiB pieces (pieces4)")
    p.add_argument("--beside", default="none", help="each row again with these beside it, comma separated: down "
                   "(C's downloads and file writes at --down-gb-s a process), gemm (a compute kernel back to back on "
                   "each device), down+gemm")
    p.add_argument("--down-gb-s", type=float, default=2.3, help="C's traffic a process beside the uploads (a "
                   "worker's on two H200s at 49152²: 4.5 GB of frames over about 2 s)")
    p.add_argument("--burn", default="4194304x4096", help="the gemm kernel's work-items x iterations")
    p.add_argument("--start-at", type=float, default=None,
                   help="the epoch second the first row's timing starts, each next row SECONDS + 5 later: processes "
                        "given the same value (a process per device, as dgemm's workers) time each row at once")
    args = p.parse_args()
    devices = _device_list(args.devices)
    nbytes = args.mib << 20
    most = max(int(x) for x in args.threads.split(","))
    rows = []
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as folder:
        for i in range(most):
            with open(os.path.join(folder, f"f{i}"), "wb") as f:
                f.write(np.full(nbytes, i % 251, np.uint8).tobytes())
        burn = tuple(int(x) for x in args.burn.split("x"))
        rows_asked = [(how, int(n), b) for b in args.beside.split(",") for how in args.paths.split(",")
                      for n in args.threads.split(",")]
        for k, (how, n, b) in enumerate(rows_asked):
            begin = None if args.start_at is None else args.start_at + k * (args.seconds + 5)
            rows.append(run(how, n, devices, nbytes, args.seconds, folder, begin, b, args.down_gb_s, burn))
            print(json.dumps(rows[-1]), flush=True)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(),
            "devices": [d.name for d in devices], "commit": os.environ.get("DGEMM_COMMIT", ""),
            "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:])}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""The host's memory copy rate by thread count: a ceiling for a worker's readers (issue 28, thirtieth session).

    python bench/notes/issue-28/membw_probe.py OUT.json [--threads 1,8,16,24,32] [--mib 256] [--seconds 1]

On two H200s of a 32-core host a worker's 12 readers copy chunk files into page-locked staging at 2.1-2.3 GB/s a
thread, CPU-bound, while the uploads read that staging and C's frames come down and are written: its Python steps
take ten times the CPU time they take on an idle host (NOTES, thirtieth session).  Whether the host's memory
bandwidth binds, this measures: THREADS threads at once, each copying its own MIB-MiB buffer into another
(``numpy.copyto``, Python's lock let go), and each reading a MIB-MiB tmpfs file of its own into a buffer with
``os.preadv`` (as the readers do), for SECONDS each; the copy rate summed over the threads (bytes copied a second:
the memory's traffic is twice that).
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time

import numpy as np


def rate(threads: int, nbytes: int, seconds: float, how: str, folder: str) -> float:
    """Bytes copied a second by ``threads`` threads at once, each its own ``nbytes`` for ``seconds``."""
    done = [0] * threads
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def work(i):
        dst = np.ones(nbytes, np.uint8)
        if how == "memcpy":
            src = np.ones(nbytes, np.uint8)
        else:
            path = os.path.join(folder, f"f{i}")
            with open(path, "wb") as f:
                f.write(np.full(nbytes, i, np.uint8).tobytes())
            fd = os.open(path, os.O_RDONLY)
        start.wait()
        while not stop.is_set():
            if how == "memcpy":
                np.copyto(dst, src)
            else:
                os.preadv(fd, [memoryview(dst)], 0)
            done[i] += nbytes
        if how != "memcpy":
            os.close(fd)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--threads", default="1,8,16,24,32")
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--seconds", type=float, default=1.0)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as folder:
        for how in ("memcpy", "tmpfs read"):
            for n in (int(x) for x in args.threads.split(",")):
                r = rate(n, args.mib << 20, args.seconds, how, folder)
                rows.append({"how": how, "threads": n, "gb_s": round(r / 1e9, 2),
                             "gb_s_a_thread": round(r / n / 1e9, 2)})
                print(json.dumps(rows[-1]), flush=True)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(),
            "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:])}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

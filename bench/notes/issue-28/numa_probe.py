"""The host's NUMA layout against its GPUs, and what a reader's copy and an upload cost across it (issue 28).

    python bench/notes/issue-28/numa_probe.py OUT.json [--gb 2] [--threads 8]

Two H200s on a 32-core host scale 1.70× (49152² zstd `on`) and raw 1.62×: each worker's readers are busy all
run long, copying chunks at 1.5-2.3 GB/s a thread (one GPU's 16-core host: 2.7).  dgemm pins no thread and
allocates its page-locked staging wherever the reader runs.  This prints and records the nodes and their CPUs, each
OpenCL GPU's PCI address and the node sysfs gives it, and times, for each node: THREADS threads pinned to it
copying a tmpfs file (written from node 0) into buffers they touched first, then each GPU's uploads from
page-locked memory allocated and touched by threads of each node, then both GPUs' uploads at once (each from its
own node, then each from the other's).
"""
import argparse
import json
import os
import threading
import time

import numpy as np


def nodes():
    base = "/sys/devices/system/node"
    out = {}
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if name.startswith("node") and name[4:].isdigit():
            with open(f"{base}/{name}/cpulist") as f:
                out[int(name[4:])] = parse_list(f.read().strip())
    return out or {0: sorted(os.sched_getaffinity(0))}


def parse_list(text):
    cpus = []
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        cpus += range(int(a), int(b or a) + 1)
    return cpus


def gpus():
    import pyopencl as cl
    out = []
    for p in cl.get_platforms():
        for d in p.get_devices():
            if not d.type & cl.device_type.GPU:
                continue
            try:
                addr = f"{d.pci_domain_id_nv:04x}:{d.pci_bus_id_nv:02x}:{d.pci_slot_id_nv >> 3:02x}.{d.pci_slot_id_nv & 7}"
            except Exception:   # noqa: BLE001  (no NVIDIA attribute query)
                addr = None
            node = cpus = None
            if addr:
                sysfs = f"/sys/bus/pci/devices/{addr}"
                try:
                    with open(f"{sysfs}/numa_node") as f:
                        node = int(f.read())
                    with open(f"{sysfs}/local_cpulist") as f:
                        cpus = f.read().strip()
                except OSError as e:
                    cpus = str(e)
            out.append({"device": d, "name": d.name, "pci": addr, "numa_node": node, "local_cpulist": cpus})
    return out


def pinned_threads(cpus, n, fn):
    """Run fn(i, barrier) on n threads, thread i pinned to ``cpus`` (or ``cpus[i]``, a list of lists); each waits
    at the barrier once ready.  Returns the wall seconds from the barrier and the threads' results."""
    barrier = threading.Barrier(n + 1)
    out = [None] * n
    each = cpus if cpus and isinstance(cpus[0], (list, tuple)) else [cpus] * n

    def body(i):
        os.sched_setaffinity(0, each[i])
        out[i] = fn(i, barrier)
    ts = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, out


def copy_rate(path, size, cpus, threads, chunk=64 << 20):
    per = size // threads // chunk * chunk

    def fn(i, barrier):
        buf = np.empty(chunk, np.uint8)
        buf[:] = 1                      # first touch: on the thread's node
        with open(path, "rb", buffering=0) as f:
            barrier.wait()
            off = i * per
            while off < (i + 1) * per:
                f.seek(off)
                f.readinto(memoryview(buf))
                off += chunk
    wall, _ = pinned_threads(cpus, threads, fn)
    return round(per * threads / wall / 1e9, 2)


def upload_rate(gpu_list, cpus_of, threads=4, nbytes=256 << 20, reps=8):
    """Uploads to each GPU in gpu_list at once, from page-locked buffers made and touched by threads on cpus_of[g]."""
    import pyopencl as cl
    ctxs = {}
    for g in gpu_list:
        ctx = cl.Context([g["device"]])
        ctxs[id(g)] = (ctx, cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes * threads))
    jobs = [(g, i) for g in gpu_list for i in range(threads)]

    def worker(j, barrier):
        g, i = jobs[j]
        ctx, dev = ctxs[id(g)]
        q = cl.CommandQueue(ctx)
        host = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
        view, _ = cl.enqueue_map_buffer(q, host, cl.map_flags.WRITE, 0, (nbytes,), np.uint8)
        view[:] = 1
        cl.enqueue_copy(q, dev, view, dst_offset=i * nbytes).wait()
        barrier.wait()
        for _ in range(reps):
            cl.enqueue_copy(q, dev, view, dst_offset=i * nbytes, is_blocking=False)
        q.finish()
    wall, _ = pinned_threads([list(cpus_of[id(g)]) for g, _ in jobs], len(jobs), worker)
    return round(nbytes * reps * threads * len(gpu_list) / wall / 1e9, 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--gb", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=8)
    args = p.parse_args()
    ns = nodes()
    gs = gpus()
    rec = {"nodes": {k: f"{v[0]}-{v[-1]} ({len(v)})" for k, v in ns.items()},
           "gpus": [{k: v for k, v in g.items() if k != "device"} for g in gs], "copy": {}, "upload": {}}
    print(json.dumps(rec), flush=True)
    size = int(args.gb * 1e9) // (64 << 20) * (64 << 20)
    path = "/dev/shm/numa-probe.bin"
    first = ns[min(ns)]
    for writer in sorted(ns):
        def write(i, barrier):
            barrier.wait()
            block = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8)
            with open(path, "wb") as f:
                for _ in range(size // (64 << 20)):
                    f.write(block)
        pinned_threads(ns[writer], 1, write)
        for node, cpus in sorted(ns.items()):
            for threads in sorted({args.threads, 2 * args.threads}):
                key = f"file on node {writer}, {threads} threads on node {node}"
                rec["copy"][key] = max(copy_rate(path, size, cpus, threads) for _ in range(2))
                print(key, rec["copy"][key], "GB/s", flush=True)
    os.unlink(path)
    for g in gs:
        for node, cpus in sorted(ns.items()):
            key = f"{g['pci']} from node {node}"
            rec["upload"][key] = upload_rate([g], {id(g): cpus})
            print(key, rec["upload"][key], "GB/s", flush=True)
    if len(gs) == 2 and len(ns) >= 2:
        local = {id(g): ns.get(g["numa_node"], first) for g in gs}
        swapped = {id(gs[0]): local[id(gs[1])], id(gs[1]): local[id(gs[0])]}
        for label, cpus_of in (("both, each from its node", local), ("both, each from the other's", swapped)):
            rec["upload"][label] = upload_rate(gs, cpus_of)
            print(label, rec["upload"][label], "GB/s", flush=True)
    rec["meta"] = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(),
                   "command": "python bench/notes/issue-28/numa_probe.py " + " ".join(os.sys.argv[1:])}
    with open(args.out, "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()

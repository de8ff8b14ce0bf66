"""Where a worker process's threads spend their CPU during one product: a process per device or one for all (issue 27).

    python bench/notes/issue-27/worker_threads.py OUT.json [--size 49152] [--chunk 4096] [--codec none|zstd]
        [--devices 0,1] [--worker-process device,host] [--switch-interval default,0.0005] [--inputs DIR]
        [--store /dev/shm]

For each ``worker-process`` value, a local cluster on DEVICES runs the product once untimed (kernels built), then
once timed while every worker process samples itself: each thread's CPU seconds over the run (from
``/proc/self/task/<tid>/stat``), grouped by the thread's name with its numbers dropped (``dgemm-read``,
``Dask-Default-Threads``, ``MainThread``: the event loop), and every 5 ms each thread's innermost frame of dgemm's,
distributed's or tornado's code (``file:function``), the most frequent kept.  A group near one CPU second per
wall second is busy throughout (the event loop serving every worker of its process, say).  Inputs A and B (SIZE²
float32, a random walk along rows) are written once under ``--inputs`` (or ``--store``), numcodecs ``Zstd(3)``
or raw; C has the inputs' codec.  Writes ``{"meta": ..., "runs": [...]}`` to OUT.json; the last C of each
cluster is checked against float64 where sampled rows and columns cross.
"""
import argparse
import json
import os
import re
import shutil
import sys
import threading
import time
from collections import Counter



def _sampler() -> dict:
    """This process's sampler state (client.run ships these functions by value: a module global would not
    outlive one call)."""
    return sys.__dict__.setdefault("_dgemm_bench_sampler", {})


def _cpu_by_thread() -> dict:
    """{native thread id: CPU seconds} of this process's threads."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick   # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return out


def _group(name: str) -> str:
    return re.sub(r"[-_']*\d+", "", name).rstrip("-_'") or name


def start_sampling(dask_worker=None):
    """On a worker: start sampling its process (once per process); returns the process id."""
    _SAMPLER = _sampler()
    if _SAMPLER.get("running"):
        return os.getpid()
    frames, stop = Counter(), threading.Event()

    def sample():
        names = {}
        while not stop.wait(0.005):
            for t in threading.enumerate():
                names[t.ident] = t.name
            for ident, frame in sys._current_frames().items():
                f, where = frame, None
                while f is not None:
                    code = f.f_code.co_filename
                    if any(k in code for k in ("/dgemm/", "/distributed/", "/tornado/", "/asyncio/")):
                        where = f"{code.rsplit('/', 2)[-2]}/{code.rsplit('/', 1)[-1]}:{f.f_code.co_name}"
                        break
                    f = f.f_back
                frames[(_group(names.get(ident, "?")), where)] += 1

    _SAMPLER.update(running=True, frames=frames, stop=stop, cpu=_cpu_by_thread(), t0=time.perf_counter(),
                    thread=threading.Thread(target=sample, name="bench-sampler", daemon=True))
    _SAMPLER["thread"].start()
    return os.getpid()


def stop_sampling(dask_worker=None):
    """On a worker: the process's CPU seconds by thread group and the most frequent frames (once per process)."""
    _SAMPLER = _sampler()
    if not _SAMPLER.get("running"):
        return None
    _SAMPLER["stop"].set()
    _SAMPLER["thread"].join()
    wall = time.perf_counter() - _SAMPLER["t0"]
    before, after = _SAMPLER["cpu"], _cpu_by_thread()
    names = {t.native_id: t.name for t in threading.enumerate()}
    cpu = Counter()
    for tid, sec in after.items():
        cpu[_group(names.get(tid, "other (not a Python thread, or gone)"))] += sec - before.get(tid, 0.0)
    frames = _SAMPLER["frames"]
    _SAMPLER.clear()
    return {"pid": os.getpid(), "wall_s": round(wall, 3), "cpu_s": {k: round(v, 3) for k, v in cpu.most_common()},
            "frames": [[g, w, n] for (g, w), n in frames.most_common(40)]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", type=int, default=49152)
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--codec", choices=("none", "zstd"), default="none")
    p.add_argument("--devices", default="0,1")
    p.add_argument("--worker-process", default="device,host")
    p.add_argument("--switch-interval", default="default", help="Python's switch interval in the workers "
                   "(sys.setswitchinterval, seconds; default: Python's 0.005), comma separated: each with each "
                   "worker-process value, a cluster each")
    p.add_argument("--store", default="/dev/shm")
    p.add_argument("--inputs", default=None)
    args = p.parse_args()

    import numcodecs
    import numpy as np
    import zarr
    from distributed import Client

    import dgemm
    from dgemm.accuracy import check_sample
    from dgemm.cluster import DeviceCluster

    n, chunk = args.size, args.chunk
    compressor = numcodecs.Zstd(level=3) if args.codec == "zstd" else None
    c_codecs = zarr.codecs.ZstdCodec(level=3) if args.codec == "zstd" else None
    folder = os.path.join(args.store, f"dgemm-worker-threads-{os.getpid()}")
    where = args.inputs or folder
    os.makedirs(where, exist_ok=True)
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays, runs, failed = [], [], 0
    try:
        for name in ("a", "b"):
            path = os.path.join(where, f"{name}-{args.codec}-{n}.zarr")
            if os.path.exists(path):
                arrays.append(zarr.open_array(path, mode="r"))
                continue
            arr = zarr.create_array(path, shape=(n, n), chunks=(chunk, chunk), dtype="float32", zarr_format=2,
                                    compressors=compressor)
            for i in range(0, n, chunk):
                arr[i:i + chunk] = np.cumsum(rng.standard_normal((min(chunk, n - i), n)), axis=1).astype("float32")
            arrays.append(arr)
        out = os.path.join(folder, "c.zarr")
        layouts = [(p, s) for p in args.worker_process.split(",") for s in args.switch_interval.split(",")]
        for process, switch in layouts:
            os.environ["DGEMM_WORKER_PROCESS"] = process
            with DeviceCluster(args.devices, dashboard_address=":0") as cluster, Client(cluster) as client:
                client.wait_for_workers(len(cluster.device_ids), timeout=120)
                if switch != "default":
                    client.run(sys.setswitchinterval, float(switch))
                switched = sorted(set(client.run(sys.getswitchinterval).values()))
                dgemm.matmul(*arrays, out=out, client=client, overwrite=True, compressors=c_codecs)
                client.run(start_sampling)
                t0 = time.perf_counter()
                dgemm.matmul(*arrays, out=out, client=client, overwrite=True, compressors=c_codecs)
                wall = time.perf_counter() - t0
                procs = [r for r in client.run(stop_sampling).values() if r is not None]
                check = check_sample(arrays[0], arrays[1], zarr.open_array(out, mode="r"), n_rows=3, n_cols=3)
                failed += not check["passed"]
                record = {"worker_process": process, "switch_interval": switched, "size": n, "chunk": chunk, "codec": args.codec,
                          "devices": args.devices, "wall_s": round(wall, 3), "processes": procs, "check": check}
                print(json.dumps({k: v for k, v in record.items() if k != "processes"}), flush=True)
                for pr in procs:
                    print(f"  pid {pr['pid']}: " + ", ".join(f"{k} {v}" for k, v in list(pr["cpu_s"].items())[:8]),
                          flush=True)
                runs.append(record)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(),
            "commit": os.environ.get("DGEMM_COMMIT"),
            "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:])}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "runs": runs}, f, indent=1)
    if failed:
        raise SystemExit(f"{failed} checked product(s) wrong")


if __name__ == "__main__":
    main()

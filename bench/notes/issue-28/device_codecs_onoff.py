"""One dgemm.matmul with the ``device-codecs`` setting off and on, on one local device (issue 28).

    python bench/notes/issue-28/device_codecs_onoff.py [OUT.json] [--size 16384] [--chunk 4096]
        [--dtype float32] [--devices gpu] [--store /dev/shm] [--repeats 2] [--codec lz4|zstd]
        [--out-codec none|zstd] [--slots 2,8 [--slots-mode share]] [--modes off,on] [--priorities on,off,inline] [--gemm-tasks 1,2]
        [--worker-process device,host] [--rounds 2] [--launches 1,2,4] [--switch default,0.0005]

Writes A and B (SIZE x SIZE, a random walk along rows: smooth floats) as Zarr v2 arrays in CHUNK² chunks
under STORE, compressed by ``--codec``: ``lz4``, numcodecs' ``Blosc("lz4", 5, SHUFFLE)`` (Zarr v2's default
compressor), ``zstd``, numcodecs' ``Zstd(level=3)``, or ``none`` (raw chunks: with ``--out-codec zstd``, only
C's encoding differs between off and on).  C is written uncompressed (``--out-codec none``, the
default with lz4 inputs) or with zarr v3's ``ZstdCodec(level=3)`` (``zstd``, the default with zstd inputs:
under on its chunks are encoded on the device, dgemm.worker.encoding).  Starts a local cluster on DEVICES,
runs the product once on and once off to build the kernels, then REPEATS times off and on (C overwritten),
and reports each run's wall time, C's stored bytes and what the workers' counters grew by:
``device_decoded_bytes``, ``host_decoded_bytes``, ``device_encoded_bytes``, ``host_encoded_bytes``,
``bytes_up`` (compressed bytes under on), ``bytes_down`` (the frames under on, with a zstd C),
``read_seconds`` (summed over reader threads) and ``download_seconds``.  ``--slots``: then runs with
device-codecs ``--slots-mode`` (on by default) and each count of device decodes at once, alternating
(``dgemm.opencl.scratch.SLOTS``).  ``--modes``: the
settings timed in turn (``on-wait``: ``on`` with each device decode waited for on the host, the engine's
``DEFERRED_DECODES`` off) (``off`` alone for raw chunks); ``--priorities``: the ``queue-priority`` values, a cluster
each (read when a worker's device opens); ``--worker-process``: a cluster for each value (a process per device, or one
for all, each device's blocks shared in memory), all of them ``--rounds`` times in turn; ``--gemm-tasks``: each mode
with each ``gemm-tasks`` value in turn; ``--launches``: each with each ``gemm-launches`` value in turn (a setting of
x-launches30.patch); ``--switch``: each with each switch interval in turn (the workers' ``sys.setswitchinterval``).
Each run also records the task stream's phases (the first GEMM's start, the last GEMM's and the last store's stops:
the fill and the drain), the busy split and each worker's busy time; each
cluster's last C is checked against numpy's float64 where sampled rows and columns cross (the script fails, after
writing its records, if one is wrong).  Prints one JSON line per run and writes them all to OUT.json if given, as
``{"meta": {date, cores, devices, commit, command}, "runs": [...]}``.  This is what ``auto`` (dgemm.opencl.codecs.AUTO) should follow.
"""
import argparse
import json
import os
import shutil
import sys
import time

COUNTERS = ("device_decoded_bytes", "host_decoded_bytes", "device_encoded_bytes", "host_encoded_bytes", "bytes_up",
            "bytes_down", "read_seconds", "download_seconds", "kernel_seconds", "busy_seconds",
            "busy_kernel_seconds", "busy_transfer_seconds", "busy_read_seconds", "busy_other_seconds",
            "host_cache_bytes_decoded", "host_cache_bytes_served")


def phases(stream, t0) -> dict:
    """Where the run's wall time went by its tasks (distributed's task stream, seconds from the call):
    the first GEMM task's start (the fill), the last GEMM's stop, the last store's stop (the drain), the
    GEMM tasks' summed time, and the gaps on each worker between its GEMM tasks (summed and the longest)."""
    spans, by_worker = {}, {}
    for x in stream:
        comp = [s for s in x["startstops"] if s["action"] == "compute"]
        if comp:
            prefix = "gemm" if "dgemm-gemm-" in str(x["key"]) else "store" if "dgemm-store-" in str(x["key"]) else "other"
            span = (min(s["start"] for s in comp) - t0, max(s["stop"] for s in comp) - t0)
            spans.setdefault(prefix, []).append(span)
            if prefix == "gemm":
                by_worker.setdefault(x.get("worker"), []).append(span)
    gemm, store = spans.get("gemm", []), spans.get("store", [])
    # a worker's time between one GEMM task's stop and its next one's start, where none of its GEMM tasks ran
    gaps = []
    for spans_ in by_worker.values():
        spans_.sort()
        end = spans_[0][1]
        for s, e in spans_[1:]:
            gaps.append(max(0.0, s - end))
            end = max(end, e)
    return {"first_gemm_start": round(min(s for s, _ in gemm), 3) if gemm else None,
            "last_gemm_stop": round(max(e for _, e in gemm), 3) if gemm else None,
            "last_store_stop": round(max(e for _, e in store), 3) if store else None,
            "gemm_task_seconds": round(sum(e - s for s, e in gemm), 3), "gemm_tasks": len(gemm),
            "gemm_gap_seconds": round(sum(gaps), 3), "gemm_gap_longest": round(max(gaps, default=0.0), 3),
            "store_task_seconds": round(sum(e - s for s, e in store), 3)}


def configure(value, dask_worker=None):
    """On a worker: the ``device-codecs`` setting; ``on-wait`` is ``on`` with each device decode waited for on the
    host before the product takes its block (dgemm.opencl.engine.DEFERRED_DECODES off, as before 2026-11-26)."""
    import dask

    from dgemm.opencl import engine

    engine.DEFERRED_DECODES = value != "on-wait"
    dask.config.set({"dgemm.device-codecs": "on" if value == "on-wait" else value})


def set_slots(n, batch=None, dask_worker=None):
    """On a worker: its device's decodes at once (dgemm.opencl.scratch.SLOTS), and where given the blocks a shared
    call takes at most (dgemm.worker.decoding.BATCH).  A scratch is kept for each count, so that a count's runs
    after its first find its buffers' sizes as a worker's runs do."""
    from dgemm.opencl.scratch import Scratch
    from dgemm.worker import decoding

    decoding.__dict__.setdefault("_x_batch", decoding.BATCH)
    decoding.BATCH = decoding._x_batch if batch is None else batch

    device = dask_worker.plugins["dgemm"].state.device
    kept = device.__dict__.setdefault("_x_scratches", {})
    kept[device.scratch._slots] = device.scratch
    device.scratch.release()
    device.scratch = kept.get(n) or Scratch(device, slots=n)


def set_launches(n):
    """On a worker: the ``gemm-launches`` setting, read when a product starts."""
    import dask

    dask.config.set({"dgemm.gemm-launches": n})


def counters(dask_worker):
    snap = dask_worker.plugins["dgemm"].metric(dask_worker)
    return {k: snap.get(k, 0) for k in COUNTERS}


def stored_bytes(path) -> int:
    """The bytes of C's chunk files (its metadata and dgemm's markers left out)."""
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files
                     if f not in ("zarr.json", ".zarray", ".zattrs", ".zgroup") and ".dgemm" not in root)
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="write the JSON records here too")
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--devices", default="gpu", help="the local cluster's devices (DGEMM_DEVICES' syntax)")
    p.add_argument("--store", default="/dev/shm", help="folder for the Zarr arrays (removed afterwards)")
    p.add_argument("--inputs", default=None,
                   help="folder of A and B, kept: made on the first run, reused by later ones with the same "
                        "--size, --chunk, --dtype and --codec (C still goes under --store)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--codec", choices=("lz4", "zstd", "none"), default="lz4", help="A's and B's compressor")
    p.add_argument("--out-codec", choices=("none", "zstd"), default=None,
                   help="C's compressor (default: zstd with zstd inputs, else none)")
    p.add_argument("--modes", default="off,on", help="the settings timed in turn, comma separated (also encode, "
                   "share, on-wait)")
    p.add_argument("--gemm-tasks", default="1", help="gemm-tasks values, comma separated: each mode runs with "
                   "each in turn (read on the client, so one cluster serves them all)")
    p.add_argument("--launches", default="1", help="gemm-launches values, comma separated: each mode runs with "
                   "each in turn (read on the workers when a product starts; a setting of x-launches30.patch, "
                   "measured no faster and not on main, where it changes nothing)")
    p.add_argument("--switch", default="default", help="the workers' switch intervals (sys.setswitchinterval, "
                   "seconds; default: each worker's own), comma separated: each mode runs with each in turn")
    p.add_argument("--priorities", default="on", help="queue-priority values, comma separated: a cluster each")
    p.add_argument("--worker-process", default="device", help="worker-process values, comma separated: a cluster "
                   "each (device: a process per device; host: one for all)")
    p.add_argument("--rounds", type=int, default=1, help="the clusters (priorities x worker-process) this many times "
                   "in turn")
    p.add_argument("--blocks", default="auto", help="block values, comma separated (auto: dgemm's choice; 8192; "
                   "8192x8192x4096 for M, N and K): each mode runs with each in turn")
    p.add_argument("--no-warmup", action="store_true", help="time each cluster's first product too (a script's first "
                   "call on a started cluster: the first run of each cluster is recorded with first: true)")
    p.add_argument("--slots-mode", default="on", help="the device-codecs value the --slots runs take (on, share)")
    p.add_argument("--slots", default=None, help="device decodes at once per device, comma separated: each "
                                                  "count timed with device-codecs on (default: the module's); "
                                                  "SxB: S slots and calls of at most B blocks (decoding.BATCH)")
    args = p.parse_args()
    out_codec = args.out_codec or ("zstd" if args.codec == "zstd" else "none")

    import dask
    import numcodecs
    import numpy as np
    import zarr
    from distributed import Client, get_task_stream

    import dgemm
    from dgemm.accuracy import check_sample
    from dgemm.benchmarks.measure import worker_probe
    from dgemm.cluster import DeviceCluster

    n, chunk = args.size, args.chunk
    compressor = {"zstd": numcodecs.Zstd(level=3), "none": None,
                  "lz4": numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)}[args.codec]
    c_codecs = zarr.codecs.ZstdCodec(level=3) if out_codec == "zstd" else None
    folder = os.path.join(args.store, f"dgemm-device-codecs-{os.getpid()}")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    records, devices, failed = [], [], 0
    try:
        arrays = make_inputs(args.inputs or folder, n, chunk, args.dtype, compressor, rng)
        out = os.path.join(folder, "c.zarr")
        layouts = [(q, w) for _ in range(args.rounds) for q in args.priorities.split(",")
                   for w in args.worker_process.split(",")]
        for priority, process in layouts:
            # read by each worker when its device opens (queue-priority) and by the cluster as it starts
            # (worker-process): a cluster of its own for each value
            os.environ["DGEMM_QUEUE_PRIORITY"] = priority
            os.environ["DGEMM_WORKER_PROCESS"] = process
            with DeviceCluster(args.devices, dashboard_address=":0") as cluster, Client(cluster) as client:
                client.wait_for_workers(len(cluster.device_ids), timeout=120)
                devices = sorted(str(v["device"]) for v in client.run(worker_probe).values())
                for mode in () if args.no_warmup else ("on", "off"):   # kernels and codecs built before any timed run
                    client.run(configure, mode)
                    dgemm.matmul(*arrays, out=out, client=client, overwrite=True, compressors=c_codecs)
                first = args.no_warmup
                tasks = [int(t) for t in args.gemm_tasks.split(",")]
                blocks = [_block(b) for b in args.blocks.split(",")]
                cuts = [int(x) for x in args.launches.split(",")]
                switches = [None if x == "default" else float(x) for x in args.switch.split(",")]
                runs = [(m, None, t, b, c, w) for m in args.modes.split(",") for t in tasks for b in blocks
                        for c in cuts for w in switches] * args.repeats
                if args.slots:
                    runs += [(args.slots_mode, k, tasks[0], blocks[0], cuts[0], switches[0])
                             for _ in range(args.repeats) for k in args.slots.split(",")]
                default_switch = client.run(sys.getswitchinterval)
                for mode, slots, gemm_tasks, block, launches, switch in runs:
                    client.run(configure, mode)
                    if len(cuts) > 1 or cuts[0] != 1:   # (only where asked: main has no such setting)
                        client.run(set_launches, launches)
                    if args.switch != "default":        # each worker's own interval back for "default"
                        for w, interval in default_switch.items():
                            client.run(sys.setswitchinterval, interval if switch is None else switch, workers=[w])
                    if slots is not None:
                        count, _, batch = str(slots).partition("x")
                        client.run(set_slots, int(count), int(batch) if batch else None)
                    before = client.run(counters)
                    t0, tt = time.perf_counter(), time.time()
                    with get_task_stream(client) as ts, dask.config.set({"dgemm.gemm-tasks": gemm_tasks}):
                        dgemm.matmul(*arrays, out=out, client=client, overwrite=True, compressors=c_codecs,
                                     block=block)
                    wall = time.perf_counter() - t0
                    after = client.run(counters)
                    grew = {k: sum(after[w][k] - before[w][k] for w in after) for k in COUNTERS}
                    # each device's share (issue 27: each GPU's busy time within 10 % of the other's)
                    per_worker = {k: sorted(round(after[w][k] - before[w][k], 3) for w in after)
                                  for k in ("busy_seconds", "busy_kernel_seconds", "kernel_seconds", "bytes_up")}
                    record = {"mode": mode, "queue_priority": priority, "worker_process": process, "slots": slots,
                              "gemm_tasks_setting": gemm_tasks, "gemm_launches": launches, "switch_interval": switch,
                              "block": block, "first": first, "size": n, "chunk": chunk, "dtype": args.dtype,
                              "devices": args.devices,
                              "codec": args.codec, "out_codec": out_codec, "wall_s": round(wall, 3),
                              "c_stored_bytes": stored_bytes(out), **grew, **phases(ts.data, tt),
                              "per_worker": per_worker}
                    print(json.dumps(record), flush=True)
                    records.append(record)
                    first = False
                # each cluster's last C against numpy's float64 where sampled rows and columns cross (the
                # first and last of each and one between: three chunk rows of A and three chunk columns of B read)
                check = check_sample(arrays[0], arrays[1], zarr.open_array(out, mode="r"), n_rows=3, n_cols=3)
                records[-1]["check"] = check
                print(json.dumps({"queue_priority": priority, "worker_process": process, "check": check}), flush=True)
                failed += not check["passed"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.out:
        meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(), "devices": devices,
                "commit": os.environ.get("DGEMM_COMMIT") or _commit(),
                "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:])}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "runs": records}, f, indent=1)
    if failed:
        raise SystemExit(f"{failed} checked product(s) wrong: see the records' check")


def _block(text: str):
    """``--blocks``' one value as ``dgemm.matmul``'s ``block``: None (auto), an int, or (M, N, K)."""
    if text == "auto":
        return None
    sizes = tuple(int(x) for x in text.split("x"))
    return sizes[0] if len(sizes) == 1 else sizes


def make_inputs(where, n, chunk, dtype, compressor, rng) -> list:
    """A and B (``n x n``, a random walk along rows) as Zarr v2 arrays in ``where``: those already there where they are
    the ones this would write (:func:`reused`), else written anew."""
    import numpy as np
    import zarr

    arrays = [reused(where, name, n, chunk, dtype, compressor) for name in ("a", "b")]
    for k, name in enumerate(("a", "b")):
        if arrays[k] is not None:
            continue
        os.makedirs(where, exist_ok=True)
        arr = zarr.create_array(os.path.join(where, f"{name}.zarr"), shape=(n, n), chunks=(chunk, chunk),
                                dtype=dtype, zarr_format=2, compressors=compressor, overwrite=True)
        for i in range(0, n, chunk):
            rows = min(chunk, n - i)
            arr[i:i + rows] = np.cumsum(rng.standard_normal((rows, n)), axis=1).astype(dtype)
        arrays[k] = arr
    return arrays


def reused(folder, name, n, chunk, dtype, compressor):
    """``folder``'s array ``name`` where it is the one this run would write (shape, chunks, dtype, compressor), else None."""
    import zarr

    if folder is None or not os.path.isdir(os.path.join(folder, f"{name}.zarr")):
        return None
    try:
        arr = zarr.open_array(os.path.join(folder, f"{name}.zarr"), mode="r")
    except Exception:
        return None
    same = (arr.shape == (n, n) and arr.chunks == (chunk, chunk) and arr.dtype == dtype
            and arr.metadata.zarr_format == 2 and arr.metadata.compressor == compressor)
    return arr if same else None


def _commit():
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


if __name__ == "__main__":
    main()

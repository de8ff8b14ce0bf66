"""Blosc-LZ4 decode on the device (dgemm/kernels/lz4.cl) against numcodecs on every host thread (issue 28).

    python bench/notes/issue-28/blosc_decode.py [OUT.json] [--mib 64] [--chunks 4] [--clevel 5]
        [--shuffle shuffle] [--data walk] [--lanes 8,32,64] [--repeats 5] [--device gpu]
        [--variants lockstep:32 table:64:stage=512 ...|sweep] [--cases normal-shuffle-5,walk-shuffle-5,...]
        [--no-host]

Encodes CHUNKS float32 chunks of MIB MiB each with numcodecs ``Blosc("lz4", CLEVEL, SHUFFLE)`` (Zarr v2's
default compressor), then decodes them, REPEATS times each way, and checks the device's bytes against
numcodecs' decoding of the same frames:

* device, kernels only: the LZ4 and unshuffle kernels' profiled time (frames already on the device), and the
  LZ4 kernel's alone, for each variant (or lane count) asked for;
* device, with upload: the whole ``decode_blosc`` call (host planning, upload of the frames from ordinary
  memory, kernels, error flags read back);
* host: numcodecs decoding the chunks on a pool of every core, one chunk per thread (blosc's own threads off),
  and one chunk at a time with blosc's threads on every core; and the host's planning alone (frame checks and
  stream table, which the device path adds on the host).

``--data``: ``walk`` (a random walk: smooth floats, the kind that compresses), ``normal`` (standard normal
values: little to compress but the exponents), ``zeros``.

``--variants``: lz4.cl's variants to time, each ``MODE:LANES[:key=value,...]``: MODE ``lockstep``
(LZ4_MODE 0) or ``table`` (LZ4_MODE 1), LANES its LZ4_WG, keys ``batch``, ``long``, ``stage``,
``copy_from``, ``unshuffle``, ``parse``, ``group`` (LZ4_BATCH, LZ4_LONG, LZ4_STAGE, LZ4_COPY_FROM,
LZ4_UNSHUFFLE, LZ4_PARSE, LZ4_GROUP_LANE; the kernel's defaults otherwise); ``sweep`` names the set in :data:`SWEEP`.  Each variant's output is compared bit for bit with numcodecs' before it
is timed; one that differs, or fails to build or run, is reported under ``failed_variants`` and the sweep
goes on.  Without ``--variants``, ``--lanes`` times the device's default parameters at those lane counts.
``--cases``: several data sets in one run, each ``DATA-SHUFFLE-CLEVEL`` (e.g. ``normal-shuffle-5``);
the JSON then holds one result per case under ``runs``.  ``--no-host``: skip the host's timings.

Rates are decoded bytes per second (GB/s, 1e9).  Prints one JSON object, and writes it to OUT.json if given.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# What ``--variants sweep`` times: today's kernel, and the token table by lanes, window, batch, long copies.
SWEEP = ("lockstep:32", "lockstep:64", "lockstep:128",
         "table:32", "table:64", "table:128",
         "table:64:stage=512", "table:64:stage=2048", "table:128:stage=2048",
         "table:64:batch=32,stage=512", "table:64:batch=128,stage=1024", "table:64:batch=256,stage=2048",
         "table:64:long=16,stage=512", "table:64:long=64,stage=512",
         "table:64:copy_from=0,stage=512", "table:64:stage=512,unshuffle=1", "lockstep:32:unshuffle=1")
KEYS = {"batch": "LZ4_BATCH", "long": "LZ4_LONG", "stage": "LZ4_STAGE", "copy_from": "LZ4_COPY_FROM",
        "unshuffle": "LZ4_UNSHUFFLE", "parse": "LZ4_PARSE",
        "group": "LZ4_GROUP_LANE"}


def parse_variant(spec):
    """``table:64:batch=128,stage=512`` -> (lanes, lz4.cl's parameters).

    >>> parse_variant("table:64:batch=128,stage=512")
    (64, {'LZ4_MODE': 1, 'LZ4_BATCH': 128, 'LZ4_STAGE': 512})
    """
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("lockstep", "table") or not parts[1].isdigit():
        raise SystemExit(f"--variants: {spec!r} is not MODE:LANES[:key=value,...] (MODE lockstep or table)")
    params = {"LZ4_MODE": 0 if parts[0] == "lockstep" else 1}
    for item in parts[2].split(",") if len(parts) == 3 else ():
        key, _, value = item.partition("=")
        if key not in KEYS or not value.isdigit():
            raise SystemExit(f"--variants: {spec!r}: {item!r} is not KEY=NUMBER with KEY one of {sorted(KEYS)}")
        params[KEYS[key]] = int(value)
    return int(parts[1]), params


def make_chunk(kind, n, rng):
    import numpy as np
    if kind == "walk":
        return np.cumsum(rng.standard_normal(n, dtype=np.float32), dtype=np.float32)
    if kind == "normal":
        return rng.standard_normal(n, dtype=np.float32)
    if kind == "zeros":
        return np.zeros(n, np.float32)
    raise SystemExit(f"--data: unknown {kind!r}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="write the JSON here too")
    p.add_argument("--mib", type=float, default=64, help="chunk size in MiB (default 64)")
    p.add_argument("--chunks", type=int, default=4, help="chunks decoded per call (default 4)")
    p.add_argument("--clevel", type=int, default=5)
    p.add_argument("--shuffle", choices=("shuffle", "noshuffle"), default="shuffle")
    p.add_argument("--data", choices=("walk", "normal", "zeros"), default="walk")
    p.add_argument("--lanes", default=None, help="work-items per LZ4 stream (LZ4_WG), or several: 1,8,32,64 "
                                                 "(default: 32 on a GPU, 1 on a CPU device)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default=None, help="an OpenCL device as DGEMM_DEVICES names one (default: "
                                                  "the first GPU, else the first CPU device)")
    p.add_argument("--variants", nargs="+", default=None,
                   help="lz4.cl variants to time: MODE:LANES[:key=value,...] ..., or sweep (see the notes)")
    p.add_argument("--cases", default=None, help="several data sets: DATA-SHUFFLE-CLEVEL,... "
                                                 "(e.g. normal-shuffle-5,walk-shuffle-5,normal-shuffle-1)")
    p.add_argument("--no-host", action="store_true", help="skip the host's timings")
    args = p.parse_args()
    if args.variants and args.lanes:
        raise SystemExit("--lanes and --variants: give one")
    specs = list(SWEEP) if args.variants == ["sweep"] else args.variants
    for spec in specs or ():
        parse_variant(spec)
    cases = []
    for case in args.cases.split(",") if args.cases else ():
        fields = case.split("-")
        if (len(fields) != 3 or fields[0] not in ("walk", "normal", "zeros")
                or fields[1] not in ("shuffle", "noshuffle") or not fields[2].isdigit()):
            raise SystemExit(f"--cases: {case!r} is not DATA-SHUFFLE-CLEVEL (e.g. normal-shuffle-5)")
        cases.append((case, fields[0], fields[1], int(fields[2])))

    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices
    device = Device(select_devices(args.device)[0])
    if cases:
        result = {"runs": {case: run(args, device, specs, data, shuffle, clevel)
                           for case, data, shuffle, clevel in cases}}
    else:
        result = run(args, device, specs, args.data, args.shuffle, args.clevel)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def run(args, device, specs, data, shuffle, clevel):
    """One data set: its frames, each variant's device rates and the host's, as a JSON object."""
    import numpy as np
    import pyopencl as cl
    from numcodecs import Blosc
    from numcodecs import blosc as ncblosc

    from dgemm.opencl.codecs import blosc

    cores = os.cpu_count()
    info = device.info
    n = int(args.mib * 2**20) // 4
    rng = np.random.default_rng(1)
    chunks = [make_chunk(data, n, rng) for _ in range(args.chunks)]
    codec = Blosc("lz4", clevel, Blosc.SHUFFLE if shuffle == "shuffle" else Blosc.NOSHUFFLE)
    frames = [codec.encode(c) for c in chunks]
    total = sum(c.nbytes for c in chunks)
    want = np.frombuffer(b"".join(bytes(codec.decode(f)) for f in frames), np.uint8)   # the reference
    if want.tobytes() != b"".join(c.tobytes() for c in chunks):
        raise SystemExit("numcodecs does not give the chunks back")
    if specs:
        variants = {spec: parse_variant(spec) for spec in specs}
    else:
        lane_counts = [int(x) for x in args.lanes.split(",")] if args.lanes else [blosc.default_lanes(device)]
        variants = {str(lanes): (lanes, blosc.default_params(device)) for lanes in lane_counts}
    plan = blosc.plan(frames[0])
    streams = len(plan.direct) + len(plan.shuffled)
    plan_s = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for f in frames:
            blosc.plan(f)
        plan_s.append(time.perf_counter() - t0)

    out = device.buffer(total, "decoded chunks")
    device_runs, failures = {}, {}
    for name, (lanes, params) in variants.items():
        kernel_s, call_s, lz4_s = [], [], []
        try:
            # poisoned first: the last variant's output must not pass for this one's
            cl.enqueue_fill_buffer(device.queue, out, np.uint8(0xFF), 0, total).wait()
            for r in range(args.repeats + 1):
                events = []
                t0 = time.perf_counter()
                blosc.decode_blosc(device, frames, out, lanes=lanes, events=events, params=params)
                t = time.perf_counter() - t0
                if r == 0:      # the first call builds the program; its bytes are checked, not timed
                    got = np.empty(total, np.uint8)
                    cl.enqueue_copy(device.queue, got, out).wait()
                    wrong = np.nonzero(got != want)[0]
                    if wrong.size:
                        raise AssertionError(f"{wrong.size} bytes differ from numcodecs' (the first at {wrong[0]})")
                    continue
                call_s.append(t)
                times = [(what, (e.profile.end - e.profile.start) * 1e-9) for what, e in events]
                kernel_s.append(sum(t for what, t in times if what != "upload"))
                lz4_s.append(sum(t for what, t in times if what == "lz4"))
        except Exception as e:  # noqa: BLE001  (a variant that fails to build, run or match is reported)
            failures[name] = f"{type(e).__name__}: {e}"
            print(f"{data}-{shuffle}-{clevel}: variant {name}: {failures[name]}", file=sys.stderr)
            continue
        device_runs[name] = (lanes, params, kernel_s, lz4_s, call_s)
    out.release()

    pool_s, one_s, jobs = [], [], 0
    if not args.no_host:
        ncblosc.use_threads = False
        local = threading.local()
        jobs = 2 * max(cores, len(frames))     # chunks decoded per repeat, every core busy

        def one(i):
            if not hasattr(local, "dest"):
                local.dest = np.empty_like(chunks[0])
            codec.decode(frames[i % len(frames)], out=local.dest)
        with ThreadPoolExecutor(cores) as pool:
            list(pool.map(one, range(cores)))
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                list(pool.map(one, range(jobs)))
                pool_s.append(time.perf_counter() - t0)
        ncblosc.use_threads = True
        ncblosc.set_nthreads(cores)
        dest = np.empty_like(chunks[0])
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for f in frames:
                codec.decode(f, out=dest)
            one_s.append(time.perf_counter() - t0)

    def gbps(nbytes, seconds):
        return round(nbytes / statistics.median(seconds) / 1e9, 3)
    result = {
        "device": info.name, "device_type": info.type, "host_cores": cores,
        "chunk_mib": args.mib, "chunks": args.chunks, "clevel": clevel, "shuffle": shuffle,
        "data": data, "ratio": round(total / sum(len(f) for f in frames), 3),
        "blocksize": int(np.frombuffer(frames[0][8:12], "<i4")[0]),
        "streams_per_chunk": streams, "repeats": args.repeats,
        "gbps": {"host_plan": gbps(total, plan_s)},
    }
    if not args.no_host:
        result["gbps"].update({"host_pool_all_cores": gbps(jobs * chunks[0].nbytes, pool_s),
                               "host_blosc_threads_all_cores": gbps(total, one_s)})
    rates = {name: {"lanes": lanes, "params": params, "kernels": gbps(total, k), "lz4_kernel": gbps(total, z),
                    "call_with_upload": gbps(total, c)}
             for name, (lanes, params, k, z, c) in device_runs.items()}
    if specs:
        result["device_gbps_by_variant"] = rates
        result["best_variant_by_lz4_kernel"] = max(rates, key=lambda v: rates[v]["lz4_kernel"], default=None)
    else:
        result["device_gbps_by_lanes"] = {name: {k: v for k, v in r.items() if k not in ("lanes", "params")}
                                          for name, r in rates.items()}
    if failures:
        result["failed_variants"] = failures
    return result


if __name__ == "__main__":
    main()

"""A product's GEMM tasks run by the device's engine alone, without Dask, and where the device idles (issue 27).

    python bench/notes/issue-27/engine_alone.py OUT.json [--size 32768] [--chunks 4096] [--codec none|zstd]
        [--rounds 3] [--threads 1,2] [--device-codecs off,on] [--store /dev/shm]

On one GPU with raw chunks, a 32768² float32 product took 1.35-1.67 s in a local cluster for 0.70 s of GEMM
kernels; the busy split put about 4 ms a product in transfers and launching and 3.6 ms outside any product.
This runs the same product's tasks, from the real graph for one worker (``dgemm.client.graph.build``: its
order, read-ahead lists and block references), through ``dgemm.worker.tasks.gemm_block`` in this process, one
after another (``--threads 1``) or two at once (``2``, as ``gemm-tasks: 2``), C discarded (no store).  Then the
device's own timeline from the GEMM kernels' profiling: the idle time between two GEMM kernels of one product
(waiting for its next inputs) and between the last kernel of one product and the first of the next (its
download, the next one's set-up), and before the first kernel.  So the wall time splits into what the engine
costs and what Dask and the store tasks add.  ``--device-codecs``: each thread count under each value of the
setting (issue 28: with ``on`` the inputs' chunks are decoded on the device); the device's other commands of the
run (uploads, padding, the decoders' kernels: every event the engine meters as a transfer) are recorded too, and
the GEMMs' gaps split into the time some such command ran (``gaps_covered_s``) and the time the device ran
nothing of the run's (``gaps_idle_s``: the device waited on the host); ``decoder_s``: the device decoders' commands'
summed seconds by kind (uploads, trees, huffman, sequences ...), beside the GEMMs, and ``decoder_n`` their numbers.  The modes alternate for ``--rounds``
rounds after one untimed warm-up each.  Records ``{"meta", "runs"}`` in OUT.json.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

GEMMS: list = []   # (product number, kernel event) of the run being timed
OTHERS: list = []   # the run's other device commands the engine meters (uploads, padding, decoders' kernels)
LABELLED: list = []   # (what, event) of the device decoders' commands (upload, trees, huffman, sequences, ...)


def tasks_of(a, b, size, chunks):
    """The GEMM tasks of the graph for one worker, in its order: the arguments of ``gemm_block``."""
    import numpy as np

    from dgemm.client import graph
    from dgemm.client.plan import make_plan
    from dgemm.storage import Operand

    worker = "tcp://127.0.0.1:40001"
    plan = make_plan(size, size, size, np.float32, (128, 128, 32), a_chunks=(chunks, chunks),
                     b_chunks=(chunks, chunks), target=chunks, n_workers=1)
    g = graph.build(plan, Operand(a, "a"), Operand(b, "b"), None, alpha=1.0, beta=0.0, token="engine-alone",
                    workers=[worker])
    layer = g.layers[g.result_name]
    ann = layer.annotations
    return [layer[k][1:] for k in sorted(layer, key=lambda k: -ann["priority"](k))]


def run(tasks, threads, scope):
    """Wall seconds of every task through gemm_block on ``threads`` threads, and the device's idle parts."""
    from dgemm.worker.tasks import gemm_block

    GEMMS.clear()
    OTHERS.clear()
    LABELLED.clear()
    t0 = time.perf_counter()
    args = [(*t[:11], scope, *t[12:]) for t in tasks]   # the run's scope: its own panel cache entries
    if threads == 1:
        for i, t in enumerate(args):
            _product(gemm_block, i, t)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda it: _product(gemm_block, *it), enumerate(args)))
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 4), **idle(GEMMS), **covered(GEMMS, OTHERS), "decoder_s": by_kind(LABELLED),
            "decoder_n": counts(LABELLED)}


def counts(labelled):
    """The device decoders' commands by kind (a zstd decode call has one ``huffman`` kernel: the calls made)."""
    out: dict = {}
    for what, _ in labelled:
        out[what] = out.get(what, 0) + 1
    return dict(sorted(out.items()))


def by_kind(labelled):
    """The device decoders' commands' summed seconds by kind (what each kernel took beside the GEMMs: against
    the decode bench's, alone, it tells how much the GEMM kernels running beside them slowed them)."""
    out: dict = {}
    for what, ev in labelled:
        try:
            out[what] = out.get(what, 0.0) + (ev.profile.end - ev.profile.start) * 1e-9
        except Exception:   # (an event without profiling: a marker)
            continue
    return {k: round(v, 4) for k, v in sorted(out.items())}


_CURRENT = {}


def _product(gemm_block, i, t):
    import threading

    _CURRENT[threading.get_ident()] = i
    gemm_block(*t)


def idle(gemms):
    """The GEMM kernels' busy time and the gaps between them: within a product, between products, before the first."""
    spans = sorted((ev.profile.start * 1e-9, ev.profile.end * 1e-9, p) for p, ev in gemms)
    out = {"kernel_s": 0.0, "within_s": 0.0, "between_s": 0.0, "products": len({p for _, _, p in spans})}
    end, last = None, None
    for s, e, p in spans:
        out["kernel_s"] += e - s
        if end is not None and s > end:
            out["within_s" if p == last else "between_s"] += s - end
        end, last = max(end or e, e), p
    out["device_span_s"] = (spans[-1][1] - spans[0][0]) if spans else 0.0
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def covered(gemms, others):
    """The gaps between the run's GEMM kernels (from its first to its last) split into the time another command
    of the run ran and the time none did; and those commands' own summed and merged seconds."""
    def merged(spans):
        out = []
        for s, e in sorted(spans):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out

    def span(ev):
        try:
            return ev.profile.start * 1e-9, ev.profile.end * 1e-9
        except Exception:   # (an event without profiling: a marker)
            return None

    kern = merged([x for x in (span(ev) for _, ev in gemms) if x])
    other = merged([x for x in (span(ev) for ev in others) if x])
    if not kern:
        return {}
    lo, hi = kern[0][0], kern[-1][1]
    gaps = [(a[1], b[0]) for a, b in zip(kern, kern[1:]) if b[0] > a[1]]
    cover = 0.0
    for gs, ge in gaps:
        for s, e in other:
            cover += max(0.0, min(e, ge) - max(s, gs))
    total_gap = sum(e - s for s, e in gaps)
    return {"gaps_s": round(total_gap, 4), "gaps_covered_s": round(cover, 4), "gaps_idle_s": round(total_gap - cover, 4),
            "others_merged_s": round(sum(min(e, hi) - max(s, lo) for s, e in other if e > lo and s < hi), 4),
            "others": len(others)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", type=int, default=32768)
    p.add_argument("--chunks", type=int, default=4096)
    p.add_argument("--codec", choices=("none", "zstd"), default="none")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--device-codecs", default="off", help="device-codecs values to run each thread count under "
                                                           "(on-wait: on, each decode waited for on the host)")
    p.add_argument("--store", default="/dev/shm")
    args = p.parse_args()
    import numcodecs
    import numpy as np
    import zarr

    from dgemm.worker import device_state

    metered = type(device_state().engine("float32"))
    launched = metered._launched

    def note(self, event, flops):   # every GEMM kernel, with the product it belongs to
        import threading

        GEMMS.append((_CURRENT.get(threading.get_ident()), event))
        launched(self, event, flops)

    metered._launched = note
    transferred = metered._transferred

    def note_other(self, event):
        OTHERS.append(event)
        transferred(self, event)

    metered._transferred = note_other
    from dgemm.worker import decoding
    fill_device = decoding.DeviceDecoded.fill_device

    def labelled(self, device, out, queue=None, events=None, **kw):   # the decoders' commands, named
        mark = len(events) if events is not None else 0
        try:
            return fill_device(self, device, out, queue, events, **kw)
        finally:
            LABELLED.extend((events or [])[mark:])

    decoding.DeviceDecoded.fill_device = labelled
    folder = tempfile.mkdtemp(prefix="dgemm-engine-alone-", dir=args.store)
    try:
        rng = np.random.default_rng(0)
        compressor = numcodecs.Zstd(level=3) if args.codec == "zstd" else None
        arrays = []
        for name in ("a", "b"):
            arr = zarr.create_array(os.path.join(folder, f"{name}.zarr"), shape=(args.size,) * 2,
                                    chunks=(args.chunks,) * 2, dtype="float32", zarr_format=2, compressors=compressor)
            for i in range(0, args.size, args.chunks):
                arr[i:i + args.chunks] = rng.standard_normal((min(args.chunks, args.size - i), args.size), "float32")
            arrays.append(arr)
        tasks = tasks_of(*arrays, args.size, args.chunks)
        import dask

        from dgemm.opencl import engine

        def setting(c):     # on-wait: on, each device decode waited for on the host (DEFERRED_DECODES off)
            engine.DEFERRED_DECODES = c != "on-wait"
            return dask.config.set({"dgemm.device-codecs": "on" if c == "on-wait" else c})

        modes = [(int(t), c) for c in args.device_codecs.split(",") for t in args.threads.split(",")]
        for t, c in modes:
            with setting(c):
                run(tasks, t, f"warm-{t}-{c}")
        runs = []
        for r in range(args.rounds):
            for t, c in modes:
                with setting(c):
                    rec = {"threads": t, "device_codecs": c, "round": r, **run(tasks, t, f"run-{r}-{t}-{c}")}
                print(json.dumps(rec), flush=True)
                runs.append(rec)
        dev = device_state().device.info
        meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(), "device": dev.name,
                "commit": os.environ.get("DGEMM_COMMIT"), "size": args.size, "chunks": args.chunks,
                "codec": args.codec, "tasks": len(tasks),
                "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:])}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "runs": runs}, f, indent=1)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Where a warm Zarr -> Zarr product's wall time goes, task by task (run on the GPU machine).

    python bench/timeline.py OUTDIR [--size N] [--chunks N] [--codec zstd|raw|blosc-lz4] [--store DIR]

Its arrays go in DIR/dgemm-timeline (DIR: --store, by default the system's temporary folder; kept for the
next call with the same options).

Writes inputs, runs dgemm.matmul twice on one DeviceCluster (the second timed
inside distributed's task stream) and prints the phases: submit -> first GEMM,
GEMM busy and the gaps between products, the last GEMM -> last store, and the
client's own finish; the task stream goes to OUTDIR/timeline-*.json.
"""
import argparse
import json
import os
import shutil
import tempfile
import time

def _row(key: str) -> str:
    """The C block row of a GEMM task's key, ``('dgemm-gemm-<token>', i, j)``."""
    return key.split(",")[1].strip()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--size", type=int, default=32768)
    p.add_argument("--chunks", type=int, default=4096)
    p.add_argument("--codec", default="zstd")
    p.add_argument("--out-codec", default="auto")
    p.add_argument("--store", default=tempfile.gettempdir(),
                   help="folder that gets the dgemm-timeline folder (default: the system's temporary folder)")
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()
    import numpy as np
    from distributed import Client, get_task_stream

    import dgemm
    from dgemm.benchmarks.inputs import input_compressors, random_zarr
    from dgemm.cluster.local import DeviceCluster

    comp = input_compressors("default" if args.codec == "zstd" else args.codec)
    outc = None if args.out_codec == "raw" else input_compressors(
        "default" if args.out_codec == "auto" else args.out_codec)
    n, c = args.size, args.chunks
    # everything in a folder of its own inside --store: what else --store holds is never touched
    folder = os.path.join(args.store, "dgemm-timeline")
    tag = os.path.join(folder, f"inputs-{n}-{c}-{args.codec}")
    if not os.path.exists(tag):    # the same inputs are reused by the next call with the same options
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        t0 = time.perf_counter()
        random_zarr(f"{folder}/a.zarr", (n, n), (c, c), "float32", seed=1, compressors=comp)
        random_zarr(f"{folder}/b.zarr", (n, n), (c, c), "float32", seed=2, compressors=comp)
        print(f"inputs {args.codec}: {time.perf_counter() - t0:.1f} s", flush=True)
        open(tag, "w").close()
    with DeviceCluster() as cluster, Client(cluster) as client:
        client.wait_for_workers(1)
        for rep in range(args.reps):
            out = f"{folder}/c{rep}.zarr"
            with get_task_stream(client) as ts:
                t = time.time()
                dgemm.matmul(f"{folder}/a.zarr", f"{folder}/b.zarr", out, client=client,
                             overwrite=True, compressors=outc)
                wall = time.time() - t
            tasks = [{"key": str(x["key"]), "prefix": str(x["key"]).split("-")[1] if "-" in str(x["key"]) else "",
                      "worker": x["worker"], "thread": x.get("thread"),
                      "start": min(s["start"] for s in x["startstops"] if s["action"] == "compute") - t,
                      "stop": max(s["stop"] for s in x["startstops"] if s["action"] == "compute") - t}
                     for x in ts.data if any(s["action"] == "compute" for s in x["startstops"])]
            gemm = sorted((x for x in tasks if "dgemm-gemm-" in x["key"]), key=lambda x: x["start"])
            store = sorted((x for x in tasks if "dgemm-store-" in x["key"]), key=lambda x: x["start"])
            gaps = sum(max(0.0, b2["start"] - b1["stop"]) for b1, b2 in zip(gemm, gemm[1:]))
            busy = sum(x["stop"] - x["start"] for x in gemm)
            summary = {
                "rep": rep, "wall": wall, "codec": args.codec, "out_codec": args.out_codec,
                "first_gemm_start": gemm[0]["start"], "last_gemm_stop": gemm[-1]["stop"],
                "gemm_busy": busy, "gemm_gaps": gaps, "store_tasks": len(store),
                "store_busy": sum(x["stop"] - x["start"] for x in store),
                "last_store_stop": max(x["stop"] for x in store) if store else None,
                "after_last_task": wall - max(x["stop"] for x in tasks),
                "gemm_first8": [(round(x["start"], 3), round(x["stop"], 3)) for x in gemm[:8]],
                # the first product of each row of C blocks (a new A panel)
                "gemm_each_row": [round(x["start"], 3) for x in gemm
                                  if x is gemm[0] or _row(x["key"]) != _row(gemm[gemm.index(x) - 1]["key"])],
            }
            print(json.dumps(summary), flush=True)
            label = os.environ.get("TL_LABEL", "")
            with open(os.path.join(args.out, f"timeline-{args.codec}-{args.out_codec}{label}-{rep}.json"), "w") as f:
                json.dump({"summary": summary, "tasks": tasks}, f)

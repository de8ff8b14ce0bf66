"""Kernel parameter sets from a variants file, each built, checked and timed through KernelBench (operands
prepared as the engine prepares them; a wrong product's time does not count), beside cuBLAS timed in the
same run on the same sizes.

A variants file (``bench/variants/*.json``)::

    {"dtype": "float32", "peer": "sgemm" | "dgemm" | "tf32", "why": "...",
     "variants": [{"label": "...", "params": {KernelParams fields}, "options": ["-DMACRO=1"]}, ...]}

``options`` are compiler options after the parameters' own (a kernel macro not yet in KernelParams).
Each size runs in a child process that goes on from where the last one stopped: a faulting kernel spoils
its OpenCL context, and the child exits when a small copy fails after an error, so one bad variant costs
only itself.  cuBLAS runs in this (parent) process, which never creates an OpenCL context.

On the GPU machine:  python3 bench/variants.py bench/variants/3xtf32.json [...] --out "$OUT" --sizes 8192,16384
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

CONTEXT_LOST = 3     # the child's exit status when its context no longer works


def child(path: str, size: int, start: int, rows_out: str):
    """Run the variants of ``path`` from index ``start`` at ``size``, appending a JSON line per variant."""
    import numpy as np
    import pyopencl as cl

    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import list_devices
    from dgemm.opencl.params import KernelParams
    from dgemm.tuning.timing import KernelBench

    spec = json.load(open(path))
    found = list_devices()
    dev = Device(([d for d in found if d.type == "GPU"] or found)[0])   # (a CPU where there is no GPU: a dry run)
    kb = KernelBench(dev, spec["dtype"], size, size, size, seed=size)
    itemsize = np.dtype(spec["dtype"]).itemsize
    verbose = "-cl-nv-verbose" if "NVIDIA" in dev.cl_device.platform.name else ""   # ptxas's registers, spills
    for i, v in enumerate(spec["variants"][start:], start):
        p = KernelParams(**v["params"])
        extra = tuple(v.get("options", ())) + ((verbose,) if verbose else ())
        row = {"index": i, "label": v.get("label", ""), "size": size, "params": p.as_dict(), "options": list(extra)}
        problems = p.problems(itemsize)
        if problems:
            row.update(ok=False, error="refused: " + "; ".join(problems))
        else:
            try:
                t = kb.run(p, reps=5, extra_options=extra)
                built = dev.kernels(spec["dtype"], p, extra)
                log = built.gemm_program.get_build_info(dev.cl_device, cl.program_build_info.LOG)
                row.update(ok=t.ok, rel_err=t.rel_err, tflops=t.tflops if t.ok else None,
                           seconds=t.seconds, built_as_asked=built.params == p,
                           failed=dev.failed.get(p),
                           registers=[ln.strip() for ln in log.splitlines() if "registers" in ln or "spill" in ln])
            except Exception as e:
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
        with open(rows_out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(size, i, row["label"], row.get("ok"), row.get("tflops"), row.get("rel_err"),
              row.get("error", ""), row.get("failed") or "", row.get("registers", ""), flush=True)
        if "error" in row and not row["error"].startswith("refused"):
            try:   # is the context still good?
                buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 64)
                cl.enqueue_copy(dev.queue, buf, np.zeros(16, np.float32)).wait()
            except Exception:
                sys.exit(CONTEXT_LOST)


def run_file(path: str, sizes: list[int], out: str, commit: str | None) -> dict:
    from dgemm.benchmarks.peers import cublas

    spec = json.load(open(path))
    name = os.path.splitext(os.path.basename(path))[0]
    rows_out = os.path.join(out, f"variants-{name}.rows")
    rows = []
    peers = {}
    for n in sizes:
        peer = cublas(spec["dtype"], n, n, n, reps=5, tf32=spec.get("peer") == "tf32")
        peers[n] = peer
        try:
            import torch
            torch.cuda.empty_cache()
        except ImportError:
            pass
        start = 0
        while start < len(spec["variants"]):
            if os.path.exists(rows_out):
                os.remove(rows_out)
            rc = subprocess.call([sys.executable, __file__, "--child", path, str(n), str(start), rows_out])
            done = [json.loads(ln) for ln in open(rows_out)] if os.path.exists(rows_out) else []
            rows += done
            start += len(done)
            if rc not in (0, CONTEXT_LOST) and start < len(spec["variants"]):   # died without a row: skip it
                rows.append({"index": start, "label": spec["variants"][start].get("label", ""), "size": n,
                             "params": spec["variants"][start]["params"], "ok": False,
                             "error": f"the child process exited with {rc}"})
                start += 1
    for r in rows:
        peer = peers.get(r["size"])
        r["peer_tflops"] = peer and peer["tflops"]
        r["ratio"] = r["tflops"] / peer["tflops"] if r.get("tflops") and peer else None
    return {"benchmark": "kernel-variants", "file": path, "dtype": spec["dtype"], "peer": spec.get("peer"),
            "why": spec.get("why"), "peers": {str(k): v for k, v in peers.items()}, "rows": rows,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "commit": commit,
            "command": f"python3 bench/variants.py {path} --sizes {','.join(map(str, sizes))}"}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="8192,16384")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    import pyopencl as cl   # the device's name and driver, without a context

    found = [d for p in cl.get_platforms() for d in p.get_devices()]
    gpu = ([d for d in found if d.type & cl.device_type.GPU] or found)[0]
    for path in args.files:
        rec = run_file(path, sizes, args.out, os.environ.get("DGEMM_COMMIT"))
        rec.update(device=gpu.name, driver=gpu.driver_version)
        name = os.path.splitext(os.path.basename(path))[0]
        with open(os.path.join(args.out, f"variants-{name}.json"), "w") as f:
            json.dump(rec, f, indent=1)
        best = {}
        for r in rec["rows"]:
            if r.get("ratio") and r["ratio"] > best.get(r["size"], (0, ""))[0]:
                best[r["size"]] = (r["ratio"], r["label"], r["tflops"])
        print("BEST", name, json.dumps(best), flush=True)


if __name__ == "__main__":
    main()

"""Diagnostics for the kernel on the GPU machine (no tuning): clocks under load, an FMA-only
cuBLAS DGEMM peer, and the PTX/SASS of the database's kernels.

Usage there: python3 bench/gpu_probe.py OUTDIR
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dgemm.opencl.device import Device  # noqa: E402
from dgemm.opencl.discovery import select_devices  # noqa: E402
from dgemm.tuning.timing import KernelBench  # noqa: E402


def cublas_dgemm_modes(n=8192, reps=5):
    """cuBLAS DGEMM with the default math mode (DMMA tensor cores) and with pedantic math (FMA only)."""
    import cupy as cp
    from cupy_backends.cuda.libs import cublas
    a = cp.random.standard_normal((n, n))
    b = cp.random.standard_normal((n, n))
    handle = cp.cuda.device.get_cublas_handle()
    out = {}
    for name, mode in (("default", 0), ("pedantic_fma_only", 2)):
        cublas.setMathMode(handle, mode)
        a @ b
        cp.cuda.Device().synchronize()
        ts = []
        for _ in range(reps):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record(); a @ b; e.record(); e.synchronize()
            ts.append(cp.cuda.get_elapsed_time(s, e) / 1e3)
        out[name] = 2 * n**3 / float(np.median(ts)) / 1e12
    cublas.setMathMode(handle, 0)
    return out


def main():
    out = sys.argv[1]
    info = select_devices("gpu")[0]
    dev = Device(info)
    rec = {"device": info.name, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "commit": os.environ.get("DGEMM_COMMIT", "unknown")}
    try:
        rec["cublas_dgemm_8192_tflops"] = cublas_dgemm_modes()
    except Exception as e:
        rec["cublas_dgemm_8192_tflops"] = f"failed: {e}"
    print("cuBLAS DGEMM 8192:", rec["cublas_dgemm_8192_tflops"], flush=True)
    for dtype in ("float32", "float64"):
        params = dev.choice(dtype).params
        kern = dev.kernels(dtype, params)
        ptx = kern.program.get_info(__import__("pyopencl").program_info.BINARIES)[0]
        path = os.path.join(out, f"gemm_{dtype}.ptx")
        with open(path, "wb") as f:
            f.write(ptx)
        subprocess.run(f"ptxas -arch=sm_90 -v {path} -o {out}/g.cubin 2> {out}/ptxas_{dtype}.txt && "
                       f"cuobjdump -sass {out}/g.cubin > {out}/gemm_{dtype}.sass", shell=True)
        sass = open(f"{out}/gemm_{dtype}.sass").read() if os.path.exists(f"{out}/gemm_{dtype}.sass") else ""
        ops = {}
        for line in sass.splitlines():
            parts = line.split("*/")
            if len(parts) > 1 and "/*" in parts[0]:
                op = parts[1].strip().split(" ")[0].rstrip(";")
                if op.startswith("@"):
                    op = parts[1].strip().split(" ")[1]
                ops[op.split(".")[0]] = ops.get(op.split(".")[0], 0) + 1
        rec[f"sass_ops_{dtype}"] = dict(sorted(ops.items(), key=lambda kv: -kv[1])[:25])
        lds = sorted({ln.split("*/")[1].strip().split(" ")[0] for ln in sass.splitlines()
                      if "LDS" in ln and "*/" in ln})
        rec[f"lds_kinds_{dtype}"] = lds
        # clocks while this kernel runs for ~6 s
        kb = KernelBench(dev, dtype, 8192, 8192, 8192, seed=1)
        mon = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                                "--format=csv,noheader", "-lms", "250"], stdout=subprocess.PIPE, text=True)
        t = kb.run(params, reps=40, warmup=2)
        mon.terminate()
        samples = mon.stdout.read().strip().splitlines()
        rec[f"{dtype}_8192"] = {"params": params.as_dict(), "tflops": t.tflops, "ok": t.ok,
                                "clocks_power_temp": samples[-12:]}
        print(dtype, params, f"{t.tflops:.2f} TF ok={t.ok}", samples[-3:], rec[f"sass_ops_{dtype}"],
              rec[f"lds_kinds_{dtype}"], flush=True)
        del kb
    with open(os.path.join(out, "probe.json"), "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()

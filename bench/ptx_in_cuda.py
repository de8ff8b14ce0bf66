"""The wgmma kernel's finished PTX (the program dgemm loads through OpenCL) launched through CUDA instead, so
NVIDIA's profiler, which does not see OpenCL launches, can read its counters; also a cross-check of the
OpenCL timing (CUDA events here against OpenCL profiling events there).

The operands are prepared as the engine prepares them (K-major, rounded to TF32, or split into [big; small]
halves for 3xTF32), C is poisoned, and sampled entries are checked against float64 before the time counts.

On the GPU machine::

    python3 bench/ptx_in_cuda.py --params '{"MMA": 8, ...}' --options=-DFENCES=0 --size 8192
    ncu --clock-control none -k regex:gemm --launch-skip 2 -c 1 --section WarpStateStats \\
        python3 bench/ptx_in_cuda.py ...
"""
import argparse
import json
import os
import tempfile

import numpy as np


def tf32(x: np.ndarray) -> np.ndarray:
    """Round float32 to TF32 (10 mantissa bits), to nearest with ties away from zero (cvt.rna)."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", required=True, help="KernelParams fields (MMA 7 or 8) as JSON")
    ap.add_argument("--options", default="", help="more compiler options, space-separated")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    import cupy
    import pyopencl as cl

    from dgemm.opencl import wgmma
    from dgemm.tuning.params import KernelParams

    p = KernelParams(**json.loads(args.params))
    assert p.k_major, "a wgmma kernel (MMA 7 or 8)"
    w = wgmma.WgmmaParams.of(p)
    dev = [d for pl in cl.get_platforms() for d in pl.get_devices() if d.type & cl.device_type.GPU][0]
    ctx = cl.Context([dev])
    _, _, finished = wgmma.build(ctx, dev, w, tuple(args.options.split()))
    del ctx
    path = os.path.join(os.environ.get("OUT") or tempfile.mkdtemp(), "gemm_wgmma.ptx")
    # NVIDIA's OpenCL reads the work-group offsets (%envreg0-2: 0 here, no global offset) and the number of
    # work-groups (%envreg6-8) from environment registers its launcher sets; a CUDA launch does not set them.
    for i in range(6):
        finished = finished.replace(f"%envreg{i};", "0;")
    for i, axis in zip((6, 7, 8), "xyz"):
        finished = finished.replace(f"%envreg{i};", f"%nctaid.{axis};")
    finished = "\n".join(ln.replace("mov.b32", "mov.u32") if "%nctaid" in ln else ln for ln in finished.splitlines())
    assert "%envreg" not in finished, "an environment register this launch does not set"
    with open(path, "w") as f:
        f.write(finished)
    entry = finished[finished.index(".entry gemm_wgmma"):]
    print("PTX:", [ln for ln in finished.splitlines()[:30] if ln.startswith(".")], entry[:entry.index("{")].split())
    kernel = cupy.RawModule(path=path).get_function("gemm_wgmma")

    n = args.size
    bm, bn, bk = w.tile
    assert n % bm == 0 and n % bn == 0 and n % bk == 0, "a size the tile divides"
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n), dtype=np.float32)      # A, M x K
    bt = rng.standard_normal((n, n), dtype=np.float32)     # B^T, N x K

    def operand(x):
        if p.parts == 2:
            big = tf32(x)
            return np.concatenate([big, tf32(x - big)])
        return tf32(x)
    da, db = cupy.asarray(operand(a)), cupy.asarray(operand(bt))
    c = cupy.full((n, n), np.nan, dtype=np.float32)   # poisoned: an unwritten entry fails the check
    grid = ((n // bm) * (n // bn), 1, 1)
    block = (w.threads, 1, 1)
    call = (np.int32(n), np.int32(n), np.int32(n), np.float32(1.0), np.float32(0.0), da, db, c, np.uint64(0))
    kernel(grid, block, call)
    cupy.cuda.Device().synchronize()
    rows = rng.choice(n, 16, replace=False)
    cols = rng.choice(n, 16, replace=False)
    ref = a[rows].astype(np.float64) @ bt[cols].astype(np.float64).T
    got = cupy.asnumpy(c)[np.ix_(rows, cols)].astype(np.float64)
    scale = np.abs(a[rows]).astype(np.float64) @ np.abs(bt[cols]).astype(np.float64).T
    err = float(np.max(np.abs(got - ref) / scale))
    times = []
    for _ in range(args.reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernel(grid, block, call)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    t = float(np.median(times))
    try:
        attrs = {k: kernel.attributes.get(k) for k in ("num_regs", "shared_size_bytes", "local_size_bytes")}
    except Exception as e:   # (CuPy versions differ in what a module's function offers)
        attrs = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps({"size": n, "params": p.as_dict(), "options": args.options, "rel_err": err,
                      "finite": bool(np.isfinite(got).all()), "seconds": t, "tflops": 2 * n ** 3 / t / 1e12,
                      "attributes": attrs}))


if __name__ == "__main__":
    main()

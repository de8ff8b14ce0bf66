"""A dgemm GEMM kernel's PTX (the program dgemm loads through OpenCL) launched through CUDA instead, so
NVIDIA's profiler, which does not see OpenCL launches, can read its counters; also a cross-check of the
OpenCL timing (CUDA events here against OpenCL profiling events there).

Any kernel: the wgmma ones (MMA 7, 8: the finished PTX of the PTX route, operands K-major, rounded to TF32
or split into [big; small] as the engine stages them) and the others (``gemm`` of gemm.cl / gemm_dmma.cl:
A^T and B, k-major).  C is poisoned, and sampled entries are checked against float64 before the time
counts.  ``--cublas`` times cuBLAS's product of the same size instead (torch), for the profiler to compare.

On the GPU machine::

    python3 bench/ptx_in_cuda.py --params '{"MMA": 8, ...}' --size 8192
    ncu --clock-control none -k regex:gemm --launch-skip 1 -c 1 --set full \\
        python3 bench/ptx_in_cuda.py --params '{"MMA": 3, ...}' --dtype float64 --reps 1
"""
import argparse
import json
import os
import tempfile

import numpy as np

from dgemm.accuracy import sampled_error, tf32


def for_cuda(ptx: str) -> str:
    """NVIDIA's OpenCL reads the work-group offsets (%envreg0-2; 3-5 the global offset: 0 here, no offset)
    and the number of work-groups (%envreg6-8) from environment registers its launcher sets; a CUDA
    launch does not set them."""
    for i in range(6):
        ptx = ptx.replace(f"%envreg{i};", "0;")
    for i, axis in zip((6, 7, 8), "xyz"):
        ptx = ptx.replace(f"%envreg{i};", f"%nctaid.{axis};")
    ptx = "\n".join(ln.replace("mov.b32", "mov.u32") if "%nctaid" in ln else ln for ln in ptx.splitlines())
    assert "%envreg" not in ptx, "an environment register this launch does not set"
    return ptx


def opencl_kernel_in_cuda(program, name: str):
    """A kernel of a built pyopencl ``program`` (NVIDIA's: its binary is PTX) as a CuPy function, for the profiler."""
    import cupy
    import pyopencl as cl

    ptx = program.get_info(cl.program_info.BINARIES)[0].rstrip(b"\0").decode()
    path = os.path.join(tempfile.mkdtemp(), f"{name}.ptx")
    with open(path, "w") as f:
        f.write(for_cuda(ptx))
    return cupy.RawModule(path=path).get_function(name)


def time_in_cuda(kernel, grid, block, args, reps: int) -> tuple[float, dict]:
    """The median of ``reps`` launches' seconds (CUDA events), and the kernel's registers and memory."""
    import cupy

    seconds = []
    for _ in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernel(grid, block, args)
        end.record()
        end.synchronize()
        seconds.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    try:
        attrs = {k: kernel.attributes.get(k) for k in ("num_regs", "shared_size_bytes", "local_size_bytes")}
    except Exception as e:   # (CuPy versions differ in what a module's function offers)
        attrs = {"error": f"{type(e).__name__}: {e}"}
    return float(np.median(seconds)), attrs


def build(p, dtype, options):
    """(PTX for CUDA, kernel name, tile (TSM, TSN, TSK), block shape)."""
    import pyopencl as cl

    from dgemm.opencl import wgmma
    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import list_devices

    if p.k_major:
        dev = [d for pl in cl.get_platforms() for d in pl.get_devices() if d.type & cl.device_type.GPU][0]
        ctx = cl.Context([dev])
        _, _, finished = wgmma.build(ctx, dev, p, tuple(options))
        return for_cuda(finished), "gemm_wgmma", p.tiles, (p.threads, 1, 1)
    device = Device([d for d in list_devices() if d.type == "GPU"][0])
    kern = device.kernels(dtype, p, tuple(options))
    assert kern.params == p, (kern.params, p)
    ptx = kern.program.get_info(cl.program_info.BINARIES)[0].rstrip(b"\0").decode()
    lx, ly = p.local_size
    return for_cuda(ptx), "gemm", p.tiles, (lx, ly, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", required=True, help="KernelParams fields as JSON")
    ap.add_argument("--options", default="", help="more compiler options, space-separated")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cublas", action="store_true", help="time cuBLAS (torch) on the same size instead")
    args = ap.parse_args()
    dtype = np.dtype(args.dtype)
    n = args.size

    if args.cublas:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        x = torch.randn(n, n, dtype=getattr(torch, dtype.name), device="cuda")
        y = torch.randn(n, n, dtype=getattr(torch, dtype.name), device="cuda")
        times = []
        for _ in range(args.reps + 1):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.matmul(x, y)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        t = float(np.median(times[1:]))
        print(json.dumps({"size": n, "cublas": True, "dtype": dtype.name, "seconds": t, "tflops": 2 * n ** 3 / t / 1e12}))
        return

    import cupy

    from dgemm.opencl.params import KernelParams

    p = KernelParams(**json.loads(args.params))
    ptx, name, (bm, bn, bk), block = build(p, dtype, args.options.split())
    path = os.path.join(os.environ.get("OUT") or tempfile.mkdtemp(), f"{name}.ptx")
    with open(path, "w") as f:
        f.write(ptx)
    entry = ptx[ptx.index(f".entry {name}("):]
    print("PTX:", [ln for ln in ptx.splitlines()[:30] if ln.startswith(".")], entry[:entry.index("{")].split())
    kernel = cupy.RawModule(path=path).get_function(name)

    assert n % bm == 0 and n % bn == 0 and n % bk == 0, "a size the tile divides"
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n)).astype(dtype)      # A, M x K
    b = rng.standard_normal((n, n)).astype(dtype)      # B, K x N
    c = cupy.full((n, n), np.nan, dtype=dtype)         # poisoned: an unwritten entry fails the check
    scalar = dtype.type
    if p.k_major:
        def operand(x):
            if p.parts == 2:
                big = tf32(x)
                return np.concatenate([big, tf32(x - big)])
            return tf32(x)
        da, db = cupy.asarray(operand(a)), cupy.asarray(operand(np.ascontiguousarray(b.T)))
        grid = ((n // bm) * (n // bn), 1, 1)
        call = (np.int32(n), np.int32(n), np.int32(n), scalar(1.0), scalar(0.0), da, db, c, np.uint64(0))
    else:
        da, db = cupy.asarray(np.ascontiguousarray(a.T)), cupy.asarray(b)
        grid = (n // bn, n // bm, 1)
        call = (np.int32(n), np.int32(n), np.int32(n), scalar(1.0), scalar(0.0), da, db, c)
    kernel(grid, block, call)
    cupy.cuda.Device().synchronize()
    # whole rows and columns, as dgemm's benchmarks check (an unwritten entry there is NaN: error inf)
    err = sampled_error(a, b, cupy.asnumpy(c), rng.choice(n, 4, replace=False), rng.choice(n, 4, replace=False))
    t, attrs = time_in_cuda(kernel, grid, block, call, args.reps)
    print(json.dumps({"size": n, "params": p.as_dict(), "options": args.options, "rel_err": err, "seconds": t, "tflops": 2 * n ** 3 / t / 1e12,
                      "attributes": attrs}))


if __name__ == "__main__":
    main()

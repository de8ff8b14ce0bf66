"""lz4.cl's stream kernel (``lz4_streams``) launched through CUDA, so that NVIDIA's profiler, which does not see
OpenCL launches, can read its counters (issue 28: the Blosc-LZ4 target is missed; what the profiler shows).

    python3 bench/notes/issue-28/lz4_in_cuda.py [--size 64] [--chunks 4] [--clevel 5] [--reps 5]
    ncu --clock-control none -k regex:lz4_streams -c 2 --set full --import-source yes -o OUT/lz4 \\
        python3 bench/notes/issue-28/lz4_in_cuda.py --reps 1

CHUNKS chunks of SIZE MiB of normal float32 are compressed by numcodecs' ``Blosc("lz4", CLEVEL, SHUFFLE)``
(Zarr v2's default) and planned on the host as ``decode_blosc`` plans them (``blosc.plan``); their shuffled
streams (the byte planes, nearly all of the bytes) are decoded by the device's tuned build of ``lz4_streams``
through OpenCL (profiling events) and, its PTX taken from the OpenCL program, through CUDA (CuPy events); the
CUDA run's planes must equal the OpenCL run's byte for byte (both poisoned first), every stream's error flag 0.
Prints one JSON line: streams, bytes, seconds and GB/s of decoded planes each way, registers and shared memory.
"""
import argparse
import importlib.util
import json
import os


def _ptx_in_cuda():
    """``bench/ptx_in_cuda.py`` (the OpenCL launcher's environment registers made CUDA's, timed launches)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "ptx_in_cuda.py")
    spec = importlib.util.spec_from_file_location("ptx_in_cuda", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=float, default=64, help="chunk size in MiB (default 64)")
    p.add_argument("--chunks", type=int, default=4, help="chunks in the call (default 4)")
    p.add_argument("--clevel", type=int, default=5, help="Blosc's compression level (default 5, Zarr's)")
    p.add_argument("--reps", type=int, default=5, help="timed launches each way (default 5)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a kernel parameter over the tuned build's (e.g. LZ4_PARSE=2); repeatable")
    p.add_argument("--save-ptx", metavar="PATH",
                   help="also write the build's PTX (NVIDIA's OpenCL binary) there: its SASS can then be read on a "
                        "machine without a GPU (ptxas -arch=sm_90 PATH -o k.cubin; nvdisasm from PyPI's "
                        "nvidia-cuda-nvdisasm wheel)")
    args = p.parse_args()

    import numpy as np
    import pyopencl as cl
    from numcodecs import Blosc

    from dgemm.opencl.codecs import blosc
    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices

    device = Device(select_devices(None)[0])
    rng = np.random.default_rng(1)
    n = int(args.size * 2**20) // 4
    codec = Blosc("lz4", args.clevel, Blosc.SHUFFLE)
    frames = [codec.encode(rng.standard_normal(n).astype(np.float32)) for _ in range(args.chunks)]
    plans = [blosc.plan(f) for f in frames]
    src = np.concatenate([np.frombuffer(f, np.uint8) for f in frames])
    bases = np.concatenate([[0], np.cumsum([len(f) for f in frames])])[:-1]
    offsets = np.concatenate([[0], np.cumsum([pl.nbytes for pl in plans])])[:-1]
    rows = []
    for pl, b, o in zip(plans, bases, offsets):
        r = pl.shuffled.copy()
        r[:, 0] += np.uint64(b)
        r[:, 1] += np.uint64(o)
        rows.append(r)
    rows = np.ascontiguousarray(np.concatenate(rows))
    nrows, total = len(rows), int(sum(pl.nbytes for pl in plans))
    planes = int(rows[:, 3].sum())
    lanes, params = blosc.default_lanes(device), blosc.default_params(device)
    src = np.concatenate([src, np.zeros(blosc.PAD_READ, np.uint8)])    # (as decode_blosc pads it)
    for kv in args.param:
        name, value = kv.split("=")
        if name == "LZ4_WG":
            lanes = int(value)
        else:
            params[name] = int(value)
    prog = blosc.program(device, lanes, params)
    q = cl.CommandQueue(device.context, device.cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    mf = cl.mem_flags
    bsrc = cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=src)
    brows = cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=rows)
    dst = cl.Buffer(device.context, mf.READ_WRITE, total)
    err = cl.Buffer(device.context, mf.READ_WRITE, 4 * nrows)
    cl_s = []
    for r in range(args.reps + 1):
        cl.enqueue_fill_buffer(q, dst, np.uint8(0xA5), 0, total)
        ev = prog.streams(q, (nrows * lanes,), (lanes,), bsrc, dst, brows, err)
        ev.wait()
        if r:
            cl_s.append((ev.profile.end - ev.profile.start) * 1e-9)
    want = np.empty(total, np.uint8)
    cl.enqueue_copy(q, want, dst).wait()
    errs = np.empty(nrows, np.int32)
    cl.enqueue_copy(q, errs, err).wait()
    if errs.any():
        raise SystemExit(f"OpenCL: {int(np.count_nonzero(errs))} streams with errors")
    row = {"lanes": lanes, "params": params, "clevel": args.clevel, "chunks": args.chunks, "chunk_mib": args.size,
           "streams": nrows, "plane_bytes": planes, "compressed_bytes": int(src.nbytes) - blosc.PAD_READ,
           "opencl_s": float(np.median(cl_s)), "opencl_gbps": planes / float(np.median(cl_s)) / 1e9}

    import cupy

    cuda = _ptx_in_cuda()
    if args.save_ptx:
        with open(args.save_ptx, "wb") as f:
            f.write(prog.program.get_info(cl.program_info.BINARIES)[0].rstrip(b"\0"))
    kernel = cuda.opencl_kernel_in_cuda(prog.program, "lz4_streams")
    dsrc, drows = cupy.asarray(src), cupy.asarray(rows)
    ddst = cupy.full(total, 0xA5, cupy.uint8)
    derr = cupy.full(nrows, -1, cupy.int32)
    kernel((nrows, 1, 1), (lanes, 1, 1), (dsrc, ddst, drows, derr))
    cupy.cuda.Device().synchronize()
    same = bool((cupy.asnumpy(ddst) == want).all()) and not cupy.asnumpy(derr).any()
    cus, attrs = cuda.time_in_cuda(kernel, (nrows, 1, 1), (lanes, 1, 1), (dsrc, ddst, drows, derr), args.reps)
    row.update(cuda_s=cus, cuda_gbps=planes / cus / 1e9, same_planes=same, attributes=attrs)
    print(json.dumps(row), flush=True)
    if not same:
        raise SystemExit("the CUDA launch's planes differ from the OpenCL launch's")


if __name__ == "__main__":
    main()

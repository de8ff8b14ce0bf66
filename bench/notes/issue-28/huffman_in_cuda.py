"""zstd_decode.cl's Huffman kernel (``zstd_huf_streams``) launched through CUDA, so that NVIDIA's profiler, which
does not see OpenCL launches, can read its counters (issue 28: where a decode target is missed, what the
profiler showed).

    python3 bench/notes/issue-28/huffman_in_cuda.py [--size 64] [--chunks 4] [--level 3] [--reps 5]
        [--variants READER:LANES:LOCAL,...]
    ncu --clock-control none -k regex:huf_streams -c 1 --set full -o OUT/huf \\
        python3 bench/notes/issue-28/huffman_in_cuda.py --reps 1

CHUNKS chunks of SIZE MiB of normal float32 (Zarr's usual chunk) are compressed by numcodecs' ``Zstd(LEVEL)``
and planned on the host as a worker's decode call plans them (``zstd_fastplan.plan``, ``zstd_decode.Batch``);
their Huffman trees are decoded by the OpenCL trees kernel (``zstd_decode.huffman_tables``).  Each variant of
the Huffman kernel (zstd_decode.cl's ZSTD_HUF_READER, ZSTD_HUF_LANES, ZSTD_HUF_LOCAL, ZSTD_HUF_FAST; the first is the
default build) runs through OpenCL (profiling events) and, its PTX taken from the OpenCL program, through CUDA
(CuPy events); the CUDA run's literals and output must equal the OpenCL run's byte for byte (both are poisoned
first) and every stream's error row must be 0.  Prints one JSON line per variant: streams, literal bytes,
seconds and GB/s of literals each way, and the kernel's registers and shared memory.
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
    p.add_argument("--level", type=int, default=3, help="zstd level (default 3, Zarr's)")
    p.add_argument("--reps", type=int, default=5, help="timed launches each way (default 5)")
    p.add_argument("--variants", default="", help="READER:LANES:LOCAL[:FAST[:ILP[:BLOCKS[:AHEAD]]]],... more builds of the kernel to run")
    p.add_argument("--opencl-only", action="store_true", help="no CUDA launch (a machine without CUDA: PoCL)")
    args = p.parse_args()

    import numpy as np
    import pyopencl as cl
    from numcodecs import Zstd

    from dgemm.opencl.codecs import zstd_decode as zd
    from dgemm.opencl.codecs import zstd_fastplan
    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices

    device = Device(select_devices(None)[0])
    rng = np.random.default_rng(1)
    n = int(args.size * 2**20) // 4
    codec = Zstd(level=args.level)
    frames = [codec.encode(rng.standard_normal(n, dtype=np.float32)) for _ in range(args.chunks)]
    plans = [zstd_fastplan.plan(f) for f in frames]
    offsets = np.concatenate([[0], np.cumsum([pl.size for pl in plans])[:-1]]).astype(np.int64)
    batch = zd.Batch(plans, offsets)
    whole = np.frombuffer(b"".join(frames), np.uint8)     # (the frames one after another, as the batch places them)
    descs = [bytes(whole[a:a + k]) for a, k in batch.trees[:, :2]]
    tables = zd.huffman_tables(device, descs)
    if any(isinstance(t, str) for t in tables):
        raise SystemExit("a tree was refused")
    huf = np.full((len(tables), zd.HUF_SLOT), 0xFFFF, np.uint16)
    info = np.zeros((len(tables), zd.TREE_INFO), np.int32)
    for k, (table, log) in enumerate(tables):
        huf[k, :1 << log] = table[:1 << log]
        info[k, 0] = log
    src = np.zeros(whole.nbytes + 16, np.uint8)
    src[:whole.nbytes] = whole
    ngroups, nstreams, nlit = len(batch.huf_groups), len(batch.streams), int(batch.literals)
    nout = int(sum(pl.size for pl in plans))     # prefix blocks' literals go straight to the output
    host = {"src": src, "streams": batch.streams, "groups": batch.huf_groups, "huf": huf, "info": info}
    cuda = _ptx_in_cuda()
    variants = [(zd.HUF_READER, 0, zd.HUF_LOCAL, zd.HUF_FAST, zd.HUF_ILP, zd.HUF_BLOCKS, zd.HUF_AHEAD)]
    variants += [(tuple(int(x) for x in v.split(":")) + (1, 1, 1, 1, 1))[:7] for v in args.variants.split(",") if v]
    for reader, lanes, local, fast, ilp, hblocks, ahead in variants:
        zd.HUF_READER, zd.HUF_LANES, zd.HUF_LOCAL, zd.HUF_FAST = reader, lanes or None, local, fast
        zd.HUF_ILP, zd.HUF_BLOCKS, zd.HUF_AHEAD = ilp, hblocks, ahead
        prog = zd.program(device, zd.default_lanes(device))
        hl, hb = prog.huf_lanes, prog.huf_blocks
        wgs = -(-ngroups // hb)       # work-groups: empty rows fill the last (as decode_zstd pads them)
        host["groups"] = np.concatenate([batch.huf_groups, np.zeros((wgs * hb - ngroups, 2), np.int64)])
        q = cl.CommandQueue(device.context, device.cl_device,
                            properties=cl.command_queue_properties.PROFILING_ENABLE)
        bufs = {k: cl.Buffer(device.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=v)
                for k, v in host.items()}
        lit = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, max(nlit, 1))
        err = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * max(nstreams, 1))
        out = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, max(nout, 1))
        cl_s = []
        for r in range(args.reps + 1):
            cl.enqueue_fill_buffer(q, lit, np.uint8(0xA5), 0, max(nlit, 1))
            cl.enqueue_fill_buffer(q, out, np.uint8(0xA5), 0, max(nout, 1))
            ev = prog.streams(q, (wgs * hl,), (hl,), bufs["src"], bufs["streams"], bufs["groups"], bufs["huf"],
                              bufs["info"], lit, out, err)
            ev.wait()
            if r:
                cl_s.append((ev.profile.end - ev.profile.start) * 1e-9)
        want = np.empty(max(nlit, 1), np.uint8)
        cl.enqueue_copy(q, want, lit).wait()
        want_out = np.empty(max(nout, 1), np.uint8)
        cl.enqueue_copy(q, want_out, out).wait()
        errs = np.empty(max(nstreams, 1), np.int32)
        cl.enqueue_copy(q, errs, err).wait()
        if errs.any():
            raise SystemExit(f"OpenCL: {int(np.count_nonzero(errs))} streams with errors")

        row = {"reader": reader, "lanes": hl, "local": local, "fast": fast, "ilp": ilp, "blocks_per_group": hb,
               "ahead": ahead, "level": args.level, "chunks": args.chunks,
               "chunk_mib": args.size, "blocks": int(len(batch.blocks)), "groups": ngroups, "streams": nstreams,
               "literal_bytes": nlit, "opencl_s": float(np.median(cl_s)),
               "opencl_gbps": nlit / float(np.median(cl_s)) / 1e9}
        for b in (*bufs.values(), lit, err, out):
            b.release()
        if args.opencl_only:
            print(json.dumps(row), flush=True)
            continue
        import cupy

        kernel = cuda.opencl_kernel_in_cuda(prog.program, "zstd_huf_streams")
        dev = {k: cupy.asarray(v) for k, v in host.items()}
        dlit = cupy.full(max(nlit, 1), 0xA5, cupy.uint8)
        dout = cupy.full(max(nout, 1), 0xA5, cupy.uint8)
        derr = cupy.full(max(nstreams, 1), -1, cupy.int32)
        call = (dev["src"], dev["streams"], dev["groups"], dev["huf"], dev["info"], dlit, dout, derr)
        kernel((wgs, 1, 1), (hl, 1, 1), call)
        cupy.cuda.Device().synchronize()
        same = (bool((cupy.asnumpy(dlit) == want).all()) and bool((cupy.asnumpy(dout) == want_out).all())
                and not cupy.asnumpy(derr).any())
        cus, attrs = cuda.time_in_cuda(kernel, (wgs, 1, 1), (hl, 1, 1), call, args.reps)
        row.update(cuda_s=cus, cuda_gbps=nlit / cus / 1e9, same_literals=same, attributes=attrs)
        print(json.dumps(row), flush=True)
        if not same:
            raise SystemExit("the CUDA launch's literals differ from the OpenCL launch's")


if __name__ == "__main__":
    main()

"""The wgmma kernel's PTX route, step by step, and the same program from dgemm's disk cache (GPU machine).

    python ptx_timing.py OUT.json      (the program-cache setting, DGEMM_PROGRAM_CACHE, names an empty folder)

Each step in a new OpenCL context, as a new worker process has: the whole route (source build for sm_90,
PTX edit, build of the finished PTX for sm_90a), then the cached program (load of the finished PTX).
Also says what the driver returns as the finished program's binary (PTX text or not).
"""
import argparse
import json
import time

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the JSON file to write")
    args = p.parse_args()
    import numpy as np
    import pyopencl as cl

    from dgemm.opencl import wgmma
    from dgemm.opencl.device import Device
    from dgemm.opencl.ptx import finish, program_ptx

    out = {}
    dev = Device()
    params = dev.choice(np.float32, "tf32").params
    out["device"], out["params"] = dev.info.name, str(params)
    ctx = cl.Context([dev.cl_device])
    flags = wgmma.options(params) + [f"-I{wgmma.__file__.rsplit('/', 2)[0]}/kernels"]
    source = open(f"{wgmma.__file__.rsplit('/', 2)[0]}/kernels/gemm_wgmma.cl").read()
    t = time.perf_counter()
    first = cl.Program(ctx, source).build(options=flags, devices=[dev.cl_device])
    out["source_build_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ptx = program_ptx(first, dev.cl_device)
    finished = finish(ptx, wgmma.sites(params.TSN))
    out["edit_s"], out["ptx_bytes"] = time.perf_counter() - t, len(finished)
    t = time.perf_counter()
    prog = cl.Program(ctx, [dev.cl_device], [finished.encode() + b"\0"]).build()
    out["finished_build_s"] = time.perf_counter() - t
    binary = bytes(prog.get_info(cl.program_info.BINARIES)[0])
    out["finished_binary"] = {"bytes": len(binary), "head": binary[:40].decode("ascii", "replace"),
                              "is_the_ptx": binary.rstrip(b"\0") == finished.encode().rstrip(b"\0")}
    for name in ("miss", "hit", "hit again"):   # through Device, each in its own context: the worker's path
        d = Device(dev.info)
        t = time.perf_counter()
        d.kernels(np.float32, params)
        out[f"device_kernels_{name}_s"] = time.perf_counter() - t
        out[f"device_failed_{name}"] = {str(k): v for k, v in d.failed.items()}
    json.dump(out, open(args.out, "w"), indent=1)
    print(json.dumps(out))

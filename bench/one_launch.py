"""One parameter set built, checked and run a few times at one size: a program for a profiler to wrap.

On the GPU machine (NVIDIA's profiler over OpenCL, the kernel named by a regular expression)::

    ncu --clock-control none -k regex:gemm --launch-skip 2 -c 1 --section WarpStateStats \\
        python3 bench/one_launch.py --params '{"MMA": 8, ...}' --size 16384
"""
import argparse
import json

from dgemm.opencl.device import Device
from dgemm.opencl.discovery import list_devices
from dgemm.tuning.params import KernelParams
from dgemm.tuning.timing import KernelBench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", required=True, help="KernelParams fields as JSON")
    ap.add_argument("--options", default="", help="more compiler options, space-separated")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    found = list_devices()
    dev = Device(([d for d in found if d.type == "GPU"] or found)[0])
    p = KernelParams(**json.loads(args.params))
    t = KernelBench(dev, args.dtype, args.size, args.size, args.size, seed=1).run(
        p, reps=args.reps, extra_options=tuple(args.options.split()))
    print(json.dumps({"size": args.size, "params": p.as_dict(), "ok": t.ok, "tflops": t.tflops, "rel_err": t.rel_err}))


if __name__ == "__main__":
    main()

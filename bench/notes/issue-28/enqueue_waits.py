"""Does enqueuing a small copy wait for the kernels before it on the queue?  (issue 28, ninth session)

    python3 bench/notes/issue-28/enqueue_waits.py [--out FILE]

CUDA's asynchronous copies from ordinary (pageable) host memory wait for the stream's earlier work before they
return, and those into pageable memory return only once done.  decode_zstd uploads its small tables between
its kernels and reads its error rows into ordinary memory; if NVIDIA's OpenCL does the same, each such enqueue
holds the calling reader thread until the kernels before it have run.  A kernel of about 50 ms (a dependent
multiply-add loop) is enqueued, then one command, and the time the enqueue call took is printed, for: an upload
of 4 KiB from ordinary memory, the same from page-locked memory (``ALLOC_HOST_PTR``, mapped), a non-blocking
read of 4 KiB into ordinary memory, the same into page-locked memory, a fill, and a marker; then the copies on a
second queue: with no wait (the kernel runs on the first) and waiting for the kernel's event.
"""
import argparse
import json
import os
import time

SRC = """
kernel void spin(global float* x, const int n) {
    float v = x[get_global_id(0)];
    for (int i = 0; i < n; i++) v = v * 0.999999f + 1e-7f;
    x[get_global_id(0)] = v;
}
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import numpy as np
    import pyopencl as cl

    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices
    from dgemm.provenance import command_line, git_commit, utc_now

    device = Device(select_devices(None)[0])
    ctx = device.context
    q = cl.CommandQueue(ctx, device.cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    q2 = cl.CommandQueue(ctx, device.cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    prog = cl.Program(ctx, SRC).build()
    spin = cl.Kernel(prog, "spin")
    n = 1 << 20
    x = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * n)
    cl.enqueue_fill_buffer(q, x, np.float32(1), 0, 4 * n).wait()
    small = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)
    ordinary = np.zeros(4096, np.uint8)
    pin = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, 4096)
    pinned, _ = cl.enqueue_map_buffer(q, pin, cl.map_flags.READ | cl.map_flags.WRITE, 0, (4096,), np.uint8,
                                      is_blocking=True)
    steps = 20000
    ev = spin(q, (n,), (256,), x, np.int32(steps))
    ev.wait()
    kernel_s = (ev.profile.end - ev.profile.start) * 1e-9
    steps = max(1000, int(steps * 0.05 / max(kernel_s, 1e-6)))     # about 50 ms

    commands = {
        "upload_ordinary": lambda: cl.enqueue_copy(q, small, ordinary, is_blocking=False),
        "upload_page_locked": lambda: cl.enqueue_copy(q, small, pinned, is_blocking=False),
        "read_ordinary": lambda: cl.enqueue_copy(q, ordinary, small, is_blocking=False),
        "read_page_locked": lambda: cl.enqueue_copy(q, pinned, small, is_blocking=False),
        "fill": lambda: cl.enqueue_fill_buffer(q, small, np.uint8(0), 0, 4096),
        "marker": lambda: cl.enqueue_marker(q),
        "other_queue_upload_page_locked": lambda: cl.enqueue_copy(q2, small, pinned, is_blocking=False),
        "other_queue_read_page_locked": lambda: cl.enqueue_copy(q2, pinned, small, is_blocking=False),
        "other_queue_read_ordinary": lambda: cl.enqueue_copy(q2, ordinary, small, is_blocking=False),
        "other_queue_read_page_locked_after_kernel": lambda: cl.enqueue_copy(q2, pinned, small, is_blocking=False,
                                                                             wait_for=[last[0]]),
        "other_queue_upload_page_locked_after_kernel": lambda: cl.enqueue_copy(q2, small, pinned,
                                                                               is_blocking=False, wait_for=[last[0]]),
        "other_queue_marker_after_kernel": lambda: cl.enqueue_marker(q2, wait_for=[last[0]]),
    }
    last = [None]
    rows = {}
    for name, command in commands.items():
        got = []
        for _ in range(3):
            q.finish()
            q2.finish()
            k = last[0] = spin(q, (n,), (256,), x, np.int32(steps))
            q.flush()
            t0 = time.perf_counter()
            command()
            t1 = time.perf_counter()
            k.wait()
            q2.finish()
            got.append({"enqueue_ms": round((t1 - t0) * 1e3, 3),
                        "kernel_ms": round((k.profile.end - k.profile.start) * 1e-6, 3)})
        rows[name] = got
        print(name, got, flush=True)
    record = {"benchmark": "enqueue-waits", "device": device.info.name, "cores": os.cpu_count(),
              "date": utc_now(), "commit": git_commit()[0], "command": command_line(), "commands": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()

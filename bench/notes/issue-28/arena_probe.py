"""Are a large buffer's sub-buffers on the device?  (issue 28, twenty-sixth session)

    python3 bench/notes/issue-28/arena_probe.py [--out FILE] [--parent-mib 6144] [--region-mib 256]

The decode slots' arenas (one buffer a slot, its call's buffers carved from it as sub-buffers: x-arena26.patch)
ran `on` at 32768² on an H200 in 39-47 s against 1.4: the decode commands ran 60 times slower, and the device's
memory in use (nvidia-smi) was no higher than main's, as if NVIDIA's driver had left the arenas in host memory.
Here each way of getting a buffer of ``--region-mib`` is timed by a copy kernel writing it from a buffer on the
device and by an upload into it from page-locked memory, with the device's memory in use after it: a buffer of its
own; one of ``--parent-mib`` used whole; a sub-buffer of a fresh parent of that size; of a parent filled first; of
a parent migrated to the device first (``clEnqueueMigrateMemObjects``); a sub-buffer of a parent just larger than
it.  A sub-buffer on the device copies at the device's bandwidth; one in host memory at the bus's at best.
"""
import argparse
import json
import os
import shutil
import subprocess
import time

SRC = """
kernel void copy(global const uint4* src, global uint4* dst) { dst[get_global_id(0)] = src[get_global_id(0)]; }
"""


def used_mib():
    """The device's memory in use (nvidia-smi), or None where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout.split()
    return int(out[0]) if out else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--parent-mib", type=int, default=6144)
    p.add_argument("--region-mib", type=int, default=256)
    args = p.parse_args()
    import numpy as np
    import pyopencl as cl

    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices
    from dgemm.provenance import command_line, git_commit, utc_now

    device = Device(select_devices(None)[0])
    ctx, dev = device.context, device.cl_device
    q = cl.CommandQueue(ctx, dev, properties=cl.command_queue_properties.PROFILING_ENABLE)
    copy = cl.Kernel(cl.Program(ctx, SRC).build(), "copy")
    region, parent = args.region_mib << 20, args.parent_mib << 20
    align = max(int(dev.mem_base_addr_align) // 8, 256)
    rw = cl.mem_flags.READ_WRITE
    src = cl.Buffer(ctx, rw, region)
    cl.enqueue_fill_buffer(q, src, np.uint8(7), 0, region).wait()
    host = cl.Buffer(ctx, rw | cl.mem_flags.ALLOC_HOST_PTR, region)
    pinned, _ = cl.enqueue_map_buffer(q, host, cl.map_flags.READ | cl.map_flags.WRITE, 0, (region,), np.uint8,
                                      is_blocking=True)
    pinned[:] = 3

    def rate(event, nbytes):
        event.wait()
        return round(nbytes / ((event.profile.end - event.profile.start) * 1e-9) / 1e9, 2)

    def timed(dst, what):
        before = used_mib()
        t0 = time.perf_counter()
        kernel = [rate(copy(q, (region // 16,), (256,), src, dst), 2 * region) for _ in range(3)]
        first_s = time.perf_counter() - t0
        upload = [rate(cl.enqueue_copy(q, dst, pinned, is_blocking=False), region) for _ in range(2)]
        check = np.empty(16, np.uint8)
        cl.enqueue_copy(q, check, dst, is_blocking=True)
        row = {"what": what, "kernel_GBps": kernel, "upload_GBps": upload, "three_kernels_wall_s": round(first_s, 3),
               "used_mib_before": before, "used_mib_after": used_mib(), "written": bool((check == 3).all())}
        print(json.dumps(row), flush=True)
        return row

    rows = []
    own = cl.Buffer(ctx, rw, region)
    rows.append(timed(own, "a buffer of its own"))
    own.release()
    whole = cl.Buffer(ctx, rw, parent)
    rows.append(timed(whole, f"a buffer of {args.parent_mib} MiB, its start"))
    whole.release()
    for how in ("fresh", "filled", "migrated"):
        arena = cl.Buffer(ctx, rw, parent)
        if how == "filled":
            cl.enqueue_fill_buffer(q, arena, np.uint8(0), 0, parent).wait()
        elif how == "migrated":
            cl.enqueue_migrate_mem_objects(q, [arena]).wait()
        sub = arena.get_sub_region(align, region)
        rows.append(timed(sub, f"a sub-buffer of a {how} parent of {args.parent_mib} MiB"))
        sub.release()
        arena.release()
    small = cl.Buffer(ctx, rw, region + align)
    sub = small.get_sub_region(align, region)
    rows.append(timed(sub, "a sub-buffer of a fresh parent just larger"))
    sub.release()
    small.release()
    record = {"meta": {"what": "a sub-buffer's copy and upload rates against a buffer's own (issue 28, 26th session)",
                       "date": utc_now(), "device": device.info.name, "cores": os.cpu_count(), "commit": git_commit(),
                       "command": command_line(), "region_bytes": region, "parent_bytes": parent, "align": align},
              "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()

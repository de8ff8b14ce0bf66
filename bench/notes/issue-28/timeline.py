"""Where a product's time goes over a run, in time bins: the readers, the device decodes, the GEMMs, the waits (issue 28).

    python bench/notes/issue-28/timeline.py OUT.json [--size 32768] [--chunk 4096] [--codec zstd|none]
        [--modes share,off] [--gemm-tasks 1] [--repeats 1] [--bin 0.1] [--inputs FOLDER] [--devices gpu]

Writes A and B as ``device_codecs_onoff.py`` does (C zstd with zstd inputs, else raw), starts a local cluster,
builds the kernels, then runs the product in each mode with a tracer installed in the worker processes: each
block read (``BlockEngine._fetch``, on a reader thread: its start and end), each device decode asked for
(``DeviceDecoded.fill_device``: taken or declined), each product (``BlockEngine._run``), each wait of a
product for its next inputs (``_waited``) and each GEMM kernel (enqueued, then its device start and end from
the queue's profiling, placed on the host's clock by its enqueue time).  ``time.perf_counter`` is the
system's monotonic clock on Linux, one for every process.  Per run it prints and records, for each
``--bin`` seconds from the call: the reader threads busy on average (all, and those in a device decode),
the GEMMs' share of the bin, the products' waiting for inputs and the worker's event loop's worst lag (a
callback asked for every 5 ms from another thread); and totals: the reads by path (count, thread-seconds,
mean), the device path's phases (the frames read into the staging; the decode call: planned, uploaded and
enqueued), the products' wall and wait, the loop's lag; and each thread group's time from the kernel's scheduler
(``/proc/self/task/*/schedstat``: on a CPU, waiting on a run queue for one, and so blocked the rest), and
how long a thread waits to take Python's lock back after a foreign call (``gil_wait_ms``, every 5 ms: a call of a
microsecond, in which another thread seldom takes the lock) and how late a 5 ms sleep ends (``sleep_late_ms``: the
lock taken back after the sleep, which other threads may hold; thirtieth session).
The question: while the products wait, are the readers busy (a rate limit) or idle (nothing asked of them: the
read-ahead's window)?  And are the threads that feed the device short of cores (run-queue waits) or of Python's
lock (blocked, and ``gil_wait_ms`` long)?
"""
import argparse
import json
import os
import shutil
import sys
import time

from device_codecs_onoff import _block, _commit, configure, make_inputs  # (beside this script: its folder is on the path)


def trace_install(dask_worker=None):
    """On a worker: wrap the engine's and the decoder's methods to log into ``builtins._dgemm_trace`` (once), and
    probe its event loop's lag every 5 ms while tracing."""
    import builtins
    import threading
    import time

    from dgemm.opencl.engine import BlockEngine
    from dgemm.worker import decoding
    from dgemm.worker.state import MeteredEngine

    trace = builtins.__dict__.setdefault("_dgemm_trace", {"on": False, "log": [], "installed": False})
    if trace["installed"]:
        return
    trace["installed"] = True
    log = trace["log"]

    def rec(*item):
        if trace["on"]:
            log.append(item)

    def name(ref):      # "a r,c" or "b r,c": the block's array (its path's last letter) and chunk-row/col start
        try:
            k = ref.key()
            rc, cc = ref.array.chunks
            return f"{str(k[0]).rstrip('/')[-6:-5]} {k[2][0] // rc},{k[3][0] // cc}"
        except Exception:   # noqa: BLE001
            return "?"

    fetch = BlockEngine._fetch

    def _fetch(self, ref, transpose, drows, dcols):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fetch(self, ref, transpose, drows, dcols)
        finally:
            rec("read", threading.get_ident(), t0, time.perf_counter(), name(ref), time.thread_time() - c0)

    staged = BlockEngine._staged

    def _staged(self, ref, *args):
        rec("ask", time.perf_counter(), name(ref))
        return staged(self, ref, *args)

    stream = BlockEngine.stream

    def _stream(self, a_refs, b_refs, *args, **kw):
        rec("task", time.perf_counter(), name(a_refs[0]) if a_refs else "?", name(b_refs[0]) if b_refs else "?")
        return stream(self, a_refs, b_refs, *args, **kw)

    fill = decoding.DeviceDecoded.fill_device

    def fill_device(self, *args, **kw):
        t0, got = time.perf_counter(), None
        try:
            got = fill(self, *args, **kw)
            return got
        finally:
            rec("device", threading.get_ident(), t0, time.perf_counter(), got is not None)

    waited = MeteredEngine._waited

    def _waited(self, start, end):
        rec("wait", threading.get_ident(), start, end)
        return waited(self, start, end)

    launched = MeteredEngine._launched

    def _launched(self, event, flops):
        rec("gemm", time.perf_counter(), event)
        return launched(self, event, flops)

    run = BlockEngine._run

    def _run(self, *args, **kw):
        t0 = time.perf_counter()
        try:
            return run(self, *args, **kw)
        finally:
            rec("product", threading.get_ident(), t0, time.perf_counter())

    local = threading.local()
    decoded = BlockEngine._decoded

    def _decoded(self, *args, **kw):    # a block the device decodes: its commands are the decode's
        local.decoding = True
        try:
            return decoded(self, *args, **kw)
        finally:
            local.decoding = False

    transferred = MeteredEngine._transferred

    def _transferred(self, event):     # every upload, decode command, unpadding and download the engine counts
        if event is not None:
            rec("cmd", threading.get_ident(), time.perf_counter(), event,
                "decode" if getattr(local, "decoding", False) else "engine")
        return transferred(self, event)

    from dgemm.worker import encoding
    encode = encoding._encode

    def _encode(device, found, buf, events, after=None):  # C's device encode: its commands (copies, kernels, downloads)
        t0, mark = time.perf_counter(), len(events) if events is not None else 0
        try:
            return encode(device, found, buf, events, after)
        finally:
            rec("encode", threading.get_ident(), t0, time.perf_counter())
            # (the block's copy, just before, too) read now, all of them run: an event kept would keep its host
            # array, and the encoder's page-locked download buffers would be pinned afresh for every block
            for what, event in (events or [])[max(0, mark - 1):]:
                try:
                    event.wait()
                    p = event.profile
                    rec("cmdp", threading.get_ident(), "encode " + what, event.command_type, p.queued, p.start, p.end)
                except Exception:   # noqa: BLE001
                    pass

    def timed(module, fname, what):     # a function's calls on this thread: ``(what, thread, start, end)``
        real = getattr(module, fname)

        def wrapper(*args, **kw):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return real(*args, **kw)
            finally:   # and the thread's CPU time in it: on a CPU (slow there), or blocked (Python's lock, a wait)
                rec(what, threading.get_ident(), t0, time.perf_counter(), time.thread_time() - c0)
        setattr(module, fname, wrapper)

    timed(decoding, "_read_packed", "packed")       # the device path: the frames read into the staging
    timed(decoding, "_decode_read", "decode_call")  # ... planned, uploaded (waited for) and enqueued
    # under on, a block that shares a call: its frames planned from their headers, then its wait for a leader
    # (or its own lead: a slot, then the call), then the shared call itself (on the leader's thread)
    timed(decoding, "_batchable", "batchable")
    # a product's deferred decode checks, on its thread before its unpadding (thirty-second session: products.py
    # found unpaddings enqueued 20-190 ms after their product's last GEMM had run)
    timed(decoding, "_checked", "check")
    timed(decoding._Batches, "_lead_or_wait", "lead_or_wait")
    timed(encoding, "_encode_job", "encode_job")    # an encoder thread's job: its slot's wait, the copy, the encode
    from dgemm.opencl import scratch
    from dgemm.opencl.codecs import _programs, zstd_decode, zstd_devplan
    timed(zstd_decode, "checked", "plan")           # the device path: a frame read on the host (its plan)
    timed(zstd_decode, "decode_zstd", "decode_enqueue")   # ... its uploads and kernels enqueued (the rest: waits)
    # within a call (decode_enqueue): the frames planned on the device (uploaded, the plan kernel run and read
    # back: a round trip), their rows read into plans on the host, the call's tables, its execute stage launched
    timed(zstd_devplan, "plan", "devplan")
    timed(zstd_devplan, "_frame_plan", "frame_plan")
    timed(zstd_decode, "Batch", "call_tables")
    timed(zstd_decode, "_execute_tables", "exec_tables")
    timed(zstd_decode, "_execute", "execute_launch")
    timed(scratch, "_wait", "slot_last")            # a slot's holder waiting for the slot's last call to have run
    # the rest of a call: its frames' plans made on the host, its buffers taken from the slot (grown where a call
    # needs more), and its copies (each a driver call: the tables' uploads, the device plan's blocking reads)
    timed(zstd_decode, "_host_plans", "host_plans")
    timed(scratch.Scratch, "buffer", "scratch_take")
    # of which new device buffers (a slot's first of a name in a run, or one grown) and the old ones released
    from dgemm.opencl import device as device_module, nogil
    timed(device_module.Device, "buffer", "alloc")
    timed(nogil, "release", "release")
    # each release's bytes and whether the buffer was page-locked host memory ("release_of": its start, bytes,
    # page-locked), to tell a slot's grown buffer from a reader's staging grown
    real_release = nogil.release

    def release_of(buffer, *args, **kw):
        try:
            import pyopencl
            pinned = bool(buffer.flags & pyopencl.mem_flags.ALLOC_HOST_PTR)
            rec("release_of", threading.get_ident(), time.perf_counter(), int(buffer.size), pinned)
        except Exception:   # (a buffer whose info cannot be read: its release alone is timed)
            pass
        return real_release(buffer, *args, **kw)
    nogil.release = release_of
    # (the device plan's read of its rows comes with the call's commands since ddc3243 and cfd1d66: a "cmd" of the
    # decode, a download, which calls.py splits the plan step at)
    import pyopencl
    copy, inside = pyopencl.enqueue_copy, threading.local()

    def enqueue_copy(*args, **kw):
        if not getattr(inside, "call", False):
            return copy(*args, **kw)
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return copy(*args, **kw)
        finally:
            rec("call_copy_blocking" if kw.get("is_blocking", True) else "call_copy", threading.get_ident(), t0,
                time.perf_counter(), time.thread_time() - c0)
    pyopencl.enqueue_copy = enqueue_copy
    enqueue = zstd_decode.decode_zstd

    def decode_zstd(*args, **kw):   # (its copies are the call's)
        inside.call = True
        try:
            return enqueue(*args, **kw)
        finally:
            inside.call = False
    zstd_decode.decode_zstd = decode_zstd
    batch_call = decoding._decode_batch

    def _decode_batch(device, batch):   # how many blocks, and chunks, each shared call took
        rec("batch_size", threading.get_ident(), time.perf_counter(), len(batch), sum(len(r.plans) for r in batch))
        return batch_call(device, batch)
    decoding._decode_batch = _decode_batch
    timed(decoding, "_decode_batch", "batch_call")

    class TimedLock:    # a codec program's launch lock: ("lock", thread, program, asked, got, let go)
        def __init__(self, lock, what):
            self.lock, self.what, self.local = lock, what, threading.local()

        def __enter__(self):
            asked = time.perf_counter()
            self.lock.acquire()
            self.local.times = (asked, time.perf_counter())

        def __exit__(self, *exc):
            self.lock.release()
            rec("lock", threading.get_ident(), self.what, *self.local.times, time.perf_counter())

    program = _programs.program

    def timed_program(device, source, *args, **kw):
        built = program(device, source, *args, **kw)
        if not isinstance(built.lock, TimedLock):
            built.lock = TimedLock(built.lock, source)
        return built
    _programs.program = timed_program

    loop = getattr(dask_worker, "loop", None)

    import ctypes

    getpid = ctypes.CDLL(None).getpid     # (ctypes lets Python's lock go around it: the time is taking it back)

    def probe():    # the worker's event loop's lag: how late a callback asked for from another thread runs
        while True:
            t = time.perf_counter()
            time.sleep(0.005)
            if trace["on"]:     # how late a 5 ms sleep ends (the lock is taken back after it: others may hold it)
                rec("gil_sleep", t, time.perf_counter() - 0.005)
                t = time.perf_counter()     # and how long taking the lock back after a foreign call of 1 µs takes
                getpid()
                rec("gil", t, time.perf_counter())
            if trace["on"] and loop is not None:
                sent = time.perf_counter()
                loop.add_callback(lambda sent=sent: rec("lag", sent, time.perf_counter()))
    threading.Thread(target=probe, daemon=True, name="timeline-probe").start()

    BlockEngine._fetch, BlockEngine._run, BlockEngine._staged, BlockEngine.stream = _fetch, _run, _staged, _stream
    decoding.DeviceDecoded.fill_device = fill_device
    MeteredEngine._waited, MeteredEngine._launched = _waited, _launched
    MeteredEngine._transferred, encoding._encode, BlockEngine._decoded = _transferred, _encode, _decoded


def schedstat() -> dict:
    """This process's threads from the kernel's scheduler: ``{tid: (name, on-CPU ns, runnable-waiting ns, slices)}``.

    The name is the Python thread's (its digits stripped) or, for a thread Python did not start (the driver's),
    ``native <comm>``.  Waiting on a run queue means a core was wanted and none was free; a thread neither on
    a CPU nor on a run queue was blocked (on Python's lock, a mutex, a sleep, the device)."""
    import threading

    names = {t.native_id: t.name.rstrip("0123456789_-") for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait, slices = (int(x) for x in f.read().split()[:3])
            name = names.get(int(tid))
            if name is None:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = "native " + f.read().strip().rstrip("0123456789_-")
        except (OSError, ValueError):
            continue
        out[int(tid)] = (name, run, wait, slices)
    return out


def trace_on(dask_worker=None):
    import builtins

    trace = builtins._dgemm_trace
    trace["log"].clear()
    trace["sched"] = schedstat()
    trace["on"] = True


def trace_take(dask_worker=None):
    """On a worker: the log, GEMM events turned into ``("gemm", device start, device end)`` on the host's clock."""
    import builtins

    import statistics
    import threading

    import pyopencl as cl

    trace = builtins._dgemm_trace
    trace["on"] = False
    out, offsets = [], []
    names = {t.ident: t.name.rstrip("0123456789_-") for t in threading.enumerate()}
    for item in trace["log"]:
        if item[0] == "gemm":
            t, event = item[1], item[2]
            event.wait()
            p = event.profile
            offsets.append(t - p.queued * 1e-9)     # the device's profiling clock onto the host's (launched at t)
            out.append(("gemm", t + (p.start - p.queued) * 1e-9, t + (p.end - p.queued) * 1e-9, t))
        elif item[0] not in ("cmd", "cmdp"):
            out.append(item)
    offset = statistics.median(offsets) if offsets else None
    kinds = {cl.command_type.NDRANGE_KERNEL: "kernel", cl.command_type.WRITE_BUFFER: "upload",
             cl.command_type.READ_BUFFER: "download", cl.command_type.COPY_BUFFER: "copy",
             cl.command_type.COPY_BUFFER_RECT: "copy", cl.command_type.FILL_BUFFER: "fill",
             cl.command_type.MARKER: "marker"}
    # ("cmd", thread's kind, by whom, command, queued, started, ended: the host's clock, the thread's id: a decode
    # call's commands are its leader's, as its "batch_call" is)
    for item in trace["log"]:
        if item[0] == "cmdp" and offset is not None:    # read already: (thread, by, command type, device times)
            _, thread, by, kind, *times = item
            out.append(("cmd", names.get(thread, "?"), by, kinds.get(kind, str(kind)),
                        *(offset + t * 1e-9 for t in times), thread))
        if item[0] != "cmd" or offset is None:
            continue
        _, thread, t, event, by = item
        try:
            event.wait()
            p = event.profile
            out.append(("cmd", names.get(thread, "?"), by, kinds.get(event.command_type, str(event.command_type)),
                        offset + p.queued * 1e-9, offset + p.start * 1e-9, offset + p.end * 1e-9, thread))
        except Exception:   # noqa: BLE001  (a queue without profiling: left out)
            pass
    trace["log"].clear()
    before, groups = trace.get("sched", {}), {}
    for tid, (name, run, wait, slices) in schedstat().items():
        _, run0, wait0, slices0 = before.get(tid, (name, 0, 0, 0))   # (a thread started meanwhile: from 0)
        g = groups.setdefault(name, {"threads": 0, "cpu_s": 0.0, "runqueue_s": 0.0, "slices": 0})
        g["threads"] += 1
        g["cpu_s"] += (run - run0) * 1e-9
        g["runqueue_s"] += (wait - wait0) * 1e-9
        g["slices"] += slices - slices0
    for g in groups.values():
        g["cpu_s"], g["runqueue_s"] = round(g["cpu_s"], 3), round(g["runqueue_s"], 3)
    out.append(("sched", groups))
    return out


def overlap(spans, a, b) -> float:
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans)


def summary(log, t0, wall, width):
    reads = [(x[2] - t0, x[3] - t0) for x in log if x[0] == "read"]
    dev = [x for x in log if x[0] == "device"]
    taken = [(x[2] - t0, x[3] - t0) for x in dev if x[4]]
    waits = [(x[2] - t0, x[3] - t0) for x in log if x[0] == "wait"]
    gemms = [(x[1] - t0, x[2] - t0) for x in log if x[0] == "gemm"]
    products = [(x[2] - t0, x[3] - t0) for x in log if x[0] == "product"]
    # a read's path: the device where its thread's device decode was taken within it
    on_device = set()
    for i, x in enumerate(x for x in log if x[0] == "read"):
        if any(d[1] == x[1] and d[4] and x[2] <= d[2] <= x[3] for d in dev):
            on_device.add(i)
    dev_reads = [r for i, r in enumerate(reads) if i in on_device]
    host_reads = [r for i, r in enumerate(reads) if i not in on_device]
    read_cpu = [x[5] if len(x) > 5 else 0.0 for x in log if x[0] == "read"]
    dev_cpu = [c for i, c in enumerate(read_cpu) if i in on_device]
    host_cpu = [c for i, c in enumerate(read_cpu) if i not in on_device]
    lags = [(x[1] - t0, x[2] - x[1]) for x in log if x[0] == "lag"]
    gil = sorted(x[2] - x[1] for x in log if x[0] == "gil")
    slept = sorted(x[2] - x[1] for x in log if x[0] == "gil_sleep")
    cmds = [x for x in log if x[0] == "cmd"]   # ("cmd", thread, by, kind, queued, start, end)

    def group(x):       # what a device command was for
        by = x[2].split()[0]
        return by if by in ("decode", "encode") else ("upload" if x[3] == "upload" else "engine other")
    groups = sorted({group(x) for x in cmds})
    bins = []
    t = 0.0
    while t < wall:
        b = t + width
        late = [d for s, d in lags if t <= s < b]
        device = {g: round(overlap([(x[5] - t0, x[6] - t0) for x in cmds if group(x) == g], t, b) / width, 2)
                  for g in groups}
        bins.append({"t": round(t, 2), "loop_lag_ms": round(1e3 * max(late, default=0.0), 1),
                     "readers": round(overlap(reads, t, b) / width, 1),
                     "device_reads": round(overlap(dev_reads, t, b) / width, 1),
                     "gemm": round(overlap(gemms, t, b) / width, 2),
                     "waiting": round(overlap(waits, t, b) / width, 2),
                     "reads_started": sum(1 for s, _ in reads if t <= s < b), "device": device})
        t = b

    def stats(spans, cpu=None):
        d = [e - s for s, e in spans]
        out = {"n": len(d), "thread_s": round(sum(d), 2), "mean_s": round(sum(d) / len(d), 4) if d else None,
               "max_s": round(max(d), 4) if d else None}
        if cpu:     # the threads' CPU time within: the rest they were blocked
            out["cpu_s"] = round(sum(cpu), 3)
        return out
    phases = {what: stats([(x[2] - t0, x[3] - t0) for x in log if x[0] == what],
                          [x[4] for x in log if x[0] == what and len(x) > 4])
              for what in ("packed", "decode_call", "batchable", "lead_or_wait", "batch_call", "plan", "decode_enqueue",
                           "devplan", "frame_plan", "call_tables", "exec_tables", "execute_launch",
                           "slot_last",
                           "host_plans", "scratch_take", "alloc", "release", "call_copy", "call_copy_blocking",
                           "encode_job", "encode")}
    sizes = [x for x in log if x[0] == "batch_size"]    # ("batch_size", thread, t, blocks, chunks)
    phases["batch_sizes"] = {"calls": len(sizes), "blocks": sum(x[3] for x in sizes), "chunks": sum(x[4] for x in sizes)}
    locks = {}      # per codec program: its launch lock's waits and holds
    for what in sorted({x[2] for x in log if x[0] == "lock"}):
        xs = [x for x in log if x[0] == "lock" and x[2] == what]
        locks[what] = {"n": len(xs), "wait_ms": round(1e3 * sum(x[4] - x[3] for x in xs) / len(xs), 2),
                       "max_wait_ms": round(1e3 * max(x[4] - x[3] for x in xs), 2),
                       "hold_ms": round(1e3 * sum(x[5] - x[4] for x in xs) / len(xs), 2)}
    commands = {}   # per thread, purpose and kind: how long its commands waited on the device, and ran
    for key in sorted({(x[1], x[2], x[3]) for x in cmds}):
        xs = [x for x in cmds if (x[1], x[2], x[3]) == key]
        commands[" ".join(key)] = {"n": len(xs), "waited_ms": round(1e3 * sum(x[5] - x[4] for x in xs) / len(xs), 2),
                                   "max_waited_ms": round(1e3 * max(x[5] - x[4] for x in xs), 2),
                                   "ran_ms": round(1e3 * sum(x[6] - x[5] for x in xs) / len(xs), 3),
                                   "device_s": round(sum(x[6] - x[5] for x in xs), 4)}
    return {"bins": bins, "reads_device": stats(dev_reads, dev_cpu), "reads_host": stats(host_reads, host_cpu), **phases,
            "commands": commands, "launch_locks": locks,
            "loop_lag_ms": {"n": len(lags), "mean": round(1e3 * sum(d for _, d in lags) / len(lags), 2) if lags else None,
                            "max": round(1e3 * max((d for _, d in lags), default=0.0), 1)},
            "gil_wait_ms": {"n": len(gil), "mean": round(1e3 * sum(gil) / len(gil), 3) if gil else None,
                            "p90": round(1e3 * gil[int(0.9 * (len(gil) - 1))], 3) if gil else None,
                            "max": round(1e3 * max(gil, default=0.0), 2)},
            "sleep_late_ms": {"n": len(slept), "mean": round(1e3 * sum(slept) / len(slept), 3) if slept else None,
                              "p90": round(1e3 * slept[int(0.9 * (len(slept) - 1))], 3) if slept else None,
                              "max": round(1e3 * max(slept, default=0.0), 2)},
            "device_declined": sum(1 for x in dev if not x[4]), "device_taken": len(taken),
            "gemm_s": round(sum(e - s for s, e in gemms), 3), "products": len(products),
            "product_wall_s": round(sum(e - s for s, e in products), 3), "wait_s": round(sum(e - s for s, e in waits), 3),
            "first_read_end": round(min((e for _, e in reads), default=0), 3),
            "first_gemm": round(min((s for s, _ in gemms), default=0), 3),
            "last_read_end": round(max((e for _, e in reads), default=0), 3),
            "last_gemm_end": round(max((e for _, e in gemms), default=0), 3)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--devices", default="gpu")
    p.add_argument("--store", default="/dev/shm")
    p.add_argument("--inputs", default=None)
    p.add_argument("--codec", choices=("zstd", "none"), default="zstd")
    p.add_argument("--modes", default="share,off")
    p.add_argument("--gemm-tasks", default="1")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--block", default="auto", help="dgemm.matmul's block: auto, 8192 or 8192x8192x4096 (M, N, K)")
    p.add_argument("--bin", type=float, default=0.1)
    args = p.parse_args()

    import dask
    import numcodecs
    import numpy as np
    import zarr
    from distributed import Client

    import dgemm
    from dgemm.accuracy import check_sample
    from dgemm.benchmarks.measure import worker_probe
    from dgemm.cluster import DeviceCluster

    compressor = numcodecs.Zstd(level=3) if args.codec == "zstd" else None
    c_codecs = zarr.codecs.ZstdCodec(level=3) if args.codec == "zstd" else None
    folder = os.path.join(args.store, f"dgemm-timeline-{os.getpid()}")
    os.makedirs(folder)
    records, devices = [], []
    try:
        arrays = make_inputs(args.inputs or folder, args.size, args.chunk, args.dtype, compressor,
                             np.random.default_rng(0))
        out = os.path.join(folder, "c.zarr")
        with DeviceCluster(args.devices, dashboard_address=":0") as cluster, Client(cluster) as client:
            client.wait_for_workers(len(cluster.device_ids), timeout=120)
            devices = sorted(str(v["device"]) for v in client.run(worker_probe).values())
            client.run(trace_install)
            for mode in args.modes.split(","):      # kernels built, buffers pinned, before any traced run
                client.run(configure, mode)
                dgemm.matmul(*arrays, out=out, client=client, overwrite=True, compressors=c_codecs)
            runs = [(m, int(t)) for _ in range(args.repeats) for m in args.modes.split(",")
                    for t in args.gemm_tasks.split(",")]
            for mode, gemm_tasks in runs:
                client.run(configure, mode)
                client.run(trace_on)
                t0 = time.perf_counter()
                with dask.config.set({"dgemm.gemm-tasks": gemm_tasks}):
                    dgemm.matmul(*arrays, out=out, client=client, overwrite=True, compressors=c_codecs,
                                 block=_block(args.block))
                wall = time.perf_counter() - t0
                logs = client.run(trace_take)
                for worker, log in logs.items():
                    sched = next((x[1] for x in log if x[0] == "sched"), {})
                    log = [x for x in log if x[0] != "sched"]
                    s = summary(log, t0, wall, args.bin)
                    raw = [[x[0]] + [round(v - t0, 4) if isinstance(v, float) else v for v in x[1:]] for x in log]
                    record = {"mode": mode, "gemm_tasks": gemm_tasks, "block": args.block, "worker": worker, "wall_s": round(wall, 3),
                              **{k: v for k, v in s.items() if k != "bins"}, "sched": sched, "bins": s["bins"],
                              "log": raw}
                    records.append(record)
                    print(json.dumps({k: v for k, v in record.items() if k not in ("bins", "log")}), flush=True)
                    print("   t  readers dev  gemm wait started lag_ms  device busy by purpose")
                    for b in s["bins"]:
                        print(f"{b['t']:5.2f} {b['readers']:5.1f} {b['device_reads']:4.1f} {b['gemm']:5.2f} "
                              f"{b['waiting']:4.2f} {b['reads_started']:3d} {b['loop_lag_ms']:6.1f}  {b['device']}",
                              flush=True)
            check = check_sample(arrays[0], arrays[1], zarr.open_array(out, mode="r"), n_rows=3, n_cols=3)
            records[-1]["check"] = check
            print(json.dumps({"check": check["passed"]}), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    meta = {"what": "the run's timeline in bins: readers busy, device decodes, GEMMs, products' waits",
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(), "host_cores": os.cpu_count(),
            "devices": devices, "device": devices[0] if devices else None,
            "commit": os.environ.get("DGEMM_COMMIT") or _commit(),
            "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:])}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "runs": records}, f, indent=1)


if __name__ == "__main__":
    main()

"""OpenCL calls made with Python's lock released, where the driver may wait inside them.

pyopencl holds Python's lock (the GIL) through most OpenCL calls: only
blocking transfers, waits and builds let it go.  NVIDIA's driver waits
inside some of the others: a buffer's release until the device has run
what came before (as CUDA's ``cuMemFree`` does), a marker behind another
thread's transfer.  Every other Python thread of the worker stops
meanwhile: the GEMM loop, the readers, the encoders, the event loop.
Under ``device-codecs: share`` py-spy found a worker's lock held 0.8 s in
``enqueue_marker`` and 0.2 s in buffers' releases over two 32768² runs
(bench/NOTES.md, issue 28, fifteenth session).

ctypes lets the lock go around a foreign call, so these calls go to the
OpenCL library directly, on the handles pyopencl holds: an ICD loader's
objects carry their driver's dispatch table, so any loader in the process
serves them, and the one pyopencl loaded is preferred.  Where no OpenCL
library can be loaded (or it lacks an entry point), pyopencl's own calls
are made, as before.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time

_lib = None
_tried = False
_lock = threading.Lock()


def library():
    """The OpenCL library (ctypes) these calls go through, or None where none can be loaded."""
    global _lib, _tried
    if not _tried:
        with _lock:
            if not _tried:
                _lib = _load()
                _tried = True
    return _lib


def _candidates() -> list:
    """The OpenCL loaders this process has mapped (pyopencl's, bundled with its wheel or the system's), then the system's."""
    names = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if "libOpenCL" in path and path.startswith("/") and path not in names:
                    names.append(path)
    except OSError:     # (not Linux)
        pass
    names += [n for n in ("libOpenCL.so.1", ctypes.util.find_library("OpenCL")) if n and n not in names]
    return names


def _load():
    handle, count = ctypes.c_void_p, ctypes.c_uint32
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
            for fn, args in (("clRetainMemObject", [handle]), ("clReleaseMemObject", [handle]),
                             ("clFlush", [handle]),
                             ("clGetEventInfo", [handle, count, ctypes.c_size_t, handle, handle]),
                             ("clEnqueueMarkerWithWaitList", [handle, count, handle, ctypes.POINTER(handle)]),
                             ("clEnqueueNDRangeKernel", [handle, handle, count, handle, handle, handle, count, handle,
                                                         ctypes.POINTER(handle)])):
                f = getattr(lib, fn)
                f.argtypes, f.restype = args, ctypes.c_int32
        except (OSError, AttributeError):
            continue
        return lib
    return None


def _check(code: int, what: str) -> None:
    """Raise pyopencl's error for a failed call, its status named as pyopencl names it (so that
    :func:`dgemm.opencl.device.device_error` tells an allocation failure from the rest)."""
    if code:
        import pyopencl as cl

        try:
            name = f" ({cl.status_code.to_string(code)})"
        except ValueError:      # (a code pyopencl does not know)
            name = ""
        raise cl.RuntimeError(f"{what} failed: OpenCL error {code}{name}")


def release(buffer, release_held) -> None:
    """Release ``buffer`` (a pyopencl memory object, not released yet) with ``release_held`` (pyopencl's
    ``release`` of it), the driver's own release made without Python's lock.

    The buffer's handle is retained first, so pyopencl's release only counts
    it down; the last reference goes in the foreign call.  (pyopencl keeps a
    released object's handle, so the caller knows it is live: retaining a
    released handle would touch freed memory.)  A buffer that
    wraps a host array (``USE_HOST_PTR``) is released by pyopencl alone: it
    keeps that array alive until the driver lets the buffer go.
    """
    lib = library()
    ptr = None
    if lib is not None and getattr(buffer, "hostbuf", None) is None:
        ptr = buffer.int_ptr
        if ptr and lib.clRetainMemObject(ptr) != 0:
            ptr = None
    try:
        release_held()
    finally:
        if ptr:
            _check(lib.clReleaseMemObject(ptr), "clReleaseMemObject")


def enqueue_marker(queue):
    """A marker on ``queue`` after every command enqueued on it so far (``pyopencl.enqueue_marker``); its event."""
    import pyopencl as cl

    lib = library()
    if lib is None:
        return cl.enqueue_marker(queue)
    event = ctypes.c_void_p()
    _check(lib.clEnqueueMarkerWithWaitList(queue.int_ptr, 0, None, ctypes.byref(event)),
           "clEnqueueMarkerWithWaitList")
    return cl.Event.from_int_ptr(event.value, retain=False)


def flush(queue) -> None:
    """``queue.flush()``."""
    lib = library()
    if lib is None:
        queue.flush()
        return
    _check(lib.clFlush(queue.int_ptr), "clFlush")


def enqueue_kernel(queue, kernel, global_size, local_size, args, wait_for=None):
    """``kernel(queue, global_size, local_size, *args, wait_for=wait_for)`` (pyopencl's launch), its event; the
    arguments set with Python's lock held, the launch made without it.

    As with pyopencl's own launch, the caller keeps two threads from
    launching one kernel object at once (its arguments are the kernel's).
    """
    import pyopencl as cl

    lib = library()
    if lib is None:
        return kernel(queue, global_size, local_size, *args, wait_for=wait_for)
    kernel.set_args(*args)
    dim = len(global_size)
    sizes = (ctypes.c_size_t * dim)(*global_size)
    local = (ctypes.c_size_t * dim)(*local_size) if local_size is not None else None
    waits = [e.int_ptr for e in (wait_for or ()) if e is not None]
    wait_list = (ctypes.c_void_p * len(waits))(*waits) if waits else None
    event = ctypes.c_void_p()
    _check(lib.clEnqueueNDRangeKernel(queue.int_ptr, kernel.int_ptr, dim, None, ctypes.cast(sizes, ctypes.c_void_p),
                                      ctypes.cast(local, ctypes.c_void_p) if local is not None else None,
                                      len(waits), ctypes.cast(wait_list, ctypes.c_void_p) if waits else None,
                                      ctypes.byref(event)), "clEnqueueNDRangeKernel")
    return cl.Event.from_int_ptr(event.value, retain=False)


_QUEUE, _EXECUTION_STATUS = 0x11D0, 0x11D3     # CL_EVENT_COMMAND_QUEUE, CL_EVENT_COMMAND_EXECUTION_STATUS


def status(event) -> int:
    """``event``'s execution status (0: it ran; negative: it failed, the error), read without Python's lock: a
    status query may wait for the driver's lock, which NVIDIA's driver holds through another thread's blocking
    transfer."""
    lib = library()
    if lib is None:
        return event.command_execution_status
    out = ctypes.c_int32()
    _check(lib.clGetEventInfo(event.int_ptr, _EXECUTION_STATUS, 4, ctypes.byref(out), None), "clGetEventInfo")
    return out.value


def wait(events, first: float = 5e-5, longest: float = 5e-4) -> None:
    """Wait for ``events`` (one or several pyopencl events) by polling their status between sleeps.

    Neither a blocking transfer nor ``clWaitForEvents``: NVIDIA's driver
    holds its own lock through a blocking transfer, and every other thread's
    OpenCL call waits for it; and its ``clWaitForEvents`` spins a core for
    as long as it waits, a core the host's decoders need (both measured on
    an H200 by bench/notes/issue-28/driver_waits.py, bench/NOTES.md).  The
    status is read without Python's lock, first after ``first`` seconds, the
    sleeps doubling up to ``longest``.  A failed command raises pyopencl's
    error, its status named.
    """
    if not isinstance(events, (list, tuple)):
        events = [events]
    lib = library()
    if lib is None:
        import pyopencl as cl

        cl.wait_for_events([e for e in events if e is not None])
        return
    status, queue, pause = ctypes.c_int32(), ctypes.c_void_p(), first
    for event in events:
        if event is None:
            continue
        # its queue flushed first, as clWaitForEvents does: a command never submitted never completes
        _check(lib.clGetEventInfo(event.int_ptr, _QUEUE, ctypes.sizeof(queue), ctypes.byref(queue), None),
               "clGetEventInfo")
        if queue.value:     # (a user event has none)
            _check(lib.clFlush(queue.value), "clFlush")
        while True:
            _check(lib.clGetEventInfo(event.int_ptr, _EXECUTION_STATUS, 4, ctypes.byref(status), None),
                   "clGetEventInfo")
            if status.value <= 0:
                break
            time.sleep(pause)
            pause = min(2 * pause, longest)
        # the command failed: its status is the error (NVIDIA's clWaitForEvents returns success for a failed user event)
        _check(min(status.value, 0), "a command waited for")


def copied(queue, dest, src, **kw):
    """``pyopencl.enqueue_copy(queue, dest, src, **kw)``, finished: enqueued without blocking and
    waited for by :func:`wait` (a blocking copy holds the driver's lock throughout); its event."""
    import pyopencl as cl

    event = cl.enqueue_copy(queue, dest, src, is_blocking=False, **kw)
    wait(event)
    return event


class Kernel:
    """A pyopencl kernel whose launches (``kernel(queue, global_size, local_size, *args, wait_for=None)``) go through
    :func:`enqueue_kernel`; anything else is the kernel's."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __call__(self, queue, global_size, local_size, *args, wait_for=None, **kw):
        if kw:      # (an offset, pyopencl's flags: its own launch)
            return self.kernel(queue, global_size, local_size, *args, wait_for=wait_for, **kw)
        return enqueue_kernel(queue, self.kernel, global_size, local_size, args, wait_for)

    def __getattr__(self, name):
        return getattr(self.kernel, name)

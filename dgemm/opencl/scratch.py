"""Each reader thread's own device buffers and command queue, kept from one call to the next.

A device decoder call (:mod:`dgemm.opencl.codecs`) needs a dozen buffers:
the compressed frames, their tables, the literals, error rows.  Allocating
and releasing them for every block costs more than decoding it: NVIDIA's
driver frees device memory only once the device is idle, so a release waits
for the GEMM kernel running beside it.  Here each thread keeps its buffers by
name, grown when a call needs more, and :meth:`Scratch.release` (called by
:meth:`Device.trim <dgemm.opencl.device.Device.trim>` between runs) gives
them all back, so the device's memory returns to idle after every product.

Each thread also gets its own in-order queue: a decode call waits for its
own commands only, not for every upload other threads queued on the
device's shared transfer queue before it.
"""
from __future__ import annotations

import threading


class Scratch:
    """Per-thread device buffers (by name, grow-only) and queues of one :class:`~dgemm.opencl.device.Device`."""

    def __init__(self, device):
        self._device = device
        self._lock = threading.Lock()
        self._buffers: dict[tuple[int, str], object] = {}
        self._queues: dict[int, object] = {}

    def buffer(self, what: str, nbytes: int):
        """This thread's device buffer named ``what``, of at least ``nbytes``, kept for its next call.

        The buffer is the thread's alone; its contents are whatever the
        last call left (poisoned first under ``DGEMM_POISON``, as new
        buffers are).  A larger request replaces it (released: OpenCL
        frees it once the commands that use it have run).
        """
        key = (threading.get_ident(), what)
        nbytes = max(int(nbytes), 1)
        with self._lock:
            held = self._buffers.get(key)
        if held is not None and held.size >= nbytes:
            return held
        if held is not None:
            held.release()
        # a little room, so that blocks a few bytes apart do not each grow the buffer
        fresh = self._device.buffer(nbytes + (nbytes >> 4), what)
        with self._lock:
            self._buffers[key] = fresh
        return fresh

    def queue(self):
        """This thread's in-order profiling queue on the device (made once per thread)."""
        me = threading.get_ident()
        with self._lock:
            q = self._queues.get(me)
        if q is None:
            import pyopencl as cl

            q = cl.CommandQueue(self._device.context,
                                properties=cl.command_queue_properties.PROFILING_ENABLE)
            with self._lock:
                self._queues[me] = q
        return q

    def release(self, busy=()) -> int:
        """Release the buffers of every thread not in ``busy`` (thread ids); returns how many."""
        with self._lock:
            gone = [k for k in self._buffers if k[0] not in busy]
            bufs = [self._buffers.pop(k) for k in gone]
        for buf in bufs:
            buf.release()
        return len(bufs)

    def nbytes(self) -> int:
        """Bytes held now, all threads together."""
        with self._lock:
            return sum(b.size for b in self._buffers.values())

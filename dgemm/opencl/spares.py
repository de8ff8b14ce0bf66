"""Blocks' source buffers kept for the next block of their size, instead of released beside the GEMMs.

A block that is not staged where it lies (transposed, or padded to the tiles) comes to the device in a buffer of
its own ``rows x cols`` (an upload's, or a device decode's), which the padding or transposing kernel reads into
the staged block.  Released as soon as that kernel was enqueued, the buffer cost its reader thread a wait: NVIDIA's
driver frees device memory only once the device has run what came before, the GEMMs beside, so each release
took about 10 ms there, 72 of them in a run of 49152² (0.8 s of the readers' time, each holding back its block's
hand-over to the products; bench/NOTES.md, issue 28, twenty-eighth session).

Here the buffer goes back to a free list with that kernel's event, and :meth:`Spares.take` hands it out again
for a block of the same size once the event has run (never before: the kernel may not have read it yet).  The
list holds at most what the readers held at once (a buffer is made only where none is free), and at most
:data:`KEPT` buffers; :meth:`Spares.release` (from :meth:`Device.trim <dgemm.opencl.device.Device.trim>`,
at every run's end) gives them all back, so the device's memory returns to idle after every product.
"""
from __future__ import annotations

import threading

from dgemm.opencl import poison

# Free buffers a device keeps at most: past them a buffer given back is released, as before (a worker's reader
# threads are 12 to 32, and each holds one such buffer at a time)
KEPT = 32


def _ran(event) -> bool:
    """Whether ``event`` has run, or ended in an error (then nothing reads the buffer)."""
    import pyopencl as cl

    return event.command_execution_status <= cl.command_execution_status.COMPLETE   # (errors are negative)


class Spares:
    """Free device buffers of one :class:`~dgemm.opencl.device.Device`, each with the event after which it is free."""

    def __init__(self, device, kept: int = KEPT):
        self._device = device
        self._kept = kept
        self._lock = threading.Lock()
        self._free: list[tuple[object, object, int]] = []     # (buffer, event, bytes), oldest first
        self.reused = 0     # buffers handed out again (tests, benchmarks)

    def take(self, nbytes: int, what: str):
        """A device buffer of exactly ``nbytes`` no command reads any more: a free one, else a new one
        (:meth:`Device.buffer <dgemm.opencl.device.Device.buffer>`, whose error names ``what``)."""
        nbytes = max(int(nbytes), 1)
        with self._lock:
            for i, (buf, event, size) in enumerate(self._free):
                if size == nbytes and _ran(event):
                    del self._free[i]
                    self.reused += 1
                    break
            else:
                buf = None
        if buf is None:
            return self._device.buffer(nbytes, what)
        return poison.fill(self._device.transfer_queue, buf)    # (as Device.buffer fills a new one, in the tests)

    def give(self, buf, event) -> None:
        """``buf`` (from :meth:`take`) free once ``event`` (the kernel reading it) has run; released where there is
        none (None: nothing was enqueued, or what was failed; OpenCL keeps it until that has run), or where
        :data:`KEPT` are kept already."""
        if event is None:
            buf.release()
            return
        with self._lock:
            if len(self._free) < self._kept:
                self._free.append((buf, event, buf.size))
                return
        buf.release()

    def held(self) -> int:
        """Bytes of the free buffers kept."""
        with self._lock:
            return sum(size for _, _, size in self._free)

    def release(self) -> None:
        """Give every free buffer back (OpenCL frees each once the commands using it have run)."""
        with self._lock:
            free, self._free = self._free, []
        for buf, _, _ in free:
            buf.release()

"""Blocks' source buffers kept for the next block of their size, instead of released beside the GEMMs.

A block that is not staged where it lies (transposed, or padded to the tiles) comes to the device in a buffer of
its own ``rows x cols`` (an upload's, or a device decode's), which the padding or transposing kernel reads into
the staged block.  Released as soon as that kernel was enqueued, the buffer cost its reader thread a wait: NVIDIA's
driver frees device memory only once the device has run what came before, the GEMMs beside, so each release
took about 10 ms there, 72 of them in a run of 49152² (0.8 s of the readers' time), and the block reached its
product only after it (bench/NOTES.md, issue 28, twenty-eighth session).

Here the buffer goes back to a free list with that kernel's event, and :meth:`Spares.take` hands it out again
for a block of the same size once the event has run (never before: the kernel may not have read it yet).  A
buffer is made only where none of its size is free, so the list holds what the blocks had in flight at once, up
to :data:`KEPT` buffers and :data:`KEPT_SHARE` of the device's memory (past them the oldest goes).  The panel
cache's budget leaves that room to the device (``dgemm.sizes.MEMORY_FRACTION`` plans 80 % of it), and a buffer
the device cannot allocate while spares are kept is asked for again once they are given back.
:meth:`Spares.release` (from :meth:`Device.trim <dgemm.opencl.device.Device.trim>`, at every run's end) gives
them all back, so the device's memory returns to idle after every product.
"""
from __future__ import annotations

import threading

from dgemm.opencl import nogil, poison

# Free buffers a device keeps at most, and at most this share of its memory: 2.8 GB (21 blocks of 8192 x 4096
# float32) on a 141 GB H200, 1.6 GB on an 80 GB H100; a worker's reader threads are 12 to 32, each with one
# such buffer at a time
KEPT = 32
KEPT_SHARE = 0.02


class Spares:
    """Free device buffers of one :class:`~dgemm.opencl.device.Device`, each with the event after which it is free."""

    UNREAD = "unread"   # give()'s event for a buffer nothing was enqueued on (a block declined before its decode)

    def __init__(self, device, kept: int = KEPT, kept_bytes: int | None = None):
        self._device = device
        self._kept = kept
        self._kept_bytes = int(KEPT_SHARE * device.info.global_mem) if kept_bytes is None else kept_bytes
        self._lock = threading.Lock()
        self._free: list[tuple[object, object, int]] = []     # (buffer, event, bytes), oldest first
        self.reused = 0     # buffers handed out again (tests, benchmarks)

    def take(self, nbytes: int, what: str):
        """A device buffer of exactly ``nbytes`` no command reads any more: a free one, else a new one
        (:meth:`Device.buffer <dgemm.opencl.device.Device.buffer>`, whose error names ``what``)."""
        nbytes = max(int(nbytes), 1)
        with self._lock:
            sized = [(buf, event) for buf, event, size in self._free if size == nbytes]
        for buf, event in sized:
            if event is not self.UNREAD and nogil.status(event) > 0:    # (queued or running; 0 ran, < 0 failed)
                continue
            with self._lock:    # (still there: another thread may have taken it meanwhile)
                at = next((i for i, entry in enumerate(self._free) if entry[0] is buf), None)
                if at is None:
                    continue
                del self._free[at]
                self.reused += 1
            return poison.fill(self._device.transfer_queue, buf)    # (as Device.buffer fills a new one, in tests)
        return self._device.buffer(nbytes, what)

    def give(self, buf, event) -> None:
        """``buf`` (from :meth:`take`) free once ``event`` (the kernel reading it) has run, or at once where it is
        :attr:`UNREAD` (nothing was enqueued on it); released where it is None (what was enqueued failed: OpenCL
        keeps it until that has run).  Past the buffers and bytes kept, the oldest free buffer is released."""
        if event is None:
            buf.release()
            return
        with self._lock:
            self._free.append((buf, event, buf.size))
            out = []
            while self._free and (len(self._free) > self._kept or self._bytes() > self._kept_bytes):
                out.append(self._free.pop(0)[0])
        for old in out:
            old.release()

    def _bytes(self) -> int:
        return sum(size for _, _, size in self._free)

    def held(self) -> int:
        """Bytes of the free buffers kept."""
        with self._lock:
            return self._bytes()

    def release(self) -> int:
        """Give every free buffer back (OpenCL frees each once the commands using it have run); their bytes."""
        with self._lock:
            free, self._free = self._free, []
        for buf, _, _ in free:
            buf.release()
        return sum(size for _, _, size in free)

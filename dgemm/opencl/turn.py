"""A block product's hold on its engine's lock (:class:`dgemm.opencl.engine.BlockEngine`)."""
from __future__ import annotations

import threading


class Turn:
    """A product's hold on its engine's lock, which the product may give up before it returns.

    A device runs one product at a time, but a product's last command, the
    download of its result, need not keep the next product out: the GEMM
    kernels and the unpadding share one in-order queue, so the next
    product's GEMMs run after this one's unpadding has read the
    accumulator; the download goes on a queue of its own from one of two
    result buffers used in turn, and an unpadding waits for its buffer's
    last download.  With two GEMM tasks per device (the ``gemm-tasks``
    setting) the device then multiplies the next block while this one comes
    down, or while its chunks are encoded on the device (a ``finish``: the
    next product in once the unpadding is enqueued; the product after it
    waits on the host until the encode has returned before it reuses the
    result buffer).
    """

    def __init__(self, lock: threading.Lock):
        self._lock = lock
        self.held = False

    def __enter__(self) -> "Turn":
        self._lock.acquire()
        self.held = True
        return self

    def release(self) -> None:
        if self.held:
            self.held = False
            self._lock.release()

    def __exit__(self, *exc) -> None:
        self.release()

"""A debug hook for the tests (:func:`poisoned`), not a setting: while on, every buffer a device hands out is
filled with :data:`POISON_BYTE` first (:class:`~dgemm.opencl.device.Device`'s new buffers and lent host memory,
and the blocks' source buffers it hands out again, :mod:`dgemm.opencl.spares`)."""
from __future__ import annotations

import contextlib

import numpy as np

POISON = False
# All-ones bytes are a NaN in float32 and in float64 alike, whatever a buffer ends up holding.
POISON_BYTE = 0xFF


@contextlib.contextmanager
def poisoned():
    """Within this block, every new device buffer and lent host buffer is filled with NaN first.

    For tests: fresh memory often holds zeros (or an earlier product), which
    hides padding or elements the kernels never wrote; NaN cannot hide.
    Covers :meth:`Device.buffer <dgemm.opencl.device.Device.buffer>` (the engine's accumulators, staged blocks
    and the panel cache's entries, staging buffers), :meth:`Device.staging` and :meth:`Device.host_array`, and
    the source buffers :class:`~dgemm.opencl.spares.Spares` hands out again.  Nothing is filled outside the block.
    """
    global POISON
    saved, POISON = POISON, True
    try:
        yield
    finally:
        POISON = saved


def fill(queue, buf):
    """``buf`` (a device buffer) filled with :data:`POISON_BYTE` on ``queue`` where poisoned, waited for (it may be
    used next on any queue); returns it."""
    if POISON:
        import pyopencl as cl
        cl.enqueue_fill_buffer(queue, buf, np.uint8(POISON_BYTE), 0, buf.size).wait()
    return buf

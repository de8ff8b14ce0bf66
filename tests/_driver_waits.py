"""Which of dgemm's calls wait inside the OpenCL driver (shared by the decode and encode tests).

On NVIDIA's driver a blocking transfer holds the driver's own lock through
the copy, and every other thread's OpenCL call waits for it (with Python's
lock held, for most of pyopencl's calls); ``clWaitForEvents`` spins a core
as long as it waits, and so does a blocking read behind a chain of kernels
(bench/NOTES.md, issue 28: driver_waits.py).  So the paths that run beside
the GEMMs wait through :mod:`dgemm.opencl.nogil` instead.  PoCL shows
neither cost, so these tests look at the calls made, not at the time.
"""
from __future__ import annotations

import contextlib
import os
import sys

import pytest

import dgemm

# dgemm's own files, by where the package is (a checkout in a folder named dgemm holds its virtual environment's
# packages too: a name with "dgemm" in it tells nothing)
_OURS = os.path.dirname(os.path.abspath(dgemm.__file__)) + os.sep


def _caller() -> str | None:
    """``file:line`` of the nearest frame outside pyopencl and this module, where it is dgemm's code; else None."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if os.sep + "pyopencl" + os.sep not in name and name != __file__:
            break
        frame = frame.f_back
    if frame is None:
        return None
    name = os.path.abspath(frame.f_code.co_filename)
    if not name.startswith(_OURS):
        return None
    return f"{name[len(_OURS):]}:{frame.f_lineno}"


@contextlib.contextmanager
def waits_in_the_driver():
    """The list of dgemm's calls, from any thread, to ``pyopencl.wait_for_events``, ``Event.wait`` or a blocking
    ``pyopencl.enqueue_copy`` to or from the host made within the block (each ``(what, file:line)``)."""
    import pyopencl as cl

    found: list = []
    wait_for_events, enqueue_copy, event_wait = cl.wait_for_events, cl.enqueue_copy, cl.Event.wait

    def waited(events):
        if (at := _caller()) is not None:
            found.append(("wait_for_events", at))
        return wait_for_events(events)

    def copied(queue, dest, src, **kw):
        host = not (isinstance(dest, cl.MemoryObjectHolder) and isinstance(src, cl.MemoryObjectHolder))
        if host and kw.get("is_blocking", True) and (at := _caller()) is not None:   # (between buffers: never)
            found.append(("blocking enqueue_copy", at))
        return enqueue_copy(queue, dest, src, **kw)

    def event_waited(self):
        if (at := _caller()) is not None:
            found.append(("Event.wait", at))
        return event_wait(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cl, "wait_for_events", waited)
        patch.setattr(cl, "enqueue_copy", copied)
        patch.setattr(cl.Event, "wait", event_waited)
        yield found

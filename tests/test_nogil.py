"""dgemm.opencl.nogil: releases, markers and flushes through the OpenCL library itself (Python's lock let go).

On this host's PoCL, through the loader pyopencl loaded.  A spy around the
library checks which calls went through it, and OpenCL's own reference
count that the foreign release is the buffer's last: pyopencl's release
before it only counted down.  (That ctypes lets Python's lock go around a
foreign call is ctypes' contract; no driver here waits long enough inside
a release to show it.)
"""
from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

pyopencl = pytest.importorskip("pyopencl")

from dgemm.opencl import nogil  # noqa: E402

CL_MEM_REFERENCE_COUNT = 0x1105


@pytest.fixture(scope="module")
def dev(any_device):
    return any_device


def _refcount(ptr: int) -> int:
    """OpenCL's count of references to the memory object ``ptr`` (through the real library, never a spy)."""
    lib = nogil._load()
    f = lib.clGetMemObjectInfo
    f.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    count = ctypes.c_uint32()
    assert f(ptr, CL_MEM_REFERENCE_COUNT, ctypes.sizeof(count), ctypes.byref(count), None) == 0
    return count.value


class _Spy:
    """The library with its calls noted: ``(name, handle, the handle's reference count just before)``."""

    def __init__(self, lib, fail: dict | None = None):
        self._lib, self.calls, self._fail = lib, [], fail or {}

    def __getattr__(self, name):
        real = getattr(self._lib, name)

        def call(*args):
            before = _refcount(args[0]) if name.endswith("MemObject") else None
            self.calls.append((name, args[0], before))
            if name in self._fail:
                return self._fail[name]
            return real(*args)
        return call


@pytest.fixture
def spy(monkeypatch):
    lib = nogil.library()
    if lib is None:
        pytest.fail("no OpenCL library loaded by ctypes here, though pyopencl runs: nogil would fall back everywhere")
    s = _Spy(lib)
    monkeypatch.setattr(nogil, "_lib", s)
    return s


def test_the_library_is_the_loader_pyopencl_loaded(dev):
    mapped = [p for p in nogil._candidates() if p.startswith("/")]
    assert nogil.library() is not None
    if mapped:     # (Linux): the process's own loader comes first
        assert nogil.library()._name == mapped[0]


def test_a_device_buffer_goes_in_the_foreign_release_its_last_reference(dev, spy):
    before = dev.live_buffers()
    buf = dev.buffer(1 << 20, "a test buffer")
    ptr = buf.int_ptr
    assert dev.live_buffers()["buffers"] == before["buffers"] + 1
    buf.release()
    assert [c[:2] for c in spy.calls] == [("clRetainMemObject", ptr), ("clReleaseMemObject", ptr)]
    assert spy.calls[0][2] == 1, "the buffer had other references before the release"
    assert spy.calls[1][2] == 1, "pyopencl's release did not count down first: the foreign one was not the last"
    assert dev.live_buffers() == before
    with pytest.raises(pyopencl.LogicError):    # released twice: pyopencl says so, nothing touches freed memory
        buf.release()
    assert len(spy.calls) == 2


def test_a_release_that_fails_gives_back_the_reference_it_took(dev, spy):
    buf = pyopencl.Buffer(dev.context, pyopencl.mem_flags.READ_WRITE, 4096)
    ptr = buf.int_ptr

    def refused():
        raise RuntimeError("the held release failed")
    with pytest.raises(RuntimeError, match="held release failed"):
        nogil.release(buf, refused)
    assert _refcount(ptr) == 1
    buf.release()


def test_a_buffer_over_a_host_array_is_released_by_pyopencl_alone(dev, spy):
    host = np.arange(1024, dtype=np.float32)
    buf = pyopencl.Buffer(dev.context, pyopencl.mem_flags.READ_WRITE | pyopencl.mem_flags.USE_HOST_PTR, hostbuf=host)
    nogil.release(buf, buf.release)
    assert spy.calls == []


def test_a_marker_runs_after_what_came_before_and_has_profiling(dev, spy):
    q = dev.queue
    host = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32)
    buf = dev.buffer(host.nbytes, "a marked buffer")
    try:
        copy = pyopencl.enqueue_copy(q, buf, host, is_blocking=False)
        marker = nogil.enqueue_marker(q)
        nogil.flush(q)
        assert [c[0] for c in spy.calls] == ["clEnqueueMarkerWithWaitList", "clFlush"]
        assert isinstance(marker, pyopencl.Event)
        assert marker.command_type == pyopencl.command_type.MARKER
        marker.wait()
        assert copy.command_execution_status == pyopencl.command_execution_status.COMPLETE
        assert marker.profile.queued > 0 and marker.profile.end >= copy.profile.end
        back = np.full_like(host, np.nan)
        pyopencl.enqueue_copy(q, back, buf, is_blocking=True)
        np.testing.assert_array_equal(back, host)
    finally:
        buf.release()


def test_an_opencl_error_is_raised_as_pyopencls(dev, monkeypatch):
    monkeypatch.setattr(nogil, "_lib", _Spy(nogil.library(), fail={"clFlush": -36}))
    with pytest.raises(pyopencl.RuntimeError, match=r"clFlush failed: OpenCL error -36"):
        nogil.flush(dev.queue)


def test_an_allocation_failure_in_a_foreign_call_is_the_devices_memory_error(dev, monkeypatch):
    from dgemm.errors import DeviceMemoryError
    from dgemm.opencl.device import device_error

    monkeypatch.setattr(nogil, "_lib", _Spy(nogil.library(), fail={"clEnqueueMarkerWithWaitList": -4}))
    with pytest.raises(pyopencl.RuntimeError, match="MEM_OBJECT_ALLOCATION_FAILURE") as info:
        nogil.enqueue_marker(dev.queue)
    assert isinstance(device_error("a device", "marking the queue", info.value), DeviceMemoryError)
    monkeypatch.setattr(nogil, "_lib", _Spy(nogil.library(), fail={"clFlush": -99999}))
    with pytest.raises(pyopencl.RuntimeError, match=r"clFlush failed: OpenCL error -99999$"):
        nogil.flush(dev.queue)


@pytest.mark.parametrize("library", ["ctypes", "pyopencl"])
def test_an_events_status_is_what_pyopencl_reads(dev, monkeypatch, spy, library):
    """``status``: waiting (positive), ran (0) or failed (negative, the error) as pyopencl reads it, through the
    library's clGetEventInfo (or pyopencl's, without one)."""
    if library == "pyopencl":
        monkeypatch.setattr(nogil, "_lib", None)
        monkeypatch.setattr(nogil, "_tried", True)
    done = pyopencl.enqueue_marker(dev.queue)
    done.wait()
    held, failed = pyopencl.UserEvent(dev.context), pyopencl.UserEvent(dev.context)
    failed.set_status(-5)
    try:
        got = [nogil.status(e) for e in (done, held, failed)]
        assert got == [e.command_execution_status for e in (done, held, failed)], got
        assert got[0] == 0 and got[1] > 0 and got[2] == -5, got
        assert any(c[0] == "clGetEventInfo" for c in spy.calls) == (library == "ctypes")
    finally:
        held.set_status(pyopencl.command_execution_status.COMPLETE)


def test_without_a_library_pyopencl_makes_the_calls(dev, monkeypatch):
    monkeypatch.setattr(nogil, "_lib", None)
    monkeypatch.setattr(nogil, "_tried", True)
    before = dev.live_buffers()
    buf = dev.buffer(4096, "a buffer released by pyopencl")
    buf.release()
    assert dev.live_buffers() == before
    marker = nogil.enqueue_marker(dev.queue)
    nogil.flush(dev.queue)
    marker.wait()
    assert marker.command_execution_status == pyopencl.command_execution_status.COMPLETE


_SCALE = """
__kernel void scale(__global const float *x, __global float *y, const float a, const uint n) {
    const uint i = get_global_id(0);
    if (i < n) y[i] = a * x[i];
}
"""


def test_a_kernel_launched_without_the_lock_computes_what_pyopencls_launch_does(dev, spy):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(1000).astype(np.float32)
    q = dev.queue
    kernel = nogil.Kernel(pyopencl.Kernel(pyopencl.Program(dev.context, _SCALE).build(), "scale"))
    src = pyopencl.Buffer(dev.context, pyopencl.mem_flags.READ_WRITE, x.nbytes)
    dst = pyopencl.Buffer(dev.context, pyopencl.mem_flags.READ_WRITE, x.nbytes)
    try:
        up = pyopencl.enqueue_copy(q, src, x, is_blocking=False)
        pyopencl.enqueue_fill_buffer(q, dst, np.float32(np.nan), 0, x.nbytes).wait()     # poisoned
        ev = kernel(q, (1024,), (64,), src, dst, np.float32(-2.5), np.uint32(x.size), wait_for=[up])
        assert [c[0] for c in spy.calls] == ["clEnqueueNDRangeKernel"]
        assert isinstance(ev, pyopencl.Event) and ev.command_type == pyopencl.command_type.NDRANGE_KERNEL
        ev.wait()
        got = np.empty_like(x)
        pyopencl.enqueue_copy(q, got, dst, is_blocking=True)
        np.testing.assert_array_equal(got, np.float32(-2.5) * x)
        # no local size (the driver picks it), and pyopencl's own launch where it is given what it alone knows
        kernel(q, (x.size,), None, src, dst, np.float32(3.0), np.uint32(x.size)).wait()
        kernel(q, (x.size,), None, src, dst, np.float32(0.5), np.uint32(x.size), global_offset=(0,)).wait()
        assert [c[0] for c in spy.calls] == ["clEnqueueNDRangeKernel"] * 2
        pyopencl.enqueue_copy(q, got, dst, is_blocking=True)
        np.testing.assert_array_equal(got, np.float32(0.5) * x)
        assert kernel.function_name == "scale"      # (anything else is the kernel's)
        gate = pyopencl.UserEvent(dev.context)     # the launch waits for what it is given to wait for
        held = kernel(q, (x.size,), None, src, dst, np.float32(4.0), np.uint32(x.size), wait_for=[gate])
        nogil.flush(q)
        time.sleep(0.2)
        assert held.command_execution_status != pyopencl.command_execution_status.COMPLETE
        gate.set_status(pyopencl.command_execution_status.COMPLETE)
        held.wait()
        pyopencl.enqueue_copy(q, got, dst, is_blocking=True)
        np.testing.assert_array_equal(got, np.float32(4.0) * x)
    finally:
        src.release()
        dst.release()


def test_a_copy_has_run_when_copied_returns_its_queue_flushed_first(dev, spy):
    q = dev.transfer_queue
    host = np.random.default_rng(3).standard_normal(1 << 20).astype(np.float32)
    buf = dev.buffer(host.nbytes, "a copied buffer")
    try:
        pyopencl.enqueue_fill_buffer(q, buf, np.float32(np.nan), 0, host.nbytes).wait()     # poisoned
        ev = nogil.copied(q, buf, host)
        assert ev.command_execution_status == pyopencl.command_execution_status.COMPLETE
        assert ev.command_type == pyopencl.command_type.WRITE_BUFFER
        names = [c[0] for c in spy.calls]
        assert names[:2] == ["clGetEventInfo", "clFlush"], "the queue is not flushed before the status is polled"
        assert spy.calls[1][1] == q.int_ptr and set(names[2:]) == {"clGetEventInfo"}
        back = np.empty_like(host)
        pyopencl.enqueue_copy(q, back, buf, is_blocking=True)
        np.testing.assert_array_equal(back, host)
    finally:
        buf.release()


def test_a_wait_returns_once_the_command_it_waits_for_has_run(dev, spy):
    import threading

    gate = pyopencl.UserEvent(dev.context)
    marker = pyopencl.enqueue_marker(dev.queue, wait_for=[gate])
    opened = threading.Timer(0.3, gate.set_status, (pyopencl.command_execution_status.COMPLETE,))
    t0 = time.perf_counter()
    opened.start()
    nogil.wait([None, marker])      # (None entries, as in a list of optional events, are passed over)
    assert time.perf_counter() - t0 >= 0.29
    assert marker.command_execution_status == pyopencl.command_execution_status.COMPLETE
    assert len(spy.calls) > 3, "the status was read only once or twice over a 0.3 s wait"
    nogil.wait(marker)      # (one event, already complete: one status read and a flush)


def test_a_failed_command_raises_pyopencls_error(dev, spy):
    import threading

    gate = pyopencl.UserEvent(dev.context)
    threading.Timer(0.1, gate.set_status, (-5,)).start()     # (a negative status: the command failed)
    with pytest.raises(pyopencl.RuntimeError, match=r"a command waited for failed: OpenCL error -5"):
        nogil.wait(gate)


def test_without_a_library_a_wait_is_pyopencls(dev, monkeypatch):
    monkeypatch.setattr(nogil, "_lib", None)
    monkeypatch.setattr(nogil, "_tried", True)
    host = np.arange(4096, dtype=np.float32)
    buf = dev.buffer(host.nbytes, "a buffer copied by pyopencl")
    try:
        ev = nogil.copied(dev.transfer_queue, buf, host)
        assert ev.command_execution_status == pyopencl.command_execution_status.COMPLETE
        nogil.wait([ev, None])
    finally:
        buf.release()

"""Device.spares (dgemm/opencl/spares.py): blocks' source buffers kept for the next block of their size."""
from __future__ import annotations

import numpy as np
import pytest

from dgemm.opencl.spares import Spares


def ran(device):
    """An event that has run (a marker waited for)."""
    import pyopencl as cl

    ev = cl.enqueue_marker(device.queue)
    ev.wait()
    return ev


@pytest.fixture
def user_event(any_device):
    """``user_event()``: a pyopencl UserEvent (a command that has not run until the test says so), each set
    complete after the test."""
    import pyopencl as cl

    made = []

    def make():
        made.append(cl.UserEvent(any_device.context))
        return made[-1]
    yield make
    for e in made:
        if e.command_execution_status > cl.command_execution_status.COMPLETE:
            e.set_status(cl.command_execution_status.COMPLETE)


def test_a_buffer_given_back_is_taken_again_once_its_event_has_run(any_device, user_event):
    import pyopencl as cl

    spares = Spares(any_device)
    before = any_device.live_buffers()["buffers"]
    first = spares.take(4096, "a test block")
    gate = user_event()
    spares.give(first, gate)
    second = spares.take(4096, "a test block")
    assert second is not first, "a buffer handed out while the kernel reading it had not run"
    gate.set_status(cl.command_execution_status.COMPLETE)
    assert spares.take(4096, "a test block") is first and spares.reused == 1
    spares.give(first, ran(any_device))
    spares.give(second, ran(any_device))
    assert spares.held() == 2 * 4096
    other = spares.take(1000, "another size")
    assert other is not first and other is not second, "a buffer of another size handed out"
    assert any_device.live_buffers()["buffers"] == before + 3
    spares.release()
    assert spares.held() == 0
    assert any_device.live_buffers()["buffers"] == before + 1     # (the one of another size, still out)
    other.release()


@pytest.mark.parametrize("limit", ["buffers", "bytes"])
def test_past_the_kept_buffers_or_bytes_the_oldest_is_released(any_device, limit):
    """Kept: at most ``kept`` buffers and ``kept_bytes`` bytes; past either, the oldest goes (a size no block asks
    for any more does not stay in the way of those in use)."""
    spares = Spares(any_device, **({"kept": 2} if limit == "buffers" else {"kept_bytes": 2 * 256 + 100}))
    before = any_device.live_buffers()["buffers"]
    bufs = [spares.take(256, "a test block") for _ in range(3)]
    for b in bufs:
        spares.give(b, ran(any_device))
    assert spares.held() == 2 * 256 and any_device.live_buffers()["buffers"] == before + 2
    assert spares.take(256, "a test block") is bufs[1] and spares.take(256, "a test block") is bufs[2]
    for b in bufs[1:]:
        b.release()
    assert any_device.live_buffers()["buffers"] == before
    huge = spares.take(1000, "a block past the bytes kept")
    spares.give(huge, ran(any_device))
    assert spares.held() == (1000 if limit == "buffers" else 0)
    spares.release()
    assert any_device.live_buffers()["buffers"] == before


def test_a_buffer_the_device_cannot_make_is_asked_again_without_the_spares(any_device, monkeypatch):
    """Out of device memory while spares are kept: they are given back and the buffer asked for again; with none
    kept, the device's error (naming the buffer) stands."""
    from dgemm.errors import DeviceMemoryError

    any_device.trim(keep_pinned=True)
    real, failed = any_device._allocate, []

    def short(*args):
        if not failed:
            failed.append(args)
            raise DeviceMemoryError("device 'test': allocating a test block failed; the device is out of memory")
        return real(*args)

    spare = any_device.spares.take(4096, "a test block")
    any_device.spares.give(spare, ran(any_device))
    monkeypatch.setattr(any_device, "_allocate", short)
    got = any_device.buffer(64, "a test block")
    assert len(failed) == 1 and any_device.spares.held() == 0
    got.release()
    failed.clear()
    with pytest.raises(DeviceMemoryError, match="a test block"):
        any_device.buffer(64, "a test block")


def test_a_buffer_with_nothing_enqueued_is_released(any_device):
    """None for the event (nothing read it, or what was enqueued failed): released, not kept."""
    spares = Spares(any_device)
    before = any_device.live_buffers()["buffers"]
    spares.give(spares.take(128, "a test block"), None)
    assert spares.held() == 0 and any_device.live_buffers()["buffers"] == before


def test_a_failed_command_frees_its_buffer(any_device, user_event):
    """An event that ended in an error: nothing reads the buffer any more."""
    spares = Spares(any_device)
    buf = spares.take(512, "a test block")
    gate = user_event()
    gate.set_status(-5)     # (CL_OUT_OF_RESOURCES: any negative status is an error)
    spares.give(buf, gate)
    assert spares.take(512, "a test block") is buf
    buf.release()


def test_a_buffer_taken_again_is_poisoned_as_a_new_one_is(any_device):
    import pyopencl as cl

    from dgemm.opencl import device as device_module

    spares = Spares(any_device)
    buf = spares.take(64, "a test block")
    cl.enqueue_copy(any_device.queue, buf, np.arange(16, dtype=np.float32), is_blocking=True)
    spares.give(buf, ran(any_device))
    with device_module.poisoned():
        again = spares.take(64, "a test block")
    assert again is buf
    got = np.empty(64, np.uint8)
    cl.enqueue_copy(any_device.queue, got, again, is_blocking=True)
    assert (got == device_module.POISON_BYTE).all(), "a reused buffer kept the last block's values"
    again.release()


def test_trim_gives_the_spares_back(any_device):
    any_device.trim(keep_pinned=True)
    before = any_device.live_buffers()
    buf = any_device.spares.take(2048, "a test block")
    any_device.spares.give(buf, ran(any_device))
    assert any_device.live_buffers()["buffers"] == before["buffers"] + 1
    any_device.trim(keep_pinned=True)
    assert any_device.live_buffers() == before and any_device.spares.held() == 0

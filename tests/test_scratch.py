"""Device.scratch (dgemm/opencl/scratch.py): reader threads' decode buffers and queues, per thread or per slot."""
from __future__ import annotations

import threading
import time

import pytest

from dgemm.opencl.scratch import Scratch


def test_at_most_slots_threads_hold_buffers_at_once(any_device):
    """12 threads decoding through 3 slots: never more than 3 at once, and the device then holds 3 slots'
    buffers (not 12 threads'), each reused by the next thread that borrows its slot."""
    scratch = Scratch(any_device, slots=3)
    inside, most, lock = [0], [0], threading.Lock()
    seen = []

    def reader():
        with scratch.slot():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            buf = scratch.buffer("frames", 1000)
            seen.append(buf.int_ptr)
            assert scratch.queue() is scratch.queue()
            time.sleep(0.05)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=reader) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 3
    assert len(set(seen)) == 3, "each slot's buffer is made once and reused"
    assert scratch.nbytes() == 3 * (1000 + (1000 >> 4))
    assert scratch.release() == 3 and scratch.nbytes() == 0


def test_release_leaves_a_held_slot_and_a_busy_thread_alone(any_device):
    scratch = Scratch(any_device, slots=2)
    scratch.buffer("mine", 64)                       # this thread's, outside any slot
    with scratch.slot():
        scratch.buffer("slot", 64)
        assert scratch.release(busy={threading.get_ident()}) == 0     # the slot is held, the thread busy
        assert scratch.release() == 1                                 # the thread's own, not the slot's
    assert scratch.release() == 1 and scratch.nbytes() == 0


def test_a_larger_request_replaces_the_buffer(any_device):
    scratch = Scratch(any_device, slots=1)
    with scratch.slot():
        small = scratch.buffer("x", 100)
        assert scratch.buffer("x", 50) is small
        big = scratch.buffer("x", 10_000)
        assert big is not small and big.size >= 10_000
    assert any_device.live_buffers()["buffers"] >= 1
    scratch.release()


def test_a_slot_left_with_commands_pending_is_handed_on_once_they_have_run(any_device):
    """A deferred decode leaves its slot at once (``leave_after`` its last command): the next holder of that
    slot waits until the command has run, so that a slot has one call in flight at a time."""
    import pyopencl as cl

    scratch = Scratch(any_device, slots=1)
    gate = cl.UserEvent(any_device.context)
    with scratch.slot():
        scratch.leave_after(gate)
        busy = scratch.buffer("frames", 100).int_ptr
    got = []

    def reader():
        with scratch.slot():
            got.append((scratch.buffer("frames", 100).int_ptr, time.perf_counter()))

    after = threading.Thread(target=reader)
    after.start()
    time.sleep(0.3)
    try:
        assert not got, "the slot was handed on before its pending command ran"
    finally:
        opened = time.perf_counter()
        gate.set_status(cl.command_execution_status.COMPLETE)
        after.join(5)
    assert len(got) == 1 and got[0][0] == busy and got[0][1] >= opened
    with scratch.slot():    # nothing pending now: taken at once
        pass
    assert scratch.release() == 1 and scratch.nbytes() == 0


def test_a_failed_grow_leaves_no_released_buffer_behind(any_device, monkeypatch):
    """The device refuses the larger buffer (out of memory): the old one is gone from the scratch, not kept
    released, so the next request allocates afresh and release() gives back only live buffers."""
    from dgemm.errors import DeviceMemoryError

    scratch = Scratch(any_device, slots=1)
    real = any_device.buffer

    def refusing(nbytes, what="a device buffer"):
        if nbytes > 5000:
            raise DeviceMemoryError(f"device 'test': allocating {what} failed; the device is out of memory")
        return real(nbytes, what)

    with scratch.slot():
        first = scratch.buffer("x", 100)
        monkeypatch.setattr(any_device, "buffer", refusing)
        try:
            scratch.buffer("x", 10_000)
        except DeviceMemoryError:
            pass
        else:
            raise AssertionError("the refusing allocation did not raise")
        assert scratch.nbytes() == 0, "the released buffer stayed in the scratch"
        again = scratch.buffer("x", 100)
        assert again is not first and again.size >= 100
    assert scratch.release() == 1 and scratch.nbytes() == 0


def test_a_slot_without_waiting_is_one_free_now_or_none_at_once(any_device):
    """``slot(wait=False)`` (device-codecs share): a free slot whose last call has run, else None at once,
    holding nothing; a slot left with its call in flight is not free until the call has run."""
    import pyopencl as cl

    scratch = Scratch(any_device, slots=2)
    gate = cl.UserEvent(any_device.context)
    with scratch.slot():
        scratch.leave_after(gate)        # this slot's call still in flight
    assert scratch.free_now() == 1
    answers = []

    def try_one():
        with scratch.slot(wait=False) as got:
            answers.append((got, scratch.holding()))

    try:
        with scratch.slot(wait=False) as mine:      # the other slot: free, nothing in flight
            assert mine is scratch and scratch.holding() and scratch.free_now() == 0
            other = threading.Thread(target=try_one)
            other.start()
            other.join(10)
            assert not other.is_alive(), "slot(wait=False) waited for the slot in flight"
            assert answers == [(None, False)]
            assert scratch.holding(), "a refused try changed this thread's slot"
        assert scratch.free_now() == 1          # this one back; the gated one still in flight
        with scratch.slot(wait=False) as again:
            assert again is scratch and scratch.buffer("x", 10).size >= 10
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    assert scratch.free_now() == 2             # the call has run: its slot is free again
    held = threading.Barrier(3)

    def hold():
        with scratch.slot(wait=False) as got:
            assert got is scratch
            held.wait(10)
            held.wait(10)

    both = [threading.Thread(target=hold) for _ in range(2)]
    for t in both:
        t.start()
    held.wait(10)       # both slots taken without waiting: none refused, the room intact after the refusals
    assert scratch.free_now() == 0
    with scratch.slot(wait=False) as none:
        assert none is None
    held.wait(10)
    for t in both:
        t.join(10)
    assert scratch.free_now() == 2 and scratch.release() >= 1


def test_a_slot_whose_last_call_failed_is_handed_on_and_kept(any_device):
    """A deferred call whose commands failed (its own check reports it) leaves its slot usable: the next holder,
    waiting or not, gets it, and no slot or place in the room is lost."""
    import pyopencl as cl

    scratch = Scratch(any_device, slots=2)
    for wait in (True, False):
        failed = [cl.UserEvent(any_device.context) for _ in range(2)]
        for ev in failed:
            with scratch.slot():
                scratch.leave_after(ev)
            ev.set_status(-5)           # (a negative status: the command failed)
        assert scratch.free_now() == 2
        for _ in range(2):
            with scratch.slot(wait=wait) as got:
                assert got is scratch and scratch.holding()
        assert scratch.free_now() == 2 and scratch._room._value == 2


def test_a_slots_new_buffer_is_as_large_as_its_name_has_been_under_its_budget(any_device):
    """With a slot's ``budget`` said, a slot's first buffer of a name is made as large as any slot's buffer of that
    name has been under that budget, in this run or an earlier one (sizes outlive ``release``, buffers do not), so
    that a later call does not grow it; without a budget, or under another one, it is made as asked."""
    scratch = Scratch(any_device, slots=2)
    before = any_device.live_buffers()["buffers"]
    scratch.budget = 100_000
    with scratch.slot():
        scratch.buffer("x", 100)
        big = scratch.buffer("x", 30_000).size      # grown: the name's size is now this
        assert scratch.grown == 1
    assert scratch.release() == 1
    assert any_device.live_buffers()["buffers"] == before and scratch.nbytes() == 0
    scratch.budget = 0
    with scratch.slot():                             # no budget said: as asked, as before
        assert scratch.buffer("x", 100).size < 1000
    scratch.release()
    scratch.budget = 90_000
    with scratch.slot():                             # another budget (blocks of another kind): as asked
        assert scratch.buffer("x", 100).size < 1000
    scratch.release()
    scratch.budget = 100_000
    with scratch.slot():
        first = scratch.buffer("x", 100)
        assert first.size == big
        assert scratch.buffer("x", 30_000) is first and scratch.grown == 1, "a later call grew it"
        assert scratch.buffer("y", 100).size < 1000  # another name: as asked
    scratch.release()
    assert any_device.live_buffers()["buffers"] == before


def test_a_slot_takes_the_sizes_only_where_all_of_them_keep_to_its_budget(any_device):
    """A name is made as large as it has been only where the slot, with every name at its size (or at what it
    holds, if more), stays within the budget: a name made large first must leave the others their room (a product
    after a larger one of the same budget, or calls that each needed only some names large)."""
    scratch = Scratch(any_device, slots=1)
    scratch.budget = 40_000
    with scratch.slot():
        scratch.buffer("x", 30_000)
        scratch.buffer("y", 10_000)                 # with their room the two pass 40,000 (as the calls asked)
    scratch.release()
    with scratch.slot():
        assert scratch.buffer("x", 100).size < 1000, "x made large with no room left for y"
        assert scratch.buffer("y", 100).size < 1000
        assert scratch.held() <= scratch.budget
    scratch.release()
    scratch.budget = 50_000
    with scratch.slot():
        scratch.buffer("x", 30_000)
        scratch.buffer("y", 10_000)
    scratch.release()
    with scratch.slot():                             # both fit: both made as large as they were
        assert scratch.buffer("y", 100).size >= 10_000 and scratch.buffer("x", 100).size >= 30_000
        assert scratch.held() <= scratch.budget
        scratch.buffer("z", 20_000)                  # a call that asks more: grown as before
    scratch.release()


def test_a_slot_short_of_device_memory_takes_what_it_asked(any_device, monkeypatch):
    """The device refusing the size a name has been: the buffer is made as asked, and the call goes on."""
    from dgemm.errors import DeviceMemoryError

    scratch = Scratch(any_device, slots=1)
    scratch.budget = 1 << 20
    with scratch.slot():
        scratch.buffer("x", 50_000)
    scratch.release()
    real = any_device.buffer

    def short(nbytes, what="a device buffer"):
        if nbytes > 10_000:
            raise DeviceMemoryError(f"device 'test': allocating {what} failed; the device is out of memory")
        return real(nbytes, what)
    monkeypatch.setattr(any_device, "buffer", short)
    with scratch.slot():
        assert scratch.buffer("x", 100).size < 1000
        with pytest.raises(DeviceMemoryError):
            scratch.buffer("x", 20_000)             # what the call needs: refused as before
    scratch.release()


def test_a_scratch_keeps_the_sizes_of_a_few_budgets(any_device):
    """Sizes are kept for the last SIZED_BUDGETS budgets used, not for every budget a worker ever saw."""
    from dgemm.opencl.scratch import SIZED_BUDGETS

    scratch = Scratch(any_device, slots=1)
    for k in range(SIZED_BUDGETS + 1):
        scratch.budget = 100_000 + k
        with scratch.slot():
            scratch.buffer("x", 20_000)
        scratch.release()
    assert len(scratch._sizes) == SIZED_BUDGETS and 100_000 not in scratch._sizes
    for budget, larger in ((100_000, False), (100_001 + SIZED_BUDGETS - 1, True)):
        scratch.budget = budget
        with scratch.slot():
            assert (scratch.buffer("x", 100).size >= 20_000) is larger, budget
        scratch.release()


def test_a_threads_own_buffers_are_made_as_asked(any_device):
    """Outside a slot (a reader thread's own buffers, which no budget counts) a buffer is made as asked, whatever
    size its name has reached in a slot."""
    scratch = Scratch(any_device, slots=1)
    scratch.budget = 1 << 30
    with scratch.slot():
        scratch.buffer("x", 50_000)
    assert scratch.buffer("x", 100).size < 1000
    scratch.release()

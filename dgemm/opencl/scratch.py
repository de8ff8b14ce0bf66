"""Each reader thread's own device buffers and command queue, kept from one call to the next.

A device decoder call (:mod:`dgemm.opencl.codecs`) needs a dozen buffers:
the compressed frames, their tables, the literals, error rows.  Allocating
and releasing them for every block costs more than decoding it: NVIDIA's
driver frees device memory only once the device is idle, so a release waits
for the GEMM kernel running beside it.  Here each thread keeps its buffers by
name, grown when a call needs more, and :meth:`Scratch.release` (called by
:meth:`Device.trim <dgemm.opencl.device.Device.trim>` between runs) gives
them all back, so the device's memory returns to idle after every product.
What outlives a run is each name's largest size (for each budget: what the
panel cache leaves a slot for blocks of a kind): the next product's slots
make their buffers that large at once, where they keep to that budget, so
that they are not grown (and released) again beside the GEMMs.

Each thread also gets its own in-order queue: a decode call waits for its
own commands only, not for every upload other threads queued on the
device's shared transfer queue before it.

A worker's reader threads (16 to 32) decode on the device through
:meth:`Scratch.slot`: at most :data:`SLOTS` at once, each in a slot whose
buffers and queue it borrows, so that the device holds the buffers of a few
calls (a 256 MiB block of 64 MiB chunks takes about 3 GiB:
``dgemm.worker.decoding.call_bytes``), not of every reader thread.
A few calls at once keep the device busy (bench/NOTES.md, issue 28); more
only wait on each other.

The device encoder (``zstd_encode.encode_zstd(keep=True)``) keeps its
buffers the same way, in a scratch of :data:`ENCODE_SLOTS` slots of its own
(``Device.encode_scratch``): each slot's calls take turns on its queue, and
the device holds that many C blocks' encoder buffers.
"""
from __future__ import annotations

import contextlib
import threading

from dgemm.errors import DeviceMemoryError
from dgemm.opencl import nogil

SLOTS = 4       # device decodes at once per device (each a slot of buffers and a queue)
# C blocks encoded at once per device (dgemm.worker.encoding: each on a thread of its own, its slot holding
# the block's copy and the frames, about twice the block), while the GEMMs go on
ENCODE_SLOTS = 4
# Budgets whose buffer sizes a scratch keeps (Scratch._sizes): a worker's products of that many block geometries
# and dtypes find their slots' sizes again
SIZED_BUDGETS = 8


class Scratch:
    """Per-thread device buffers (by name, grow-only) and queues of one :class:`~dgemm.opencl.device.Device`."""

    def __init__(self, device, slots: int = SLOTS):
        self._device = device
        self._lock = threading.Lock()
        self._buffers: dict[tuple[int, str], object] = {}
        self._queues: dict[int, object] = {}
        self._slots = slots
        self._free = list(range(-slots, 0))     # slot keys: negative, never a thread's id
        self._room = threading.Semaphore(slots)
        self._held = threading.local()           # the slot this thread holds now, if any
        self._busy: dict[int, object] = {}       # a slot's last command, where a call left without waiting
        # What a slot may hold for the blocks decoded (or encoded) now, bytes (0: not said): what the panel cache
        # leaves it, said by each GEMM task before its blocks are read (decoding.size_slots; the encoder's in
        # worker.tasks) and kept to the next task (the last blocks' encodes may outlast their run).  One value a
        # scratch: runs at once on a worker have their tasks say theirs in turn, as they plan the one panel cache.
        # For each budget, the largest size each buffer name reached in a slot under it (``_sizes``; kept across
        # runs: sizes, not buffers).  A slot's new buffer is made that large at once where the slot, every name
        # at its size, stays within the budget, so that its calls need not grow it: a growth releases the old
        # buffer in the call, and NVIDIA's driver makes a release wait for the device to run what came before it,
        # the GEMMs beside (200 such releases took 0.7 s of the slots' time in a run of 32768²: bench/NOTES.md,
        # issue 28, twenty-seventh session).  Keyed by budget, since a product of other blocks (float32 after
        # float64) has calls of other sizes.
        self.budget = 0
        self._sizes: dict[int, dict[str, int]] = {}
        self.grown = 0      # buffers replaced by larger ones, since the scratch was made

    @contextlib.contextmanager
    def slot(self, wait: bool = True):
        """Within this block, :meth:`buffer` and :meth:`queue` are those of a slot this thread borrows.

        At most ``slots`` threads hold one at once; the others wait here
        (without Python's lock), so the device holds the buffers of that
        many calls.  A call that left its slot without waiting for its
        commands (:meth:`leave_after`) still counts until they have run: the
        next holder waits for them here first, so that a slot has one call in
        flight and the readers cannot queue work without bound behind the
        GEMMs.  (Its buffers would be safe anyway: a slot's commands share
        its in-order queue.)

        ``wait=False``: take a slot only where one is free now, its last
        call's commands run; else the block gets None at once and holds
        nothing (``device-codecs: share``: the reader decodes on the host).
        """
        if not self._room.acquire(blocking=wait):
            yield None
            return
        with self._lock:
            if wait:
                key = self._free.pop(0)     # the slot left longest ago: its commands the likeliest done
            else:
                key = next((k for k in self._free if _ran(self._busy.get(k))), None)
                if key is not None:
                    self._free.remove(key)
            last = self._busy.pop(key, None) if key is not None else None
        if key is None:     # (not waiting) every free slot's last call still in flight
            self._room.release()
            yield None
            return
        self._held.key = key
        try:
            if last is not None:
                _wait(last)
            yield self
        finally:
            self._held.key = None
            with self._lock:
                self._free.append(key)
            self._room.release()

    def slots(self) -> int:
        """How many threads may hold a slot at once."""
        return self._slots

    def free_now(self) -> int:
        """How many slots :meth:`slot` would give at once with ``wait=False`` (a hint: another thread may take one)."""
        with self._lock:
            return sum(1 for k in self._free if _ran(self._busy.get(k)))

    def holding(self) -> bool:
        """Whether this thread holds one of the slots now (:meth:`slot`)."""
        return getattr(self._held, "key", None) is not None

    def leave_after(self, event) -> None:
        """Within :meth:`slot`: the slot's call is in flight until ``event`` (its last command) has run."""
        key = getattr(self._held, "key", None)
        if key is None:
            raise RuntimeError("leave_after outside a slot")
        with self._lock:
            self._busy[key] = event

    def _owner(self) -> int:
        key = getattr(self._held, "key", None)
        return threading.get_ident() if key is None else key

    def buffer(self, what: str, nbytes: int):
        """This thread's (or its slot's) device buffer named ``what``, of at least ``nbytes``, kept for its next call.

        The buffer is the thread's alone; its contents are whatever the
        last call left (poisoned first under the tests' hook, :mod:`.poison`, as new
        buffers are).  A larger request replaces it (released: OpenCL
        frees it once the commands that use it have run).  A slot's new
        buffer may be larger than asked: as large as the name has been
        under the slot's :attr:`budget`, where that keeps to it.
        """
        key = (self._owner(), what)
        nbytes = max(int(nbytes), 1)
        size = asked = nbytes + (nbytes >> 4)   # a little room, so that blocks a few bytes apart do not each grow it
        with self._lock:
            held = self._buffers.get(key)
            if held is not None and held.size >= nbytes:
                return held
            if held is not None:    # out before it is released: should the larger one fail, none is left
                del self._buffers[key]
                self.grown += 1
            budget = self.budget
            if key[0] < 0 and budget:      # a slot's: as large as the name has been, where that keeps to the budget
                size = max(asked, self._sized(key[0], what, asked, budget))
        if held is not None:
            held.release()
        try:
            fresh = self._device.buffer(size, what)
        except DeviceMemoryError:
            if size == asked:
                raise
            fresh = self._device.buffer(asked, what)   # (the device short of room: what the call needs alone)
        with self._lock:
            self._buffers[key] = fresh
            if key[0] < 0 and budget:
                sizes = self._sizes.pop(budget, {})     # (last: the budgets used least lately go first)
                sizes[what] = max(sizes.get(what, 0), fresh.size)
                self._sizes[budget] = sizes
                while len(self._sizes) > SIZED_BUDGETS:
                    del self._sizes[next(iter(self._sizes))]
        return fresh

    def _sized(self, owner: int, what: str, asked: int, budget: int) -> int:
        """The size for slot ``owner``'s new buffer ``what`` (``asked`` bytes) under ``budget``: the name's size
        under it, where the slot holding every name at its size (or at what it holds, if more) stays within the
        budget; else 0.  With the lock held."""
        sizes = self._sizes.get(budget)
        if not sizes or sizes.get(what, 0) <= asked:
            return 0
        held = {k[1]: b.size for k, b in self._buffers.items() if k[0] == owner}
        held[what] = sizes[what]
        if sum(max(held.get(n, 0), sizes.get(n, 0)) for n in held.keys() | sizes.keys()) > budget:
            return 0
        return sizes[what]

    def held(self) -> int:
        """Bytes this thread's slot (or, outside one, the thread) holds now."""
        owner = self._owner()
        with self._lock:
            return sum(b.size for k, b in self._buffers.items() if k[0] == owner)

    def queue(self):
        """This thread's (or its slot's) in-order profiling queue on the device (made once per thread or slot);
        the GEMM kernels' own queue under ``queue-priority: inline`` (:meth:`Device.kernel_queue
        <dgemm.opencl.device.Device.kernel_queue>`: a decode's uploads and kernels in order between GEMMs)."""
        if getattr(self._device, "inline_feeding", False):
            return self._device.queue
        me = self._owner()
        with self._lock:
            q = self._queues.get(me)
        if q is None:
            q = self._device.feeding_queue()    # (of high priority where the driver offers it)
            with self._lock:
                self._queues[me] = q
        return q

    def release(self, busy=()) -> int:
        """Release the buffers of every thread not in ``busy`` (thread ids) and of every slot not held now;
        returns how many."""
        with self._lock:
            held = set(range(-self._slots, 0)) - set(self._free)
            gone = [k for k in self._buffers if k[0] not in busy and k[0] not in held]
            bufs = [self._buffers.pop(k) for k in gone]
            for key in set(self._busy) - held:      # (OpenCL frees the buffers once those commands ran)
                del self._busy[key]
        for buf in bufs:
            buf.release()
        return len(bufs)

    def nbytes(self) -> int:
        """Bytes held now, all threads together."""
        with self._lock:
            return sum(b.size for b in self._buffers.values())


def _wait(event) -> None:
    """Wait for a slot's last command; one that failed is its own call's to report (that call's deferred check
    raises it for its block), not the next holder's, whose block is sound: the slot goes on."""
    import pyopencl as cl

    try:
        nogil.wait([event])
    except (cl.Error, RuntimeError):
        pass


def _ran(event) -> bool:
    """Whether a slot's last command ``event`` (None: none) has run, or failed (its error is the call's check's)."""
    if event is None:
        return True
    import pyopencl as cl

    return event.command_execution_status <= cl.command_execution_status.COMPLETE

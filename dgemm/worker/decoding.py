"""Input blocks whose chunks the device decodes: :mod:`dgemm.storage.frames` joined to :mod:`dgemm.opencl.codecs`.

Storage and opencl know nothing of each other (``tests/test_imports.py``);
the worker joins them here.  Where the ``device-codecs`` setting is on for
this worker's device (:func:`wanted`), :func:`through` wraps each input
:class:`~dgemm.storage.ZarrBlock` of a block product in a
:class:`DeviceDecoded`, which the engine asks first to fill a device buffer
(:meth:`~dgemm.opencl.engine.BlockEngine._decoded`): when the block's chunks
are frames a device decoder takes (:data:`dgemm.opencl.codecs.DECODERS`),
their stored bytes are read (not decoded), uploaded and decoded there, and
only compressed bytes cross the bus.  Otherwise the block declines and is read
on the host exactly as without the setting.

A read or decode that fails raises the host reader's one read error
(:func:`dgemm.storage.unreadable`: array, rows and columns, the chunk and its
store key), so the block product fails and its C block is never stored or
marked done.  What the device decoded counts in ``device_decoded_bytes``, a
frame it left to the host in ``host_decoded_bytes``
(:mod:`dgemm.storage.fastpaths`).
"""
from __future__ import annotations

import functools
import logging
import threading
import weakref

import numpy as np

from dgemm import config
from dgemm.errors import DgemmError
from dgemm.opencl import codecs, nogil
from dgemm.opencl.codecs.zstd_frames import BLOCK_MAX
from dgemm.opencl.device import DeviceError
from dgemm.storage import ZarrBlock, fastpaths, frames, unreadable
from dgemm.storage.blocks import Through
from dgemm.worker.perdevice import PerDevice

log = logging.getLogger(__name__)


def wanted(device, work: str = "decode") -> bool:
    """Whether this worker's ``device-codecs`` setting (read now) has ``device`` do ``work`` (``"decode"``: the
    inputs' chunks, ``"encode"``: C's)."""
    return device is not None and codecs.enabled(config.get("device-codecs") or "auto", device.info.type, work)


# Device bytes one decode call holds (zstd_decode.decode_zstd's buffers, each with the scratch's 1/16 of room; the
# Blosc decoder holds less), per byte of the chunks it decodes, whole (a block's edge chunks count whole): the
# compressed frames, the literals or the sequences (16 bytes each, a match of 3 bytes or more), the execute
# stage's origins and waiting bits (4 bytes and a bit per byte), the scratch of chunks placed aside; and per zstd
# block of them (128 KiB of content, so at least one a chunk, however small): its Huffman table (8 KiB), FSE
# tables, its plan's and the call's rows.  A slot keeps each buffer at the largest any of its calls asked for, so
# a slot that decoded normal values, then values rounded to 2 decimals (few literals, many sequences), holds
# both at their largest.  Fitted: tests/test_decoding.py decodes blocks of 256-byte to 1 MiB chunks (float32
# drawn normal, rounded to 1 and 2 decimals, a random walk; zstd levels 0 (Zarr's default, 3) and 19, by hand 1
# and 5 too; on and off the chunk grid; mixed in one slot) and checks the slots' bytes against these.  The most measured per byte
# of the chunks, past 20 KiB a zstd block: 11.2 (mixed, 256 KiB chunks), 10.2 for one call (2 decimals); every
# buffer at its bound would be 13-14 (sequences of 3-byte matches, which float arrays hardly have).  Level 19
# cuts a random walk into blocks of 8 KiB, each with its own tables (9.2-10.4 bytes a byte, within these);
# data cut finer would go past: :func:`reserve` then follows what the slots hold.
CALL_BYTES_PER_BYTE = 12.0
CALL_BYTES_PER_BLOCK = 20 << 10

# Blocks one device decode call takes at most (zstd, whose calls defer): the readers' blocks that queued while
# every decode slot was busy go in the next call together.  A call's kernels run one after another beside
# the GEMMs, and a call of one 64 MiB chunk (512 zstd blocks, 2,048 Huffman streams, one lane each) fills a
# fraction of an H100: the Huffman kernel decodes 28.7 GB/s there, 91 at 4 chunks a call (bench/NOTES.md,
# issue 28, thirteenth session).  1: each block its own call.
BATCH = 4
# Decoded bytes a shared call takes at most (past its first block): zstd_decode's execution walks a call's frames
# one after another once they pass 4 GiB (its origins are 32-bit positions).
BATCH_BYTES = 1 << 31
# The part of a device's memory share (what the panel cache and a product's own buffers divide:
# dgemm.sizes.cache_budget) that the decode slots' shared calls may hold together: past it a call takes fewer
# blocks.  The panel cache needs the rest: at 49152² float32 on an 80 GB H100, four calls of four 8192 x 4096
# blocks (24.3 GiB) left it 34 GiB against the 36 both inputs take (3xTF32 keeps two halves of a block), so
# blocks were read and decoded 2.25 times over and `on` ran 5.9 s against share's 4.2 (bench/NOTES.md, issue 28,
# twenty-fourth session).  A quarter leaves calls of two such blocks there, and of four on a 141 GB H200.
SLOTS_SHARE = 0.25


def call_cap(share: int) -> int:
    """Device bytes one shared decode call may hold (:func:`call_bytes` over its blocks, the first taken whatever
    it holds) on a device whose memory share is ``share`` bytes: :data:`SLOTS_SHARE` of it over the slots."""
    from dgemm.opencl.scratch import SLOTS

    return int(SLOTS_SHARE * share / SLOTS)


def device_bytes(refs, share: int | None = None) -> int:
    """What the device's decode slots may hold while blocks like ``refs`` are decoded (:mod:`dgemm.opencl.scratch`):
    :data:`~dgemm.opencl.scratch.SLOTS` calls, each of the largest block the device may take (:func:`call_bytes`)
    or, where readers wait for slots (not under ``share``: its readers never queue) and the decoder defers (zstd;
    Blosc's calls take one block), of up to :data:`BATCH` blocks, as far as :func:`call_cap` lets them on a device
    of memory share ``share`` (None: no cap); the panel cache leaves it free."""
    from dgemm.opencl.scratch import SLOTS

    return SLOTS * slot_bytes(refs, share)


def slot_bytes(refs, share: int | None = None) -> int:
    """What one decode slot may hold while blocks like ``refs`` are decoded: :func:`device_bytes` over the slots."""
    mine = [(r, dec) for r in refs if type(r) is DeviceDecoded and _may_take(r) and (dec := _decoder(r.block))]
    largest = max((call_bytes(r.block) for r, _ in mine), default=0)
    # (blocks share calls where their readers queue for slots and the decoder defers: zstd's, not Blosc's)
    shared = max((call_bytes(r.block) for r, dec in mine if not r.share and dec.defers), default=0)
    # (not floored to whole blocks: a call of smaller blocks, a product's edge blocks, may fill its cap)
    batch = BATCH * shared if share is None else min(BATCH * shared, call_cap(share))
    return int(max(largest, batch))


def size_slots(device, refs, share: int | None) -> None:
    """Tell the decode slots of ``device`` what each may hold for blocks like ``refs`` (:func:`slot_bytes`, what
    :func:`reserve` leaves them): within it a slot's new buffers are made as large as their names have been
    (:attr:`Scratch.budget <dgemm.opencl.scratch.Scratch.budget>`)."""
    device.scratch.budget = slot_bytes(refs, share)


def reserve(device, refs, share: int | None) -> int:
    """What the panel cache leaves the decode slots of ``device`` for blocks like ``refs``, the device's memory
    share being ``share`` bytes (None: its calls uncapped): :func:`device_bytes`, or what the slots hold already
    where an earlier block (of data the model was not fitted on) grew them more."""
    return max(device_bytes(refs, share), device.scratch.nbytes())


def limit_calls(device, share: int) -> None:
    """Have the shared decode calls of ``device``, whose memory share is ``share`` bytes, keep to
    :func:`call_cap` from now (what :func:`reserve` counts with the same ``share``)."""
    _batches(device).cap = call_cap(share)


def call_bytes(block) -> int:
    """Device bytes one decode call of ``block`` (a :class:`~dgemm.storage.ZarrBlock`) may hold: its chunks'
    decoded bytes, whole, and their zstd blocks (see :data:`CALL_BYTES_PER_BYTE`); 0 for a block of a 1-D
    array, which the device never decodes (:func:`dgemm.storage.frames.region`)."""
    if block.expand is not None or len(block.array.chunks) != 2:
        return 0
    (r0, r1), (c0, c1) = block.rows, block.cols
    rows, cols = (int(n) for n in block.array.chunks)
    chunks = (-(-r1 // rows) - r0 // rows) * (-(-c1 // cols) - c0 // cols)
    return chunks * _chunk_call_bytes(rows * cols * block.dtype.itemsize)


def _chunk_call_bytes(chunk: int) -> int:
    """Device bytes a decode call holds for one whole chunk of ``chunk`` decoded bytes (:func:`call_bytes`)."""
    return int(CALL_BYTES_PER_BYTE * chunk + max(1, -(-chunk // BLOCK_MAX)) * CALL_BYTES_PER_BLOCK)


def _decoder(block):
    """The device decoder that takes the chunks of ``block``'s array (its one compressor and its configuration,
    from the metadata), or None: blocks of uncompressed, sharded or otherwise compressed arrays are read on the
    host, and the decode slots need no room for them."""
    found = frames.codec_config(block.array)
    return codecs.decoder(*found) if found is not None else None


def _may_take(ref, codec: str | None = None) -> bool:
    """Whether the device may decode ``ref``'s chunks: a codec (``codec``, else the array's compressor, read from
    its metadata alone: this is asked per block and per product) in its ``only``."""
    if ref.only is None:
        return True
    if codec is None:
        found = frames.codec_config(ref.block.array)
        codec = found[0] if found is not None else None
    return codec in ref.only


def shared(device=None) -> bool:
    """Whether this worker's ``device-codecs`` setting (read now) shares the inputs' chunks with the host's readers
    on ``device`` (``share``, or ``auto`` where :data:`dgemm.opencl.codecs.AUTO` maps its type to ``share``: a block
    whose reader finds every decode slot busy is decoded on the host)."""
    return codecs.shares(config.get("device-codecs") or "auto", device.info.type if device is not None else None)


def only(device) -> frozenset | None:
    """The inputs' codecs this worker's ``device-codecs`` setting (read now) has ``device`` decode, None for every
    one it can (:func:`dgemm.opencl.codecs.codecs_of`: ``auto`` on a GPU, zstd's alone)."""
    return codecs.codecs_of(config.get("device-codecs") or "auto", device.info.type)


def through(ref, share: bool = False, only: frozenset | None = None):
    """``ref`` as a :class:`DeviceDecoded` where it is a Zarr input block; anything else as it is."""
    return DeviceDecoded(ref, share, only) if type(ref) is ZarrBlock else ref


class DeviceDecoded(Through):
    """A :class:`~dgemm.storage.ZarrBlock` that can also be decoded on the device (:meth:`fill_device`).

    Everything else is the block's own (``shape``, ``dtype``, ``key()``,
    ``fill_into`` ...): the engine caches it under the block's key, and reads
    it on the host where :meth:`fill_device` declines.  ``share``
    (``device-codecs: share``): it also declines where every decode slot of
    the device is busy (:meth:`declines`), so that the reader decodes it on
    the host rather than wait.  ``only``: the codecs (:data:`dgemm.opencl.codecs.DECODERS`' keys) whose chunks
    the device decodes, None for all (``auto`` on a GPU: zstd's); it declines the others.
    """

    __slots__ = ("block", "share", "only")

    def __init__(self, block: ZarrBlock, share: bool = False, only: frozenset | None = None):
        self.block = block
        self.share = share
        self.only = only

    def __getattr__(self, name):
        if name in ("block", "share", "only"):   # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.block, name)

    def declines(self, device) -> bool:
        """Whether :meth:`fill_device` would decline now: a codec not in ``only``, or (``share``) no free decode
        slot; asked before the engine allocates the block's device buffers, which a declined block would not use."""
        return not _may_take(self) or (self.share and device.scratch.free_now() == 0)

    def __repr__(self):
        more = (", share=True" if self.share else "") + (f", only={sorted(self.only)}" if self.only is not None else "")
        return f"DeviceDecoded({self.block!r}{more})"

    def fill_into(self, out):
        return self.block.fill_into(out)

    def fill_device(self, device, out, queue=None, events: list | None = None,
                    pending: list | None = None) -> int | None:
        """Decode the block into the device buffer ``out`` (``rows x cols`` in C order); bytes sent, or None.

        None (nothing done): the block's chunks are not frames of a device
        decoder (another codec, a layout :func:`dgemm.storage.frames.region`
        does not describe), or, with ``share``, every decode slot of the
        device is busy (nothing read).  Returns when ``out`` holds the block, or, given
        ``pending`` and a decoder that ``defers`` (zstd), once the decode is
        enqueued: ``pending`` then gets ``(event, check)``, ``event`` the
        decode's last command (what reads ``out`` must wait for), ``check()``
        waits for its error rows and raises what this call would have
        raised (a chunk's read error).  Nothing may take ``out`` as the block
        before ``check()`` has returned.
        ``events`` gets ``(what, event)`` of the uploads, kernels and copies.

        Raises
        ------
        OSError
            The host reader's error (:func:`dgemm.storage.unreadable`) for a
            chunk that cannot be read or decoded.
        """
        found = frames.region(self.block)
        if found is None or not _may_take(self, found.codec):
            return None
        dec = codecs.decoder(found.codec, found.config)
        if dec is None:
            return None
        mine = [] if pending is not None else None
        try:
            sent = _decode(device, dec, found, out, queue if queue is not None else device.transfer_queue, events,
                           mine, share=self.share)
        except DeviceError:
            raise   # the device's own (out of memory, a failed launch): not the chunk's fault
        except Exception as e:
            raise unreadable(self.block, e) from e
        for event, check in mine or ():
            pending.append((event, functools.partial(_checked, self.block, check)))
        return sent


def _checked(block, check) -> None:
    """A deferred decode's ``check()``, its errors the host reader's (as :meth:`DeviceDecoded.fill_device` raises)."""
    try:
        check()
    except DeviceError:
        raise
    except Exception as e:
        raise unreadable(block, e) from e


def _read_packed(device, found) -> tuple:
    """Read ``found``'s frames into this thread's page-locked staging, one after another.

    Returns ``(frames, starts, host)``: each piece's frame (a view of
    ``host``, or bytes of its own for one past the room :meth:`Frames.bound`
    leaves, or None for a chunk never written), where each packed frame starts
    in ``host`` (None for the others), and ``host`` itself.  Page-locked bytes
    go over the bus at its full speed; a local file is read straight into the
    staging, other stores' bytes copied in once.
    """
    host = device.staging(found.bound())
    frames, starts = [], []
    # (beyond the codec's worst case, a frame is its own copy, decoded apart); each frame 16-byte aligned:
    # the kernels' wide reads start aligned
    for data, start in found.fetch_into(host, align=16):
        frames.append(data)
        starts.append(start)
    return frames, starts, host


def _decode(device, dec, found, out, queue, events, pending=None, share: bool = False) -> int | None:
    """Decode ``found``'s pieces into ``out``: whole-row chunks in place, the others aside then copied.

    The decode runs on its slot's queue (:meth:`Device.scratch`, :mod:`dgemm.opencl.scratch`) with
    buffers kept for the slot's next block, and has finished when this returns, so
    ``queue`` (where the engine reads ``out`` next) needs nothing from it; or, with ``pending``
    (a decoder that ``defers``), has been enqueued: ``pending`` gets ``(event, check)`` as
    :meth:`DeviceDecoded.fill_device` describes, and the slot is left to the next holder once
    ``event`` has run.  ``share``: None (nothing read) where no slot is free now.
    """
    if share:   # a free slot now or the host's decoder: read within the slot
        with device.scratch.slot(wait=False) as held:
            if held is None:
                return None
            data, starts, host = _read_packed(device, found)
            return _decode_read(device, dec, found, out, events, data, starts, host, pending)
    data, starts, host = _read_packed(device, found)     # (read by every reader thread at once)
    plans = _batchable(dec, found, data, starts, pending)
    if plans is not None:
        return _batches(device).decode(_Request(dec, found, out, events, pending, data, starts, host, plans))
    with device.scratch.slot():     # a few decodes at once per device, each with its slot's buffers and queue
        return _decode_read(device, dec, found, out, events, data, starts, host, pending)


def _decode_read(device, dec, found, out, events, data, starts, host, pending=None) -> int:
    """:func:`_decode` once the frames are read, within a slot of the device's scratch.

    The frames' headers alone are read here where the decoder plans them on the device; one that only the
    host decodes, which the call finds from its blocks, makes it raise before it writes anything, and the
    block is read again with every frame planned here.
    """
    try:
        return _decode_planned(device, dec, found, out, events, data, starts, host, pending, light=True)
    except dec.refused_light():
        return _decode_planned(device, dec, found, out, events, data, starts, host, pending, light=False)


def _decode_planned(device, dec, found, out, events, data, starts, host, pending, light: bool) -> int:
    """:func:`_decode_read` with the frames checked by ``dec.checked(..., light)``."""
    import pyopencl as cl

    calls = [] if pending is not None and dec.defers else None   # each decode call's (last command, check)
    own: list = []      # this call's commands (the uploads from the thread's staging among them)

    n = found.chunk_nbytes
    queue = device.scratch.queue()
    # (piece, frame, plan, start) decoded into out; (piece, frame, plan, start, how) into scratch
    direct, aside = [], []
    for piece, frame, start in zip(found.pieces, data, starts):
        if frame is None:
            aside.append((piece, None, None, None, "fill"))
            continue
        reason, plan = dec.checked(frame, piece.name, light)
        if reason is not None:      # (decoded below, after the device's calls: one may send the block back)
            aside.append((piece, frame, None, None, "host"))
        elif piece.direct:
            direct.append((piece, frame, plan, start))
        else:
            aside.append((piece, frame, plan, start, "device"))
    decode = dec.load()
    decoded = sent = 0

    def run(rows, buf, offsets):
        nonlocal decoded, sent
        if not rows:
            return
        names = [r[0].name for r in rows]
        frames = [r[1] for r in rows]
        packed = None
        if all(r[3] is not None for r in rows):
            packed = (host, [r[3] for r in rows])
        more = {"pending": calls} if calls is not None else {}
        sizes = decode(device, frames, buf, offsets=offsets, names=names, events=own, queue=queue,
                       plans=[r[2] for r in rows], packed=packed, keep=True, **more)
        for name, size in zip(names, sizes):
            if size != n:
                raise ValueError(f"{name}: decodes to {size} bytes, a chunk of this array has {n}")
        decoded += sum(sizes)
        sent += sum(len(f) for f in frames)

    run(direct, out, [r[0].offset for r in direct])
    if aside:
        scratch = device.scratch.buffer("the decode scratch", len(aside) * n)
        with device.failing(f"placing {len(aside)} decoded chunks of {n} bytes"):
            rows = [r for r in aside if r[4] == "device"]
            run(rows, scratch, [i * n for i, r in enumerate(aside) if r[4] == "device"])
            done = []
            for i, (piece, what, _, _, how) in enumerate(aside):
                if how == "fill":
                    fill = np.asarray(found.fill, found.dtype).reshape(1)
                    done.append(cl.enqueue_fill_buffer(queue, scratch, fill, i * n, n))
                elif how == "host":
                    what = found.decode_on_host(what, piece.name)
                    nogil.copied(queue, scratch, what, dst_offset=i * n)
                    sent += what.nbytes
            # the chunks' rows and columns the block takes, into their place in the block
            done += [_placed(queue, found, piece, out, scratch, i * n) for i, (piece, *_) in enumerate(aside)]
            own.extend(("copy", e) for e in done)
            if calls is None:
                nogil.wait(done)
    if events is not None:
        events.extend(own)
    if calls is not None and own:
        last = nogil.enqueue_marker(queue)  # (the slot's queue is in order: after all of this call's commands)
        nogil.flush(queue)
        device.scratch.leave_after(last)
        # the thread's staging is read by this call's uploads; its next block refills it
        nogil.wait([e for what, e in own if what == "upload"] or [last])
        checks = [check for _, check in calls]

        def check_all():
            for check in checks:
                check()

        pending.append((last, check_all))
    fastpaths.codec("device_decoded_bytes", decoded)
    return sent


# -- blocks decoded together: one call for the blocks queued while the slots were busy ------------------------
def _batchable(dec, found, data, starts, pending) -> list | None:
    """The plans of ``found``'s frames where its block may share a decode call with others (:data:`BATCH`), or None.

    That is a deferred call (``pending``, a decoder that defers) whose every
    chunk was read into the thread's staging and is a frame the device
    takes, of the chunk's size, whether it lies in place in the block
    (``direct``) or is copied there, rows and columns, from the call's
    scratch; anything else (a chunk never written, one left to the host)
    goes its own way (:func:`_decode_read`), which also raises a frame's size
    error as it always has.
    """
    if BATCH < 2 or pending is None or not dec.defers:
        return None
    if not all(frame is not None and start is not None for frame, start in zip(data, starts)):
        return None     # (before any frame is planned: _decode_read plans them all)
    plans = []
    for piece, frame in zip(found.pieces, data):
        reason, plan = dec.checked(frame, piece.name, light=True)
        if reason is not None or plan is None or getattr(plan, "size", None) != found.chunk_nbytes:
            return None
        plans.append(plan)
    return plans


class _Request:
    """One block's part of a shared decode call: what its reader read, and what it gets back."""

    __slots__ = ("dec", "found", "out", "events", "pending", "frames", "starts", "host", "plans", "taken",
                 "done", "sent", "check", "last", "alone")

    def __init__(self, dec, found, out, events, pending, frames, starts, host, plans):
        self.dec, self.found, self.out, self.events, self.pending = dec, found, out, events, pending
        self.frames, self.starts, self.host, self.plans = frames, starts, host, plans
        self.taken = False                  # in a call (another thread's, perhaps)
        self.done = threading.Event()       # the call is enqueued and its uploads have read our staging
        self.sent = 0
        self.check = self.last = None
        self.alone = False                  # the shared call failed: decode this block in a call of its own


class _Batches:
    """A device's queue of blocks waiting for a decode call (group commit).

    A reader queues its block, then leads a call if fewer than the slots'
    number of leaders are at work, else waits.  A leader takes a slot
    (:meth:`Scratch.slot`, which waits for the slot's last call), then every
    block queued by then, up to :data:`BATCH`, its own or not, decodes them
    in one call and lets their readers go once the call is enqueued.  So a
    block waits for nothing a call of its own would not have waited for,
    and the blocks that queue behind busy slots share the next call.
    """

    def __init__(self, device):
        self._device = weakref.ref(device)
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._leaders = 0
        self.cap: int | None = None     # device bytes a call of several blocks may hold (limit_calls sets it)

    def decode(self, req: _Request) -> int:
        """Decode ``req``'s block (in a call of its own or shared); bytes sent, as :func:`_decode_read` returns."""
        device = self._device()
        with self._cond:
            self._queue.append(req)
        try:
            self._lead_or_wait(device, req)
        except BaseException:
            with self._cond:
                taken = req.taken
                if not taken:      # nobody will upload from our staging or write our buffer now
                    self._queue.remove(req)
            if taken:       # another leader's call writes our buffer: not ours to give back before it is enqueued
                req.done.wait()
            raise
        req.done.wait()
        if req.alone:       # (the shared call failed: this block's own call says whose fault it was)
            with device.scratch.slot():
                return _decode_read(device, req.dec, req.found, req.out, req.events, req.frames, req.starts,
                                    req.host, req.pending)
        fastpaths.codec("device_decoded_bytes", sum(p.size for p in req.plans))
        req.pending.append((req.last, req.check))
        return req.sent

    def _lead_or_wait(self, device, req: _Request) -> None:
        """Until ``req`` is in a call: lead one (a slot, then what is queued, up to :data:`BATCH` blocks and
        :data:`BATCH_BYTES`) where fewer leaders than slots are at work, else wait."""
        while True:
            with self._cond:
                while not req.taken and self._leaders >= device.scratch.slots():
                    self._cond.wait()
                if req.taken:
                    return
                self._leaders += 1
            try:
                with device.scratch.slot():
                    with self._cond:
                        batch = _take(self._queue, self.cap)
                    if batch:
                        _decode_batch(device, batch)
            finally:
                with self._cond:
                    self._leaders -= 1
                    self._cond.notify_all()


def _take(queue: list, cap: int | None = None) -> list:
    """The first requests of ``queue`` (taken out and marked): up to :data:`BATCH` blocks, and past the first
    block no more than :data:`BATCH_BYTES` decoded, nor ``cap`` bytes held on the device (:func:`call_bytes`:
    every chunk a request's block touches, whole)."""
    n = total = held = 0
    while n < min(BATCH, len(queue)):
        size = sum(p.size for p in queue[n].plans)
        holds = len(queue[n].plans) * _chunk_call_bytes(queue[n].found.chunk_nbytes)
        if n and (total + size > BATCH_BYTES or (cap is not None and held + holds > cap)):
            break
        total += size
        held += holds
        n += 1
    batch, queue[:n] = queue[:n], []
    for r in batch:
        r.taken = True
    return batch


_batches = PerDevice(_Batches)     # a device's queue of blocks waiting for a decode call


def _decode_batch(device, batch: list) -> None:
    """Decode the blocks of ``batch`` (requests) in one call, within a slot: a block alone whose chunks lie in
    place into its own buffer, anything else into the slot's scratch, then each chunk copied to its place in its
    block's buffer (:func:`_placed`); every request is let go (``done``) at the end, to a call of its own
    (``alone``) where this one failed."""
    import pyopencl as cl

    queue, ok = None, False
    try:
        queue = device.scratch.queue()
        plans = [p for r in batch for p in r.plans]
        sizes = [p.size for p in plans]
        # (a block alone whose chunks all lie in place: straight into its buffer, nothing to copy)
        alone = len(batch) == 1 and all(piece.direct for piece in batch[0].found.pieces)
        if alone:
            target, offsets = batch[0].out, [piece.offset for piece in batch[0].found.pieces]
        else:
            offsets, end = [], 0
            for r in batch:     # (each chunk starting on a row of its own: its rows are copied from there)
                pitch = r.found.chunk[1] * r.found.dtype.itemsize
                for p in r.plans:
                    offsets.append(-(-end // pitch) * pitch)
                    end = offsets[-1] + p.size
            target = device.scratch.buffer("the decoded blocks of a shared call", end)
        own, calls = [], []
        batch[0].dec.load()(device, [f for r in batch for f in r.frames], target, offsets=offsets,
                            names=[p.name for r in batch for p in r.found.pieces], events=own, queue=queue,
                            plans=plans, packed=[(r.host, r.starts) for r in batch], keep=True, pending=calls)
        done, check = calls[0]
        first = 0
        for r in batch:
            n = len(r.plans)
            copies = [] if alone else [_placed(queue, r.found, piece, r.out, target, int(offsets[first + k]))
                                       for k, piece in enumerate(r.found.pieces)]
            r.last = copies[-1] if copies else done
            r.check = functools.partial(check, only=range(first, first + n))
            r.sent = sum(len(f) for f in r.frames)
            if r.events is not None:
                r.events.extend(("copy", e) for e in copies)
            first += n
        if batch[0].events is not None:     # (the call's uploads and kernels, counted once)
            batch[0].events.extend(own)
        last = nogil.enqueue_marker(queue)
        nogil.flush(queue)
        device.scratch.leave_after(last)
        # the readers' staging is read by the uploads; their next blocks refill it
        nogil.wait([e for what, e in own if what == "upload"] or [last])
        ok = True
    except Exception as e:   # noqa: BLE001  (a frame the call refused, or no room for it: each block alone says)
        if not isinstance(e, DgemmError):   # (neither the data's nor the device's memory: a fault to see, not hide)
            log.warning("a shared decode call of %d blocks failed (%s: %s); each block is decoded in a call of its "
                        "own", len(batch), type(e).__name__, e, exc_info=True)
        try:
            if queue is not None:
                queue.finish()  # (what the call did enqueue has run before a block's own call writes its buffer)
        except Exception:   # noqa: BLE001
            pass
    finally:
        for r in batch:
            r.alone = not ok
            r.done.set()


def _placed(queue, found, piece, out, scratch, at: int):
    """Copy ``piece``'s part of its decoded chunk (whole, at byte ``at`` of ``scratch``: a multiple of the chunk's
    row) to its place in ``out``, the block of ``found``: in one run where the chunk is whole rows of the block
    (``direct``), else row by row."""
    import pyopencl as cl

    if piece.direct:
        return cl.enqueue_copy(queue, out, scratch, src_offset=at, dst_offset=piece.offset,
                               byte_count=found.chunk_nbytes)
    itemsize, width, chunk_cols = found.dtype.itemsize, found.shape[1], found.chunk[1]
    first, within = divmod(at, chunk_cols * itemsize)
    if within:
        raise ValueError(f"{piece.name}: decoded at byte {at} of the scratch, within a row of {chunk_cols} values")
    return cl.enqueue_copy(queue, out, scratch,
                           src_origin=(piece.inside[1] * itemsize, first + piece.inside[0], 0),
                           dst_origin=(piece.at[1] * itemsize, piece.at[0], 0),
                           region=(piece.size[1] * itemsize, piece.size[0], 1),
                           src_pitches=(chunk_cols * itemsize, 0), dst_pitches=(width * itemsize, 0))

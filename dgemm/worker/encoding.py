"""Output blocks whose chunks the device encodes: :mod:`dgemm.storage.encoded` joined to :mod:`dgemm.opencl.codecs`.

Storage and opencl know nothing of each other (``tests/test_imports.py``);
the worker joins them here, as :mod:`dgemm.worker.decoding` does for inputs.
Where the ``device-codecs`` setting is on for this worker's device
(:func:`dgemm.worker.decoding.wanted`) and the output's chunks are plain zstd
frames (:func:`dgemm.storage.encoded.chunks_of`: one zstd compressor, no
checksum, unsharded, native byte order, C order, the block made of whole
chunks), :func:`finisher` gives the engine what it does in place of
downloading the C block (:meth:`dgemm.opencl.engine.BlockEngine.stream`'s
``finish``): the block stays on the device, each of its chunks is laid out
there (a chunk as wide as the block is already in place; others, and edge
chunks padded with the array's fill value as the host writer pads them, are
copied into a scratch buffer), all of them are encoded in one
:func:`dgemm.opencl.codecs.zstd_encode.encode_zstd` call, and only the frames
come down, into page-locked memory.  The GEMM task returns them as an
:class:`~dgemm.storage.encoded.EncodedBlock`, which its store task writes as
the chunk objects (:func:`dgemm.storage.encoded.write`).

What the device encoded counts in ``device_encoded_bytes``: every chunk's
whole size before encoding (an edge chunk's padding too), as
``host_encoded_bytes`` counts the host writer's (:mod:`dgemm.storage.fastpaths`).
"""
from __future__ import annotations

import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dgemm.errors import DeviceMemoryError
from dgemm.opencl import nogil
from dgemm.opencl.stats import seconds as _seconds
from dgemm.storage import encoded, fastpaths
from dgemm.worker import decoding
from dgemm.worker.perdevice import PerDevice


def target(device, dtype, out) -> encoded.Chunks | None:
    """The output chunks this worker encodes on ``device`` for the block ``out`` (``(array, rows, cols, drop)``,
    from :func:`dgemm.client.graph.add_store`), or None: the C block comes down and the store task encodes it
    on the host, as without the setting."""
    if out is None or not decoding.wanted(device, "encode"):
        return None
    found = encoded.chunks_of(*out)
    if found is None or found.dtype != np.dtype(dtype):
        return None   # the host converts a block to another dtype before it encodes
    return found


def device_bytes(found: encoded.Chunks, slots: int = 1) -> int:
    """What the device's encoder scratch (:attr:`Device.encode_scratch`) holds for blocks like ``found`` in each of
    its ``slots``: the block's copy, the chunks laid out side by side where they are not in place, the
    frames at their bound and the tables (a few KiB per 128 KiB block, and a chunk's own), each buffer with
    the scratch's sixteenth of room; the panel cache leaves it free, as it leaves the decode slots theirs
    (:func:`dgemm.worker.decoding.device_bytes`)."""
    from dgemm.opencl.codecs.zstd_encode import frame_bound

    n, k = found.chunk_nbytes, len(found.pieces)
    laid_out = 0 if all(found.contiguous(p) for p in found.pieces) else k * n
    return slots * ((k * n + laid_out + k * frame_bound(n)) * 17 // 16 + k * (n // 16 + (64 << 10)))


class PendingBlock:
    """A C block whose chunks the device is encoding (:func:`finisher`): what its GEMM task returns.

    Its store task waits for :meth:`result` (an
    :class:`~dgemm.storage.encoded.EncodedBlock`, or the block's values where
    the encoder had no room), which raises what the encode raised, so the
    block is never stored or marked done.  Moved to another worker or
    spilled, it is pickled as that result (waited for first).
    """

    __slots__ = ("shape", "_future", "_nbytes")

    def __init__(self, shape, future, nbytes: int):
        self.shape, self._future, self._nbytes = shape, future, nbytes

    def result(self):
        return self._future.result()

    def __reduce__(self):
        return _as_it_is, (self.result(),)

    def __sizeof__(self) -> int:   # what dask's memory accounting counts: at most the block's values
        return self._nbytes + 1024


def _as_it_is(value):
    return value


def finisher(device, found: encoded.Chunks, count=None):
    """The engine's ``finish(buffer, events, after)``: the ``m x n`` C block in ``buffer`` (C order, on ``device``,
    there once the events ``after`` have run) encoded as ``found``'s chunks by one of the device's encoder
    threads; returns ``(PendingBlock, 0, copied)`` once the thread has enqueued its copy of the block, which
    ``buffer`` may be written again after (the event ``copied``).

    So the GEMMs go on while up to :meth:`Scratch.slots <dgemm.opencl.scratch.Scratch.slots>` of the
    encoder scratch's blocks are encoded (each encode's host round trips wait behind the device's other
    work: under ``share``, beside the device's decodes, 15-80 ms a 64 MiB block, which one GEMM task
    waited out 64 times in a 32768² product; bench/NOTES.md, issue 28, fourteenth session).  ``count``
    (the engine's stats' adder) gets ``bytes_down`` and ``download_seconds`` of each encode once done.

    Where the encoder's own buffers (the block's copy, the frames: about
    twice the block) do not fit beside the run's, the block comes down as
    it would without the setting, and its store task encodes it on the
    host: ``(values, bytes downloaded)``; the encoder's kept buffers are
    given back then.
    """
    from concurrent.futures import Future

    rows, cols = found.rows[1] - found.rows[0], found.cols[1] - found.cols[0]

    def finish(buf, events, after=None):
        copied = Future()
        job = _encoders(device).submit(_encode_job, device, found, buf, after, copied, count)
        try:
            event = copied.result()
        except DeviceMemoryError:
            job.exception()     # (the job is over: nothing of it reads buf any more)
            device.encode_scratch.release()     # what it did get goes too: the next block tries afresh
            return download(device, found, buf)
        return PendingBlock((rows, cols), job, rows * cols * found.dtype.itemsize), 0, event
    return finish


class _Encoders:
    """A device's encoder threads (one per slot of its encoder scratch) and the jobs in flight on them."""

    def __init__(self, device):
        self._device = weakref.ref(device)
        self._pool = ThreadPoolExecutor(device.encode_scratch.slots(), thread_name_prefix="dgemm-encode")
        weakref.finalize(device, self._pool.shutdown, wait=False)     # (its threads end with the device)
        self._lock = threading.Lock()
        self._running = 0
        self._release = False   # the run is over: the last job in flight gives the encoder's buffers back

    def submit(self, fn, *args):
        with self._lock:
            self._running += 1
            # a block of a later run (release_after comes after a run's last block): its buffers stay for it, and
            # that run's end says when they go, not the moment its encodes in flight happen to run out
            self._release = False
        try:
            return self._pool.submit(self._job, fn, *args)
        except BaseException:
            self._done()
            raise

    def _job(self, fn, *args):
        try:
            return fn(*args)
        finally:
            self._done()

    def _done(self) -> None:
        with self._lock:
            self._running -= 1
            last = not self._running and self._release
            if last:
                self._release = False
        device = self._device()
        if last and device is not None:
            device.encode_scratch.release()

    def release_after(self) -> bool:
        """Have the last job in flight give the encoder scratch's buffers back; False where none is in flight
        (``Device.trim`` gives them back)."""
        with self._lock:
            self._release = bool(self._running)
            return self._release


_encoders = PerDevice(_Encoders)


def release(device) -> bool:
    """At a run's end (``DeviceState.release``): the device's encoder buffers go once its blocks still being
    encoded are (``Device.trim`` gives back only the slots no encode holds); whether any was."""
    found = _encoders.get(device)
    return found is not None and found.release_after()


def _encode_job(device, found: encoded.Chunks, buf, after, copied, count):
    """On an encoder thread, within a slot: copy the block out of ``buf`` (``copied`` gets the copy's event, or
    the error that stopped it), then encode the copy; its :class:`EncodedBlock`, or, where the encoder had no
    room for its other buffers, the block's values."""
    import pyopencl as cl

    rows, cols = found.rows[1] - found.rows[0], found.cols[1] - found.cols[0]
    nbytes = rows * cols * found.dtype.itemsize
    events: list = []
    with device.encode_scratch.slot():
        try:
            copy = device.encode_scratch.buffer("the C block", nbytes)
            queue = device.encode_scratch.queue()
            with device.failing(f"copying the {rows}x{cols} {found.dtype.name} result to encode"):
                event = cl.enqueue_copy(queue, copy, buf, byte_count=nbytes, wait_for=after)
                queue.flush()
        except BaseException as e:
            copied.set_exception(e)     # (finish brings the block down from buf itself where there is no room)
            raise
        events.append(("copy", event))
        copied.set_result(event)
        try:
            block = _encode(device, found, copy, events)     # (after the copy, on the slot's in-order queue)
            down = block.nbytes
        except DeviceMemoryError:   # the copy comes down as values, for the store task to encode on the host
            block, down = download(device, found, copy, queue)
    if not isinstance(block, encoded.EncodedBlock):
        device.encode_scratch.release()     # what the encoder got goes too: the next block tries afresh
    if count is not None:
        count(bytes_down=down, download_seconds=sum(_seconds(e) for what, e in events if what == "download"))
    return block


def download(device, found: encoded.Chunks, buf, queue=None):
    """The C block in ``buf`` brought down into page-locked memory: ``(values, bytes)`` (on ``queue``, by default
    the GEMMs', after the product's commands)."""
    rows, cols = found.rows[1] - found.rows[0], found.cols[1] - found.cols[0]
    out = device.host_array((rows, cols), found.dtype)
    with device.failing(f"downloading the {rows}x{cols} {found.dtype.name} result ({out.nbytes} bytes)"):
        nogil.copied(queue if queue is not None else device.queue, out, buf)
    return out, out.nbytes


def encode(device, found: encoded.Chunks, buf, events: list | None = None, after=None) -> encoded.EncodedBlock:
    """The chunks of the block in the device buffer ``buf`` (``rows x cols`` of ``found``, C order) as zstd frames.

    All chunks as wide as the block and whole are encoded where they lie;
    otherwise every chunk is first copied into a scratch buffer, one after
    another, edge chunks filled with the array's fill value outside the
    array.  The device buffers (the scratch, the encoder's) are the
    device's encoder scratch (:attr:`Device.encode_scratch`), kept for the
    next block and given back by ``Device.trim`` at the run's end; blocks
    encoded at once on one device take turns with them.

    The encode runs on the scratch slot's own queue, after the events
    ``after`` (the product's unpadding: None, ``buf`` is there already), not
    on the GEMMs' queue: there its commands would queue behind the next
    product's GEMMs, and NVIDIA's driver holds each of its uploads and
    downloads until every command before it has run, so with two GEMM tasks
    a device this block's encode would wait out the next product.
    """
    with device.encode_scratch.slot():
        return _encode(device, found, buf, events, after)


def _encode(device, found: encoded.Chunks, buf, events, after=None) -> encoded.EncodedBlock:
    """:func:`encode` within the slot of the device's encoder scratch."""
    import pyopencl as cl

    from dgemm.opencl.codecs.zstd_encode import encode_zstd, frame_bound

    n, itemsize = found.chunk_nbytes, found.dtype.itemsize
    width = found.cols[1] - found.cols[0]
    names = [f"chunk {p.key!r} of {found.array.store_path}" for p in found.pieces]
    bound = sum(frame_bound(n) for _ in found.pieces)
    host = device.host_array((bound,), np.uint8)   # page-locked: the frames come down at bus speed
    queue = device.encode_scratch.queue()           # in order: the layout copies, then the encode
    if all(found.contiguous(p) for p in found.pieces):
        src, offsets = buf, [p.at[0] * width * itemsize for p in found.pieces]
    else:
        scratch = device.encode_scratch.buffer("the encode scratch", len(found.pieces) * n)
        with device.failing(f"laying out {len(found.pieces)} chunks of {n} bytes to encode"):
            done = []
            fill = np.asarray(found.fill, found.dtype).reshape(1)
            rows, cols = found.shape
            for i, p in enumerate(found.pieces):
                if p.size != found.shape:   # an edge chunk: the part outside the array holds the fill value
                    done.append(cl.enqueue_fill_buffer(queue, scratch, fill, i * n, n))
                done.append(cl.enqueue_copy(
                    queue, scratch, buf,
                    src_origin=(p.at[1] * itemsize, p.at[0], 0), dst_origin=(0, i * rows, 0),
                    region=(p.size[1] * itemsize, p.size[0], 1),
                    src_pitches=(width * itemsize, 0), dst_pitches=(cols * itemsize, 0), wait_for=after))
            if events is not None:
                events.extend(("copy", e) for e in done)
        src, offsets = scratch, [i * n for i in range(len(found.pieces))]
        after = None    # the copies above ran after it
    frames = encode_zstd(device, src, offsets, [n] * len(found.pieces), names=names, events=events, host=host,
                         keep=True, queue=queue, wait_for=after)
    sizes = tuple(len(f) for f in frames)
    total = sum(sizes)
    fastpaths.codec("device_encoded_bytes", n * len(found.pieces))
    return encoded.EncodedBlock(found, host[:total], sizes, n * len(found.pieces))

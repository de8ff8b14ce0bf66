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

import numpy as np

from dgemm.errors import DeviceMemoryError
from dgemm.storage import encoded, fastpaths
from dgemm.worker import decoding


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


def device_bytes(found: encoded.Chunks) -> int:
    """What the device's encoder scratch (:attr:`Device.encode_scratch`) holds for the block ``found``: the
    frames at their bound, the chunks laid out side by side where they are not in place, and the tables
    (a few KiB per 128 KiB block, and a chunk's own), each buffer with the scratch's sixteenth of room; the
    panel cache leaves it free, as it leaves the decode slots theirs (:func:`dgemm.worker.decoding.device_bytes`)."""
    from dgemm.opencl.codecs.zstd_encode import frame_bound

    n, k = found.chunk_nbytes, len(found.pieces)
    laid_out = 0 if all(found.contiguous(p) for p in found.pieces) else k * n
    return (laid_out + k * frame_bound(n)) * 17 // 16 + k * (n // 16 + (64 << 10))


def finisher(device, found: encoded.Chunks):
    """The engine's ``finish(buffer, events, after)``: encode the ``m x n`` C block in ``buffer`` (C order, on
    ``device``, there once the events ``after`` have run) as ``found``'s chunks; returns
    ``(EncodedBlock, bytes downloaded)``.

    Where the encoder's own buffers (the frames, a scratch copy: up to
    about twice the block) do not fit beside the run's, the block comes down
    as it would without the setting, and its store task encodes it on the
    host: ``(values, bytes downloaded)``; the encoder's kept buffers are
    given back then.
    """

    def finish(buf, events, after=None):
        try:
            block = encode(device, found, buf, events, after)
        except DeviceMemoryError:
            device.encode_scratch.release()     # what it did get goes too: the next block tries afresh
            return download(device, found, buf)
        return block, block.nbytes
    return finish


def download(device, found: encoded.Chunks, buf):
    """The C block in ``buf`` brought down into page-locked memory: ``(values, bytes)`` (on the GEMMs' queue, after
    the product's commands)."""
    import pyopencl as cl

    rows, cols = found.rows[1] - found.rows[0], found.cols[1] - found.cols[0]
    out = device.host_array((rows, cols), found.dtype)
    with device.failing(f"downloading the {rows}x{cols} {found.dtype.name} result ({out.nbytes} bytes)"):
        cl.enqueue_copy(device.queue, out, buf, is_blocking=True)
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

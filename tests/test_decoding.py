"""Input chunks decoded on the device (dgemm.worker.decoding, the ``device-codecs`` setting), on PoCL.

References are numpy and zarr: the values a block decodes to on the device
are the array's (written by zarr, read back by numpy slicing); the bytes
sent are the chunk files' sizes on disk; the decoded bytes, whole chunks
times the chunk's size.  Arrays are small (two cores in CI) but have edge
chunks, chunks never written, chunks cut by the region and chunks as wide as
the region (decoded in place), in Zarr v2 (numcodecs' Blosc, the default
compressor's codec) and v3 (``BloscCodec(cname="lz4")``).  The last tests
run ``dgemm.matmul`` on the session's worker processes with the setting
changed on them: results against numpy, each worker's counters
(``device_decoded_bytes`` / ``host_decoded_bytes`` from its dgemm metric), a
corrupt chunk's error and the markers of the blocks it fails, and a bad
setting refused before any work.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import time
from types import SimpleNamespace

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec

import dgemm
import _device_codecs
from _check import check_product
from dgemm.names import CODEC_COUNTERS
from dgemm.storage import ZarrBlock, fastpaths, frames
from dgemm.worker.decoding import DeviceDecoded

LZ4 = {
    "v2 shuffle": {"zarr_format": 2, "compressors": numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE)},
    "v2 bitshuffle": {"zarr_format": 2, "compressors": numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.BITSHUFFLE)},
    "v3 shuffle": {"compressors": BloscCodec(cname="lz4", shuffle="shuffle")},
    "v3 noshuffle": {"compressors": BloscCodec(cname="lz4", shuffle="noshuffle", clevel=9)},
    # zstd frames without a checksum (zarr v3's default codec, numcodecs' Zstd): opencl/codecs/zstd_decode.py
    "v3 zstd": {"compressors": ZstdCodec(level=1)},
    "v3 zstd level 19": {"compressors": ZstdCodec(level=19)},
    "v2 zstd": {"zarr_format": 2, "compressors": numcodecs.Zstd(level=3)},
}
# what the device path leaves to the host reader: fill_device declines, nothing done
OTHERS = {
    "v3 zstd with checksum": {"compressors": ZstdCodec(level=1, checksum=True)},
    "v2 blosc-zstd": {"zarr_format": 2, "compressors": numcodecs.Blosc(cname="zstd")},
    "v3 blosc-lz4 sharded": {"compressors": BloscCodec(cname="lz4"), "shards": (16, 32)},
    "v3 blosc-lz4 big-endian": {"compressors": BloscCodec(cname="lz4"), "serializer": BytesCodec(endian="big")},
    "v3 raw": {"compressors": None},
}
CHUNK = (8, 16)
SHAPE = (3 * 8 + 5, 2 * 16 + 7)     # edge chunks on both axes
MISSING = {(1, 1)}                  # never written (all fill): read as the fill value


def create(path, layout: dict, rng, *, shape=SHAPE, chunks=CHUNK, dtype="float64", fill=0.25, missing=()):
    """A Zarr array with random data (``missing`` chunks left unwritten); (array, data)."""
    kw = dict(layout)
    dt = np.dtype(dtype)
    if kw.get("zarr_format") == 2:
        kw["chunk_key_encoding"] = {"name": "v2", "separator": "."}
    arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dt, fill_value=fill, **kw)
    data = rng.standard_normal(shape).astype(dt)
    for idx in missing:
        data[tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunks))] = fill
    arr[...] = data
    return arr, data


def stored(arr, rows, cols) -> list[str]:
    """The chunk files a region of a local, unsharded array touches and the store holds."""
    root = str(arr.store_path).removeprefix("file://")
    out = []
    for idx in itertools.product(range(rows[0] // arr.chunks[0], -(-rows[1] // arr.chunks[0])),
                                 range(cols[0] // arr.chunks[1], -(-cols[1] // arr.chunks[1]))):
        path = os.path.join(root, *arr.metadata.encode_chunk_key(idx).split("/"))
        if os.path.exists(path):
            out.append(path)
    return out


def regions(shape, chunk) -> dict:
    c0, c1 = chunk
    return {"whole array": ((0, shape[0]), (0, shape[1])),
            "whole rows, as wide as a chunk": ((c0, 3 * c0), (c1, 2 * c1)),      # in place; (1, 1) missing
            "cut": ((c0 // 2 + 1, shape[0] - 3), (3, shape[1] - 5)),
            "edge corner": ((3 * c0, shape[0]), (2 * c1, shape[1])),
            "one row of chunks": ((0, c0), (0, shape[1]))}


def device_read(dev, block, poison=0x7F, share=False, only=None):
    """``(values or None, bytes sent, {counter: growth})`` of DeviceDecoded(block, share, only).fill_device into a
    poisoned buffer."""
    import pyopencl as cl

    rows, cols = block.shape
    out = dev.buffer(rows * cols * block.dtype.itemsize + 64, "test output")
    try:
        cl.enqueue_fill_buffer(dev.transfer_queue, out, np.uint8(poison), 0, out.size).wait()
        before = fastpaths.snapshot()
        sent = DeviceDecoded(block, share, only).fill_device(dev, out, dev.transfer_queue)
        grew = fastpaths.since(before)
        host = np.empty(out.size, np.uint8)
        cl.enqueue_copy(dev.transfer_queue, host, out, is_blocking=True)
    finally:
        out.release()
    n = rows * cols * block.dtype.itemsize
    assert (host[n:] == poison).all(), "bytes written past the block's end"
    values = host[:n].view(block.dtype).reshape(rows, cols) if sent is not None else None
    if sent is None:
        assert (host == poison).all(), "a declined block wrote to the buffer"
    return values, sent, {k: grew[k] for k in CODEC_COUNTERS}


# -- one block, on the device -------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(LZ4))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_blocks_decode_on_the_device_to_the_arrays_values(any_device, tmp_path, rng, layout, dtype):
    arr, data = create(tmp_path / "a.zarr", LZ4[layout], rng, dtype=dtype, missing=MISSING)
    chunk_bytes = CHUNK[0] * CHUNK[1] * np.dtype(dtype).itemsize
    for name, (rows, cols) in regions(SHAPE, CHUNK).items():
        got, sent, grew = device_read(any_device, ZarrBlock(arr, rows, cols))
        label = f"{layout} {dtype} {name}"
        assert got is not None, f"{label}: declined"
        np.testing.assert_array_equal(got, data[rows[0]:rows[1], cols[0]:cols[1]], err_msg=label)
        files = stored(arr, rows, cols)
        assert sent == sum(os.path.getsize(f) for f in files), f"{label}: sent {sent} bytes, not the chunk files'"
        assert grew == {"device_decoded_bytes": len(files) * chunk_bytes, "host_decoded_bytes": 0,
                        "device_encoded_bytes": 0, "host_encoded_bytes": 0}, f"{label}: {grew}"


@pytest.mark.parametrize("layout", list(OTHERS))
def test_other_codecs_and_layouts_are_left_to_the_host(any_device, tmp_path, rng, layout):
    arr, data = create(tmp_path / "a.zarr", OTHERS[layout], rng)
    _, sent, grew = device_read(any_device, ZarrBlock(arr, (0, SHAPE[0]), (0, SHAPE[1])))
    assert sent is None and not any(grew.values()), (layout, sent, grew)
    # and the host reads it as before
    np.testing.assert_array_equal(DeviceDecoded(ZarrBlock(arr, (0, SHAPE[0]), (0, SHAPE[1]))).load(), data)


def test_a_frame_the_device_does_not_decode_is_decoded_on_the_host(any_device, tmp_path, rng):
    """One chunk of a Blosc-LZ4 array written by Blosc with zstd (a valid frame, another compressor)."""
    arr, data = create(tmp_path / "a.zarr", LZ4["v2 shuffle"], rng)
    part = np.ascontiguousarray(data[8:16, 0:16])
    path = os.path.join(str(arr.store_path).removeprefix("file://"), "1.0")
    with open(path, "wb") as f:
        f.write(numcodecs.Blosc(cname="zstd").encode(part))
    got, _, grew = device_read(any_device, ZarrBlock(arr, (0, 24), (0, 16)))
    np.testing.assert_array_equal(got, data[:24, :16])
    assert grew["host_decoded_bytes"] == part.nbytes and grew["device_decoded_bytes"] == 2 * part.nbytes, grew


@contextlib.contextmanager
def every_slot_held(dev):
    """Threads holding every decode slot of ``dev`` (its readers busy decoding, as far as a block can tell) within."""
    try:
        assert _device_codecs.hold_slots(device=dev) == 0
        yield
    finally:
        _device_codecs.free_slots()


def test_share_leaves_a_block_to_the_host_while_every_slot_is_busy(any_device, tmp_path, rng, monkeypatch):
    """``device-codecs: share``: a block whose reader finds every decode slot busy is declined at once, nothing
    read, counted or written, so the host decodes it; once a slot is free the device decodes it."""
    from dgemm.worker import decoding

    arr, data = create(tmp_path / "a.zarr", LZ4["v3 zstd"], rng, dtype="float32")
    block = ZarrBlock(arr, (0, SHAPE[0]), (0, SHAPE[1]))
    reads = []
    real = decoding._read_packed
    monkeypatch.setattr(decoding, "_read_packed", lambda *a: reads.append(1) or real(*a))
    with every_slot_held(any_device):
        assert DeviceDecoded(block, share=True).declines(any_device)
        assert not DeviceDecoded(block).declines(any_device)      # on: its reader waits for a slot instead
        got, sent, grew = device_read(any_device, block, share=True)
        assert sent is None and not any(grew.values()) and not reads, (sent, grew, reads)
    assert not DeviceDecoded(block, share=True).declines(any_device)
    got, sent, grew = device_read(any_device, block, share=True)
    np.testing.assert_array_equal(got, data)
    assert grew["device_decoded_bytes"] > 0 and grew["host_decoded_bytes"] == 0 and reads, grew


@pytest.mark.parametrize("trans_a", [False, True], ids=["a", "a-transposed"])
def test_share_in_the_engine_decodes_on_the_host_while_the_slots_are_busy(any_device, engines, tmp_path, rng,
                                                                         trans_a, monkeypatch):
    """The engine stages a declined block through the host's reader (padding or transposing it as any upload), and
    the same blocks on the device once a slot is free: both products right."""
    eng = engines(any_device, "float64")
    m, n, k = 37, 29, 45
    A, B = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    sa = A.T if trans_a else A
    arrays = []
    for name, value in (("a", sa), ("b", B)):
        z = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=value.shape, chunks=(16, 16), dtype="f8",
                              compressors=ZstdCodec(level=3))
        z[...] = value
        arrays.append(DeviceDecoded(ZarrBlock(z, (0, value.shape[0]), (0, value.shape[1])), share=True))
    nbytes = (sa.size + B.size) * 8
    allocated = []
    real = any_device.buffer

    def counted(size, what="a device buffer"):
        if " block" in what and "accumulator" not in what:    # the blocks' own (staged, upload, decode)
            allocated.append(what)
        return real(size, what)

    monkeypatch.setattr(any_device, "buffer", counted)
    plain = [r.block for r in arrays]     # the host's path alone: what it allocates
    any_device.spares.release()         # (each stream makes its blocks' source buffers anew: none free)
    eng.stream(plain[:1], plain[1:], m, n, trans_a=trans_a, scope=("plain", tmp_path.name))
    host_path = sorted(allocated)
    for busy in (True, False):
        allocated.clear()
        any_device.spares.release()
        before = fastpaths.snapshot()
        with every_slot_held(any_device) if busy else contextlib.nullcontext():
            got = eng.stream(arrays[:1], arrays[1:], m, n, trans_a=trans_a, scope=("share", busy, tmp_path.name))
        grew = fastpaths.since(before)
        check_product(got, A, B, dtype="float64", what=f"slots busy: {busy}")
        where, other = ("host", "device") if busy else ("device", "host")
        assert grew[f"{where}_decoded_bytes"] >= nbytes and grew[f"{other}_decoded_bytes"] == 0, (busy, grew)
        if busy:    # declined before the device path allocated anything for the blocks
            assert sorted(allocated) == host_path, (allocated, host_path)


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "padded"])
@pytest.mark.parametrize("inline", [False, True], ids=["own-queues", "inline"])
@pytest.mark.parametrize("codec", ["blosc-lz4", "zstd"])
def test_the_engine_stages_device_decoded_blocks(any_device, engines, tmp_path, rng, trans_a, trans_b, aligned,
                                                 inline, codec, monkeypatch):
    """Blocks decoded in place (aligned: the staged buffer itself) and through the padding or transposing kernels;
    with ``queue-priority: inline``, the decoders' commands in the GEMM kernels' queue; zstd's decodes deferred
    (the product takes the block once its decode is enqueued), Blosc-LZ4's waited for."""
    monkeypatch.setattr(any_device, "inline_feeding", inline)
    assert (any_device.scratch.queue() is any_device.queue) == inline
    eng = engines(any_device, "float64")
    p = eng.params
    m, n, k = (p.TSM * 2, p.TSN * 2, p.TSK * 4) if aligned else (37, 29, 45)
    A, B = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    sa, sb = (A.T if trans_a else A), (B.T if trans_b else B)
    comp = BloscCodec(cname="lz4") if codec == "blosc-lz4" else ZstdCodec(level=3)
    za = zarr.create_array(str(tmp_path / "a.zarr"), shape=sa.shape, chunks=(sa.shape[0] // 2 + 1, sa.shape[1]),
                           dtype="f8", compressors=comp)
    zb = zarr.create_array(str(tmp_path / "b.zarr"), shape=sb.shape, chunks=(16, 16), dtype="f8", compressors=comp)
    za[...], zb[...] = sa, sb
    ra = DeviceDecoded(ZarrBlock(za, (0, sa.shape[0]), (0, sa.shape[1])))
    rb = DeviceDecoded(ZarrBlock(zb, (0, sb.shape[0]), (0, sb.shape[1])))
    before = fastpaths.snapshot()
    any_device.trim(keep_pinned=True)
    got = eng.stream([ra], [rb], m, n, trans_a=trans_a, trans_b=trans_b, scope=("test", tmp_path.name))
    grew = fastpaths.since(before)
    check_product(got, A, B, dtype="float64")
    assert grew["host_decoded_bytes"] == 0 and grew["device_decoded_bytes"] >= za.nbytes + zb.nbytes, grew
    # read again (another scope): a block decoded through the padding or transposing kernel decodes into a
    # source buffer of the first product's, given back once its kernel ran (dgemm.opencl.spares)
    reused, gave = any_device.spares.reused, any_device.spares.held() > 0
    assert gave or aligned, "a padded block's source buffer never came back"
    again = eng.stream([ra], [rb], m, n, trans_a=trans_a, trans_b=trans_b, scope=("again", tmp_path.name))
    check_product(again, A, B, dtype="float64", what="read again")
    assert (any_device.spares.reused > reused) == gave, (gave, any_device.spares.reused)
    any_device.trim(keep_pinned=True)
    assert any_device.spares.held() == 0


def test_a_block_declined_after_its_buffer_was_taken_gives_it_back_unread(any_device, engines, tmp_path, rng,
                                                                          monkeypatch):
    """``fill_device`` declines (None: nothing enqueued) after the engine took the block's source buffer: the
    buffer goes back free at once (not released beside the GEMMs), and the host path's upload of the same block
    takes it; the product is right."""
    eng = engines(any_device, "float64")
    m, n, k = 37, 29, 45
    A, B = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    refs = []
    for name, value in (("a", A), ("b", B)):
        z = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=value.shape, chunks=(16, 16), dtype="f8",
                              compressors=ZstdCodec(level=3))
        z[...] = value
        refs.append(DeviceDecoded(ZarrBlock(z, (0, value.shape[0]), (0, value.shape[1]))))
    monkeypatch.setattr(DeviceDecoded, "fill_device", lambda self, *args, **kwargs: None)
    any_device.spares.release()
    reused = any_device.spares.reused
    got = eng.stream(refs[:1], refs[1:], m, n, scope=("declined", tmp_path.name))
    check_product(got, A, B, dtype="float64")
    assert any_device.spares.reused >= reused + 2, "a declined block's buffer was not taken by its upload"
    any_device.trim(keep_pinned=True)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "padded"])
def test_a_deferred_decode_is_waited_for_on_the_device(any_device, engines, tmp_path, rng, aligned, monkeypatch):
    """zstd blocks are handed to the product once their decode is enqueued: the staged block's event completes
    only after the decode's kernels (held here behind a gate the test opens later), and the product is right."""
    import pyopencl as cl

    from dgemm.opencl.codecs import zstd_decode as zd

    gate = cl.UserEvent(any_device.context)
    real = zd.program

    class Gated:
        def __init__(self, prog):
            self._prog = prog

        def __getattr__(self, name):
            return getattr(self._prog, name)

        def execute(self, queue, *args, **kw):   # a call's last kernel, after all its uploads
            cl.enqueue_barrier(queue, wait_for=[gate])
            return self._prog.execute(queue, *args, **kw)

    monkeypatch.setattr(zd, "program", lambda *a, **kw: Gated(real(*a, **kw)))
    eng = engines(any_device, "float64")
    p = eng.params
    k, n = (p.TSK * 4, p.TSN * 2) if aligned else (45, 29)
    X = rng.standard_normal((k, n))       # a block of B: staged as it is (k x n), K padded to TSK
    zx = zarr.create_array(str(tmp_path / "b.zarr"), shape=X.shape, chunks=X.shape, dtype="f8",
                           compressors=ZstdCodec(level=3))
    zx[...] = X
    transpose, drows, dcols = eng._layout("b", False, k, eng._padded(n, n)[1])
    assert not transpose and ((drows, dcols) == (k, n)) == aligned
    try:
        staged = eng._decoded(DeviceDecoded(ZarrBlock(zx, (0, k), (0, n))), transpose, drows, dcols)
        assert staged is not None and len(staged) == 3, "the decode was not deferred"
        buf, ev, checks = staged
        time.sleep(0.3)     # what does not wait for the gate has run by now
        assert ev is not None and ev.command_execution_status != cl.command_execution_status.COMPLETE
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    ev.wait()
    for check in checks:
        check()
    got = np.empty((drows, dcols), np.float64)
    cl.enqueue_copy(any_device.queue, got, buf).wait()
    buf.release()
    np.testing.assert_array_equal(got[:k, :n], X)
    assert not got[k:].any() and not got[:, n:].any()


# -- blocks decoded together (zstd): the blocks queued behind busy slots share one call ----------------------------
def _queued_behind_held_slots(dev, blocks, monkeypatch, bad=(), wait: float = 60):
    """Fill each of ``blocks`` (DeviceDecoded, deferred) from a thread of its own while every decode slot is held,
    let the slots go once all of them have queued, and return per block ``(poisoned host copy of its buffer,
    pending, error)`` and the decode calls made (each the frames' names); ``bad``: the indices whose check
    should raise (the others' must not)."""
    import threading

    import pyopencl as cl

    from dgemm.opencl.codecs import zstd_decode as zd
    from dgemm.worker import decoding

    calls = []
    real = zd.decode_zstd

    def counted(device, frames, *args, **kw):
        calls.append(list(kw.get("names") or []))
        return real(device, frames, *args, **kw)
    monkeypatch.setattr(zd, "decode_zstd", counted)
    outs = [dev.buffer(int(np.prod(b.shape)) * b.dtype.itemsize, "test output") for b in blocks]
    pendings, errors, threads = [[] for _ in blocks], [None] * len(blocks), []

    def fill(i):
        try:
            blocks[i].fill_device(dev, outs[i], dev.transfer_queue, pending=pendings[i])
        except Exception as e:     # noqa: BLE001  (returned to the test)
            errors[i] = e
    try:
        for o in outs:
            cl.enqueue_fill_buffer(dev.transfer_queue, o, np.uint8(0x7F), 0, o.size).wait()
        with every_slot_held(dev):
            threads += [threading.Thread(target=fill, args=(i,), daemon=True) for i in range(len(blocks))]
            for t in threads:
                t.start()
            queue = decoding._batches(dev)._queue
            deadline = time.monotonic() + wait
            while len(queue) < len(blocks) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(queue) == len(blocks), f"{len(queue)} of {len(blocks)} blocks queued"
        for t in threads:
            t.join(120)
        got = []
        for i, (b, o) in enumerate(zip(blocks, outs)):
            assert errors[i] is None, errors[i]
            assert len(pendings[i]) == 1, pendings[i]
            event, check = pendings[i][0]
            event.wait()
            if i in bad:
                with pytest.raises(OSError) as info:
                    check()
                errors[i] = info.value
            else:
                check()
            host = np.empty(o.size, np.uint8)
            cl.enqueue_copy(dev.transfer_queue, host, o, is_blocking=True)
            got.append(host.view(b.dtype).reshape(b.shape))
    finally:
        for t in threads:       # (slots freed: they end) before their buffers go
            t.join(120)
        dev.transfer_queue.finish()
        for o in outs:
            o.release()
    return got, errors, calls


def test_blocks_queued_behind_busy_slots_share_one_decode_call(any_device, tmp_path, rng, monkeypatch):
    """zstd blocks whose readers queue while every decode slot is busy are decoded in one call once a slot is free
    (up to ``BATCH`` blocks), each block's chunks copied into its own buffer: every value right, none left
    poisoned, and the codec counters as for calls of their own."""
    from dgemm.worker import decoding

    arr, data = create(tmp_path / "a.zarr", LZ4["v2 zstd"], rng, shape=(80, 512), chunks=(8, 512), dtype="float32")
    spans = [(0, 16), (16, 40), (40, 48), (48, 80)]       # whole-row chunks: each block's chunks lie in place
    blocks = [DeviceDecoded(ZarrBlock(arr, r, (0, 512))) for r in spans]
    assert decoding.BATCH >= len(blocks)
    before = fastpaths.snapshot()
    got, _, calls = _queued_behind_held_slots(any_device, blocks, monkeypatch)
    grew = fastpaths.since(before)
    for (r0, r1), values in zip(spans, got):
        np.testing.assert_array_equal(values, data[r0:r1])
    assert len(calls) == 1 and len(calls[0]) == 10, calls
    assert grew["device_decoded_bytes"] == data.nbytes and grew["host_decoded_bytes"] == 0, grew


@pytest.mark.parametrize("how", ["shared zstd call", "blosc-lz4"])
def test_decodes_wait_for_the_device_outside_the_driver(any_device, engines, tmp_path, rng, monkeypatch, how):
    """A decode call shared by blocks queued behind busy slots, and Blosc-LZ4 blocks staged by the engine: no
    thread of dgemm's waits in ``clWaitForEvents`` or a blocking transfer (tests/_driver_waits.py says why), and
    every value is right."""
    from _driver_waits import waits_in_the_driver

    if how == "shared zstd call":
        arr, data = create(tmp_path / "a.zarr", LZ4["v2 zstd"], rng, shape=(48, 512), chunks=(8, 512),
                           dtype="float32")
        spans = [(0, 16), (16, 40), (40, 48)]
        blocks = [DeviceDecoded(ZarrBlock(arr, r, (0, 512))) for r in spans]
        with waits_in_the_driver() as waits:
            got, _, calls = _queued_behind_held_slots(any_device, blocks, monkeypatch)
        assert len(calls) == 1, calls
        for (r0, r1), values in zip(spans, got):
            np.testing.assert_array_equal(values, data[r0:r1])
    else:
        m, k, n = 37, 45, 29
        A, B = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        refs = []
        for name, value in (("a", A), ("b", B)):
            z = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=value.shape, chunks=(16, 16), dtype="f8",
                                  compressors=BloscCodec(cname="lz4"))
            z[...] = value
            refs.append(DeviceDecoded(ZarrBlock(z, (0, value.shape[0]), (0, value.shape[1]))))
        before = fastpaths.snapshot()
        with waits_in_the_driver() as waits:
            got = engines(any_device, "float64").stream(refs[:1], refs[1:], m, n, scope=("waits", tmp_path.name))
        assert fastpaths.since(before)["host_decoded_bytes"] == 0
        check_product(got, A, B, dtype="float64")
    assert waits == [], waits


def _copied_into_place(tmp_path, rng, which: str) -> list:
    """Blocks whose chunks do not all lie in place, as ``(array, its values, rows, cols)``: ``one``, a block of
    chunks side by side; ``four``, blocks of two arrays whose chunk rows have other lengths; ``edges``, blocks
    that mix chunks in place and chunks copied, and take the clipped edge chunks of an array."""
    # Chunks of 3,200, 8,320 and 4,096 bytes, whose frames of normal values compress (a frame past its room is
    # read aside, and a block with one goes its own way).  Rows of 200 and 1,040 bytes: in whatever order the
    # blocks of `four` queue, a chunk placed right after the other array's chunks would start within a row.
    one, x = create(tmp_path / "x.zarr", LZ4["v2 zstd"], rng, shape=(96, 300), chunks=(16, 50), dtype="float32")
    two, y = create(tmp_path / "y.zarr", LZ4["v2 zstd"], rng, shape=(40, 390), chunks=(8, 130), dtype="float64")
    spans = {"one": [(one, x, (0, 32), (0, 150))],     # whole chunks, side by side: a chunk's rows are not the block's
             "four": [(one, x, (0, 32), (0, 150)),
                      (two, y, (5, 29), (37, 351)),     # off the grid in both directions: parts of chunks
                      (one, x, (7, 96), (13, 300)),
                      (two, y, (0, 40), (0, 390))]}
    if which == "edges":    # one chunk as wide as the array: whole chunks in place between cut ones; rows 80-90 clipped
        three, z = create(tmp_path / "z.zarr", LZ4["v2 zstd"], rng, shape=(90, 64), chunks=(16, 64), dtype="float32")
        spans["edges"] = [(three, z, (3, 40), (0, 64)), (three, z, (60, 90), (0, 64)), (two, y, (33, 40), (0, 390)),
                          (one, x, (90, 96), (290, 300))]
    return spans[which]


@pytest.mark.parametrize("which", ["one", "four", "edges"])
def test_blocks_whose_chunks_are_copied_into_place_share_a_call_too(any_device, tmp_path, rng, monkeypatch, which):
    """Blocks whose chunks do not all lie in place (chunks side by side, a block off the chunk grid, clipped edge
    chunks), of arrays whose chunks have rows of other lengths, queued behind busy slots: one call for all of them,
    each chunk's rows and columns copied from the call's scratch to their place, every value right and none left
    poisoned; no block goes its own way (a block alone in its call goes through the scratch too)."""
    from dgemm.worker import decoding

    spans = _copied_into_place(tmp_path, rng, which)
    blocks = [DeviceDecoded(ZarrBlock(a, r, c)) for a, _, r, c in spans]
    assert decoding.BATCH >= len(blocks)
    pieces = [p for b in blocks for p in frames.region(b.block).pieces]
    assert not all(p.direct for p in pieces) and (which != "edges" or any(p.direct for p in pieces))

    def own_way(*args, **kw):
        raise AssertionError("a block was decoded in a call of its own")
    monkeypatch.setattr(decoding, "_decode_read", own_way)
    got, errors, calls = _queued_behind_held_slots(any_device, blocks, monkeypatch, wait=20)
    assert errors == [None] * len(blocks)
    for (_, data, (r0, r1), (c0, c1)), values in zip(spans, got):
        np.testing.assert_array_equal(values, data[r0:r1, c0:c1])
    assert len(calls) == 1, calls


def test_a_shared_call_that_fails_for_no_fault_of_its_data_says_so(any_device, tmp_path, rng, monkeypatch, caplog):
    """A shared call that fails with an error neither of the data nor of the device's memory (here its first copy
    into place) leaves each block to a call of its own, whose values are right, and logs a warning with the
    error: a fault of this code or the driver's is not hidden behind the fallback."""
    from dgemm.worker import decoding

    spans = _copied_into_place(tmp_path, rng, "four")
    blocks = [DeviceDecoded(ZarrBlock(a, r, c)) for a, _, r, c in spans]
    placed, failed = decoding._placed, []

    def once(*args, **kw):
        if not failed:
            failed.append(True)
            raise AttributeError("a stand-in for a fault")
        return placed(*args, **kw)
    monkeypatch.setattr(decoding, "_placed", once)
    with caplog.at_level("WARNING", logger="dgemm.worker.decoding"):
        got, errors, calls = _queued_behind_held_slots(any_device, blocks, monkeypatch)
    assert errors == [None] * len(blocks) and failed
    for (_, data, (r0, r1), (c0, c1)), values in zip(spans, got):
        np.testing.assert_array_equal(values, data[r0:r1, c0:c1])
    assert len(calls) == 1 + len(blocks), calls
    said = [r for r in caplog.records if "shared decode call" in r.getMessage()]
    assert len(said) == 1 and "AttributeError: a stand-in for a fault" in said[0].getMessage(), caplog.text


def test_a_shared_call_takes_no_more_than_its_bytes_cap(any_device, tmp_path, rng, monkeypatch):
    """``BATCH_BYTES``: past its first block a call takes no block that would carry it over the cap (here one
    block's bytes: every block gets a call of its own), and the blocks come out right."""
    from dgemm.worker import decoding

    arr, data = create(tmp_path / "a.zarr", LZ4["v2 zstd"], rng, shape=(48, 512), chunks=(8, 512), dtype="float32")
    spans = [(0, 16), (16, 32), (32, 48)]
    monkeypatch.setattr(decoding, "BATCH_BYTES", 16 * 512 * 4)
    blocks = [DeviceDecoded(ZarrBlock(arr, r, (0, 512))) for r in spans]
    got, _, calls = _queued_behind_held_slots(any_device, blocks, monkeypatch)
    assert sorted(len(c) for c in calls) == [2, 2, 2], calls
    for (r0, r1), values in zip(spans, got):
        np.testing.assert_array_equal(values, data[r0:r1])


@pytest.mark.parametrize("spans, cap_blocks, want", [
    ([(0, 16), (16, 32), (32, 48), (48, 64)], 2.5, [4, 4]),                 # two blocks a call, not four
    ([(0, 16), (16, 24), (24, 32), (32, 48), (48, 64)], 2.5, None),         # mixed: 2, 1, 1, 2, 2 chunks
    ([(0, 16), (16, 32), (32, 48)], 0.5, [2, 2, 2]),                        # a cap below one block: each alone
])
def test_a_shared_call_holds_no_more_than_its_part_of_the_devices_memory(any_device, tmp_path, rng, monkeypatch,
                                                                        spans, cap_blocks, want):
    """``limit_calls``: on a device whose memory share leaves each slot ``cap_blocks`` blocks' calls (blocks of two
    chunks), the blocks queued behind busy slots go in calls that keep to the cap in queue order (a first block
    whatever it holds), the reserve counts the cap's bytes, the slots hold no more, and the blocks come out right."""
    from dgemm.opencl.scratch import SLOTS
    from dgemm.worker import decoding

    arr, data = create(tmp_path / "a.zarr", LZ4["v2 zstd"], rng, shape=(64, 512), chunks=(8, 512), dtype="float32")
    blocks = [DeviceDecoded(ZarrBlock(arr, r, (0, 512))) for r in spans]
    two = decoding.call_bytes(ZarrBlock(arr, (0, 16), (0, 512)))
    share = int(cap_blocks * two * SLOTS / decoding.SLOTS_SHARE)
    cap = decoding.call_cap(share)
    assert abs(cap - cap_blocks * two) <= 1 and decoding.BATCH >= 4
    assert decoding.reserve(any_device, blocks, share) >= SLOTS * min(cap, decoding.BATCH * two)
    monkeypatch.setattr(decoding._batches(any_device), "cap", None)     # (set back after the test)
    any_device.scratch.release()
    decoding.limit_calls(any_device, share)
    queued, take = [], decoding._take

    def watched(queue, cap=None):       # the chunks of each block in the order the readers queued them
        queued.append([len(r.plans) for r in queue])
        return take(queue, cap)
    monkeypatch.setattr(decoding, "_take", watched)
    got, _, calls = _queued_behind_held_slots(any_device, blocks, monkeypatch)
    if want is None:    # greedy in queue order: a block joins while the call's chunks keep within the cap
        chunk, order, want = two // 2, queued[0], []
        while order:
            n = 1
            while n < min(decoding.BATCH, len(order)) and sum(order[:n + 1]) * chunk <= cap:
                n += 1
            want.append(sum(order[:n]))
            order = order[n:]
        assert len(want) < len(spans) and max(want) > 2, want    # (the case shares calls, of more than a block)
    assert len(queued[0]) == len(spans) and sorted(len(c) for c in calls) == sorted(want), (calls, queued)
    assert any_device.scratch.nbytes() <= decoding.device_bytes(blocks, share) == SLOTS * max(two, cap)
    for (r0, r1), values in zip(spans, got):
        np.testing.assert_array_equal(values, data[r0:r1])


def test_a_call_takes_its_first_block_whatever_the_cap_and_keeps_to_it_after():
    """``_take`` (no device): queued blocks of 2, 1, 4 and 1 chunks under a cap of three chunks' bytes give calls
    of 2+1, then 4 (over the cap alone: taken, or its reader would wait for ever), then 1; each request marked."""
    from types import SimpleNamespace as NS

    from dgemm.worker import decoding

    chunk = 1 << 20
    per = decoding._chunk_call_bytes(chunk)

    def req(n):
        return NS(plans=[NS(size=chunk)] * n, found=NS(chunk_nbytes=chunk), taken=False)
    queue = [req(n) for n in (2, 1, 4, 1)]
    calls = []
    while queue:
        batch = decoding._take(queue, 3 * per)
        assert batch and all(r.taken for r in batch)
        calls.append([len(r.plans) for r in batch])
    assert calls == [[2, 1], [4], [1]], calls
    queue = [req(n) for n in (2, 1, 4, 1)]
    assert [len(r.plans) for r in decoding._take(queue, None)] == [2, 1, 4, 1][:decoding.BATCH]


def test_a_chunk_a_kernel_refuses_fails_only_its_block_in_a_shared_call(any_device, tmp_path, rng, monkeypatch):
    """A shared call with one chunk that only the kernels find corrupt: that block's check raises the reader's
    error naming its chunk; the other blocks of the call are whole and pass."""
    arr, data = create(tmp_path / "a.zarr", LZ4["v2 zstd"], rng, shape=(48, 512), chunks=(8, 512), dtype="float32")
    path = os.path.join(str(arr.store_path).removeprefix("file://"), "3.0")
    with open(path, "rb") as f:
        good = f.read()
    with open(path, "wb") as f:
        f.write(_device_refused_flip(any_device, good))
    spans = [(0, 16), (16, 32), (32, 48)]       # the second block holds chunk (3, 0)
    blocks = [DeviceDecoded(ZarrBlock(arr, r, (0, 512))) for r in spans]
    got, errors, calls = _queued_behind_held_slots(any_device, blocks, monkeypatch, bad={1})
    assert len(calls) == 1, calls
    assert "chunk (3, 0) (store key '3.0')" in str(errors[1]), errors[1]
    for i in (0, 2):
        r0, r1 = spans[i]
        np.testing.assert_array_equal(got[i], data[r0:r1])


def test_a_shared_call_that_fails_leaves_each_block_to_a_call_of_its_own(any_device, tmp_path, rng, monkeypatch):
    """Where the shared call itself raises (here: refused for taking several blocks), each block is decoded in a
    call of its own, so an error names its own chunk, and sound blocks come out right."""
    from dgemm.opencl.codecs import zstd_decode as zd

    arr, data = create(tmp_path / "a.zarr", LZ4["v3 zstd"], rng, shape=(32, 512), chunks=(8, 512), dtype="float32")
    real = zd.decode_zstd

    def no_sharing(device, frames, *args, **kw):
        if isinstance(kw.get("packed"), list) and len(kw["packed"]) > 1:
            raise zd.ZstdFrameError("refused: a shared call")
        return real(device, frames, *args, **kw)
    monkeypatch.setattr(zd, "decode_zstd", no_sharing)
    spans = [(0, 16), (16, 32)]
    blocks = [DeviceDecoded(ZarrBlock(arr, r, (0, 512))) for r in spans]
    got, _, calls = _queued_behind_held_slots(any_device, blocks, monkeypatch)
    assert len(calls) == 3 and sorted(len(c) for c in calls) == [2, 2, 4], calls     # the shared one, then one each
    for (r0, r1), values in zip(spans, got):
        np.testing.assert_array_equal(values, data[r0:r1])


# -- on the workers -------------------------------------------------------------------------------------------------
@pytest.fixture
def setting(client):
    """``setting(value)``: the workers' ``device-codecs``; unset again after the test."""
    yield from _device_codecs.setting(client)


run_counted = _device_codecs.run_counted


def inputs(tmp_path, rng, layout, dtype="float32"):
    """A (50 x 40) and B (40 x 30) in 16 x 16 chunks (edge chunks on every axis); their paths and values."""
    A, B = rng.standard_normal((50, 40)).astype(dtype), rng.standard_normal((40, 30)).astype(dtype)
    out = {}
    for name, value in (("a", A), ("b", B)):
        arr, _ = create(tmp_path / f"{name}.zarr", layout, rng, shape=value.shape, chunks=(16, 16), dtype=dtype)
        arr[...] = value
        out[name] = arr
    return out["a"], out["b"], A, B


def decoded_bytes(*arrays) -> int:
    """What decoding every chunk of ``arrays`` once gives: whole chunks, edge chunks at their full size."""
    return sum(a.nchunks * int(np.prod(a.chunks)) * a.dtype.itemsize for a in arrays)


def _auto_as(device_type, way, dask_worker=None):
    """On a worker: ``auto`` takes the device path ``way`` (``on``, ``share``) on devices of ``device_type``, as on a
    GPU (None: as built)."""
    from dgemm.opencl import codecs

    if not hasattr(codecs, "_BUILT_AUTO"):
        codecs._BUILT_AUTO = dict(codecs.AUTO)
    codecs.AUTO = dict(codecs._BUILT_AUTO) if device_type is None else {device_type: way}


@pytest.mark.parametrize("way", ["on", "share"])
def test_auto_on_a_gpu_decodes_zstd_inputs_encodes_c_and_leaves_blosc_to_the_host(client, setting, tmp_path, rng,
                                                                                   way):
    """``auto`` where AUTO maps the device type to ``way`` (GPUs, as built: ``on``; here the workers' CPU device
    stands in for one): zstd inputs are decoded on the device, each chunk once, C's zstd chunks are encoded on
    the device, and Blosc inputs stay on the host's readers.  With every decode slot busy, under ``share`` the
    host's readers take the zstd chunks; under ``on`` they wait for the slots.  On a CPU device as built,
    ``auto`` is off."""
    import threading

    from dgemm.opencl import codecs

    assert codecs.AUTO["GPU"] in ("on", "share")      # (what GPUs take is one of the ways tested here)
    zstd_a, zstd_b, A, B = inputs(tmp_path / "z", rng, LZ4["v3 zstd"])
    blosc_a, blosc_b, A2, B2 = inputs(tmp_path / "l", rng, LZ4["v3 shuffle"])
    setting(None)
    client.run(_auto_as, "CPU", way)
    try:
        out = str(tmp_path / "c-zstd.zarr")
        c, grew = run_counted(client, lambda: dgemm.matmul(zstd_a, zstd_b, out=out, client=client, block=64))
        check_product(np.asarray(c[...]), A, B, dtype="float32", what="auto, zstd")
        assert grew["device_decoded_bytes"] == decoded_bytes(zstd_a, zstd_b) and grew["host_decoded_bytes"] == 0, grew
        assert grew["device_encoded_bytes"] > 0 and grew["host_encoded_bytes"] == 0, grew
        out = str(tmp_path / "c-blosc.zarr")
        c, grew = run_counted(client, lambda: dgemm.matmul(blosc_a, blosc_b, out=out, client=client, block=64))
        check_product(np.asarray(c[...]), A2, B2, dtype="float32", what="auto, blosc")
        assert grew["device_decoded_bytes"] == 0 and grew["host_decoded_bytes"] == decoded_bytes(blosc_a, blosc_b), grew
        out, got = str(tmp_path / "c-held.zarr"), {}
        try:
            assert set(client.run(_device_codecs.hold_slots).values()) == {0}
            if way == "share":  # the host's readers take the zstd chunks
                got["c"], got["grew"] = run_counted(
                    client, lambda: dgemm.matmul(zstd_a, zstd_b, out=out, client=client, block=64))
            else:               # the readers wait: the product runs once the slots are free
                def run():
                    got["c"], got["grew"] = run_counted(
                        client, lambda: dgemm.matmul(zstd_a, zstd_b, out=out, client=client, block=64))
                waiting = threading.Thread(target=run)
                waiting.start()
                time.sleep(1.0)
                assert waiting.is_alive(), "the product ran while every decode slot was held"
        finally:
            client.run(_device_codecs.free_slots)
        if way != "share":
            waiting.join(120)
        check_product(np.asarray(got["c"][...]), A, B, dtype="float32", what="auto, zstd, slots busy")
        on_host = decoded_bytes(zstd_a, zstd_b) if way == "share" else 0
        assert got["grew"]["device_decoded_bytes"] == decoded_bytes(zstd_a, zstd_b) - on_host, got["grew"]
        assert got["grew"]["host_decoded_bytes"] == on_host, got["grew"]
    finally:
        client.run(_auto_as, None, None)
    out = str(tmp_path / "c-built.zarr")
    c, grew = run_counted(client, lambda: dgemm.matmul(zstd_a, zstd_b, out=out, client=client, block=64))
    assert grew["device_decoded_bytes"] == 0 and grew["device_encoded_bytes"] == 0, grew      # a CPU device: off


def test_the_decode_slots_room_counts_shared_calls_only_where_readers_queue(tmp_path, rng):
    """``device_bytes``: SLOTS calls, each of BATCH blocks where they share calls (under ``on``, whose readers queue
    for slots, a decoder that defers: zstd), of the largest block alone otherwise (``share``, whose readers never
    queue; Blosc, whose calls take one block), and only the blocks whose codec the device takes."""
    from dgemm.opencl.scratch import SLOTS
    from dgemm.worker import decoding

    zst, _ = create(tmp_path / "z.zarr", LZ4["v3 zstd"], rng, shape=(64, 64), chunks=(16, 64), dtype="float32")
    lz4, _ = create(tmp_path / "l.zarr", LZ4["v3 shuffle"], rng, shape=(128, 64), chunks=(16, 64), dtype="float32")
    small, large = ZarrBlock(zst, (0, 64), (0, 64)), ZarrBlock(lz4, (0, 128), (0, 64))
    per_chunk = decoding.CALL_BYTES_PER_BYTE * 16 * 64 * 4 + decoding.CALL_BYTES_PER_BLOCK      # (one zstd block)
    zstd_call, blosc_call = decoding.call_bytes(small), decoding.call_bytes(large)
    assert zstd_call == int(4 * per_chunk) and blosc_call == int(8 * per_chunk)
    assert decoding.BATCH * zstd_call > blosc_call
    assert decoding.device_bytes([DeviceDecoded(small), DeviceDecoded(large)]) == SLOTS * decoding.BATCH * zstd_call
    assert decoding.device_bytes([DeviceDecoded(large)]) == SLOTS * blosc_call, "Blosc's calls counted as shared"
    one = SLOTS * blosc_call
    assert decoding.device_bytes([DeviceDecoded(small, True), DeviceDecoded(large, True)]) == one
    # a device whose memory share caps the calls: the cap's bytes, never less than a call of the largest block alone
    for calls, per_call in ((1.5, None), (0.5, zstd_call), (decoding.BATCH + 1, decoding.BATCH * zstd_call)):
        share = int(calls * zstd_call * SLOTS / decoding.SLOTS_SHARE)    # (each slot's part: `calls` zstd blocks)
        cap = decoding.call_cap(share)
        assert abs(cap - calls * zstd_call) <= 1, (cap, calls)
        held = decoding.device_bytes([DeviceDecoded(small)], share)
        assert held == SLOTS * (cap if per_call is None else per_call), calls
        assert decoding.device_bytes([DeviceDecoded(small, True), DeviceDecoded(large, True)], share) == one
        assert decoding.device_bytes([DeviceDecoded(small), DeviceDecoded(large)], share) == SLOTS * max(
            blosc_call, cap if per_call is None else per_call), calls
    zstd_only = frozenset({"zstd"})
    assert decoding.device_bytes([DeviceDecoded(small, True, zstd_only), DeviceDecoded(large, True, zstd_only)]) \
        == SLOTS * decoding.call_bytes(small), "a Blosc block that auto leaves to the host counted"
    assert decoding.device_bytes([small, DeviceDecoded(large, True, zstd_only)]) == 0
    for layout in ("v3 raw", "v3 zstd with checksum", "v3 blosc-lz4 sharded"):     # (read on the host under on too)
        other, _ = create(tmp_path / f"{layout}.zarr", OTHERS[layout], rng, shape=(128, 64), chunks=(16, 32),
                          dtype="float32")
        assert decoding.device_bytes([DeviceDecoded(ZarrBlock(other, (0, 128), (0, 64)))]) == 0, layout
    # each slot is told its part of that room (Scratch.budget: within it a slot's buffers are made as large as
    # their names have been), no more
    device = SimpleNamespace(scratch=SimpleNamespace(budget=0))
    for share in (None, int(1.5 * zstd_call * SLOTS / decoding.SLOTS_SHARE)):
        refs = [DeviceDecoded(small), DeviceDecoded(large)]
        decoding.size_slots(device, refs, share)
        assert device.scratch.budget * SLOTS == decoding.device_bytes(refs, share) > 0, share


def test_a_block_counts_the_whole_chunks_it_touches(tmp_path, rng):
    """``call_bytes``: a block off the chunk grid decodes every chunk it touches whole (its edge chunks
    too), so it counts them all; a chunk of more than one zstd block (128 KiB of content) counts each."""
    from dgemm.worker import decoding

    arr, _ = create(tmp_path / "z.zarr", LZ4["v3 zstd"], rng, shape=(64, 64), chunks=(16, 32), dtype="float32")
    chunk = decoding.CALL_BYTES_PER_BYTE * 16 * 32 * 4 + decoding.CALL_BYTES_PER_BLOCK
    assert decoding.call_bytes(ZarrBlock(arr, (0, 32), (0, 32))) == int(2 * chunk)
    assert decoding.call_bytes(ZarrBlock(arr, (8, 40), (16, 48))) == int(6 * chunk)     # 3 x 2 chunks, cut
    big = zarr.create_array(str(tmp_path / "big.zarr"), shape=(256, 512), chunks=(256, 512), dtype="float32")
    whole = 256 * 512 * 4        # 512 KiB: four zstd blocks
    assert decoding.call_bytes(ZarrBlock(big, (0, 10), (0, 10))) == \
        int(decoding.CALL_BYTES_PER_BYTE * whole + 4 * decoding.CALL_BYTES_PER_BLOCK)


CALL_CHUNKS = {"256 B": (1, 64), "4 KiB": (16, 64), "64 KiB": (16, 1024), "256 KiB": (64, 1024), "1 MiB": (256, 1024)}
CALL_VALUES = {
    "normal": lambda rng, shape: rng.standard_normal(shape).astype("float32"),
    # (rounded: many short matches, so many sequences; the most bytes a byte of all that was measured)
    "rounded": lambda rng, shape: np.round(rng.standard_normal(shape), 1).astype("float32"),
    "cents": lambda rng, shape: np.round(rng.standard_normal(shape), 2).astype("float32"),
    # (one long walk: level 19 cuts it into blocks of 8 KiB, each with its own tables)
    "walk": lambda rng, shape: np.cumsum(rng.standard_normal(shape[0] * shape[1])).reshape(shape).astype("float32"),
}


@pytest.mark.parametrize("chunk", list(CALL_CHUNKS))
@pytest.mark.parametrize("values", list(CALL_VALUES))
@pytest.mark.parametrize("level", [0, 19])      # (0: Zarr's default, zstd's level 3)
def test_a_decode_call_holds_no_more_than_the_worker_reserves_for_it(any_device, tmp_path, rng, chunk, values,
                                                                      level):
    """What the panel cache leaves the decode slots is :func:`call_bytes` a call: after a block's decode (on
    the grid and off it; in a slot a reader waits for, and in one ``share`` takes), the device's decode
    scratch holds no more than that, and the block is the array's.  Small chunks hold tables per chunk, and so
    do a random walk's blocks of 8 KiB at level 19."""
    from dgemm.worker import decoding

    rows, cols = CALL_CHUNKS[chunk]
    height = min(max(4 * rows, 64), 256)
    shape = (height + rows, 2048)
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=shape, chunks=(rows, cols), dtype="float32",
                            compressors=ZstdCodec(level=level))
    data = CALL_VALUES[values](rng, shape)
    arr[...] = data
    scratch = any_device.scratch
    for where in (((0, height), (0, 2048)), ((rows // 2, rows // 2 + height), (cols // 2, cols // 2 + 1024))):
        block = ZarrBlock(arr, *where)
        for share in (False, True):
            scratch.release()
            assert scratch.nbytes() == 0
            got, sent, grew = device_read(any_device, block, share=share)
            assert sent is not None and grew["host_decoded_bytes"] == 0, (where, share, grew)
            np.testing.assert_array_equal(got, data[slice(*where[0]), slice(*where[1])])
            assert scratch.nbytes() > 0
            assert scratch.nbytes() <= decoding.call_bytes(block), (where, share, scratch.nbytes())
            if values == "normal" and chunk == "1 MiB":     # (a reserve far above what is held starves the cache)
                assert scratch.nbytes() >= decoding.call_bytes(block) / 2, (where, share, scratch.nbytes())
    scratch.release()


def test_a_slot_that_decoded_other_values_holds_no_more_than_the_reserve(any_device, tmp_path, rng, monkeypatch):
    """A slot keeps each buffer at its largest: blocks of normal values (many literals) then of values rounded to
    2 decimals (many sequences), in one slot, hold both at their largest, and that is within the reserve too."""
    from dgemm.opencl.scratch import Scratch
    from dgemm.worker import decoding

    monkeypatch.setattr(any_device, "scratch", Scratch(any_device, 1))     # (every call in the one slot)
    shape, chunks = (320, 2048), (64, 1024)
    arrays = []
    for name, values in (("normal", rng.standard_normal(shape)), ("cents", np.round(rng.standard_normal(shape), 2))):
        arr = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=shape, chunks=chunks, dtype="float32",
                                compressors=ZstdCodec(level=0))
        arr[...] = values.astype("float32")
        arrays.append((arr, values.astype("float32")))
    blocks = [(ZarrBlock(arr, rows, cols), data[slice(*rows), slice(*cols)]) for arr, data in arrays
              for rows, cols in (((0, 256), (0, 2048)), ((32, 288), (512, 1536)))]
    try:
        for block, want in blocks:
            got, sent, _ = device_read(any_device, block)
            np.testing.assert_array_equal(got, want)
        held = any_device.scratch.nbytes()
        assert 0 < held <= max(decoding.call_bytes(b) for b, _ in blocks), held
    finally:
        any_device.scratch.release()


def test_the_reserve_follows_what_the_decode_slots_hold(any_device, tmp_path, rng):
    """Where the slots hold more than the model says (an earlier block of data it was not fitted on), the panel
    cache leaves them what they hold; once they are given back (between runs), the model again."""
    from dgemm.worker import decoding

    arr, _ = create(tmp_path / "z.zarr", LZ4["v3 zstd"], rng, shape=(64, 64), chunks=(16, 64), dtype="float32")
    refs = [DeviceDecoded(ZarrBlock(arr, (0, 64), (0, 64)))]
    scratch = any_device.scratch
    scratch.release()
    model = decoding.device_bytes(refs)
    assert model > 0 and decoding.reserve(any_device, refs, None) == model
    try:
        with scratch.slot():
            scratch.buffer("test: grown by an earlier block", 3 * model)
        assert scratch.nbytes() > model and decoding.reserve(any_device, refs, None) == scratch.nbytes()
    finally:
        scratch.release()
    assert decoding.reserve(any_device, refs, None) == model


def test_every_decoder_that_reads_frames_lightly_says_what_sends_them_back():
    """A decoder module with ``headed`` (frames checked from their headers alone) names the errors its decode raises
    where a frame needs the host's plan after all: without them the worker would fail the block instead."""
    import importlib

    from dgemm.opencl import codecs

    light = [d for d in codecs.DECODERS.values() if hasattr(importlib.import_module(d.module), "headed")]
    assert light, "no decoder reads frames lightly"
    for dec in light:
        assert dec.refused_light() and all(issubclass(e, Exception) for e in dec.refused_light()), dec.module


def test_auto_where_it_is_on_waits_for_the_device_for_its_codecs_alone(any_device, monkeypatch):
    """A device type that ``AUTO`` maps to ``on``: its readers wait for a decode slot (no sharing with the host),
    for AUTO_CODECS' chunks alone, and C's chunks are encoded on it; unmapped types stay off."""
    from dgemm.opencl import codecs
    from dgemm.worker import decoding

    monkeypatch.delenv("DGEMM_DEVICE_CODECS", raising=False)
    monkeypatch.setattr(codecs, "AUTO", {any_device.info.type: "on"})
    assert decoding.wanted(any_device) and decoding.wanted(any_device, "encode")
    assert not decoding.shared(any_device) and decoding.only(any_device) == codecs.AUTO_CODECS == {"zstd"}
    monkeypatch.setattr(codecs, "AUTO", {})
    assert not decoding.wanted(any_device) and not decoding.wanted(any_device, "encode")


def test_a_block_of_a_codec_auto_leaves_to_the_host_is_declined(any_device, tmp_path, rng):
    """``only`` (``auto`` on a GPU: zstd's): a Blosc block is declined before any buffer is allocated, nothing
    read or written; a zstd block is decoded on the device."""
    lz4, _ = create(tmp_path / "l.zarr", LZ4["v3 shuffle"], rng, dtype="float32")
    zst, data = create(tmp_path / "z.zarr", LZ4["v3 zstd"], rng, dtype="float32")
    only = frozenset({"zstd"})
    blosc_block = DeviceDecoded(ZarrBlock(lz4, (0, SHAPE[0]), (0, SHAPE[1])), share=True, only=only)
    assert blosc_block.declines(any_device)
    got, sent, grew = device_read(any_device, blosc_block.block, share=True, only=only)
    assert sent is None and not any(grew.values()), (sent, grew)
    zstd_block = DeviceDecoded(ZarrBlock(zst, (0, SHAPE[0]), (0, SHAPE[1])), share=True, only=only)
    assert not zstd_block.declines(any_device)
    got, sent, grew = device_read(any_device, zstd_block.block, share=True, only=only)
    np.testing.assert_array_equal(got, data)
    assert grew["device_decoded_bytes"] > 0 and grew["host_decoded_bytes"] == 0, grew


@pytest.mark.parametrize("layout", ["v2 shuffle", "v3 shuffle"])
def test_matmul_decodes_blosc_lz4_inputs_on_the_device_where_the_setting_says(client, setting, tmp_path, rng, layout):
    """One block product (block larger than the arrays): each chunk is decoded exactly once, on the device
    under ``on``, on the host under ``off``."""
    a, b, A, B = inputs(tmp_path, rng, LZ4[layout])
    expected = decoded_bytes(a, b)
    for mode, where in (("on", "device"), ("off", "host")):
        setting(mode)
        out = str(tmp_path / f"c-{mode}.zarr")
        c, grew = run_counted(client, lambda out=out: dgemm.matmul(a, b, out=out, client=client, block=64))
        check_product(np.asarray(c[...]), A, B, dtype="float32", what=f"{layout} {mode}")
        other = "host" if where == "device" else "device"
        assert grew[f"{where}_decoded_bytes"] == expected and grew[f"{other}_decoded_bytes"] == 0, (mode, grew)
        # C's zstd chunks (the default codec) are encoded where its setting says too (tests/test_encoding.py)
        assert grew[f"{where}_encoded_bytes"] > 0 and grew[f"{other}_encoded_bytes"] == 0, (mode, grew)


def test_matmul_in_blocks_decodes_on_the_device_only(client, setting, tmp_path, rng):
    """Several block products on two workers: every chunk decoded at least once, all of them on the device."""
    a, b, A, B = inputs(tmp_path, rng, LZ4["v3 shuffle"])
    setting("on")
    c, grew = run_counted(client, lambda: dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=16))
    check_product(np.asarray(c[...]), A, B, dtype="float32")
    assert grew["host_decoded_bytes"] == 0 and grew["device_decoded_bytes"] >= decoded_bytes(a, b), grew


@pytest.mark.parametrize("layout,where", [(LZ4["v3 zstd"], "device"), (OTHERS["v3 zstd with checksum"], "host")],
                         ids=["zstd", "zstd with checksum"])
def test_zstd_inputs_are_decoded_on_the_device_unless_they_carry_a_checksum(client, setting, tmp_path, rng,
                                                                             layout, where):
    a, b, A, B = inputs(tmp_path, rng, layout)
    setting("on")
    c, grew = run_counted(client, lambda: dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=64))
    check_product(np.asarray(c[...]), A, B, dtype="float32")
    other = "host" if where == "device" else "device"
    assert grew[f"{other}_decoded_bytes"] == 0 and grew[f"{where}_decoded_bytes"] == decoded_bytes(a, b), grew


def test_matmul_under_share_decodes_each_chunk_once_between_the_device_and_the_host(client, setting, tmp_path, rng):
    """``device-codecs: share`` on real workers: the product right, each chunk decoded once, on the device or on the
    host (whichever was free), and C's zstd chunks encoded on the device as under ``on``."""
    a, b, A, B = inputs(tmp_path, rng, LZ4["v3 zstd"])
    setting("share")
    c, grew = run_counted(client, lambda: dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=64))
    check_product(np.asarray(c[...]), A, B, dtype="float32")
    assert grew["device_decoded_bytes"] + grew["host_decoded_bytes"] == decoded_bytes(a, b), grew
    # the first block's reader finds every slot free: the device takes it (and maybe more)
    assert grew["device_decoded_bytes"] > 0, grew
    assert grew["device_encoded_bytes"] > 0 and grew["host_encoded_bytes"] == 0, grew


def test_matmul_under_share_decodes_on_the_host_while_the_workers_slots_are_busy(client, setting, tmp_path, rng):
    """The setting reaches the workers' blocks: with every decode slot held on each worker (its device's decoders
    busy), ``share`` decodes every chunk on the host's readers, ``on`` would wait for the slots."""
    a, b, A, B = inputs(tmp_path, rng, LZ4["v3 zstd"])
    setting("share")
    try:
        assert set(client.run(_device_codecs.hold_slots).values()) == {0}
        c, grew = run_counted(client, lambda: dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client,
                                                           block=64))
    finally:
        client.run(_device_codecs.free_slots)
    check_product(np.asarray(c[...]), A, B, dtype="float32")
    assert grew["device_decoded_bytes"] == 0 and grew["host_decoded_bytes"] == decoded_bytes(a, b), grew


def _assert_rows_16_32_unmarked(path) -> None:
    """The output at ``path`` is incomplete, and none of C's blocks that read A's rows 16:32 (chunk (1, 0)) is
    marked done."""
    from dgemm.storage import COMPLETE_ATTR, BlockMarkers

    c = zarr.open_array(path, mode="r")
    meta = c.attrs[COMPLETE_ATTR]
    assert meta["complete"] is False
    done = BlockMarkers(c, meta["owner"]).done()
    rows = meta["run"]["block"][0]
    assert not any(i * rows < 32 and (i + 1) * rows > 16 for i, _ in done), (rows, sorted(done))


def _failed_run(client, a, b, out):
    with pytest.raises(OSError) as info:
        dgemm.matmul(a, b, out=out, client=client, block=16)
    return str(info.value)


@pytest.mark.parametrize("corruption", ["garbage", "a frame of the wrong size", "truncated"])
def test_a_corrupt_chunk_fails_its_blocks_with_the_readers_error(client, setting, tmp_path, rng, corruption):
    """The error names the array, rows, columns, chunk and store key, as the host reader's does (word for word
    where the host detects the corruption too: c-blosc reads past a truncated frame without a word); the
    blocks that read the chunk get no completion marker, and the output stays incomplete."""
    a, b, A, _ = inputs(tmp_path, rng, LZ4["v2 shuffle"])
    path = os.path.join(str(a.store_path).removeprefix("file://"), "1.0")
    with open(path, "rb") as f:
        good = f.read()
    bad = {"garbage": b"broken", "truncated": good[:len(good) // 2],
           "a frame of the wrong size": numcodecs.Blosc(cname="lz4").encode(A[:8, :16].copy())}[corruption]
    with open(path, "wb") as f:
        f.write(bad)
    setting("on")
    message = _failed_run(client, a, b, str(tmp_path / "c-on.zarr"))
    assert re.search(r"could not read Zarr array \S*a\.zarr rows \d+:\d+, columns \d+:\d+", message), message
    assert "chunk (1, 0) (store key '1.0')" in message, message
    if corruption != "truncated":
        setting("off")
        assert message == _failed_run(client, a, b, str(tmp_path / "c-off.zarr"))
    _assert_rows_16_32_unmarked(str(tmp_path / "c-on.zarr"))


def _device_refused_flip(dev, frame: bytes) -> bytes:
    """``frame`` with one bit flipped where the host's reading of its headers and tables still takes it (so the
    device decodes it), numcodecs refuses it and so does the device: the error only a kernel finds."""
    from dgemm.opencl.codecs import zstd_decode as zd

    for at in range(len(frame) - 1, 8, -1):
        for bit in range(8):
            bad = bytearray(frame)
            bad[at] ^= 1 << bit
            bad = bytes(bad)
            reason, plan = zd.checked(bad)
            if reason is not None or plan is None:      # left to the host, or found corrupt there
                continue
            try:
                numcodecs.Zstd().decode(bad)
                continue
            except Exception:
                pass
            out = dev.buffer(1 << 16, "test output")
            try:
                zd.decode_zstd(dev, [bad], out)
            except zd.ZstdFrameError:
                return bad
            finally:
                out.release()
    raise AssertionError("no flip the host's plan takes and the device refuses")


def test_a_zstd_chunk_only_a_kernel_refuses_fails_its_blocks(client, setting, any_device, tmp_path, rng):
    """A zstd chunk whose damage only the device's kernels find (its decode is enqueued and the product goes on;
    the error rows are read before the product gives its result): the product fails with the reader's error,
    and the blocks that read the chunk get no completion marker."""
    a, b, A, _ = inputs(tmp_path, rng, LZ4["v2 zstd"])
    # values zstd always compresses (a kilobyte of normal float32 is sometimes stored as a raw block, whose every
    # flip libzstd decodes): the product fails anyway
    a[16:32, 0:16] = np.round(rng.standard_normal((16, 16)) * 4) / 4
    path = os.path.join(str(a.store_path).removeprefix("file://"), "1.0")
    with open(path, "rb") as f:
        good = f.read()
    with open(path, "wb") as f:
        f.write(_device_refused_flip(any_device, good))
    # here: the decode is enqueued and returns; its check raises the reader's error
    block, pending = DeviceDecoded(ZarrBlock(a, (0, 32), (0, 16))), []
    out = any_device.buffer(32 * 16 * 4, "test output")
    try:
        assert block.fill_device(any_device, out, any_device.transfer_queue, pending=pending) > 0
        assert len(pending) == 1
        with pytest.raises(OSError) as info:
            pending[0][1]()
    finally:
        out.release()
    setting("on")
    message = _failed_run(client, a, b, str(tmp_path / "c-on.zarr"))
    assert re.search(r"could not read Zarr array \S*a\.zarr rows \d+:\d+, columns \d+:\d+", message), message
    assert "chunk (1, 0) (store key '1.0')" in message and message == str(info.value), message
    _assert_rows_16_32_unmarked(str(tmp_path / "c-on.zarr"))


@pytest.mark.parametrize("value", ["maybe", "2", "gpu"])
def test_bad_setting_values_are_refused_before_any_work(client, setting, tmp_path, rng, value):
    from dgemm.errors import NoDeviceWorkerError

    a, b, _, _ = inputs(tmp_path, rng, LZ4["v3 shuffle"])
    setting(value)
    with pytest.raises(NoDeviceWorkerError, match=rf"dgemm.device-codecs='{value}' must be auto, on, off, encode or share"):
        dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=16)
    assert not (tmp_path / "c.zarr").exists()


# -- where the counters are shown --------------------------------------------------------------------------------
def test_the_prometheus_collector_reports_the_codec_counters():
    pytest.importorskip("prometheus_client")
    from dgemm import metrics

    snap = {"device": "dev", "ok": True, "device_decoded_bytes": 3 << 20, "host_decoded_bytes": 5,
            "device_encoded_bytes": 7, "host_encoded_bytes": 11}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics, "_worker_sources", [lambda: [("tcp://w:1", "w1", snap)]])
        mp.setattr(metrics, "_scheduler_sources", [])
        got = {f.name: f.samples[0].value for f in metrics.DgemmCollector().collect()
               if f.name.endswith(("_decoded_bytes", "_encoded_bytes"))}
    assert got == {f"dgemm_{k}": float(snap[k]) for k in CODEC_COUNTERS}, got


def test_the_dashboard_shows_bytes_decoded_on_the_device_and_on_the_host():
    from dask.utils import format_bytes

    from dgemm import busy
    from dgemm.scheduler.plots import WorkerTable

    def worker(name, device, host):
        return {"name": name, "address": f"tcp://{name}", "alive": True, "ok": True, "device": "dev",
                "device_type": "GPU", "device_id": "0:0", "device_decoded_bytes": device,
                "host_decoded_bytes": host, **{f"flops_{k}": 0.0 for k in ("now", "peak", "busy", "kernel")}}

    workers = [worker("w1", 3 << 30, 0), worker("w2", 1 << 20, 5 << 20)]
    table = WorkerTable(None)
    total = dict.fromkeys(("blocks", "flops", "bytes_up", "bytes_down", "busy_seconds", *busy.KEYS.values()), 0.0)
    table.show({"workers": workers, "total": total})
    shown = table.source.data["decoded"]
    assert shown[0] == f"{format_bytes(3 << 30)} · {format_bytes(0)}"
    assert shown[1] == f"{format_bytes(1 << 20)} · {format_bytes(5 << 20)}"
    assert shown[2] == f"{format_bytes((3 << 30) + (1 << 20))} · {format_bytes(5 << 20)}"   # all workers


# -- on a GPU (pytest -m gpu): the kernels at the GPU's work-group sizes, and a product end to end ----------------
GPU_DATA = {
    "normal": lambda rng, shape: rng.standard_normal(shape),
    # a random walk along rows: frames with sequences in most blocks, matches across blocks
    "walk": lambda rng, shape: np.cumsum(rng.standard_normal(shape), axis=1),
    # small integers: nearly every match reaches into an earlier block (origins followed across blocks)
    "ints": lambda rng, shape: rng.integers(0, 7, shape).astype(np.float64),
}


def _gpu_blocks_decode(dev, tmp_path, rng):
    """Zarr arrays of 512 KiB to 1 MiB float32 chunks (4 to 8 zstd blocks each) at levels 1, 3 and 19 and
    Blosc-LZ4, regions cut and whole, decoded by ``fill_device`` into poisoned buffers: the array's values."""
    shape, chunks = (900, 1500), (256, 512)        # (regions() cuts up to 3 chunks of rows)
    layouts = {"zstd 3": {"compressors": ZstdCodec(level=3)}, "zstd 1": {"compressors": ZstdCodec(level=1)},
               "zstd 19": {"compressors": ZstdCodec(level=19)}, "v2 zstd": LZ4["v2 zstd"],
               "blosc": LZ4["v3 shuffle"]}
    for (name, layout), (kind, make) in itertools.product(layouts.items(), GPU_DATA.items()):
        kw = dict(layout)
        if kw.get("zarr_format") == 2:
            kw["chunk_key_encoding"] = {"name": "v2", "separator": "."}
        arr = zarr.create_array(str(tmp_path / f"{name}-{kind}.zarr".replace(" ", "_")), shape=shape,
                                chunks=chunks, dtype="float32", **kw)
        data = make(rng, shape).astype(np.float32)
        arr[...] = data
        for region, (rows, cols) in regions(shape, chunks).items():
            block = ZarrBlock(arr, rows, cols)
            values, sent, grew = device_read(dev, block)
            assert sent is not None, (name, kind, region)
            np.testing.assert_array_equal(values, data[slice(*rows), slice(*cols)], err_msg=f"{name} {kind} {region}")
            assert grew["device_decoded_bytes"] > 0 and grew["host_decoded_bytes"] == 0


@pytest.mark.gpu
def test_gpu_blocks_decode_on_the_device_to_the_arrays_values(gpu_device, tmp_path, rng):
    _gpu_blocks_decode(gpu_device, tmp_path, rng)


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("priority,mode", [("on", "on"), ("inline", "on"), ("on", "share")])
def test_gpu_matmul_with_zstd_in_and_out_under_device_codecs_on(tmp_path, rng, monkeypatch, priority, mode):
    """One GPU worker, device-codecs on: zstd A and B decoded there, C's chunks encoded there, and C equal to
    numpy's float64 product; the counters say the device did the codec work.  Under ``queue-priority``
    on (separate queues) and inline (the decoders' and padding kernels in the GEMM kernels' queue); and under
    ``share``, each chunk decoded once, on the device or the host, C encoded on the device."""
    monkeypatch.setenv("DGEMM_QUEUE_PRIORITY", priority)    # the worker reads it when its device opens
    from distributed import Client

    from conftest import DEVICES

    gpus = [d for d in DEVICES if d.type == "GPU"]
    a = rng.standard_normal((3000, 2500)).astype(np.float32)
    b = np.cumsum(rng.standard_normal((2500, 2100)), axis=1).astype(np.float32)
    pa, pb = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    for path, x in ((pa, a), (pb, b)):
        zarr.create_array(path, shape=x.shape, chunks=(1024, 1024), dtype=x.dtype,
                          compressors=ZstdCodec(level=3))[...] = x
    with dgemm.DeviceCluster(gpus[0].id, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(1, timeout=120)
        client.run(_device_codecs.configure, mode)
        out = str(tmp_path / "c.zarr")
        _, grew = _device_codecs.run_counted(client, lambda: dgemm.matmul(
            pa, pb, out=out, client=client, compressors=ZstdCodec(level=3)))
    check_product(zarr.open_array(out, mode="r")[...], a, b, dtype=np.float32)
    if mode == "share":
        assert grew["device_decoded_bytes"] + grew["host_decoded_bytes"] >= a.nbytes + b.nbytes, grew
    else:
        assert grew["device_decoded_bytes"] >= a.nbytes + b.nbytes and grew["host_decoded_bytes"] == 0, grew
    assert grew["device_encoded_bytes"] > 0 and grew["host_encoded_bytes"] == 0, grew

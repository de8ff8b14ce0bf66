"""Output chunks encoded on the device (dgemm.worker.encoding, the ``device-codecs`` setting), on PoCL.

References are numpy and zarr: C read back by zarr against numpy's float64
product; every stored chunk file decoded by numcodecs' Zstd on its own (a
valid frame of the whole chunk, an edge chunk padded with the fill value as
zarr pads it); the encoded bytes, whole chunks times the chunk's size.  The
first tests run the engine and the encoder in this process; the others run
``dgemm.matmul`` on the session's worker processes with the setting changed
on them: the v3 default codec and v2's numcodecs Zstd, float32 and float64,
chunks as large as the blocks, smaller, as wide as them (encoded where they
lie) and at the array's edges; what stays on the host (the setting off, a
checksum, Blosc); a block whose chunk cannot be written (never marked done,
redone by ``resume=True``), and an S3 output (moto's server).
"""
from __future__ import annotations

import itertools
import os
import shutil
import time

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

import dgemm
import _device_codecs
from _check import check_product
from dgemm.names import CODEC_COUNTERS
from dgemm.storage import encoded, fastpaths

ZSTD = {
    "v3 default": {},                                                           # zarr's default: ZstdCodec(level=0)
    "v2 Zstd": {"zarr_format": 2, "compressors": numcodecs.Zstd(level=3)},
}
HOST = {
    "v3 zstd checksum": {"compressors": ZstdCodec(level=1, checksum=True)},
    "v3 blosc": {"compressors": BloscCodec(cname="lz4")},
}
# (C's shape, output chunks, block): edge chunks on both axes, chunks equal to the blocks; smaller than the
# blocks; as wide as the blocks (encoded where they lie) with rows at the edge, and whole-row chunks only
CASES = {
    "chunks are blocks": ((50, 30), (32, 32), 32),
    "smaller chunks": ((50, 30), (16, 8), 32),
    "whole-row chunks": ((64, 30), (16, 30), 32),
    "whole-row chunks, edge rows": ((50, 30), (16, 30), 32),
}


def chunk_files(arr) -> dict:
    """Every chunk of a local, unsharded array: index -> its file's bytes (all must exist)."""
    root = str(arr.store_path).removeprefix("file://")
    out = {}
    for idx in itertools.product(*[range(-(-s // c)) for s, c in zip(arr.shape, arr.chunks)]):
        with open(os.path.join(root, *arr.metadata.encode_chunk_key(idx).split("/")), "rb") as f:
            out[idx] = f.read()
    return out


def check_frames(arr, values, fill=0.0):
    """Each chunk file of ``arr`` is one zstd frame numcodecs decodes to the chunk of ``values`` (padded with
    ``fill`` past the array's edge, as zarr stores an edge chunk)."""
    cr, cc = arr.chunks
    padded = np.full((-(-arr.shape[0] // cr) * cr, -(-arr.shape[1] // cc) * cc), fill, values.dtype)
    padded[:arr.shape[0], :arr.shape[1]] = values
    for (i, j), raw in chunk_files(arr).items():
        assert raw[:4] == b"\x28\xb5\x2f\xfd", f"chunk {(i, j)} is not a zstd frame"
        got = np.frombuffer(numcodecs.Zstd().decode(raw), values.dtype).reshape(cr, cc)
        np.testing.assert_array_equal(got, padded[i * cr:(i + 1) * cr, j * cc:(j + 1) * cc],
                                      err_msg=f"chunk {(i, j)}")


def encoded_bytes(arr) -> int:
    """What encoding every chunk of ``arr`` once takes: whole chunks, edge chunks at their full size."""
    return arr.nchunks * int(np.prod(arr.chunks)) * arr.dtype.itemsize


# -- in this process -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_engine_hands_back_the_chunks_encoded(any_device, engines, tmp_path, rng, case, dtype):
    """One block product whose C block is the whole output: its frames are the chunks, written as they are."""
    from dgemm.worker import encoding

    shape, chunks, _ = CASES[case]
    m, n = shape
    A, B = rng.standard_normal((m, 20)).astype(dtype), rng.standard_normal((20, n)).astype(dtype)
    out = zarr.create_array(str(tmp_path / "c.zarr"), shape=shape, chunks=chunks, dtype=dtype, fill_value=0.5)
    found = encoded.chunks_of(out, (0, m), (0, n))
    assert found is not None
    eng = engines(any_device, dtype)
    before = fastpaths.snapshot()
    pending = eng.stream([A], [B], m, n, finish=encoding.finisher(any_device, found))
    assert isinstance(pending, encoding.PendingBlock) and pending.shape == (m, n), type(pending)
    got = pending.result()
    grew = fastpaths.since(before)
    assert isinstance(got, encoded.EncodedBlock), type(got)
    assert grew["device_encoded_bytes"] == encoded_bytes(out) and grew["host_encoded_bytes"] == 0, grew
    encoded.write(got)
    values = out[...]
    check_product(values, A, B, dtype=dtype)
    check_frames(out, values, fill=0.5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_product_of_zstd_blocks_waits_for_the_device_outside_the_driver(any_device, engines, tmp_path, rng, dtype):
    """A's and B's zstd chunks decoded on the device, the GEMMs, C's chunks encoded there: no thread of dgemm's
    waits in ``clWaitForEvents`` or a blocking transfer (tests/_driver_waits.py says why), and C is right."""
    from _driver_waits import waits_in_the_driver

    from dgemm.storage import ZarrBlock
    from dgemm.worker import encoding
    from dgemm.worker.decoding import DeviceDecoded

    m, k, n = 50, 45, 30
    A, B = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    refs = []
    for name, value in (("a", A), ("b", B)):
        z = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=value.shape, chunks=(16, 16), dtype=dtype,
                              compressors=ZstdCodec(level=3))
        z[...] = value
        refs.append(DeviceDecoded(ZarrBlock(z, (0, value.shape[0]), (0, value.shape[1]))))
    out = zarr.create_array(str(tmp_path / "c.zarr"), shape=(m, n), chunks=(16, 8), dtype=dtype)
    found = encoded.chunks_of(out, (0, m), (0, n))
    eng = engines(any_device, dtype)
    before = fastpaths.snapshot()
    with waits_in_the_driver() as waits:
        got = eng.stream(refs[:1], refs[1:], m, n, finish=encoding.finisher(any_device, found)).result()
    grew = fastpaths.since(before)
    assert waits == [], waits
    assert grew["device_decoded_bytes"] > 0 and grew["host_decoded_bytes"] == 0, grew
    assert isinstance(got, encoded.EncodedBlock) and grew["host_encoded_bytes"] == 0, (type(got), grew)
    encoded.write(got)
    values = out[...]
    check_product(values, A, B, dtype=dtype)
    check_frames(out, values)


def _encoded(device, out, values):
    """``values`` (the whole of ``out``) uploaded to ``device`` and encoded as ``out``'s chunks: the EncodedBlock."""
    import pyopencl as cl

    from dgemm.worker import encoding

    found = encoded.chunks_of(out, (0, out.shape[0]), (0, out.shape[1]))
    buf = device.buffer(values.nbytes, "test C block")
    try:
        cl.enqueue_copy(device.queue, buf, values, is_blocking=True)
        return encoding.encode(device, found, buf)
    finally:
        buf.release()


@pytest.mark.parametrize("n_threads", [2, 3])
def test_frames_written_with_helpers_are_the_same_chunk_files(any_device, tmp_path, rng, n_threads):
    """A block of 4 x 4 chunks (edge chunks on both axes) encoded once, its frames written alone and with helpers:
    the same files, every chunk written once, the helpers' share (all but every n-th) counted as helped."""
    m, n = 62, 58
    values = rng.standard_normal((m, n)).astype(np.float32)
    files = {}
    for label, threads in (("alone", 1), ("helped", n_threads)):
        out = zarr.create_array(str(tmp_path / f"{label}.zarr"), shape=(m, n), chunks=(16, 16), dtype="float32",
                                fill_value=0.5)
        got = _encoded(any_device, out, values)
        before = fastpaths.snapshot()
        encoded.write(got, threads=threads)
        grew = fastpaths.since(before)
        assert grew["storage_write_direct"] == 16, grew
        assert grew["storage_write_helped"] == (0 if threads == 1 else 16 - len(range(0, 16, threads))), grew
        check_frames(out, values, fill=0.5)
        files[label] = chunk_files(out)
    any_device.trim(keep_pinned=True)
    assert files["helped"] == files["alone"]


def test_a_frame_that_cannot_be_written_fails_the_helped_write(any_device, tmp_path, rng):
    """A folder where chunk (1, 0)'s file goes: the write with helpers raises it, once every thread has stopped
    (the other threads' chunks written), and leaves the folder (and its file) as it was."""
    m, n = 32, 32
    values = rng.standard_normal((m, n)).astype(np.float32)
    out = zarr.create_array(str(tmp_path / "c.zarr"), shape=(m, n), chunks=(16, 16), dtype="float32")
    got = _encoded(any_device, out, values)
    any_device.trim(keep_pinned=True)
    root = str(out.store_path).removeprefix("file://")
    blocker = os.path.join(root, *out.metadata.encode_chunk_key((1, 0)).split("/"))
    os.makedirs(blocker)
    with open(os.path.join(blocker, "mine.txt"), "w") as f:
        f.write("the user's")
    with pytest.raises(OSError):
        encoded.write(got, threads=3)
    with open(os.path.join(blocker, "mine.txt")) as f:
        assert f.read() == "the user's"
    for idx in ((0, 0), (0, 1), (1, 1)):
        with open(os.path.join(root, *out.metadata.encode_chunk_key(idx).split("/")), "rb") as f:
            raw = f.read()
        i, j = idx
        np.testing.assert_array_equal(np.frombuffer(numcodecs.Zstd().decode(raw), np.float32).reshape(16, 16),
                                      values[16 * i:16 * (i + 1), 16 * j:16 * (j + 1)], err_msg=str(idx))


@pytest.mark.parametrize("case", ["chunks are blocks", "whole-row chunks"])
def test_the_encode_waits_for_the_events_its_block_is_written_after(any_device, tmp_path, rng, case):
    """The engine's ``after`` (its unpadding): the encode, on its own queue, reads the C block only once those
    events have run, whether it lays the chunks out first (smaller chunks) or encodes them where they lie."""
    from dgemm.worker import encoding

    shape, chunks, _ = CASES[case]
    m, n = shape
    out = zarr.create_array(str(tmp_path / "c.zarr"), shape=shape, chunks=chunks, dtype="float32", fill_value=0.5)
    found = encoded.chunks_of(out, (0, m), (0, n))
    buf = any_device.buffer(m * n * 4, "test C block")
    try:
        got = _device_codecs.behind_a_gate(any_device, buf, rng.standard_normal((m, n)).astype(np.float32),
                                           np.float32(-2.25), lambda written: encoding.encode(
                                               any_device, found, buf, [], [written]), "the encode")
    finally:
        buf.release()
    encoded.write(got)
    check_frames(out, np.full(shape, -2.25, np.float32), fill=0.5)


@pytest.mark.parametrize("where", ["frames", "copy"])
def test_a_block_the_encoder_has_no_room_for_comes_down_as_values(any_device, engines, tmp_path, rng, monkeypatch,
                                                                  where):
    """The encoder's buffers do not fit (the device says it is out of memory): the C block comes down as without
    the setting, for its store task to encode on the host, instead of failing the block; what the encoder did
    get of its kept buffers is given back.  ``frames``: the frames do not fit beside the block's copy (the
    encoder thread brings the copy down); ``copy``: the copy itself does not (the product brings the block
    down from its own buffer)."""
    from dgemm.errors import DeviceMemoryError
    from dgemm.opencl.codecs import zstd_encode
    from dgemm.worker import encoding

    def no_room(device, *args, **kwargs):
        device.encode_scratch.buffer("zstd stream rows", 4096)      # got, before the frames did not fit
        raise DeviceMemoryError("device 'test': allocating the frames failed; the device is out of memory")

    real = any_device.encode_scratch.buffer

    def no_room_for_the_copy(what, nbytes):
        if what == "the C block":
            real("zstd stream rows", 4096)
            raise DeviceMemoryError("device 'test': allocating the C block's copy failed; out of memory")
        return real(what, nbytes)

    if where == "frames":
        monkeypatch.setattr(zstd_encode, "encode_zstd", no_room)
    else:
        monkeypatch.setattr(any_device.encode_scratch, "buffer", no_room_for_the_copy)
    m, n = 48, 40
    A, B = rng.standard_normal((m, 20)).astype("float32"), rng.standard_normal((20, n)).astype("float32")
    out = zarr.create_array(str(tmp_path / "c.zarr"), shape=(m, n), chunks=(16, 40), dtype="float32")
    found = encoded.chunks_of(out, (0, m), (0, n))
    before = fastpaths.snapshot()
    got = engines(any_device, "float32").stream([A], [B], m, n, finish=encoding.finisher(any_device, found))
    if where == "frames":
        assert isinstance(got, encoding.PendingBlock), type(got)
        got = got.result()
    grew = fastpaths.since(before)
    assert isinstance(got, np.ndarray) and got.shape == (m, n), type(got)
    check_product(got, A, B, dtype="float32")
    assert grew["device_encoded_bytes"] == 0, grew
    assert any_device.encode_scratch.nbytes() == 0, "the encoder's kept buffers stayed after it had no room"


def _held_encode(monkeypatch, tmp_path, rng):
    """The device encoder held back until the returned gate (a threading.Event) is set, and a one-block product
    to encode: ``(gate, m, n, out, found, A, B)``."""
    import threading

    from dgemm.opencl.codecs import zstd_encode

    gate, real = threading.Event(), zstd_encode.encode_zstd

    def held(*args, **kwargs):
        assert gate.wait(60), "the gate never opened"
        return real(*args, **kwargs)

    monkeypatch.setattr(zstd_encode, "encode_zstd", held)
    m, n = 48, 40
    out = zarr.create_array(str(tmp_path / "c.zarr"), shape=(m, n), chunks=(16, 40), dtype="float32")
    found = encoded.chunks_of(out, (0, m), (0, n))
    A, B = rng.standard_normal((m, 20)).astype("float32"), rng.standard_normal((20, n)).astype("float32")
    return gate, m, n, out, found, A, B


def test_the_product_returns_before_its_block_is_encoded(any_device, engines, tmp_path, rng, monkeypatch):
    """The encode runs on an encoder thread: the product returns once the thread has copied its block, while the
    encode is held back; the block comes out right once it goes on.  An encode that fails raises from the
    pending block's result (what its store task waits for), not from the product."""
    from dgemm.opencl.codecs import zstd_encode
    from dgemm.worker import encoding

    gate, m, n, out, found, A, B = _held_encode(monkeypatch, tmp_path, rng)
    eng = engines(any_device, "float32")
    try:
        pending = eng.stream([A], [B], m, n, finish=encoding.finisher(any_device, found))
        assert isinstance(pending, encoding.PendingBlock) and not pending._future.done()
    finally:
        gate.set()
    encoded.write(pending.result())
    check_product(out[...], A, B, dtype="float32")

    def broken(*args, **kwargs):
        raise zstd_encode.ZstdEncodeError("chunk '0/0': zstd encode of block 0: a test's error")

    monkeypatch.setattr(zstd_encode, "encode_zstd", broken)
    pending = eng.stream([A], [B], m, n, finish=encoding.finisher(any_device, found))
    with pytest.raises(zstd_encode.ZstdEncodeError, match="a test's error"):
        pending.result()


def test_a_result_buffer_is_written_again_only_after_the_encoder_copied_it(any_device, engines, tmp_path, rng):
    """The engine's two result buffers take turns: the third product writes the first one's again.  The first
    block's copy is held back (its encoder's queue waits for a user event): the third product's result must
    wait for it, so each of the three blocks' frames holds its own product."""
    import pyopencl as cl

    from dgemm.worker import encoding

    m, n = 48, 40
    out = zarr.create_array(str(tmp_path / "c.zarr"), shape=(3 * m, n), chunks=(16, 40), dtype="float32")
    eng = engines(any_device, "float32")
    gate, opened = cl.UserEvent(any_device.context), False
    inputs, pending = [], []
    try:
        for i in range(3):
            found = encoded.chunks_of(out, (i * m, (i + 1) * m), (0, n))
            real = encoding.finisher(any_device, found)

            def finish(buf, events, after=None, real=real, first=not i):
                return real(buf, events, (after or []) + [gate] if first else after)
            A, B = rng.standard_normal((m, 20)).astype("float32"), rng.standard_normal((20, n)).astype("float32")
            inputs.append((A, B))
            pending.append(eng.stream([A], [B], m, n, finish=finish))
        assert not pending[0]._future.done()
        opened = gate.set_status(cl.command_execution_status.COMPLETE) or True
        for p in pending:
            encoded.write(p.result())
    finally:
        if not opened:
            gate.set_status(cl.command_execution_status.COMPLETE)
        for p in pending:
            p._future.exception()
    values = out[...]
    for i, (A, B) in enumerate(inputs):
        check_product(values[i * m:(i + 1) * m], A, B, dtype="float32", what=f"block {i}")


def test_the_encoders_buffers_go_once_the_blocks_still_encoded_at_a_runs_end_are(any_device, engines, tmp_path, rng,
                                                                                   monkeypatch):
    """A run ends (``DeviceState.release``) while a block is still being encoded: ``Device.trim`` leaves that
    encode's slot alone, and its buffers go once it is done; with nothing in flight there is nothing to wait for."""
    from dgemm.worker import encoding

    gate, m, n, out, found, A, B = _held_encode(monkeypatch, tmp_path, rng)
    try:
        pending = engines(any_device, "float32").stream([A], [B], m, n, finish=encoding.finisher(any_device, found))
        any_device.trim(keep_pinned=True)
        assert encoding.release(any_device) is True
        assert any_device.encode_scratch.nbytes() > 0, "the encode in flight lost its buffers"
    finally:
        gate.set()
    encoded.write(pending.result())
    check_product(out[...], A, B, dtype="float32")
    deadline = time.monotonic() + 10
    while any_device.encode_scratch.nbytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert any_device.encode_scratch.nbytes() == 0, "the encoder's buffers stayed after the last encode"
    assert encoding.release(any_device) is False


def test_a_later_runs_encodes_keep_the_encoders_buffers_to_its_end(any_device, engines, tmp_path, rng, monkeypatch):
    """A run ends with a block still being encoded, and the next run's block comes before that encode is done: the
    encoder's buffers stay for the next run (not released the moment its encodes in flight run out, in the middle
    of it, where NVIDIA's driver makes a release wait for the GEMMs), and go at that run's end."""
    from dgemm.worker import encoding

    gate, m, n, out, found, A, B = _held_encode(monkeypatch, tmp_path, rng)
    eng = engines(any_device, "float32")
    pending = []
    try:
        pending.append(eng.stream([A], [B], m, n, finish=encoding.finisher(any_device, found)))
        any_device.trim(keep_pinned=True)                       # the first run's end
        assert encoding.release(any_device) is True
        pending.append(eng.stream([A], [B], m, n, finish=encoding.finisher(any_device, found)))   # the next run's
    finally:
        gate.set()
    for p in pending:
        encoded.write(p.result())
    check_product(out[...], A, B, dtype="float32")
    time.sleep(0.2)     # (the encoder threads' last steps after their results)
    assert any_device.encode_scratch.nbytes() > 0, "the encoder's buffers went in the middle of the next run"
    any_device.trim(keep_pinned=True)                           # the next run's end: nothing in flight
    assert encoding.release(any_device) is False and any_device.encode_scratch.nbytes() == 0


def test_a_pending_block_pickles_as_its_encoded_block(any_device, engines, tmp_path, rng):
    """Moved to another worker or spilled, a pending block is its encoded block (waited for), whose frames are
    the chunks; dask counts it at most the block's values."""
    import pickle
    import sys

    from dgemm.worker import encoding

    m, n = 48, 40
    out = zarr.create_array(str(tmp_path / "c.zarr"), shape=(m, n), chunks=(16, 40), dtype="float32")
    found = encoded.chunks_of(out, (0, m), (0, n))
    A, B = rng.standard_normal((m, 20)).astype("float32"), rng.standard_normal((20, n)).astype("float32")
    pending = engines(any_device, "float32").stream([A], [B], m, n, finish=encoding.finisher(any_device, found))
    assert m * n * 4 <= sys.getsizeof(pending) <= m * n * 4 + 4096
    got = pickle.loads(pickle.dumps(pending))
    assert isinstance(got, encoded.EncodedBlock)
    encoded.write(got)
    check_product(out[...], A, B, dtype="float32")


def test_chunks_of_leaves_other_outputs_to_the_host(tmp_path):
    def make(name, **kw):
        return zarr.create_array(str(tmp_path / name), shape=(50, 30), chunks=(16, 16), dtype="f4", **kw)

    assert encoded.chunks_of(make("v3.zarr"), (0, 32), (0, 30)) is not None
    assert encoded.chunks_of(make("v2.zarr", zarr_format=2, compressors=numcodecs.Zstd()), (0, 32), (0, 30))
    for name, kw in {"checksum": {"compressors": ZstdCodec(checksum=True)},
                     "blosc": {"compressors": BloscCodec(cname="zstd")},
                     "raw": {"compressors": None},
                     "two compressors": {"compressors": [ZstdCodec(), ZstdCodec()]},
                     "sharded": {"shards": (32, 32)},
                     "v2 filters": {"zarr_format": 2, "compressors": numcodecs.Zstd(),
                                    "filters": [numcodecs.Delta(dtype="f4")]},
                     "big-endian": {"serializer": zarr.codecs.BytesCodec(endian="big")}}.items():
        assert encoded.chunks_of(make(f"{name}.zarr", **kw), (0, 32), (0, 30)) is None, name
    arr = make("cut.zarr")
    assert encoded.chunks_of(arr, (0, 24), (0, 30)) is None                  # cuts a chunk
    assert encoded.chunks_of(arr, (0, 32), (0, 30), drop=(0,)) is None       # a 1-D output
    assert encoded.chunks_of(zarr.open_array(str(tmp_path / "v3.zarr"), mode="r"), (0, 32), (0, 30)) is None


# -- on the workers -------------------------------------------------------------------------------------------------
PATHS = ("storage_write_direct", "storage_write_batched", "storage_write_zarr", "storage_write_helped")


@pytest.fixture
def setting(client):
    """``setting(value)``: the workers' ``device-codecs``; unset again after the test."""
    yield from _device_codecs.setting(client)


def run_counted(client, fn):
    return _device_codecs.run_counted(client, fn, (*CODEC_COUNTERS, *PATHS))


def inputs(rng, m, n, dtype, k=40):
    return rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)


@pytest.mark.parametrize("layout", list(ZSTD))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_encodes_zstd_outputs_on_the_device(client, setting, tmp_path, rng, layout, dtype):
    setting("on")
    for case, (shape, chunks, block) in CASES.items():
        A, B = inputs(rng, *shape, dtype)
        out = str(tmp_path / f"c-{case}.zarr")
        c, grew = run_counted(client, lambda A=A, B=B, out=out, block=block, chunks=chunks: dgemm.matmul(
            A, B, out=out, client=client, block=block, chunks=chunks, **ZSTD[layout]))
        what = f"{layout} {dtype} {case}"
        values = c[...]
        check_product(values, A, B, dtype=dtype, what=what)
        check_frames(c, values)
        assert grew["device_encoded_bytes"] == encoded_bytes(c) and grew["host_encoded_bytes"] == 0, (what, grew)


def test_a_runs_last_block_has_its_frames_written_with_helpers(client, setting, tmp_path, rng):
    """One block product, its C block in 4 zstd chunks encoded on the device: its store runs after the worker's
    last GEMM, so helpers write some of its frames (as the host writer's chunks are encoded then); C is right."""
    setting("on")
    A, B = inputs(rng, 64, 64, "float32")
    c, grew = run_counted(client, lambda: dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=client, block=64,
                                                       chunks=(32, 32)))
    values = c[...]
    check_product(values, A, B, dtype="float32")
    check_frames(c, values)
    assert grew["device_encoded_bytes"] == encoded_bytes(c) and grew["storage_write_direct"] == 4, grew
    assert grew["storage_write_helped"] > 0, grew


def test_matmul_encodes_on_the_host_where_the_setting_is_off(client, setting, tmp_path, rng):
    A, B = inputs(rng, 50, 30, "float32")
    for mode in ("off", "auto"):
        setting(mode)
        c, grew = run_counted(client, lambda mode=mode: dgemm.matmul(A, B, out=str(tmp_path / f"c-{mode}.zarr"),
                                                                     client=client, block=32, chunks=(16, 8)))
        check_product(c[...], A, B, dtype="float32", what=mode)
        assert grew["host_encoded_bytes"] == encoded_bytes(c) and grew["device_encoded_bytes"] == 0, (mode, grew)


def test_encode_alone_decodes_the_inputs_on_the_host(client, setting, tmp_path, rng):
    """``device-codecs: encode``: zstd inputs decoded on the host, C's zstd chunks encoded on the device."""
    setting("encode")
    A, B = inputs(rng, 70, 45, "float32", k=52)
    names = []
    for name, x in (("a", A), ("b", B)):
        names.append(str(tmp_path / f"{name}.zarr"))
        zarr.create_array(names[-1], data=x, chunks=(16, 16), compressors=ZstdCodec(level=3))
    c, grew = run_counted(client, lambda: dgemm.matmul(*names, out=str(tmp_path / "c.zarr"), client=client,
                                                       block=32, chunks=(16, 8), compressors=ZstdCodec(level=3)))
    values = c[...]
    check_product(values, A, B, dtype="float32", what="encode")
    check_frames(c, values)
    assert grew["device_encoded_bytes"] == encoded_bytes(c) and grew["host_encoded_bytes"] == 0, grew
    assert grew["device_decoded_bytes"] == 0 and grew["host_decoded_bytes"] >= A.nbytes + B.nbytes, grew


@pytest.mark.parametrize("layout", list(HOST))
def test_other_output_codecs_stay_on_the_host(client, setting, tmp_path, rng, layout):
    setting("on")
    A, B = inputs(rng, 50, 30, "float64")
    c, grew = run_counted(client, lambda: dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=client, block=32,
                                                       chunks=(16, 8), **HOST[layout]))
    check_product(c[...], A, B, dtype="float64", what=layout)
    assert grew["host_encoded_bytes"] == encoded_bytes(c) and grew["device_encoded_bytes"] == 0, (layout, grew)


def test_gemm_with_beta_encodes_on_the_device(client, setting, tmp_path, rng):
    """beta * C joins the product on the device before the chunks are encoded: C is read, never read back."""
    setting("on")
    A, B = inputs(rng, 50, 30, "float64")
    C = rng.standard_normal((50, 30))
    c, grew = run_counted(client, lambda: dgemm.gemm(A, B, C, alpha=0.5, beta=-2.0, out=str(tmp_path / "c.zarr"),
                                                     client=client, block=32, chunks=(16, 8)))
    values = c[...]
    check_product(values, A, B, alpha=0.5, beta=-2.0, c=C, dtype="float64")
    check_frames(c, values)
    assert grew["device_encoded_bytes"] == encoded_bytes(c) and grew["host_encoded_bytes"] == 0, grew


def test_a_block_whose_chunk_is_not_written_is_not_marked_done_and_resume_redoes_it(client, setting, tmp_path, rng):
    """A folder (holding a file) where chunk (1, 0) goes: its frame cannot replace it, so its block fails and
    gets no completion marker.  ``resume=True`` then computes only the blocks without one."""
    from dgemm.storage import COMPLETE_ATTR, BlockMarkers

    setting("on")
    A, B = inputs(rng, 64, 64, "float32")
    path = str(tmp_path / "c.zarr")
    blocker = os.path.join(path, "c", "1", "0")
    os.makedirs(blocker)
    with open(os.path.join(blocker, "x"), "w") as f:
        f.write("in the way")
    out = zarr.create_array(path, shape=(64, 64), chunks=(32, 32), dtype="float32", overwrite=False)
    with pytest.raises(OSError):
        dgemm.matmul(A, B, out=out, client=client, block=32)
    c = zarr.open_array(path, mode="r")
    meta = c.attrs[COMPLETE_ATTR]
    assert meta["complete"] is False
    done = set(BlockMarkers(c, meta["owner"]).done())
    # the failed block is never marked; how many others were stored before the failure stopped the run is
    # the workers' order (a loaded machine stores none of them, an idle one all three)
    assert (1, 0) not in done and done <= {(0, 0), (0, 1), (1, 1)}, sorted(done)
    shutil.rmtree(blocker)
    c, grew = run_counted(client, lambda: dgemm.matmul(A, B, out=path, client=client, block=32, resume=True))
    values = c[...]
    check_product(values, A, B, dtype="float32")
    check_frames(c, values)
    # resume computes, and the device encodes, only the blocks without a marker
    assert grew["device_encoded_bytes"] == (4 - len(done)) * 32 * 32 * 4 and grew["host_encoded_bytes"] == 0, grew


def test_an_s3_output_is_encoded_on_the_device(client, setting, s3, rng):
    setting("on")
    A, B = inputs(rng, 50, 30, "float32")
    url = s3.url("encoding/c.zarr")
    c, grew = run_counted(client, lambda: dgemm.matmul(A, B, out=url, client=client, block=32, chunks=(16, 8),
                                                       storage_options=s3.storage_options))
    values = zarr.open_array(url, mode="r", storage_options=s3.storage_options)[...]
    check_product(values, A, B, dtype="float32")
    fs = s3.fs()
    raw = fs.cat(f"{s3.bucket}/encoding/c.zarr/c/3/3")          # an edge chunk on both axes: rows 48:50, cols 24:30
    padded = np.zeros((16, 8), np.float32)
    padded[:2, :6] = values[48:, 24:]
    np.testing.assert_array_equal(np.frombuffer(numcodecs.Zstd().decode(raw), np.float32).reshape(16, 8), padded)
    assert grew["device_encoded_bytes"] == encoded_bytes(c) and grew["host_encoded_bytes"] == 0, grew
    # one batch of PUTs per block (dgemm.storage.remote.put_many), not zarr's store.set
    assert grew["storage_write_batched"] == c.nchunks and grew["storage_write_zarr"] == 0, grew


def test_an_output_inside_a_group_is_written_under_its_path(client, setting, tmp_path, rng):
    """The chunk files go under the array's own folder in the group's store (keys relative to the array)."""
    setting("on")
    A, B = inputs(rng, 50, 30, "float64")
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    out = group.create_array("sub/c", shape=(50, 30), chunks=(16, 8), dtype="float64")
    _, grew = run_counted(client, lambda: dgemm.matmul(A, B, out=out, client=client, block=32))
    values = zarr.open_array(str(tmp_path / "g.zarr"), path="sub/c", mode="r")[...]
    check_product(values, A, B, dtype="float64")
    check_frames(out, values)
    assert not os.path.exists(tmp_path / "g.zarr" / "c"), "chunks written at the group's root"
    assert grew["device_encoded_bytes"] == encoded_bytes(out) and grew["storage_write_direct"] == out.nchunks, grew


def _device_buffers(dask_worker=None):
    return dask_worker.plugins["dgemm"].state.device.live_buffers()["buffers"]


def test_no_device_buffer_is_left_after_encoded_products(client, setting, tmp_path, rng):
    """The encoder's kept buffers (Device.encode_scratch) and the engine's go at the run's end."""

    setting("on")
    A, B = inputs(rng, 50, 30, "float32")
    _, grew = run_counted(client, lambda: dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=client, block=16,
                                                       chunks=(16, 8)))
    assert grew["device_encoded_bytes"] > 0, grew
    deadline = time.monotonic() + 20
    while (left := sum(client.run(_device_buffers).values())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == 0, f"{left} device buffers left after the run"


def test_an_in_place_update_encodes_on_the_device(client, setting, tmp_path, rng):
    """out is C (beta != 0): each block reads its original C, then its chunks are encoded on the device."""
    setting("on")
    A, B = inputs(rng, 50, 30, "float64")
    C = rng.standard_normal((50, 30))
    c = zarr.create_array(str(tmp_path / "c.zarr"), shape=C.shape, chunks=(16, 8), dtype="float64")
    c[...] = C
    _, grew = run_counted(client, lambda: dgemm.gemm(A, B, c=c, beta=-1.0, out=c, client=client, block=32))
    after = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")
    values = after[...]
    check_product(values, A, B, beta=-1.0, c=C, dtype="float64")
    check_frames(after, values)
    assert grew["device_encoded_bytes"] == encoded_bytes(after) and grew["host_encoded_bytes"] == 0, grew


def test_a_vector_output_is_encoded_on_the_host(client, setting, tmp_path, rng):
    """A matrix times a vector: a 1-D output, whose chunks the device path does not lay out."""
    setting("on")
    M, v = rng.standard_normal((50, 40)), rng.standard_normal(40)
    c, grew = run_counted(client, lambda: dgemm.matmul(M, v, out=str(tmp_path / "c.zarr"), client=client, block=32))
    check_product(c[...][:, None], M, v[:, None], dtype="float64")
    assert grew["device_encoded_bytes"] == 0 and grew["host_encoded_bytes"] == encoded_bytes(c), grew


def test_a_devices_encoder_threads_end_with_it():
    """The encoder threads (dgemm.worker.encoding) of a device that is gone are shut down, not left idle."""
    import gc

    from dgemm.worker import encoding

    class _Scratch:
        def slots(self):
            return 2

    class _Device:
        pass

    device = _Device()
    device.encode_scratch = _Scratch()
    pool = encoding._encoders(device)._pool
    assert pool.submit(lambda: 3).result() == 3
    del device
    gc.collect()
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(lambda: 3)

"""dgemm.storage.zstd: libzstd with reused contexts, against numcodecs and zarr (the references)."""
from __future__ import annotations

import threading

import numcodecs
import numpy as np
import pytest
import zarr

from dgemm.storage import chunks, zstd

pytestmark = pytest.mark.skipif(zstd.library() is None, reason="no libzstd of 1.4 or later on this machine")


def _payloads():
    rng = np.random.default_rng()
    yield "normal float32", rng.standard_normal(50_000).astype("float32").view(np.uint8)
    yield "float64 with runs", np.repeat(rng.standard_normal(300), 97).view(np.uint8)
    yield "zeros", np.zeros(70_001, np.uint8)
    yield "random bytes", rng.integers(0, 256, 33_333, dtype=np.uint8)
    yield "one byte", np.array([rng.integers(1, 256)], np.uint8)
    yield "seven bytes", rng.integers(1, 256, 7, dtype=np.uint8)


@pytest.mark.parametrize("level", [-5, -1, 0, 1, 3, 9, 19])
@pytest.mark.parametrize("checksum", [False, True])
def test_frames_read_both_ways(level, checksum):
    """Every frame dgemm writes, numcodecs reads; every frame numcodecs writes, dgemm reads: the same bytes."""
    ours = zstd.codec(level, checksum)
    ref = numcodecs.Zstd(level=level, checksum=checksum)
    for what, data in _payloads():
        mine = bytes(ours.encode(data))
        assert np.array_equal(np.frombuffer(ref.decode(mine), np.uint8), data), what
        out = np.full(data.nbytes, 0xAB, np.uint8)           # poisoned: a byte left unwritten shows
        assert ours.decode(ref.encode(data), out, what) is out
        assert np.array_equal(out, data), what


def test_encode_buffer_is_reused_by_the_thread():
    """What ``transient`` says: the next encode in the thread overwrites the last one's bytes."""
    z = zstd.codec(3, False)
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(20_000).astype("float32") for _ in range(2))
    first = z.encode(a)
    kept = bytes(first)
    z.encode(b)
    assert bytes(first) != kept and z.transient


def test_threads_have_their_own_contexts():
    z = zstd.codec(3, True)
    rng = np.random.default_rng()
    data = [rng.standard_normal(40_000).astype("float32") for _ in range(8)]
    errors = []

    def work(x):
        try:
            for _ in range(5):
                frame = bytes(z.encode(x))
                out = np.empty_like(x)
                z.decode(frame, out.view(np.uint8), "chunk")
                assert np.array_equal(out, x)
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(x,)) for x in data]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def _forgeries(frame: bytes):
    yield "truncated by one", frame[:-1]
    yield "truncated to the header", frame[:8]
    yield "empty", b""
    yield "trailing garbage", frame + b"\x01\x02\x03"
    yield "two frames", frame + frame
    for at in (4, 5, 6, 12, len(frame) // 2, len(frame) - 5):
        b = bytearray(frame)
        b[at] ^= 0x5A
        yield f"byte {at} flipped", bytes(b)
    yield "not zstd", b"\x00" * len(frame)


@pytest.mark.parametrize("checksum", [False, True])
def test_hostile_frames_as_the_reference_decodes_them(checksum):
    """Where numcodecs raises, dgemm raises ValueError; where it decodes, the bytes agree; never a crash."""
    data = np.random.default_rng().standard_normal(30_000).astype("float32").view(np.uint8)
    frame = numcodecs.Zstd(level=3, checksum=checksum).encode(data)
    ours = zstd.codec(3, checksum)
    for what, forged in _forgeries(bytes(frame)):
        ref_out = np.full(data.nbytes, 0xAB, np.uint8)
        try:
            numcodecs.Zstd().decode(forged, out=ref_out)
            ref_ok = True
        except Exception:   # noqa: BLE001 - any refusal by the reference
            ref_ok = False
        out = np.full(data.nbytes, 0xCD, np.uint8)
        try:
            ours.decode(forged, out, "chunk")
            ok = True
        except ValueError:
            ok = False
        assert ok == ref_ok, what
        if ok:
            assert np.array_equal(out, ref_out), what


def test_chunk_reader_and_writer_use_it_and_zarr_agrees(tmp_path):
    """An array with zarr's default codec: dgemm's writer encodes through libzstd, zarr reads the chunks back,
    and dgemm's reader decodes zarr's own chunks into its buffer."""
    rng = np.random.default_rng()
    x = rng.standard_normal((300, 200)).astype("float32")
    arr = zarr.create_array(str(tmp_path / "w.zarr"), shape=x.shape, chunks=(128, 64), dtype="float32")
    steps = chunks.layout(arr).steps
    assert [type(s.fast).__name__ for s in steps if getattr(s, "name", "") == "zstd"] == ["Zstd"]
    assert chunks.write_region(arr, (slice(0, 300), slice(0, 200)), x)
    assert np.array_equal(zarr.open_array(str(tmp_path / "w.zarr"), mode="r")[...], x)

    ref = zarr.create_array(str(tmp_path / "r.zarr"), shape=x.shape, chunks=(100, 50), dtype="float32")
    ref[...] = x
    from dgemm.storage import ZarrBlock

    out = np.full((100, 200), np.nan, np.float32)
    assert ZarrBlock(ref, (100, 200), (0, 200)).read_into(out)
    assert np.array_equal(out, x[100:200])


def test_without_libzstd_numcodecs_does_it(tmp_path, monkeypatch):
    monkeypatch.setattr(zstd, "_lib", None)
    monkeypatch.setattr(zstd, "_tried", True)
    x = np.random.default_rng().standard_normal((64, 64)).astype("float32")
    arr = zarr.create_array(str(tmp_path / "n.zarr"), shape=x.shape, chunks=(32, 32), dtype="float32")
    assert all(getattr(s, "fast", None) is None for s in chunks.layout(arr).steps)
    assert chunks.write_region(arr, (slice(0, 64), slice(0, 64)), x)
    assert np.array_equal(zarr.open_array(str(tmp_path / "n.zarr"), mode="r")[...], x)


def test_release_frees_every_threads_contexts_and_they_come_back():
    """A run's end gives back each thread's contexts and output buffer; the next chunk makes them again."""
    z = zstd.codec(3, False)
    x = np.random.default_rng().standard_normal(50_000).astype("float32")
    frames = []
    t = threading.Thread(target=lambda: frames.append(bytes(z.encode(x))))
    t.start()
    t.join()
    frame = bytes(z.encode(x))
    held = [c for c in list(zstd._ALL) if c.cctx]
    assert held and zstd.release() >= 1
    assert all(not c.cctx and not c.dctx and c.out.nbytes == 0 for c in list(zstd._ALL))
    out = np.empty_like(x)
    z.decode(frame, out.view(np.uint8), "chunk")          # made again, as good as before
    assert np.array_equal(out, x) and bytes(z.encode(x)) == frame == frames[0]

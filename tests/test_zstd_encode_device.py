"""zstd frames written on the device (dgemm/kernels/zstd_encode.cl through dgemm.opencl.codecs.zstd_encode), on PoCL.

The references are the readers: every frame must decode, with libzstd (through
ctypes), with numcodecs' ``Zstd`` and with zarr reading it as a chunk file, to
exactly the region it was made from.  The regions sit at odd offsets of one
device buffer; every device buffer the encoder allocates is filled with 0xFF
first (``poisoned``), so a byte of a frame that no kernel writes shows.  The
frames' block types are read here too (a small parser of RFC 8878's headers,
independent of the module), so that a frame which decodes but is not what the
encoder means to write (a table in every block, raw blocks where Huffman
gains, RLE for a block of several bytes) fails as well.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("numcodecs")
from numcodecs import Zstd

from dgemm.opencl.codecs import zstd_encode as ze
from dgemm.opencl.device import poisoned
from dgemm.storage import zstd as libzstd

LANES = (5, 64)     # a few lanes (runs of many literals, an odd count) and the GPU's shape (short runs)
GAP = 0xEE          # the device buffer's bytes between regions


@pytest.fixture(scope="module")
def dev(any_device):
    return any_device


@pytest.fixture(scope="module")
def z3():
    z = libzstd.codec(3, False)
    if z is None:
        pytest.skip("no libzstd 1.4 or later here")
    return z


def skewed(rng, n):
    """Bytes of a geometric distribution: codes far longer than 11 bits before the limit."""
    return np.minimum(rng.geometric(0.45, n) - 1, 255).astype(np.uint8).tobytes()


def regions(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((512, 48)), rng.standard_normal((48, 2048))
    out = {
        "product_f32": (a @ b).astype(np.float32).tobytes(),              # 4 MiB: 32 blocks
        "product_f64": (a[:40] @ b).tobytes(),
        "normal_f32": rng.standard_normal(75001).astype(np.float32).tobytes()[:-1],
        "normal_f64": rng.standard_normal(40000).tobytes(),
        "zeros": bytes(300_000),
        "one_byte": b"\x5a" * 200_003,
        "runs": np.repeat(rng.integers(0, 256, 400).astype(np.uint8), rng.integers(1, 2000, 400)).tobytes(),
        "random": rng.bytes(300_001),
        "bits01": rng.integers(0, 2, 70_000).astype(np.uint8).tobytes(),
        "alphabet2": rng.choice(np.array([3, 250], np.uint8), 100_000).tobytes(),
        "alphabet3": rng.choice(np.array([0, 7, 200], np.uint8), 100_000, p=[0.7, 0.2, 0.1]).tobytes(),
        "alphabet17": rng.integers(40, 57, 150_000).astype(np.uint8).tobytes(),
        "alphabet129": rng.choice(rng.permutation(256)[:129].astype(np.uint8), 200_000).tobytes(),
        "skewed": skewed(rng, 500_000),
        # each of a block's 4 streams one byte, a different one: no RLE block
        "stream_runs": np.repeat(np.array([1, 2, 3, 4], np.uint8), 256).tobytes(),
    }
    for n in (0, 1, 3, 255, 256, 1024, 65791, 65792, 127 * 1024, 128 * 1024, 128 * 1024 + 1, 3 * 2**20 + 1001):
        out[f"size_{n}"] = skewed(rng, n)
    return out


def upload(dev, data: dict):
    """One device buffer, every other region 16-byte aligned (the kernel's uint4 loads), the others at odd
    offsets (its byte loads); returns (buffer, offsets, sizes, whole bytes)."""
    import pyopencl as cl
    parts, offsets, at = [], [], 0
    for i, v in enumerate(data.values()):
        gap = bytes([GAP]) * (16 - at % 16 if i % 2 == 0 else 1 + i % 7)
        parts += [gap, v]
        offsets.append(at + len(gap))
        at += len(gap) + len(v)
    whole = np.frombuffer(b"".join(parts) + bytes([GAP]) * 5, np.uint8)
    buf = dev.buffer(whole.nbytes, "test regions")
    cl.enqueue_copy(dev.queue, buf, whole).wait()
    return buf, offsets, [len(v) for v in data.values()], whole


@pytest.fixture(scope="module", params=LANES, ids=[f"lanes{n}" for n in LANES])
def encoded(request, dev):
    """The frames of every region, encoded once per lane count."""
    import pyopencl as cl
    seed = int(os.environ.get("DGEMM_TEST_SEED") or np.random.SeedSequence().entropy % 2**63)
    print(f"DGEMM_TEST_SEED={seed}")
    data = regions(seed)
    buf, offsets, sizes, whole = upload(dev, data)
    try:
        with poisoned():
            frames = ze.encode_zstd(dev, buf, offsets, sizes, names=list(data), lanes=request.param)
        after = np.empty_like(whole)
        cl.enqueue_copy(dev.queue, after, buf).wait()
    finally:
        buf.release()
    assert np.array_equal(after, whole), "the encoder wrote into its input"
    return dict(zip(data, frames)), data


def parse(frame: bytes):
    """(content size, [(block type, literals type or None, literal streams or None), ...]) per RFC 8878."""
    assert frame[:4] == b"\x28\xb5\x2f\xfd"
    fhd = frame[4]
    fcs_flag, single = fhd >> 6, (fhd >> 5) & 1
    assert fhd & 0x1F == 0x00, f"reserved, checksum or dictionary bits set: {fhd:#x}"
    at = 5 + (0 if single else 1)
    width = [1 if single else 0, 2, 4, 8][fcs_flag]
    content = int.from_bytes(frame[at:at + width], "little") + (256 if width == 2 else 0)
    at += width
    blocks = []
    while True:
        h = int.from_bytes(frame[at:at + 3], "little")
        last, kind, size = h & 1, (h >> 1) & 3, h >> 3
        at += 3
        lit = streams = None
        if kind == 2:
            lit, fmt = frame[at] & 3, (frame[at] >> 2) & 3
            streams = 1 if fmt == 0 else 4
        blocks.append((kind, lit, streams))
        at += {0: size, 1: 1, 2: size}[kind]
        if last:
            break
    assert at == len(frame), f"{len(frame) - at} bytes after the last block"
    return content, blocks


def test_every_frame_decodes_with_libzstd_and_numcodecs(encoded, z3):
    frames, data = encoded
    for name, frame in frames.items():
        want = data[name]
        got = np.empty(len(want), np.uint8)
        z3.decode(frame, got, name)
        assert got.tobytes() == want, f"{name}: libzstd decodes other bytes"
        if want:
            assert bytes(Zstd().decode(frame)) == want, f"{name}: numcodecs decodes other bytes"
        else:   # numcodecs refuses an empty frame, its own too: this one is byte for byte its own
            assert frame == bytes(Zstd().encode(b"")), f"{name}: {frame.hex()}"
        content, _ = parse(frame)
        assert content == len(want), f"{name}: the header's content size"


def test_block_types_are_what_libzstd_would_choose(encoded):
    frames, data = encoded
    kinds = {name: parse(f)[1] for name, f in frames.items()}
    for name in ("random", "size_0", "size_1"):
        assert all(k == 0 for k, _, _ in kinds[name]), f"{name}: {kinds[name]}"
    assert kinds["size_3"] == [(1 if len(set(data["size_3"])) == 1 else 0, None, None)], kinds["size_3"]
    for name in ("zeros", "one_byte"):
        assert all(k == 1 for k, _, _ in kinds[name]), f"{name}: {kinds[name]}"
    assert all(k != 1 for k, _, _ in kinds["stream_runs"]), kinds["stream_runs"]
    for name in ("product_f32", "product_f64", "normal_f32", "normal_f64", "alphabet2", "alphabet3",
                 "alphabet17", "alphabet129", "skewed", "stream_runs", "size_255", "size_1024", "size_65792",
                 "size_131072", "size_3146729"):
        blocks = kinds[name]
        # the frame's first block carries the table (literals type 2), every later one reuses it (type 3)
        assert [k for k, _, _ in blocks] == [2] * len(blocks), f"{name}: {blocks}"
        assert [lit for _, lit, _ in blocks] == [2] + [3] * (len(blocks) - 1), f"{name}: {blocks}"
        sizes = [min(ze.BLOCK, len(data[name]) - i * ze.BLOCK) for i in range(len(blocks))]
        assert [s for _, _, s in blocks] == [1 if n < 256 else 4 for n in sizes], f"{name}: {blocks}"
    # runs of one byte: RLE blocks where a block is one byte, Huffman or raw elsewhere; never a table twice
    for name, blocks in kinds.items():
        assert sum(lit == 2 for _, lit, _ in blocks) <= 1, f"{name}: {blocks}"


def test_ratio_is_libzstd_level3s_on_products_and_floats(encoded, z3):
    frames, data = encoded
    for name in ("product_f32", "product_f64", "normal_f32", "normal_f64"):
        ours = len(frames[name])
        theirs = len(bytes(z3.encode(np.frombuffer(data[name], np.uint8))))
        assert ours <= 1.005 * theirs, f"{name}: {ours} bytes, libzstd level 3 {theirs}"
    # a small alphabet without repeats: Huffman alone beats what matches find
    for name in ("alphabet3", "alphabet17"):
        assert len(frames[name]) <= 1.01 * len(bytes(z3.encode(np.frombuffer(data[name], np.uint8)))), name


def test_tables_of_many_distributions_decode(dev, z3, rng):
    """Regions of random alphabets (2 to 256 bytes, here and there) and skews: every table and description."""
    import pyopencl as cl
    data = []
    for _ in range(120):
        k = int(rng.integers(2, 257))
        symbols = rng.choice(256, k, replace=False).astype(np.uint8)
        p = rng.dirichlet(np.full(k, float(rng.choice([0.05, 0.3, 1.0, 5.0]))))
        n = int(rng.integers(300, 30_000))
        data.append(rng.choice(symbols, n, p=p).tobytes())
    whole = np.frombuffer(b"".join(data), np.uint8)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in data])[:-1]]).tolist()
    buf = dev.buffer(whole.nbytes, "test regions")
    try:
        cl.enqueue_copy(dev.queue, buf, whole).wait()
        with poisoned():
            frames = ze.encode_zstd(dev, buf, offsets, [len(d) for d in data])
    finally:
        buf.release()
    compressed = 0
    for i, (frame, want) in enumerate(zip(frames, data)):
        got = np.empty(len(want), np.uint8)
        z3.decode(frame, got, f"region {i}")
        assert got.tobytes() == want, f"region {i}"
        compressed += parse(frame)[1][0][1] == 2
    assert compressed >= 80, f"only {compressed} of 120 regions Huffman-coded"


def test_zarr_reads_chunks_written_here(tmp_path, dev):
    zarr = pytest.importorskip("zarr")
    import pyopencl as cl
    rng = np.random.default_rng(7)
    values = (rng.standard_normal((300, 64)) @ rng.standard_normal((64, 500))).astype(np.float32)
    path = tmp_path / "c.zarr"
    arr = zarr.create_array(store=str(path), shape=values.shape, chunks=(150, 500), dtype="float32",
                            compressors=zarr.codecs.ZstdCodec(level=3, checksum=False), fill_value=np.nan)
    del arr
    buf = dev.buffer(values.nbytes, "test chunks")
    try:
        cl.enqueue_copy(dev.queue, buf, values).wait()
        half = values.nbytes // 2
        with poisoned():
            frames = ze.encode_zstd(dev, buf, [0, half], [half, half], names=["c/0/0", "c/1/0"])
    finally:
        buf.release()
    for i, frame in enumerate(frames):
        (path / "c" / str(i)).mkdir(parents=True, exist_ok=True)
        (path / "c" / str(i) / "0").write_bytes(frame)
    got = zarr.open_array(str(path), mode="r")[:]
    assert np.array_equal(got, values)


def test_regions_are_checked(dev):
    buf = dev.buffer(100, "test")
    try:
        assert ze.encode_zstd(dev, buf, [], []) == []
        with pytest.raises(ValueError, match="chunk x: its 10 bytes at 95"):
            ze.encode_zstd(dev, buf, [0, 95], [5, 10], names=["chunk w", "chunk x"])
        with pytest.raises(ValueError, match="offsets"):
            ze.encode_zstd(dev, buf, [0], [5, 10])
    finally:
        buf.release()


def test_frames_into_a_host_array(dev, z3):
    import pyopencl as cl
    rng = np.random.default_rng(11)
    values = (rng.standard_normal((200, 32)) @ rng.standard_normal((32, 400))).astype(np.float32)
    raw = values.tobytes()
    sizes = [len(raw) // 3, 5, len(raw) - len(raw) // 3 - 5]
    offsets = [0, sizes[0], sizes[0] + 5]
    buf = dev.buffer(len(raw), "test regions")
    try:
        cl.enqueue_copy(dev.queue, buf, values).wait()
        room = sum(ze.frame_bound(n) for n in sizes)
        with pytest.raises(ValueError, match="may not hold the frames"):
            ze.encode_zstd(dev, buf, offsets, sizes, host=np.empty(room - 1, np.uint8))
        host = np.full(room + 10, 0xFF, np.uint8)
        with poisoned():
            frames = ze.encode_zstd(dev, buf, offsets, sizes, host=host)
    finally:
        buf.release()
    assert all(isinstance(f, memoryview) for f in frames)
    assert sum(len(f) for f in frames) < len(raw)
    for f, o, n in zip(frames, offsets, sizes):
        got = np.empty(n, np.uint8)
        z3.decode(f, got, "region")
        assert got.tobytes() == raw[o:o + n]
    assert (host[sum(len(f) for f in frames):] == 0xFF).all(), "written past the frames"


def test_kept_buffers_are_reused_taken_in_turn_and_given_back(dev, z3):
    """``keep=True`` within the device's encoder slot: the buffers of the first call serve the next (a larger
    call grows them, a smaller one allocates nothing), whatever the last call left in them changes no frame
    (each frame is the one fresh buffers give), two threads take turns (an encoder scratch of one slot here),
    and ``Device.trim`` gives them back."""
    from dgemm.opencl.scratch import Scratch

    saved, dev.encode_scratch = dev.encode_scratch, Scratch(dev, slots=1)
    try:
        _kept_buffers(dev, z3)
    finally:
        dev.encode_scratch.release()
        dev.encode_scratch = saved


def _kept_buffers(dev, z3):
    import threading

    import pyopencl as cl

    rng = np.random.default_rng(12)
    values = (rng.standard_normal((600, 32)) @ rng.standard_normal((32, 700))).astype(np.float32)
    raw = values.tobytes()
    buf = dev.buffer(len(raw), "test regions")
    calls = {"small": ([0, 1000], [1000, 300_000]), "large": ([0, 400_000], [400_000, len(raw) - 400_000]),
             "small again": ([5, 2000], [1000, 250_001])}
    try:
        cl.enqueue_copy(dev.queue, buf, values).wait()
        with poisoned():
            fresh = {k: ze.encode_zstd(dev, buf, o, n) for k, (o, n) in calls.items()}
        dev.encode_scratch.release()    # (what earlier tests' encodes on this device kept)
        before = dev.live_buffers()["buffers"]
        kept, counts = {}, {}
        with poisoned(), dev.encode_scratch.slot():
            for k, (o, n) in calls.items():     # (the large one on the slot's own queue)
                kept[k] = ze.encode_zstd(dev, buf, o, n, keep=True,
                                         queue=dev.encode_scratch.queue() if k == "large" else None)
                counts[k] = dev.live_buffers()["buffers"]
        assert counts["small"] > before and counts["large"] >= counts["small"], counts
        assert counts["small again"] == counts["large"], "a smaller call allocated buffers"
        assert kept == fresh, "a kept buffer's old bytes changed a frame"
        for k, (o, n) in calls.items():
            for f, at, size in zip(kept[k], o, n):
                got = np.empty(size, np.uint8)
                z3.decode(f, got, k)
                assert got.tobytes() == raw[at:at + size], k

        results, errors = {}, []

        def encode(name):
            try:
                with dev.encode_scratch.slot():
                    results[name] = ze.encode_zstd(dev, buf, *calls[name], keep=True)
            except Exception as e:   # noqa: BLE001  (shown by the assertion below)
                errors.append(e)
        threads = [threading.Thread(target=encode, args=(k,)) for k in ("large", "small again")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and results == {k: fresh[k] for k in results} and len(results) == 2, errors
        assert dev.live_buffers()["buffers"] == counts["large"], "the threads' turns allocated buffers"
    finally:
        buf.release()
    dev.trim(keep_pinned=True)
    assert dev.encode_scratch.nbytes() == 0 and dev.live_buffers()["buffers"] < counts["large"]
    with pytest.raises(RuntimeError, match="outside the device's encoder slot"):
        ze.encode_zstd(dev, dev.buffer(16, "test"), [0], [16], keep=True)


def test_an_encode_on_another_queue_waits_for_what_writes_its_buffer(dev, z3):
    """``queue`` and ``wait_for``: the encode runs on a queue of its own, and reads the buffer only after the
    events given (here a fill on the GEMMs' queue, held back by a user event): until they have run the call
    does not return, and its frames hold what they wrote, not what the buffer held before."""
    import _device_codecs

    values = np.random.default_rng(13).standard_normal(300_000).astype(np.float32)
    buf = dev.buffer(values.nbytes, "test regions")

    def encode(written):
        with dev.encode_scratch.slot():
            return ze.encode_zstd(dev, buf, [0, 4096], [4096, values.nbytes - 4096], keep=True,
                                  queue=dev.encode_scratch.queue(), wait_for=[written])
    try:
        got = _device_codecs.behind_a_gate(dev, buf, values, np.float32(1.5), encode, "the encode")
    finally:
        buf.release()
    want = np.full(values.size, 1.5, np.float32).tobytes()
    for f, o, n in zip(got, [0, 4096], [4096, values.nbytes - 4096]):
        out = np.empty(n, np.uint8)
        z3.decode(f, out, "region")
        assert out.tobytes() == want[o:o + n]

"""zstd frames decoded on the device (dgemm/kernels/zstd_decode.cl through dgemm.opencl.codecs.zstd_decode), on PoCL.

The references are numcodecs' ``Zstd`` (what it writes, the device decodes bit
for bit) and libzstd itself, called here through ctypes exactly as numcodecs
calls it (one ``ZSTD_decompressDCtx`` into a buffer of the frame's content
size): for every frame of a corpus of truncated, bit-flipped and forged frames,
where libzstd refuses, the device refuses with a :class:`ZstdFrameError` naming
the frame; where libzstd decodes, the device decodes to the same bytes, or
refuses a bitstream that does not end where its last symbol or sequence does,
which RFC 8878 forbids and libzstd 1.5.4 sometimes decodes anyway (the module's
notes; counted, and only those messages are allowed).  Frames are also built
by hand (raw literals, RLE-coded sequence fields, direct Huffman weights) to
reach what an encoder never writes: offsets before the frame's start, repeat
offsets across blocks, literal lengths past the literals, sequence counts the
bitstream cannot hold.  Output buffers are poisoned first, so a byte the device
never writes shows, and so does one written outside the frames' output.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

import numpy as np
import pytest

numcodecs = pytest.importorskip("numcodecs")
from numcodecs import Zstd  # noqa: E402

from dgemm.opencl.codecs import zstd_decode as zd  # noqa: E402
from dgemm.opencl.codecs import zstd_entropy as ent  # noqa: E402
from dgemm.opencl.codecs import zstd_devplan as zdp  # noqa: E402
from dgemm.opencl.codecs import zstd_frames as zf  # noqa: E402

POISON = 0xA5
LANES = (1, 4)      # one lane (the CPU default, no barriers) and several (the GPU's shape, with barriers)
CAP = 1 << 20


def _libzstd():
    for name in ("libzstd.so.1", ctypes.util.find_library("zstd")):
        try:
            lib = ctypes.CDLL(name)
        except (OSError, TypeError):
            continue
        lib.ZSTD_createDCtx.restype = ctypes.c_void_p
        lib.ZSTD_decompressDCtx.restype = ctypes.c_size_t
        lib.ZSTD_decompressDCtx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                            ctypes.c_size_t]
        lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
        return lib, lib.ZSTD_createDCtx()
    pytest.skip("no libzstd to compare with")


@pytest.fixture(scope="module")
def dev(any_device):
    return any_device


@pytest.fixture(scope="module")
def libzstd():
    return _libzstd()


def reference(libzstd, frame: bytes):
    """libzstd's answer, as numcodecs asks for it: the decoded bytes, or None where it refuses."""
    lib, dctx = libzstd
    try:
        size = min(zf.header(frame)[1], CAP)
    except (zf.ZstdFrameError, zf.ZstdUnsupported):
        size = CAP
    dst = ctypes.create_string_buffer(max(size, 1))
    n = lib.ZSTD_decompressDCtx(dctx, dst, size, frame, len(frame))
    if lib.ZSTD_isError(n):
        return None
    return dst.raw[:n]


def device_decode(dev, frames, lanes=1, offsets=None, names=None, size=None):
    """Decode into a poisoned buffer; returns the whole buffer's bytes.

    Checks, also when the frames are refused, that nothing was written past ``size``.
    """
    import pyopencl as cl
    size = size if size is not None else sum(zf.header(f)[1] for f in frames)
    out = dev.buffer(size + 64, "test output")
    refused = None
    try:
        cl.enqueue_fill_buffer(dev.queue, out, np.uint8(POISON), 0, out.size).wait()
        try:
            zd.decode_zstd(dev, frames, out, offsets=offsets, names=names, lanes=lanes)
        except zd.ZstdFrameError as e:
            refused = e
        got = np.empty(out.size, np.uint8)
        cl.enqueue_copy(dev.queue, got, out).wait()
    finally:
        out.release()
    assert (got[size:] == POISON).all(), "the device wrote past the frames' output"
    if refused is not None:
        raise refused
    return got[:size].tobytes()


def data(kind, n, rng) -> bytes:
    if kind == "normal":      # Zarr's usual chunk: float32 noise, compressible exponents
        return rng.normal(size=n // 4 + 1).astype(np.float32).tobytes()[:n]
    if kind == "product":     # a matrix product's floats: sums of products, smoother
        a = rng.normal(size=(n // 64 + 1, 4)).astype(np.float32)
        return (a @ rng.normal(size=(4, 16)).astype(np.float32)).tobytes()[:n]
    if kind == "zeros":
        return bytes(n)
    if kind == "runs":
        return np.repeat(rng.integers(0, 256, n // 37 + 1), 37).astype(np.uint8).tobytes()[:n]
    if kind == "random":
        return rng.bytes(n)
    if kind == "text":        # a small alphabet: Huffman literals, many matches
        return bytes(rng.choice(np.frombuffer(b"acgt ,.\n", np.uint8), n))
    raise ValueError(kind)


KINDS = ("normal", "product", "zeros", "runs", "random", "text")


@pytest.mark.parametrize("lanes", LANES)
def test_every_level_round_trips_like_numcodecs(dev, rng, lanes):
    frames, want = [], []
    for level in range(-7, 20):
        for checksum in (False, True):
            for kind in KINDS:
                raw = data(kind, int(rng.integers(1, 6000)), rng)
                frame = Zstd(level=level, checksum=checksum).encode(raw)
                assert Zstd().decode(frame) == raw
                frames.append(frame)
                want.append(raw)
    assert device_decode(dev, frames, lanes) == b"".join(want)


@pytest.mark.parametrize("lanes", LANES)
def test_edge_sizes(dev, rng, lanes):
    sizes = (0, 1, 127 * 1024, 128 * 1024, 128 * 1024 + 1, 3 * 1024 * 1024 + 7)
    frames, want = [], []
    for n in sizes:
        for kind, level, checksum in (("normal", 3, False), ("text", 1, True), ("runs", -1, False),
                                      ("random", 3, True)):
            if n > 1 << 20 and kind in ("text", "random"):
                continue       # (slow to build on two cores; the other kinds cover several blocks)
            raw = data(kind, n, rng)
            frames.append(Zstd(level=level, checksum=checksum).encode(raw))
            want.append(raw)
    assert device_decode(dev, frames, lanes) == b"".join(want)


def test_frames_land_at_their_offsets_and_nowhere_else(dev, rng):
    raws = [data(k, int(rng.integers(100, 3000)), rng) for k in KINDS]
    frames = [Zstd(level=3).encode(r) for r in raws]
    offsets, at = [], 5
    for r in raws:
        offsets.append(at)
        at += len(r) + int(rng.integers(0, 40))
    got = device_decode(dev, frames, 1, offsets=offsets, size=at)
    want = bytearray([POISON]) * at
    for r, o in zip(raws, offsets):
        want[o:o + len(r)] = r
    assert got == bytes(want)


def test_errors_name_the_frame_and_block(dev, rng):
    good = Zstd(level=3).encode(data("text", 5000, rng))
    broken = bytearray(good)
    broken[-2] ^= 0x40            # inside the last block's bitstream
    with pytest.raises(zd.ZstdFrameError, match=r"^zstd frame chunk/0\.1: block \d+: "):
        device_decode(dev, [good, bytes(broken)], names=["chunk/0.0", "chunk/0.1"])


def test_what_is_left_to_the_host(dev, rng):
    raw = data("text", 300, rng)
    frame = Zstd(level=3).encode(raw)
    skippable = (0x184D2A53).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    no_size = zf.MAGIC.to_bytes(4, "little") + bytes([0x00, 0x00]) + (1 | (len(raw) << 3)).to_bytes(3, "little") + raw
    for f in (skippable, no_size, frame + frame, frame + skippable, b""):
        assert zd.unsupported_reason(f) is not None and not zd.supported(f)
        with pytest.raises(zd.ZstdUnsupported):
            device_decode(dev, [f], size=1)
    assert zd.supported(frame) and zd.unsupported_reason(b"\x00" * 20) is None   # corrupt: refused, not left


def test_a_deferred_decode_is_checked_as_often_as_asked(dev, rng):
    """A deferred call (``pending``) returns once enqueued; its check() reads the error rows once the kernels
    have run, from buffers of the call's own (the slot may serve another call by then), and answers every later
    call alike: a block of a cached panel is checked by each product that reads it."""
    import pyopencl as cl

    good = [Zstd(level=3).encode(data("normal", 40_000, rng)), Zstd(level=3).encode(data("text", 5000, rng))]
    broken = bytearray(good[1])
    broken[-2] ^= 0x40            # inside the last block's bitstream: only a kernel finds it (as above)
    for frames, fails in ((good, False), ([good[0], bytes(broken)], True)):
        size = sum(zf.header(f)[1] for f in frames)
        out = dev.buffer(size, "test output")
        try:
            pending = []
            with dev.reading(), dev.scratch.slot():
                zd.decode_zstd(dev, frames, out, names=["chunk/0", "chunk/1"], keep=True, pending=pending)
                event, check = pending[0]
                dev.scratch.leave_after(event)
            for _ in range(3):
                if fails:
                    with pytest.raises(zd.ZstdFrameError, match=r"^zstd frame chunk/1: block \d+: "):
                        check()
                else:
                    check()
            got = np.empty(size, np.uint8)
            cl.enqueue_copy(dev.queue, got, out, wait_for=[event]).wait()
            if not fails:
                assert got.tobytes() == b"".join(Zstd().decode(f) for f in frames)
        finally:
            out.release()


# -- the reference-equality corpus ---------------------------------------------------------------------
def compare(dev, libzstd, frame: bytes, counts: dict, lanes=1) -> None:
    want = reference(libzstd, frame)
    try:
        size = zf.header(frame)[1]
        got = device_decode(dev, [frame], lanes, size=size if size <= CAP else 0)
        kind = "decoded"
    except zd.ZstdUnsupported:
        counts["left to the host"] = counts.get("left to the host", 0) + 1
        return
    except zd.ZstdFrameError as e:
        assert str(e).startswith("zstd frame frame 0") or str(e).startswith("zstd frame frame:"), str(e)
        kind, got = "refused", str(e)
    if want is None:
        assert kind == "refused", f"libzstd refuses {frame.hex()}, the device decodes it"
    elif kind == "decoded":
        assert got == want, f"the device decodes {frame.hex()} to other bytes than libzstd"
    else:
        assert any(s in got for s in zd.STRICT), f"libzstd decodes {frame.hex()}, the device says: {got}"
        kind = "refused, libzstd 1.5.4 decodes (a bitstream that does not end where it should, or what 1.5.6 refuses)"
    counts[kind] = counts.get(kind, 0) + 1


def corpus_bases(rng):
    bases = []
    for kind in KINDS:
        raw = data(kind, int(rng.integers(200, 9000)), rng)
        for level in (-5, -1, 1, 3, 9, 19):
            bases.append(Zstd(level=level, checksum=bool(rng.integers(0, 2))).encode(raw))
    raw = data("text", 2000, rng) + data("random", 300, rng) + data("normal", 3000, rng)
    bases.append(Zstd(level=5).encode(raw * 2))
    return bases


def mutations(frame: bytes, rng, count: int):
    """Truncations, bit flips and overwritten bytes, the headers' bytes more often."""
    for _ in range(count):
        g = bytearray(frame)
        how = rng.integers(0, 5)
        if how == 0:
            g = g[:rng.integers(0, len(g))]
        elif how in (1, 2):
            for _ in range(rng.integers(1, 3)):
                p = rng.integers(0, len(g))
                g[p] ^= 1 << int(rng.integers(0, 8))
        elif how == 3:
            g[rng.integers(0, min(len(g), 48))] = rng.integers(0, 256)
        else:
            p = rng.integers(4, min(len(g), 48))
            g[p] ^= 1 << int(rng.integers(0, 8))
        yield bytes(g)


def test_a_call_enqueues_every_upload_before_its_first_kernel(dev, rng):
    """A reader waits for its call's uploads before it reads its next block into the same staging; an upload
    enqueued behind a kernel would hold it there until the kernel had run (beside the GEMMs, a GEMM launch or
    more each). Shown by the profiling times of one in-order queue: every upload ends before any kernel starts,
    for a call with Huffman streams, sequences, blocks copied at once and blocks executed."""
    import pyopencl as cl

    raw = [data("normal", 300_000, rng), data("text", 200_000, rng), data("random", 150_000, rng)]
    frames = [Zstd(level=3).encode(r) for r in raw]
    batch = zd.Batch([zf.plan(f) for f in frames], [0, 0, 0])
    assert len(batch.streams) and len(batch.with_seqs) and len(batch.prefix)   # every upload the call has
    size = sum(len(r) for r in raw)
    out = dev.buffer(size, "test output")
    try:
        pending, events = [], []
        with dev.reading(), dev.scratch.slot():
            zd.decode_zstd(dev, frames, out, keep=True, pending=pending, events=events,
                           queue=dev.scratch.queue())
            event, check = pending[0]
            dev.scratch.leave_after(event)
        check()
        got = np.empty(size, np.uint8)
        cl.enqueue_copy(dev.queue, got, out, wait_for=[event]).wait()
        assert got.tobytes() == b"".join(raw)
        uploads = [e for what, e in events if what == "upload"]
        kernels = [e for what, e in events if what != "upload"]
        assert len(uploads) >= 8 and len(kernels) >= 6
        assert max(e.profile.end for e in uploads) <= min(e.profile.start for e in kernels)
    finally:
        out.release()


def test_corrupt_frames_are_refused_or_decoded_as_libzstd_does(dev, libzstd, rng):
    """40 corrupt versions of each frame of the corpus; ``DGEMM_FUZZ_ROUNDS`` of them for a longer search."""
    counts: dict = {}
    for base in corpus_bases(rng):
        compare(dev, libzstd, base, counts)
        for g in mutations(base, rng, int(os.environ.get("DGEMM_FUZZ_ROUNDS") or 40)):
            compare(dev, libzstd, g, counts)
    print(counts)
    assert counts.get("refused", 0) > 500 and counts.get("decoded", 0) > 100


# libzstd's compression parameters (zstd.h, 1.5.x; the experimental ones are accepted by the shared library too,
# and refused with an error code by a version without them, which the test then leaves out)
_LEVEL, _WINDOW_LOG, _MIN_MATCH, _STRATEGY, _LDM, _CHECKSUM = 100, 101, 105, 107, 160, 201
_LITERALS_MODE, _TARGET_BLOCK, _BLOCK_SPLITTER, _MAX_BLOCK = 1002, 1003, 1010, 1015


def _compressor(libzstd):
    """``compress(data, params) -> frame or None`` through libzstd's advanced API (ZSTD_compress2)."""
    lib, _ = libzstd
    for name, res, args in (("ZSTD_createCCtx", ctypes.c_void_p, []),
                            ("ZSTD_CCtx_setParameter", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]),
                            ("ZSTD_CCtx_reset", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int]),
                            ("ZSTD_compressBound", ctypes.c_size_t, [ctypes.c_size_t]),
                            ("ZSTD_compress2", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                                 ctypes.c_void_p, ctypes.c_size_t])):
        if not hasattr(lib, name):
            pytest.skip(f"this libzstd has no {name}")
        getattr(lib, name).restype = res
        getattr(lib, name).argtypes = args
    cctx = lib.ZSTD_createCCtx()

    def compress(data: bytes, params: dict):
        lib.ZSTD_CCtx_reset(cctx, 3)            # the session and the parameters
        taken = {}
        for key, value in params.items():
            if not lib.ZSTD_isError(lib.ZSTD_CCtx_setParameter(cctx, key, value)):
                taken[key] = value
        dst = ctypes.create_string_buffer(lib.ZSTD_compressBound(len(data)))
        n = lib.ZSTD_compress2(cctx, dst, len(dst), data, len(data))
        return (None if lib.ZSTD_isError(n) else dst.raw[:n]), taken
    return compress


def shaped(rng, n: int) -> bytes:
    """Data of a kind chosen at random, some with repeats far apart (long offsets, repeated offsets)."""
    kind = str(rng.choice(list(KINDS) + ["repeats", "mixed"]))
    if kind == "repeats":       # pieces of one random block copied again and again, some changed a little
        piece = data(str(rng.choice(["text", "random", "normal"])), int(rng.integers(64, 70_000)), rng)
        out = bytearray()
        while len(out) < n:
            at, k = int(rng.integers(0, len(piece))), int(rng.integers(3, 5000))
            out += piece[at:at + k]
            if rng.random() < 0.3:
                out += rng.bytes(int(rng.integers(1, 20)))
        return bytes(out[:n])
    if kind == "mixed":
        return b"".join(data(str(rng.choice(KINDS)), n // 4 + 1, rng) for _ in range(4))[:n]
    return data(kind, n, rng)


def test_frames_of_random_compression_parameters_decode_like_libzstd(dev, libzstd, rng):
    """libzstd's frames under parameters drawn at random (level, window, minimum match, strategy, long-distance
    matching, raw or Huffman literals, small and split blocks, checksum), on data of every kind and some with
    repeats far apart: every frame decodes as libzstd decodes it, as do a few corrupt versions of each.
    ``DGEMM_FUZZ_ROUNDS`` frames (25 by default)."""
    compress = _compressor(libzstd)
    counts: dict = {}
    taken_any: set = set()
    for _ in range(int(os.environ.get("DGEMM_FUZZ_ROUNDS") or 25)):
        params = {_LEVEL: int(rng.integers(-7, 23)), _CHECKSUM: int(rng.integers(0, 2))}
        if rng.random() < 0.6:
            params.update({_WINDOW_LOG: int(rng.integers(10, 24)), _MIN_MATCH: int(rng.integers(3, 8)),
                           _STRATEGY: int(rng.integers(1, 10))})
        for key, values, p in ((_LDM, [1], 0.2), (_LITERALS_MODE, [1, 2], 0.4), (_TARGET_BLOCK, [1340, 5000], 0.2),
                               (_BLOCK_SPLITTER, [1, 2], 0.3), (_MAX_BLOCK, [1024, 4096, 40_000], 0.3)):
            if rng.random() < p:
                params[key] = int(rng.choice(values))
        raw = shaped(rng, int(rng.integers(1, 400_000)))
        frame, taken = compress(raw, params)
        assert frame is not None, params
        taken_any |= set(taken)
        want = reference(libzstd, frame)
        assert want == raw, "libzstd does not decode its own frame"
        compare(dev, libzstd, frame, counts, lanes=int(rng.choice(LANES)))
        for g in mutations(frame, rng, 3):
            compare(dev, libzstd, g, counts)
    print(counts, sorted(taken_any))
    assert counts.get("decoded", 0) >= 10 and {_LEVEL, _WINDOW_LOG} <= taken_any, (counts, taken_any)


# -- frames built by hand ---------------------------------------------------------------------------------
def frame_of(blocks, size, checksum=None) -> bytes:
    """A frame with a 4-byte content size and these (type, last, body, header size) blocks."""
    out = zf.MAGIC.to_bytes(4, "little") + bytes([0x80 | (4 if checksum is not None else 0), 0x58])
    out += size.to_bytes(4, "little")
    for btype, last, body, hsize in blocks:
        out += (last | (btype << 1) | (hsize << 3)).to_bytes(3, "little") + body
    if checksum is not None:
        out += checksum.to_bytes(4, "little")
    return out


def bitstream(fields) -> bytes:
    """A backward bitstream whose reads, in order, give these (value, bits) fields."""
    total = sum(n for _, n in fields)
    v, at = 1 << total, total
    for value, n in fields:
        at -= n
        v |= (value & ((1 << n) - 1)) << at
    return v.to_bytes(total // 8 + 1, "little")


def raw_literals(lits: bytes) -> bytes:
    n = len(lits)
    assert n < 4096
    return (((n << 4) | 0b0100).to_bytes(2, "little") if n >= 32 else bytes([n << 3])) + lits


def rle_sequences(nseq: int, ll_code: int, of_code: int, ml_code: int, fields) -> bytes:
    """A sequences section with all three fields RLE-coded (no state bits) and this bitstream."""
    head = bytes([nseq]) if nseq < 128 else bytes([0x80 | (nseq >> 8), nseq & 0xFF])
    return head + bytes([0x54, ll_code, of_code, ml_code]) + bitstream(fields)


def compressed(lits: bytes, seqs: bytes, last=1):
    body = raw_literals(lits) + seqs
    return (2, last, body, len(body))


def crafted_frames():
    lits = b"0123456789abcdefghijklmnopqrstuvwxyz"
    # LL code 4: 4 literals; ML code 1: a 4-byte match; OF code 2: offset 1 + 2 bits
    for off_bits in range(4):
        for nseq in (1, 2, 5, 9, 10, 12):
            for extra in (0, 1, 3, 9):
                seqs = rle_sequences(nseq, 4, 2, 1, [(off_bits, 2)] * nseq + [(0, extra)])
                size = min(nseq, 9) * 8 + len(lits) - 4 * min(nseq, 9)
                for delta in (-1, 0, 1):       # output one byte short of, at, one byte past the content size
                    yield frame_of([compressed(lits, seqs)], size + delta)
    # offsets before the frame's start, across a raw block before it
    for pre in (0, 3, 20):
        for code, bits in ((2, 3), (3, 7), (5, 31), (10, 1000), (31, 5)):
            seqs = rle_sequences(1, 4, code, 1, [(bits, code)])
            body = [(0, 0, b"x" * pre, pre)] if pre else []
            for size in (pre + 8 + len(lits) - 4, pre + 5):
                yield frame_of(body + [compressed(lits, seqs)], size)
    # offsets reaching exactly the frame's first byte, and one byte before it
    for pre in (0, 3, 20):
        for target in (pre + 4, pre + 5):
            code = (target + 3).bit_length() - 1
            seqs = rle_sequences(1, 4, code, 1, [(target + 3 - (1 << code), code)])
            body = [(0, 0, b"x" * pre, pre)] if pre else []
            yield frame_of(body + [compressed(lits, seqs)], pre + 8 + len(lits) - 4)
    # repeat offsets carried across blocks (OF code 0 and 1, with and without literals first)
    for ll_code in (0, 3):
        for of_code, nbits in ((0, 0), (1, 1)):
            for bit in (0, 1):
                # 4 literals, then a 5-byte match at offset 2 (OF code 2, bits 1), then 4 literals
                first = compressed(lits[:8], rle_sequences(1, 4, 2, 2, [(1, 2)]), last=0)
                second = compressed(lits[8:20], rle_sequences(2, ll_code, of_code, 1, [(bit, nbits)] * 2))
                for size in range(30, 60):
                    yield frame_of([first, second], size)
    # literal lengths past the literals, output past the content size, RLE blocks
    for ll_code in (10, 15, 20, 25, 35, 36):
        yield frame_of([compressed(lits, rle_sequences(1, ll_code, 2, 0, [(0, 2), (0, 6)]))], 40)
    yield frame_of([(1, 0, b"z", 70000), (1, 1, b"y", 70000)], 140000)
    yield frame_of([(1, 0, b"z", 70000), (1, 1, b"y", 70001)], 140000)
    yield frame_of([(0, 1, b"abc", 3)], 3, checksum=0)
    yield frame_of([(0, 0, b"ab", 2), (0, 1, b"abc", 3)], 4)       # a raw block one byte past the content
    yield frame_of([(1, 0, b"a", 2), (1, 1, b"b", 3)], 4)
    after = compressed(lits[:8], rle_sequences(1, 4, 2, 2, [(1, 2)]), last=0)     # 13 bytes, then the walk
    for size in (15, 16, 17):
        yield frame_of([after, (0, 1, b"abc", 3)], size)
        yield frame_of([after, (1, 1, b"c", 3)], size)
    # direct Huffman weights: 2..6 symbols of these weights, one stream of 1..3-bit codes
    for weights in ((1,), (1, 1), (2, 1), (1, 2), (2, 2, 1), (3, 1, 1), (1, 1, 1), (4, 0, 1), (13,), (0, 0), (2,),
                    (3, 3)):
        n = len(weights)
        tree = bytes([127 + n]) + bytes((weights[i] << 4) | (weights[i + 1] if i + 1 < n else 0)
                                        for i in range(0, n, 2))
        for lit in (2, 3, 4):
            for nbits in range(2, 6):
                for value in range(1 << nbits):      # every stream of 2 to 5 bits
                    stream = tree + bitstream([(value, nbits)])
                    head = (2 | (lit << 4) | (len(stream) << 14)).to_bytes(3, "little")
                    body = head + stream + b"\x00"
                    yield frame_of([(2, 1, body, len(body))], lit)


@pytest.mark.parametrize("lanes", LANES)
def test_crafted_frames_are_decoded_or_refused_as_libzstd_does(dev, libzstd, lanes):
    counts: dict = {}
    for frame in crafted_frames():
        compare(dev, libzstd, frame, counts, lanes)
    print(counts)
    assert counts.get("decoded", 0) > 30 and counts.get("refused", 0) > 100


# zstd's doc/decompressor_permissive.md: frames RFC 8878 forbids that libzstd up to 1.5.5 decoded and later
# versions refuse (as zarr's own reader, numcodecs, does).  Its example of an offset of 0 (a sequence of no
# literals asking for repeat offset 1 less 1, while that is 1), given a content size (single segment) so that
# the device takes it: 18 bytes of zeros by libzstd 1.5.4.
OFFSET_ZERO = bytes.fromhex("28b52ffd2012" + "450000" + "080002002f430bae")
MODES_AT = 6 + 3 + 3        # (header, block header, literals header and its one literal, sequence count)


@pytest.mark.parametrize("lanes", LANES)
def test_frames_that_libzstd_up_to_1_5_5_took_are_refused_as_zarrs_reader_refuses_them(dev, libzstd, lanes):
    """An offset of 0 and the sequence modes' reserved bits set: the device refuses them, planned on the host or
    on the device, with the frame's error, where zarr's numcodecs refuses them too (libzstd 1.5.4, the system's,
    still takes them: STRICT lists these messages for the corpora's comparisons)."""
    reserved = bytearray(OFFSET_ZERO)
    assert reserved[MODES_AT] == 0     # (predefined tables for all three)
    reserved[MODES_AT] |= 3
    cases = {"offset is 0": OFFSET_ZERO, "reserved bits": bytes(reserved)}
    for message, frame in cases.items():
        with pytest.raises(Exception, match="(?i)corrupt"):
            Zstd().decode(frame)            # zarr's reader
        for heads in (False, True):
            plans = [zdp.head(frame, "chunk/0")] if heads else None
            with pytest.raises(zd.ZstdFrameError, match=rf"^zstd frame chunk/0: block 0: .*{message}"):
                out = dev.buffer(64, "test output")
                try:
                    zd.decode_zstd(dev, [frame], out, names=["chunk/0"], plans=plans, lanes=lanes)
                finally:
                    out.release()
    assert reference(libzstd, OFFSET_ZERO) in (None, bytes(18))   # (1.5.4 makes zeros of it; 1.5.6 on refuse it)


def test_forged_table_descriptions_match_libzstd(dev, libzstd, rng):
    """FSE table descriptions and Huffman trees of random bytes, in place of an encoder's."""
    counts: dict = {}
    base = Zstd(level=19).encode(data("text", 4000, rng))
    plan = zf.plan(base)
    block = plan.blocks[0]
    tree_at = int(block[zf.B_SRC]) + 3 + ((int(base[int(block[zf.B_SRC])]) >> 2) & 3 >= 2) + \
        ((int(base[int(block[zf.B_SRC])]) >> 2) & 3 == 3)
    seq_at = int(block[zf.B_SSRC])
    for _ in range(300):
        g = bytearray(base)
        at = tree_at if rng.integers(0, 2) else max(seq_at - int(rng.integers(1, 12)), 0)
        for k in range(int(rng.integers(1, 4))):
            g[at + k] = rng.integers(0, 256)
        compare(dev, libzstd, bytes(g), counts)
    print(counts)
    assert counts.get("refused", 0) > 50


# -- Huffman trees decoded on the device (zstd_huf_trees), compared table by table ------------------------------
def encoder_trees(rng, count: int) -> list:
    """Tree descriptions numcodecs' encoder writes: small buffers of skewed bytes over random alphabets."""
    trees = []
    while len(trees) < count:
        alphabet = rng.choice(256, int(rng.integers(2, 257)), replace=False)
        p = rng.random(len(alphabet)) ** float(rng.uniform(0.5, 8))
        raw = rng.choice(alphabet, int(rng.integers(300, 5000)), p=p / p.sum()).astype(np.uint8).tobytes()
        frame = Zstd(level=int(rng.integers(-3, 20))).encode(raw)
        plan = zf.plan(frame)
        trees += [frame[a:a + n] for a, n, _ in plan.trees]
    return trees


def direct_form(tree: bytes, rng):
    """A tree of the same code lengths as direct 4-bit weights: its symbols moved to random places below 128
    (the implied last one after them), or None where it has more than 129 symbols."""
    table, log, _ = ent.huffman_tree(tree, 0, len(tree))
    weights = np.zeros(256, np.int64)
    weights[table & 0xFF] = log + 1 - (table >> 8)
    w = weights[weights > 0]
    if len(w) > 129:
        return None
    m = int(rng.integers(len(w) - 1, 129))      # the implied symbol's number: m weights are written
    placed = np.zeros(m + (m & 1), np.int64)
    placed[np.sort(rng.choice(m, len(w) - 1, replace=False))] = w[:-1]
    return bytes([127 + m]) + bytes((placed[0::2] << 4 | placed[1::2]).astype(np.uint8).tolist())


def forged_trees(valid, rng, count: int) -> list:
    """Descriptions of random bytes, and valid ones with bytes overwritten or bits flipped."""
    out = []
    for _ in range(count):
        how = rng.integers(0, 4)
        if how == 0:                      # random bytes, the small sizes (libzstd's zero-padded copy) often
            head = int(rng.integers(0, 12)) if rng.integers(0, 2) else int(rng.integers(0, 256))
            g = bytearray([head]) + bytearray(rng.bytes(ent.tree_size(head) - 1))
        else:
            g = bytearray(valid[int(rng.integers(0, len(valid)))])
            for _ in range(int(rng.integers(1, 4))):
                p = int(rng.integers(1, len(g))) if len(g) > 1 else 0
                if how == 1:
                    g[p] = int(rng.integers(0, 256))
                else:
                    g[p] ^= 1 << int(rng.integers(0, 8))
            if how == 3 and g[0] < 128:   # the FSE table's header: log and first counts
                g[1] = int(rng.integers(0, 256))
        out.append(bytes(g))
    return out


def host_tree(tree: bytes):
    try:
        table, log, _ = ent.huffman_tree(tree, 0, len(tree))
    except ent.Corrupt as e:
        return str(e)
    return table, log


@pytest.mark.parametrize("lanes", (1, 32))
def test_device_trees_equal_the_host_trees(dev, rng, lanes):
    """Thousands of tree descriptions: the device's table equals zstd_entropy's entry for entry, or both refuse
    with the same message; nothing is written past a table's 2**log entries."""
    valid = encoder_trees(rng, 1500)
    valid += [d for d in (direct_form(t, rng) for t in valid[:400]) if d is not None]
    trees = valid + forged_trees(valid, rng, 3000)
    got = zd.huffman_tables(dev, trees, lanes=lanes)
    seen: dict = {}
    for tree, mine in zip(trees, got):
        want = host_tree(tree)
        if isinstance(want, str):
            assert mine == want, f"tree {tree.hex()}: the host refuses ({want}), the device: {mine}"
            seen[want] = seen.get(want, 0) + 1
            continue
        assert not isinstance(mine, str), f"tree {tree.hex()}: the host takes it, the device says {mine}"
        table, log = mine
        assert log == want[1], f"tree {tree.hex()}: log {log}, not {want[1]}"
        assert np.array_equal(table[:1 << log], want[0]), f"tree {tree.hex()}: another table"
        assert (table[1 << log:] == 0xFFFF).all(), f"tree {tree.hex()}: written past its 2**{log} entries"
        seen["taken"] = seen.get("taken", 0) + 1
    print(seen)
    assert seen["taken"] > 1500 and sum(seen.values()) - seen["taken"] > 1000
    assert len(seen) >= 10, seen        # most of huffman_tree's refusals are reached
    assert sum(t[0] >= 128 for t in valid) > 100 and sum(len(t) < 9 for t in trees) > 100


def test_treeless_blocks_read_the_tree_before_them(dev, rng):
    """Blocks that repeat the previous tree (treeless literals) in several frames of one call decode as
    numcodecs does: each names its own frame's last tree, decoded on the device."""
    frames, want, treeless, trees = [], [], 0, 0
    # frames until the corpus holds both (about 1 seed in 12 gives 3 treeless blocks in 4 frames)
    while len(frames) < 4 or (len(frames) < 16 and not (treeless > 3 and trees > 2 * len(frames))):
        p = rng.random(40) ** 3
        skewed = rng.choice(40, int(rng.integers(100_000, 300_000)), p=p / p.sum()).astype(np.uint8).tobytes()
        # stationary statistics: libzstd repeats the tree; a change of alphabet: a new tree mid-frame
        raw = data("text", int(rng.integers(150_000, 400_000)), rng) + skewed + data("text", 200_000, rng)
        frame = Zstd(level=int(rng.integers(1, 20))).encode(raw)
        plan = zf.plan(frame)
        huf = plan.blocks[plan.blocks[:, zf.B_LITKIND] == zf.LIT_HUF]
        treeless += len(huf) - len(plan.trees)
        trees += len(plan.trees)
        frames.append(frame)
        want.append(raw)
    assert treeless > 3 and trees > 2 * len(frames)      # the corpus has both
    for lanes in LANES:
        assert device_decode(dev, frames, lanes) == b"".join(want)
        assert device_decode(dev, frames[::-1], lanes) == b"".join(want[::-1])


def test_a_refused_tree_is_the_frames_error(dev, libzstd, rng):
    """A tree the device refuses becomes the host's message, naming the block; a later block the host
    refuses does not hide it (libzstd reads in order, and refuses at the tree)."""
    p = rng.random(40) ** 3
    raw = rng.choice(40, 300_000, p=p / p.sum()).astype(np.uint8).tobytes()
    frame = bytearray(Zstd(level=3).encode(raw))
    plan = zf.plan(bytes(frame))
    assert len(plan.blocks) >= 2 and plan.trees[0, zf.T_BLOCK] == 0
    at = int(plan.trees[0, zf.T_SRC])
    if frame[at] < 128:                     # FSE-coded weights: a table log of 7 (6 at most)
        frame[at + 1] = frame[at + 1] & 0xF0 | 2
        text = "Huffman weights' FSE table log 7, over 6"
    else:                                   # direct weights: a weight of 15 (12 at most)
        frame[at + 1] |= 0xF0
        text = "a Huffman weight over 12"
    want = f"zstd frame chunk/0: block 0: its Huffman tree: {text}"
    for lanes in LANES:
        with pytest.raises(zd.ZstdFrameError) as e:
            device_decode(dev, [bytes(frame)], lanes, names=["chunk/0"], size=len(raw))
        assert str(e.value) == want
    assert reference(libzstd, bytes(frame)) is None
    frame[int(plan.blocks[1, zf.B_SRC]) - 3] |= 0b110     # block 1: type 3 (reserved), which the host finds
    with pytest.raises(zd.ZstdFrameError) as e:
        device_decode(dev, [bytes(frame)], names=["chunk/0"], size=len(raw))
    assert str(e.value) == want
    assert reference(libzstd, bytes(frame)) is None


def huffman_block(rng, log: int, nlit: int, last: int, uniform: bool = False, tamper=None, four: bool = False,
                  which: int = 3):
    """A compressed block of Huffman literals only (no sequences) whose code is ``log`` bits at most and at
    least (skewed counts, cut to ``log``), in one stream (under 1024 literals, unless ``four``) or four; and its
    literals.

    ``uniform``: every code ``log`` bits long (``2**log`` symbols, ``log`` 7 or less), a code that never
    resynchronizes; ``tamper``: a function of stream ``which``'s (value, bits) fields giving the fields written.
    """
    from dgemm.opencl.codecs import huffman

    # direct 4-bit weights: at most 128 are written
    nsym = 1 << log if uniform else int(rng.integers(log + 2, min(120, 1 << log)))
    counts = np.zeros(256, np.int64)
    syms = rng.choice(128, nsym, replace=False)     # symbols below 128: the weights' direct form
    counts[syms] = 1 if uniform else \
        (2.0 ** np.minimum(np.arange(nsym), 40)).astype(np.int64)[rng.permutation(nsym)] + 1
    lengths = huffman.code_lengths(counts, max_bits=log)
    assert lengths.max() == log
    present = np.flatnonzero(lengths)
    p = 2.0 ** -lengths[present].astype(np.float64)
    lits = rng.choice(present, nlit, p=p / p.sum()).astype(np.uint8)
    lits[:present.size] = rng.permutation(present)[:nlit]     # every code length occurs
    code = huffman.codes(lengths)
    fields = [(int(code[x]) & 0xFFFF, int(code[x]) >> 16) for x in lits.tolist()]
    w, _ = huffman.weights(lengths)
    explicit = [int(x) for x in w[:int(np.flatnonzero(w)[-1])]] + [0]
    tree = bytes([127 + len(explicit) - 1]) + bytes(a << 4 | b for a, b in zip(explicit[0::2], explicit[1::2]))
    tamper = tamper or (lambda f: f)
    if nlit < 1024 and not four:
        body, fmt, bits = bitstream(tamper(fields)), 0, 10
    else:
        seg = (nlit + 3) // 4
        parts = [fields[k * seg:(k + 1) * seg] if k < 3 else fields[3 * seg:] for k in range(4)]
        parts = [bitstream(tamper(f) if k == which else f) for k, f in enumerate(parts)]
        body = b"".join(len(x).to_bytes(2, "little") for x in parts[:3]) + b"".join(parts)
        fmt, bits = (1, 10) if nlit < 1024 and len(tree) + len(body) < 1024 else (2, 14)
    csize = len(tree) + len(body)
    assert csize < 1 << bits
    head = (2 | fmt << 2 | nlit << 4 | csize << (4 + bits)).to_bytes(3 if bits == 10 else 4, "little")
    block = head + tree + body + b"\x00"            # no sequences
    return (2, last, block, len(block)), lits.tobytes()


def test_huffman_blocks_of_every_table_log_decode_like_libzstd(dev, libzstd, rng):
    """Blocks of tables of every size, the format's largest (log 12, which no encoder of ours or libzstd's writes)
    among them, in one stream or four, in several frames of one call: each block decodes with its own table
    (loaded into local memory by its work-group), as libzstd decodes it."""
    frames, want = [], []
    for nblocks in (13, 1, 9):          # 23 blocks: groups of 8 across frames, the last group short
        blocks, lits = [], b""
        for k in range(nblocks):
            log = int(rng.choice([12, 12, 12, 11, 9, 6]))
            nlit = int(rng.integers(300, 1000)) if rng.random() < 0.25 else int(rng.integers(1024, 9000))
            block, raw = huffman_block(rng, log, nlit, int(k == nblocks - 1))
            blocks.append(block)
            lits += raw
        frames.append(frame_of(blocks, len(lits)))
        want.append(lits)
        assert reference(libzstd, frames[-1]) == lits
    for lanes in LANES:
        assert device_decode(dev, frames, lanes) == b"".join(want)
        assert device_decode(dev, frames[::-1], lanes) == b"".join(want[::-1])


@pytest.mark.parametrize("reader, ilp", [(1, 1), (5, 1), (5, 2), (5, 4)])
def test_the_other_huffman_readers_decode_like_libzstd(dev, libzstd, rng, monkeypatch, reader, ilp):
    """The Huffman kernel's other builds (zstd_decode.cl's reader 1, the default before reader 5; reader 5, the
    default before reader 6, with 1, 2 or 4 streams a work-item in step, which the decode bench sweeps) decode
    what the default decodes, and refuse what libzstd refuses: blocks of every table log, Zarr's float chunks,
    and damaged frames."""
    monkeypatch.setattr(zd, "HUF_READER", reader)
    monkeypatch.setattr(zd, "HUF_ILP", ilp)
    frames, want = [], []
    blocks, lits = [], b""
    for k, log in enumerate((12, 11, 9, 6, 12)):
        nlit = int(rng.integers(300, 1000)) if k == 2 else int(rng.integers(1024, 9000))
        block, raw = huffman_block(rng, log, nlit, int(k == 4))
        blocks.append(block)
        lits += raw
    frames.append(frame_of(blocks, len(lits)))
    want.append(lits)
    for level in (-1, 1, 3, 19):
        raw = data("normal", int(rng.integers(130_000, 300_000)), rng)
        frames.append(Zstd(level=level).encode(raw))
        want.append(raw)
    for lanes in LANES:
        assert device_decode(dev, frames, lanes) == b"".join(want)
    counts: dict = {}
    for base in frames[1:3]:
        for g in mutations(base, rng, 25):
            compare(dev, libzstd, g, counts, lanes=4)
    assert counts.get("refused", 0) > 10, counts


@pytest.mark.parametrize("split", (1, 3, 8, 32))
def test_streams_split_among_work_items_decode_as_one_work_item_does(dev, libzstd, rng, monkeypatch, split):
    """Reader 6 (each stream split among ``split`` work-items, which resynchronize) decodes what reader 5 (a
    stream a work-item) decodes and refuses what it refuses, with its message: codes that resynchronize within
    a few symbols, and fixed-length codes, which never do (every part re-read, a round each, where a part's
    length is no multiple of the code's); whole streams, and streams whose last symbols are cut or followed by
    a few bits (out of bits or bits left, where the stream's last part reads on from another start)."""
    cases = []
    for log, uniform in ((4, True), (5, True), (7, True), (6, False), (11, False)):
        # 9 literals: a last stream of none, its end mark alone; 160 at 4 bits: streams of 2 parts
        for nlit in (9, 160, 1100, 4099, int(rng.integers(5000, 9000))):
            bits = log if uniform else 1
            cut = int(rng.integers(1, bits)) if bits > 1 else 0
            which = int(rng.integers(0, 4)) if nlit > 9 else 3       # (the stream changed)
            for tamper in (None,                                        # whole
                           lambda f: f + [(0, int(rng.integers(1, 3)))],    # bits left
                           lambda f: f + [f[-1] if f else (0, 1)],      # a literal more
                           lambda f: f[:-1] if f else [(0, 1)],         # a literal less
                           lambda f, c=cut: (f[:-1] + [(f[-1][0] >> (f[-1][1] - c), c)] if c else f[:-1]) if f
                           else [(0, 1)]):
                block, raw = huffman_block(rng, log, nlit, 1, uniform=uniform, tamper=tamper, four=True,
                                           which=which)
                cases.append((frame_of([block], len(raw)), raw, tamper is None))
    results = {}
    for reader, spl in ((5, 1), (6, split)):
        monkeypatch.setattr(zd, "HUF_READER", reader)
        monkeypatch.setattr(zd, "HUF_SPLIT", spl)
        got = []
        for frame, raw, whole in cases:
            try:
                got.append(device_decode(dev, [frame], 4))
            except zd.ZstdFrameError as e:
                got.append(str(e))
        results[reader] = got
    assert results[6] == results[5]
    refused = 0
    for (frame, raw, whole), got in zip(cases, results[6]):
        if whole:
            assert got == raw and reference(libzstd, frame) == raw
        else:
            assert isinstance(got, str) and any(t in got for t in zd.STRICT), got
            refused += 1
    assert refused == 4 * len(cases) // 5


# -- sequence execution: blocks at once, the matches that wait for earlier blocks after (issue 28) --------------
def sequence_data(kind, n, rng) -> bytes:
    """Data whose zstd frames hold sequences in every block (float noise holds almost none)."""
    if kind == "walk":        # a random walk's floats: smooth, a few matches per block
        return np.cumsum(rng.standard_normal(n // 4), dtype=np.float32).tobytes()
    if kind == "ints":        # small integers: matches of zeros, every one reading the one before
        return (rng.integers(0, 1000, n // 4) // 7).astype(np.int32).tobytes()
    if kind == "counter":
        start = int(rng.integers(0, 1 << 40))
        return np.arange(start, start + n // 8, dtype=np.int64).tobytes()
    if kind == "pattern":     # a period that no block size divides, with changed bytes
        period = bytearray(rng.bytes(int(rng.integers(300, 5000))))
        out = bytearray(period * (n // len(period) + 1))[:n]
        for p in rng.integers(0, n, n // 500):
            out[p] = int(rng.integers(0, 256))
        return bytes(out)
    return data(kind, n, rng)


@pytest.mark.parametrize("lanes", LANES)
def test_frames_of_many_blocks_with_sequences_decode_like_numcodecs(dev, rng, lanes):
    """numcodecs' frames of several blocks, each with sequences whose matches reach into earlier blocks."""
    frames, want, busy = [], [], 0
    for kind in ("walk", "ints", "counter", "pattern", "text"):
        for level in (1, 3, 9, 19):
            raw = sequence_data(kind, int(rng.integers(600_000, 900_000)), rng)
            frame = Zstd(level=level).encode(raw)
            blocks = zf.plan(frame).blocks
            busy += int((blocks[:, zf.B_NSEQ] > 0).sum() >= 4)
            frames.append(frame)
            want.append(raw)
    assert busy >= 14             # most frames have 4 blocks or more with sequences
    assert device_decode(dev, frames, lanes) == b"".join(want)


LITS = bytes((i * 151 + 7) % 256 for i in range(4096))


def sequence_block(rng, last: int, before: int):
    """A compressed block of 1..6 sequences (raw literals, RLE-coded fields, random extra bits) after ``before``
    bytes: the block, its decoded size and whether a match with a new offset reaches before the block's start."""
    nseq = int(rng.integers(1, 7))
    ll_code = int(rng.choice([0, 4, 24]))           # 0, 4, 48..63 literals
    # repeat offsets (0, 1), new ones of 1..4, 5..12, 29..60, 253..508, 509..1020 (those mostly in the frame)
    of_code = int(rng.choice([c for c in (0, 1, 2, 3, 5, 8, 9) if (1 << c) - 3 <= before + 60]))
    ml_code = int(rng.choice([1, 13, 14, 29]))      # 4, 16, 17, 32 bytes (short and long matches)
    ml = ent.ML_BASE[ml_code]
    fields, nlit, at, reaches = [], 0, 0, False
    for _ in range(nseq):
        ob = int(rng.integers(0, 1 << of_code)) if of_code else 0
        lb = int(rng.integers(0, 16)) if ll_code == 24 else 0
        fields += [(ob, of_code)] if of_code else []
        fields += [(lb, 4)] if ll_code == 24 else []
        ll = ent.LL_BASE[ll_code] + lb
        at += ll
        reaches |= of_code >= 2 and (1 << of_code) - 3 + ob > at
        at += ml
        nlit += ll
    nlit += int(rng.integers(0, 40))
    start = int(rng.integers(0, len(LITS) - nlit))
    block = compressed(LITS[start:start + nlit], rle_sequences(nseq, ll_code, of_code, ml_code, fields), last)
    return block, nlit + nseq * ml, reaches


def crossing_frame(rng):
    """A frame of 3..8 blocks: raw and RLE blocks (a copied prefix, or between) and blocks of sequences."""
    n = int(rng.integers(3, 9))
    blocks, size, reaching = [], 0, 0
    for k in range(n):
        last = int(k == n - 1)
        kind = rng.integers(0, 5)
        if kind == 0:
            m = int(rng.integers(1, 300))
            blocks.append((0, last, LITS[:m], m))
        elif kind == 1:
            m = int(rng.integers(1, 300))
            blocks.append((1, last, bytes([int(rng.integers(0, 256))]), m))
        else:
            block, m, reaches = sequence_block(rng, last, size)
            blocks.append(block)
            reaching += reaches and k > 0
        size += m
    return frame_of(blocks, size), reaching


@pytest.mark.parametrize("lanes", LANES)
def test_matches_across_blocks_decode_like_libzstd(dev, libzstd, rng, lanes):
    """Hand-built frames whose blocks' matches reach into earlier blocks (some through a match that itself
    reaches back, so they wait too), after blocks that do not, with repeat offsets carried from block to
    block (repeat codes 0 and 1, after literals and after none: offset 1 less 1 too); raw and RLE blocks
    before and between.  Each decodes as libzstd decodes it, or is refused where libzstd refuses it."""
    counts: dict = {}
    reaching, good = 0, []
    for _ in range(300):
        frame, r = crossing_frame(rng)
        before = counts.get("decoded", 0)
        compare(dev, libzstd, frame, counts, lanes)
        if counts.get("decoded", 0) > before:
            reaching += r
            good.append(frame)
    print(counts, reaching)
    assert counts.get("decoded", 0) > 100 and counts.get("refused", 0) > 20
    assert reaching > 50          # decoded frames with matches reaching back from a later block
    # the decoded ones again, in one call, each at an odd offset with a gap after it
    offsets, at = [], 3
    for f in good:
        offsets.append(at)
        at += zf.header(f)[1] + int(rng.integers(0, 40))
    got = device_decode(dev, good, lanes, offsets=offsets, size=at)
    want = bytearray([POISON]) * at
    for f, o in zip(good, offsets):
        raw = reference(libzstd, f)
        want[o:o + len(raw)] = raw
    assert got == bytes(want)


def test_the_first_failing_block_gives_the_error(dev, libzstd):
    """The copied prefix's blocks are checked at once and the later blocks each on its own: the error is still
    the earliest failing block's (then the frame's size), as the serial walk found it, whatever fails after."""
    lits = LITS[:8]
    seq = compressed(lits, rle_sequences(1, 4, 2, 2, [(1, 2)]), last=0)          # 13 bytes
    leftover = compressed(lits, rle_sequences(1, 4, 2, 2, [(1, 2), (0, 3)]), last=1)   # bits left over
    before_start = compressed(lits, rle_sequences(1, 4, 10, 1, [(5, 10)]), last=0)    # offset 1026
    reach_back = compressed(lits, rle_sequences(1, 4, 3, 29, [(7, 3)]), last=0)       # 32 bytes at 12: waits
    cases = [
        ([(0, 0, b"a" * 100, 100), (0, 0, b"b" * 100, 100), (1, 1, b"c", 100)], 150,
         "block 1: a raw block of 100 bytes runs past the frame's content size"),
        ([(0, 0, b"a" * 100, 100), (1, 0, b"c", 100), seq, (0, 1, b"d" * 5, 5)], 150,
         "block 1: an RLE block of 100 bytes runs past the frame's content size"),
        ([(0, 0, b"a" * 100, 100), (0, 0, b"b" * 100, 100), leftover], 150,
         "block 1: a raw block of 100 bytes runs past the frame's content size"),
        ([(0, 0, b"a" * 20, 20), seq, (0, 0, b"b" * 100, 100), (1, 1, b"c", 100)], 83,
         "block 2: a raw block of 100 bytes runs past the frame's content size"),
        ([(0, 0, b"a" * 3, 3), seq, before_start, (1, 1, b"c", 100)], 60,
         "block 2: sequence 0's offset reaches before the frame's start"),
        ([(0, 0, LITS[100:130], 30), reach_back, seq, (1, 0, b"c", 100), (0, 1, b"d" * 100, 100)], 120,
         "block 3: an RLE block of 100 bytes runs past the frame's content size"),
        ([(0, 0, LITS[100:130], 30), reach_back, seq, (1, 1, b"c", 10)], 130,
         "the frame decodes to 93 bytes, not its content size"),
        ([(0, 0, b"a" * 10, 10), (0, 0, b"b" * 10, 10), (1, 1, b"c", 10)], 40,
         "the frame decodes to 30 bytes, not its content size"),
        # one byte past the output: the sequence's error, not the last literals' (checked after it)
        ([(2, 1) + seq[2:]], 8, "block 0: sequence 0 runs past the block's output bound"),
        ([(1, 0, b"c", 10), (2, 1) + seq[2:]], 18, "block 1: sequence 0 runs past the block's output bound"),
    ]
    for blocks, size, text in cases:
        frame = frame_of(blocks, size)
        assert reference(libzstd, frame) is None
        for lanes in LANES:
            with pytest.raises(zd.ZstdFrameError) as e:
                device_decode(dev, [frame], lanes, names=["c/0"], size=size)
            assert str(e.value) == f"zstd frame c/0: {text}", (lanes, blocks)


def test_a_block_past_128_kib_with_waiting_matches_decodes_like_libzstd(dev, libzstd, rng):
    """A compressed block whose raw literals libzstd reads in place is bounded by the frame's output only, so
    it may decode to more than 128 KiB (libzstd decodes it): its matches that wait for the block before it
    then run in order in zstd_execute (their origins are not tracked past 128 KiB)."""
    nseq, fields, ml = 10, [], 0
    for _ in range(nseq):          # offsets of 125..184 from 4 bytes into the block: into the raw block first
        ob, mb = int(rng.integers(0, 60)), int(rng.integers(0, 1 << 12))
        fields += [(ob, 7), (mb, 16)]
        ml += ent.ML_BASE[52] + mb
    lits = LITS[:4 * nseq + 10]
    block = compressed(lits, rle_sequences(nseq, 4, 7, 52, fields), last=1)
    frame = frame_of([(0, 0, LITS[500:700], 200), block], 200 + len(lits) + ml)
    assert zf.plan(frame).blocks[1, zf.B_LIMIT] == zf.LIMIT_REMAINING and ml > 2 * zf.BLOCK_MAX
    for lanes in LANES:
        counts: dict = {}
        compare(dev, libzstd, frame, counts, lanes)
        assert counts == {"decoded": 1}

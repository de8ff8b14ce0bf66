"""Blosc-LZ4 frames decoded on the device (dgemm/kernels/lz4.cl through dgemm.opencl.codecs.blosc), on PoCL.

The reference is numcodecs (c-blosc 1.x and lz4): what it writes, the device
decodes bit for bit; what it refuses, the device refuses with a
:class:`BloscFrameError` naming the frame; what it decodes, the device decodes
to the same bytes.  Frames are also built by hand here (header, block starts,
streams compressed by numcodecs' LZ4) to reach what numcodecs' encoder never
writes: byte and bit shuffle with a block size that typesize does not divide,
stored streams, split and unsplit blocks.  Output buffers are filled with 0xFF first,
so a byte the device never writes shows, and so does one written outside the
frame's own output.
"""
from __future__ import annotations

import os
import re
import struct

import numpy as np
import pytest

pytest.importorskip("numcodecs")
from numcodecs import Blosc
from numcodecs import lz4 as nclz4

from dgemm.opencl.codecs import blosc

POISON = 0xFF
# lz4.cl's variants, (LZ4_WG, its other parameters): the lockstep kernel on one lane (the CPU default, no
# barriers) and on several (the GPU's shape, with barriers); the token table (LZ4_MODE 1) on one lane with
# its defaults, on several lanes that all copy, and with its parsing lane apart from the copying ones and
# reading a staged window of the stream, with batches, long-copy threshold and window small enough that
# these small frames cross batch boundaries, phase-2 groups, copies shared by all lanes and window ends
# many times.  One also undoes byte shuffles an element per work-item (LZ4_UNSHUFFLE 1), another four elements
# of 4 or 8 bytes a work-item where aligned (LZ4_UNSHUFFLE 2); three parse with the
# wide parser (LZ4_PARSE 2: lane 0 walks the tokens a batch ahead, every lane reads a sequence and applies
# the output's rules to it), on one lane, on several, and with its walking lane apart from the copying ones
# and phase 2's groups made by a copying lane.
VARIANTS = [pytest.param((1, {}), id="lockstep-1"),
            pytest.param((4, {}), id="lockstep-4"),
            pytest.param((1, {"LZ4_MODE": 1}), id="table-1"),
            pytest.param((4, {"LZ4_MODE": 1, "LZ4_BATCH": 8, "LZ4_LONG": 4, "LZ4_UNSHUFFLE": 1}), id="table-4"),
            pytest.param((4, {"LZ4_MODE": 1, "LZ4_BATCH": 3, "LZ4_LONG": 16, "LZ4_COPY_FROM": 1, "LZ4_STAGE": 16}),
                         id="table-4-apart-staged"),
            pytest.param((1, {"LZ4_MODE": 1, "LZ4_PARSE": 2}), id="table-1-wide"),
            pytest.param((4, {"LZ4_MODE": 1, "LZ4_BATCH": 6, "LZ4_LONG": 8, "LZ4_PARSE": 2, "LZ4_UNSHUFFLE": 2}),
                         id="table-4-wide"),
            pytest.param((4, {"LZ4_MODE": 1, "LZ4_BATCH": 7, "LZ4_COPY_FROM": 1, "LZ4_PARSE": 2, "LZ4_GROUP_LANE": 2}),
                         id="table-4-wide-apart")]


@pytest.fixture(scope="module")
def dev(any_device):
    return any_device


def device_decode(dev, frames, variant=(1, {}), size=None, offsets=None, names=None):
    """Decode into a poisoned buffer with ``variant`` (lanes, parameters); returns the whole buffer's bytes."""
    import pyopencl as cl
    size = size if size is not None else sum(blosc._header(memoryview(f), "")[4] for f in frames) or 1
    out = dev.buffer(size + 64, "test output")
    try:
        cl.enqueue_fill_buffer(dev.queue, out, np.uint8(POISON), 0, out.size).wait()
        blosc.decode_blosc(dev, frames, out, offsets=offsets, names=names, lanes=variant[0], params=variant[1])
        got = np.empty(out.size, np.uint8)
        cl.enqueue_copy(dev.queue, got, out).wait()
    finally:
        out.release()
    assert (got[size:] == POISON).all(), "the device wrote past the frames' output"
    return got[:size]


def data(kind, n, dtype, rng):
    dtype = np.dtype(dtype)
    if kind == "walk":      # smooth floats: shuffle makes the high bytes compress
        return np.cumsum(rng.normal(size=n)).astype(dtype)
    if kind == "zeros":
        return np.zeros(n, dtype)
    if kind == "runs":
        return np.repeat(rng.normal(size=max(n // 37, 1)) + 1, 37)[:n].astype(dtype)
    if kind == "random":    # incompressible: stored streams or a memcpyed frame
        return np.frombuffer(rng.bytes(n * dtype.itemsize), dtype)
    raise ValueError(kind)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shuffle", [Blosc.NOSHUFFLE, Blosc.SHUFFLE, Blosc.BITSHUFFLE])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_round_trips_match_numcodecs(dev, rng, dtype, shuffle, variant):
    frames, want = [], []
    for kind in ("walk", "zeros", "runs", "random"):
        for n in (1, 5, 31, 33, 1000, 20001):
            for clevel in (0, 1, 5, 9):
                a = data(kind, n, dtype, rng)
                frames.append(Blosc("lz4", clevel, shuffle).encode(a))
                want.append(a.tobytes())
    flags = {f[2] for f in frames}
    assert any(fl & blosc.MEMCPYED for fl in flags) and any(not fl & blosc.MEMCPYED for fl in flags)
    got = device_decode(dev, frames, variant)
    assert got.tobytes() == b"".join(want)


@pytest.mark.parametrize("variant", VARIANTS)
def test_edge_sizes_and_forced_blocks(dev, rng, variant):
    """1 byte, sizes around the 128-byte split limit, a last partial block, forced small blocks, 1-byte types."""
    cases = []
    for dtype, n in (("uint8", 1), ("uint8", 127), ("uint8", 128), ("float32", 32), ("float32", 33),
                     ("uint16", 4099), ("float64", 3001), ("int32", 70001)):
        for blocksize in (0, 256, 1000, 4096):
            for shuffle in (Blosc.NOSHUFFLE, Blosc.SHUFFLE, Blosc.BITSHUFFLE, Blosc.AUTOSHUFFLE):
                a = data("walk", n, "float64", rng).astype(dtype) if dtype[0] != "u" else \
                    (np.arange(n) % 7 * 3).astype(dtype)
                cases.append((Blosc("lz4", 5, shuffle, blocksize).encode(a), a.tobytes()))
    nbytes = [struct.unpack_from("<3i", f, 4) for f, _ in cases]
    assert any(nb % bs for nb, bs, _ in nbytes), "no frame with a partial last block"
    got = device_decode(dev, [f for f, _ in cases], variant)
    assert got.tobytes() == b"".join(w for _, w in cases)


# -- frames built by hand ----------------------------------------------------------------------
def lz4_block(raw: bytes) -> bytes:
    return nclz4.compress(raw)[4:]      # numcodecs prepends the size


def bit_planes(block: bytes, typesize: int) -> bytes:
    """c-blosc's bit shuffle of one block: bit k of byte j of element e at bit e % 8 of byte e / 8 of row 8 j + k."""
    n = len(block) // typesize
    if n % 8:
        return block
    m = np.frombuffer(block[:n * typesize], np.uint8).reshape(n, typesize)
    bits = np.unpackbits(m[..., None], axis=2, bitorder="little")          # (element, byte, bit)
    rows = np.packbits(bits.transpose(1, 2, 0), axis=2, bitorder="little")  # (byte, bit, element / 8)
    return rows.tobytes() + block[n * typesize:]


def build_frame(raw: bytes, typesize: int, blocksize: int, shuffle, split: bool,
                store=lambda j: False) -> bytes:
    """A Blosc-LZ4 frame of ``raw`` as c-blosc would lay it out.

    ``shuffle``: None, "byte" or "bit"; ``store(k)`` keeps stream k uncompressed.
    """
    nbytes = len(raw)
    nblocks = -(-nbytes // blocksize)
    flags = ((blosc.LZ4_FORMAT << 5) | {None: 0, "byte": blosc.DOSHUFFLE, "bit": blosc.DOBITSHUFFLE}[shuffle]
             | (0 if split else blosc.DONT_SPLIT))
    body, starts, k = b"", [], 0
    head = 16 + 4 * nblocks
    for b in range(nblocks):
        block = raw[b * blocksize:(b + 1) * blocksize]
        if shuffle == "byte" and typesize > 1:
            q = len(block) // typesize
            planes = np.frombuffer(block[:q * typesize], np.uint8).reshape(q, typesize).T.tobytes()
            block = planes + block[q * typesize:]
        elif shuffle == "bit":
            block = bit_planes(block, typesize)
        full = len(block) == blocksize
        nsplits = typesize if split and full and typesize <= 16 and blocksize // typesize >= 128 else 1
        neblock = len(block) // nsplits
        starts.append(head + len(body))
        for j in range(nsplits):
            part = block[j * neblock:(j + 1) * neblock]
            packed = part if store(k) else lz4_block(part)
            if len(packed) >= len(part):
                packed = part
            body += struct.pack("<i", len(packed)) + packed
            k += 1
    header = bytes([2, 1, flags, typesize]) + struct.pack("<3i", nbytes, blocksize, head + len(body))
    return header + struct.pack(f"<{nblocks}i", *starts) + body


def reference(frame: bytes):
    """numcodecs' result: the bytes, or the exception it raised."""
    try:
        return bytes(Blosc().decode(frame))
    except Exception as e:  # noqa: BLE001  (c-blosc's failures come as RuntimeError, bad sizes as others)
        return e


@pytest.mark.parametrize("variant", VARIANTS)
def test_hand_built_frames_shuffle_tails_splits_and_stored_streams(dev, rng, variant):
    frames = []
    for typesize, blocksize, nbytes in ((3, 1000, 2999), (4, 1024, 5000), (8, 2048, 2048 * 3 + 17),
                                        (5, 641, 641), (16, 4096, 9000), (7, 5, 5),
                                        (2, 256, 1000), (4, 508, 2000),    # split just so, and just not
                                        # last blocks of whole groups of 4 elements and a tail (LZ4_UNSHUFFLE 2)
                                        (4, 1024, 1024 + 83), (8, 2048, 2048 + 101)):
        raw = (np.cumsum(rng.integers(-2, 3, nbytes)) % 251).astype(np.uint8).tobytes()
        for shuffle in (None, "byte", "bit"):
            # split streams that do not cover a block leave c-blosc's output undefined (see the fuzz test)
            for split in (False, True) if blocksize % typesize == 0 else (False,):
                for store in (lambda k: False, lambda k: k % 2 == 1):
                    frames.append(build_frame(raw, typesize, blocksize, shuffle, split, store))
    for flag in (blosc.DOSHUFFLE, blosc.DOBITSHUFFLE):
        tails = [f for f in frames if f[2] & flag and struct.unpack_from("<i", f, 8)[0] % f[3]]
        assert tails, "no shuffled block that typesize does not divide"
    want = [reference(f) for f in frames]
    assert all(isinstance(w, bytes) for w in want)
    assert [len(w) for w in want] == [struct.unpack_from("<i", f, 4)[0] for f in frames]
    assert device_decode(dev, frames, variant).tobytes() == b"".join(want)
    # again with each frame 16-byte aligned (packed, most start unaligned: both of LZ4_UNSHUFFLE 2's paths)
    offsets = np.cumsum([0] + [-(-len(w) // 16) * 16 for w in want])
    got = device_decode(dev, frames, variant, size=int(offsets[-1]), offsets=offsets[:-1])
    assert all(got[o:o + len(w)].tobytes() == w for o, w in zip(offsets, want))


@pytest.mark.parametrize("variant", VARIANTS)
def test_frames_land_at_their_offsets_and_nowhere_else(dev, rng, variant):
    a = data("walk", 3000, "float32", rng)
    b = data("runs", 1001, "float64", rng)
    fa, fb = Blosc("lz4", 5, Blosc.SHUFFLE).encode(a), Blosc("lz4", 1, Blosc.NOSHUFFLE).encode(b)
    size = 40000
    got = device_decode(dev, [fa, fb], variant, size=size, offsets=[20000, 100])
    assert got[20000:20000 + a.nbytes].tobytes() == a.tobytes()
    assert got[100:100 + b.nbytes].tobytes() == b.tobytes()
    rest = np.ones(size, bool)
    rest[20000:20000 + a.nbytes] = rest[100:100 + b.nbytes] = False
    assert (got[rest] == POISON).all()


def test_other_compressors_are_left_to_the_host(dev, rng):
    a = data("walk", 5000, "float32", rng)
    zstd = Blosc("zstd", 5, Blosc.SHUFFLE).encode(a)
    blosclz = Blosc("blosclz", 5, Blosc.BITSHUFFLE).encode(a)
    assert not blosc.supported(zstd) and "zstd" in blosc.unsupported_reason(zstd)
    assert not blosc.supported(blosclz) and "blosclz" in blosc.unsupported_reason(blosclz)
    assert blosc.supported(Blosc("lz4", 5, Blosc.BITSHUFFLE).encode(a))
    assert blosc.supported(Blosc("zstd", 0).encode(a))    # memcpyed: no compressor involved
    with pytest.raises(blosc.BloscUnsupported, match="c/0.0"):
        device_decode(dev, [zstd], names=["c/0.0"])


# -- hostile frames ----------------------------------------------------------------------------
def lz4_streams(frame: bytes):
    """Each LZ4 stream of a frame (not the stored ones): ``(block, stream, output size)``, walked as c-blosc
    walks them; the walk stops where the frame's layout goes wrong."""
    flags, ts = frame[2], frame[3]
    nbytes, blocksize, _ = struct.unpack_from("<3i", frame, 4)
    if flags & 2 or blocksize <= 0 or ts == 0 or nbytes <= 0:
        return
    nblocks = -(-nbytes // blocksize)
    for b in range(nblocks):
        if 16 + 4 * b + 4 > len(frame):
            return
        pos = struct.unpack_from("<i", frame, 16 + 4 * b)[0]
        size = blocksize if b < nblocks - 1 or nbytes % blocksize == 0 else nbytes % blocksize
        split = not flags & 0x10 and ts <= 16 and size // ts >= 128 and size == blocksize
        nsplits = ts if split else 1
        for _ in range(nsplits):
            if pos < 0 or pos + 4 > len(frame):
                return
            n = struct.unpack_from("<i", frame, pos)[0]
            pos += 4
            if n < 0 or pos + n > len(frame):
                return
            if n != size // nsplits:
                yield b, frame[pos:pos + n], size // nsplits
            pos += n


def uses_offset_zero(frame: bytes) -> bool:
    """Whether some LZ4 stream of this frame has a match of offset 0 (walked as the format says)."""
    for _, stream, _ in lz4_streams(frame):
        ip = 0
        while ip < len(stream):
            token = stream[ip]
            ip += 1
            lit = token >> 4
            if lit == 15:
                while ip < len(stream):
                    ip += 1
                    lit += stream[ip - 1]
                    if stream[ip - 1] != 255:
                        break
            ip += lit
            if ip + 2 > len(stream):
                break
            if stream[ip] == 0 and stream[ip + 1] == 0:
                return True
            ip += 2
            if token & 15 == 15:
                while ip < len(stream) and stream[ip] == 255:
                    ip += 1
                ip += 1
    return False


def _more_length(stream: bytes, ip: int, limit: int, check_first: bool):
    """An LZ4 length's extra bytes read from ``ip``: ``(added, new ip)``, or None where they run to ``limit``."""
    if check_first and ip >= limit:
        return None
    added = 0
    while True:
        if ip >= len(stream):
            return None
        b = stream[ip]
        ip += 1
        added += b
        if ip > limit:
            return None
        if b != 255:
            return added, ip


def strict_refusal(stream: bytes, n_out: int) -> int:
    """The LZ4 block format's rules, its end conditions strictly, as lz4.cl's kernels apply them: the first
    rule ``stream`` breaks as the kernels' error code (blosc.LZ4_ERRORS), or 0 where it decodes to ``n_out``."""
    n_in = len(stream)
    if n_in == 0:
        return 1
    ip = op = 0
    while True:
        token = stream[ip]
        ip += 1
        lit = token >> 4
        if lit == 15:
            got = _more_length(stream, ip, n_in - 15, True)
            if got is None:
                return 2
            lit, ip = lit + got[0], got[1]
        if op + lit > n_out - 12 or ip + lit > n_in - 8:        # the last literals
            return 3 if ip + lit != n_in or op + lit > n_out else (0 if op + lit == n_out else 8)
        ip += lit
        op += lit
        offset = stream[ip] | stream[ip + 1] << 8
        ip += 2
        length = token & 15
        if length == 15:
            got = _more_length(stream, ip, n_in - 4, False)
            if got is None:
                return 4
            length, ip = length + got[0], got[1]
        length += 4
        if offset == 0:
            return 5
        if offset > op:
            return 6
        if op + length > n_out - 5:
            return 7
        op += length


def end_condition_refusals(frame: bytes) -> set:
    """``(block, reason)`` of each LZ4 stream of this frame whose first broken rule is one of the format's end
    conditions (its last literals, or a match within the output's last 5 bytes).  The format lets a decoder
    refuse such a block (lz4's doc/lz4_Block_format.md); lz4's own decoder lets some through its fast paths (its
    shortcut for short sequences, and on x86-64 its fast loop), and the device refuses them."""
    out = set()
    for block, stream, n_out in lz4_streams(frame):
        code = strict_refusal(stream, n_out)
        if code in (3, 7):
            out.add((block, blosc.LZ4_ERRORS[code]))
    return out


def split_uncovered(frame: bytes) -> bool:
    """Split streams that leave a block's last bytes to c-blosc's scratch memory (undefined output)."""
    flags, ts = frame[2], frame[3]
    nbytes, blocksize, _ = struct.unpack_from("<3i", frame, 4)
    return (not flags & 2 and not flags & 0x10 and 0 < ts <= 16 and 0 < blocksize <= nbytes
            and blocksize // ts >= 128 and blocksize % ts != 0)


def check_like_numcodecs(dev, frame: bytes, variant: tuple, counts: dict) -> None:
    """The device path decodes ``frame`` as numcodecs does, or raises where it raises."""
    name = "arr/c/3.1"
    nbytes, _, cbytes = struct.unpack_from("<3i", frame, 4) if len(frame) >= 16 else (0, 0, 0)
    if len(frame) < 16 or cbytes > len(frame) or not 0 < nbytes <= 1 << 24:
        # c-blosc trusts the header's sizes: it would read past the frame, or allocate gigabytes
        with pytest.raises(blosc.BloscFrameError, match=name):
            device_decode(dev, [frame], variant, size=1, names=[name])
        counts["refused: header outside the frame"] = counts.get("refused: header outside the frame", 0) + 1
        return
    if not blosc.supported(frame):
        counts["left to the host"] = counts.get("left to the host", 0) + 1
        return
    want = reference(frame)
    if isinstance(want, bytes):
        try:
            got = device_decode(dev, [frame], variant, size=nbytes, names=[name])
        except blosc.BloscFrameError as e:
            if "offset of 0" in str(e) and uses_offset_zero(frame):
                counts["refused: offset 0"] = counts.get("refused: offset 0", 0) + 1
                return
            if "do not cover" in str(e) and split_uncovered(frame):
                counts["refused: undefined split"] = counts.get("refused: undefined split", 0) + 1
                return
            said = re.search(r": block (\d+): (.+) \(\d+ compressed bytes", str(e))
            if said and (int(said[1]), said[2]) in end_condition_refusals(frame):
                counts["refused: end conditions"] = counts.get("refused: end conditions", 0) + 1
                return
            raise AssertionError(f"numcodecs decodes this frame, the device raised: {e}\n{frame.hex()}")
        assert got.tobytes() == want, f"the device decoded other bytes than numcodecs\n{frame.hex()}"
        counts["decoded alike"] = counts.get("decoded alike", 0) + 1
    else:
        with pytest.raises(blosc.BloscFrameError, match=name):
            device_decode(dev, [frame], variant, size=nbytes, names=[name])
        counts["both raised"] = counts.get("both raised", 0) + 1


def base_frames(rng):
    a = data("walk", 3000, "float32", rng)
    r = data("runs", 700, "float64", rng)
    raw = (np.cumsum(rng.integers(-1, 2, 3001)) % 7).astype(np.uint8).tobytes()
    return [Blosc("lz4", 5, Blosc.SHUFFLE, 1024).encode(a),          # split, shuffled, partial last block
            Blosc("lz4", 9, Blosc.NOSHUFFLE).encode(r),              # split, not shuffled
            Blosc("lz4", 5, Blosc.BITSHUFFLE, 2000).encode(a[:1500]),  # bit shuffled, last block partial
            Blosc("lz4", 0).encode(a[:50]),                          # memcpyed, one block
            Blosc("lz4", 0, Blosc.SHUFFLE, 4000).encode(a),           # memcpyed, several blocks
            build_frame(raw, 3, 1000, "byte", False),                # unsplit, shuffled with a tail
            build_frame(raw, 3, 984, "bit", True),                   # bit shuffled: 328 elements, a tail
            build_frame(raw, 2, 1024, None, True, lambda k: k == 1)]   # a stored stream


def forgeries(frame: bytes, rng):
    """Truncated, flipped and forged versions of a valid frame."""
    n = len(frame)
    nbytes, blocksize, cbytes = struct.unpack_from("<3i", frame, 4)
    nblocks = -(-nbytes // blocksize)
    assert cbytes == len(frame)
    out = [frame[:k] for k in sorted({0, 3, 15, 16, 17, 19, 20, n // 2, n - 5, n - 1})]
    out += [frame + b"\0" * 7]                                       # trailing bytes: ignored by both
    for _ in range(40):                                              # random byte flips anywhere
        f = bytearray(frame)
        k = int(rng.integers(0, n))
        f[k] ^= int(rng.integers(1, 256))
        out.append(bytes(f))
    for _ in range(20):                                              # flips in the header and block starts
        f = bytearray(frame)
        k = int(rng.integers(0, min(n, 16 + 4 * nblocks)))
        f[k] ^= 1 << int(rng.integers(0, 8))
        out.append(bytes(f))

    def forge(offset, fmt, *values):
        f = bytearray(frame)
        struct.pack_into(fmt, f, offset, *values)
        return bytes(f)
    out += [forge(0, "B", 1), forge(0, "B", 3), forge(1, "B", 2), forge(2, "B", frame[2] | 0x08),
            forge(2, "B", frame[2] ^ 0x10), forge(2, "B", frame[2] ^ 0x01), forge(2, "B", frame[2] ^ 0x02),
            forge(2, "B", frame[2] ^ 0x04), forge(2, "B", frame[2] ^ 0x05),
            forge(3, "B", 0), forge(3, "B", 1), forge(3, "B", 255), forge(3, "B", frame[3] + 1)]
    for v in (0, -1, 1, nbytes - 1, nbytes + 1, nbytes * 2, 2**31 - 1):
        out.append(forge(4, "<i", v))
    for v in (1, 15, nbytes - blocksize, nbytes - 1):                 # a smaller output, the block size kept
        if 0 < v < nbytes and blocksize < v:
            out.append(forge(4, "<i", v))
    for v in (0, -1, 1, 7, blocksize - 1, blocksize + 1, nbytes, nbytes + 1, 2**30):
        out.append(forge(8, "<i", v))
    for v in (0, 15, 16, 20, cbytes - 1, cbytes + 1, -1):
        out.append(forge(12, "<i", v))
    if not frame[2] & blosc.MEMCPYED:
        start = struct.unpack_from("<i", frame, 16)[0]
        for v in (-1, 0, 12, 16, start + 1, start - 1, cbytes - 4, cbytes - 3, cbytes):
            out.append(forge(16 + 4 * (nblocks - 1), "<i", v))    # the last block's start
        for v in (0, -1, 1, 2**31 - 1, cbytes):                       # the first stream's length
            out.append(forge(start, "<i", v))
        length = struct.unpack_from("<i", frame, start)[0]
        for k in range(start + 4, min(start + 4 + length, start + 40)):    # the first stream's first bytes
            out.append(forge(k, "B", frame[k] ^ 0xF0))
            out.append(forge(k, "B", 0))
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_truncated_flipped_and_forged_frames_are_decoded_as_numcodecs_does(dev, rng, variant):
    counts: dict = {}
    for frame in base_frames(rng):
        check_like_numcodecs(dev, frame, variant, counts)
        for f in forgeries(frame, rng):
            check_like_numcodecs(dev, f, variant, counts)
    print(counts)
    assert counts.get("both raised", 0) > 50 and counts.get("decoded alike", 0) > 20


def lz4_frame(stream: bytes, nbytes: int) -> bytes:
    """A one-block, one-stream unshuffled Blosc-LZ4 frame around a raw LZ4 stream."""
    body = struct.pack("<i", len(stream)) + stream
    flags = (blosc.LZ4_FORMAT << 5) | blosc.DONT_SPLIT
    return bytes([2, 1, flags, 1]) + struct.pack("<3i", nbytes, nbytes, 20 + len(body)) + struct.pack("<i", 20) + body


def crafted_streams():
    """LZ4 streams written sequence by sequence: (what, stream, output size)."""
    lit = bytes(range(1, 17))
    last = b"\x50" + b"ZZZZZ"                                  # 5 last literals
    return [
        ("valid: literals, match, last literals", b"\x84" + lit[:8] + b"\x08\x00" + last, 8 + 8 + 5),
        ("valid: overlapping match (offset 1)", b"\x1f" + b"A" + b"\x01\x00" + b"\x10" + last, 1 + 35 + 5),
        ("valid: long literal run", b"\xf0" + b"\x05" + bytes(20), 20),
        ("offset 0", b"\x84" + lit[:8] + b"\x00\x00" + last, 21),
        # 14 literals and a match of 18 (offset 8) ending in the output's last 5 bytes: lz4's shortcut for
        # short sequences skips that check, so lz4 decodes it; the format lets a decoder refuse it
        ("end conditions broken", b"\xee" + lit[:14] + b"\x08\x00" + b"\x40ZZZZ", 14 + 18 + 4),
        ("match before the output start", b"\x84" + lit[:8] + b"\x09\x00" + last, 21),
        ("match from far before the start", b"\x84" + lit[:8] + b"\xff\xff" + last, 21),
        ("literal run past the end", b"\xf0" + b"\x40" + bytes(20), 20),
        ("literal length bytes past the end", b"\xf0" + b"\xff" * 3, 1000),
        ("last literals short of the end", b"\x84" + lit[:8] + b"\x08\x00" + b"\x10Z", 8 + 8 + 1),
        ("match into the last 5 bytes", b"\x8f" + lit[:8] + b"\x08\x00" + b"\x00" + b"\x40ZZZZ", 8 + 19 + 4),
        ("bytes after the last literals", b"\x84" + lit[:8] + b"\x08\x00" + last + b"\x00\x00", 21),
        ("match length bytes past the end", b"\x8f" + lit[:8] + b"\x08\x00" + b"\xff" * 6, 5000),
        ("output longer than the stream's", b"\x84" + lit[:8] + b"\x08\x00" + last, 40),
        ("output shorter than the stream's", b"\x84" + lit[:8] + b"\x08\x00" + last, 20),
        ("empty stream", b"", 16),
        ("just a token", b"\x00", 16),
        ("no last literals", b"\x84" + lit[:8] + b"\x08\x00", 16),
        # a long match, then 5 last literals whose bytes read as an offset of 257: 14 bytes short of the output
        ("stream ends short after a long match", b"\x8f" + lit[:8] + b"\x08\x00" + b"\xfe" + b"\x50" + b"\x01" * 5,
         8 + 273 + 5 + 14),
        # a match length of 2^32 + 18 (16,843,009 extra bytes of 255): its low 32 bits would fit the output
        ("match length past 2^32", b"\x4f" + b"ABCD" + b"\x01\x00" + b"\xff" * 16843009 + b"\x00" + b"\x50" + b"ZZZZZ",
         4 + 18 + 5),
    ]


@pytest.mark.parametrize("variant", VARIANTS)
def test_crafted_lz4_streams(dev, variant):
    counts: dict = {}
    for what, stream, nbytes in crafted_streams():
        frame = lz4_frame(stream, nbytes)
        want = reference(frame)
        lz4_lets_through = what in ("offset 0", "end conditions broken")
        assert isinstance(want, bytes) == (what.startswith("valid") or lz4_lets_through), what
        check_like_numcodecs(dev, frame, variant, counts)
    assert counts["decoded alike"] == 3 and counts["refused: end conditions"] == 1, counts


def outcome(dev, frame: bytes, variant) -> str:
    """What the device makes of one frame: its decoded bytes' hex, or the error message."""
    nbytes = struct.unpack_from("<i", frame, 4)[0]
    try:
        return device_decode(dev, [frame], variant, size=nbytes, names=["c/0"]).tobytes().hex()
    except blosc.BloscFrameError as e:
        return f"error: {e}"


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.values[0][1].get("LZ4_MODE")])
def test_every_variant_refuses_for_the_lockstep_kernels_reason(dev, variant):
    """Streams broken anywhere in their sequences (past many of the variants' batches), and the crafted
    ones: the token table stops at the same sequence for the same reason as the one-lane lockstep
    kernel, whose rules follow lz4's; between them they give every one of the kernel's error codes."""
    raw = (np.cumsum(np.random.default_rng(5).integers(-2, 3, 3000)) % 13).astype(np.uint8).tobytes()
    frame = build_frame(raw, 1, 3000, None, False)             # one stream of about 500 short sequences
    start = 16 + 4 + 4
    length = struct.unpack_from("<i", frame, start - 4)[0]
    assert length < 2500
    frames = [lz4_frame(stream, nbytes) for _, stream, nbytes in crafted_streams()]
    for k in range(start, start + length, 53):
        for value in (frame[k] ^ 0xF0, frame[k] ^ 0x0F, 0, 0xFF):
            frames.append(frame[:k] + bytes([value]) + frame[k + 1:])
    reasons = set()
    for f in frames:
        want = outcome(dev, f, (1, {}))
        assert outcome(dev, f, variant) == want, f.hex()
        reasons.add(want.split("block 0: ")[1].split(" (")[0] if want.startswith("error") else "decoded")
    assert reasons == set(blosc.LZ4_ERRORS.values()) | {"decoded"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_hostile_frame_writes_nothing_outside_its_output(dev, rng, variant):
    """A frame that fails between two good ones: the neighbours' bytes are theirs, the error names it."""
    import pyopencl as cl
    a = data("walk", 2000, "float32", rng)
    good = Blosc("lz4", 5, Blosc.SHUFFLE).encode(a)
    evil = lz4_frame(b"\x84" + bytes(8) + b"\xff\xff" + b"\x50" + b"ZZZZZ", 4000)
    out = dev.buffer(3 * 8000)
    cl.enqueue_fill_buffer(dev.queue, out, np.uint8(POISON), 0, out.size).wait()
    with pytest.raises(blosc.BloscFrameError, match=r"c/0\.1: block 0: an LZ4 match starts before"):
        blosc.decode_blosc(dev, [good, evil, good], out, offsets=[0, 9000, 16000],
                           names=["c/0.0", "c/0.1", "c/0.2"], lanes=variant[0], params=variant[1])
    got = np.empty(out.size, np.uint8)
    cl.enqueue_copy(dev.queue, got, out).wait()
    out.release()
    assert got[:8000].tobytes() == a.tobytes() and got[16000:24000].tobytes() == a.tobytes()
    assert (got[8000:9000] == POISON).all() and (got[13000:16000] == POISON).all()


@pytest.mark.parametrize(("zarr_format", "shuffle"), [(2, "shuffle"), (2, "noshuffle"), (3, "shuffle"),
                                                       (3, "bitshuffle")])
def test_zarr_chunks_decode_to_what_zarr_stored(dev, rng, tmp_path, zarr_format, shuffle):
    """Chunk files zarr-python wrote (v2: numcodecs' Blosc; v3: BloscCodec), decoded together into one buffer."""
    zarr = pytest.importorskip("zarr")
    a = np.cumsum(rng.normal(size=(300, 200)), axis=1).astype("float32")
    if zarr_format == 2:
        codec = Blosc("lz4", 5, {"shuffle": Blosc.SHUFFLE, "noshuffle": Blosc.NOSHUFFLE}[shuffle])
    else:
        from zarr.codecs import BloscCodec
        codec = BloscCodec(cname="lz4", clevel=5, shuffle=shuffle)
    z = zarr.create_array(store=str(tmp_path / "a"), shape=a.shape, chunks=(128, 128), dtype="float32",
                          compressors=codec, zarr_format=zarr_format, fill_value=0)
    z[:] = a
    keys = [f"{i}.{j}" if zarr_format == 2 else f"c/{i}/{j}" for i in range(3) for j in range(2)]
    frames = [(tmp_path / "a" / k).read_bytes() for k in keys]
    got = device_decode(dev, frames, (4, {}), names=keys).view("float32").reshape(len(keys), 128, 128)
    for k, chunk in zip(keys, got):
        i, j = (int(x) for x in k.replace("c/", "").replace("/", ".").split("."))
        want = np.zeros((128, 128), "float32")      # edge chunks are stored whole, the outside filled
        part = a[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
        want[:part.shape[0], :part.shape[1]] = part
        np.testing.assert_array_equal(chunk, want, err_msg=k)


def decoded_by_default(dev, frame: bytes, nbytes: int) -> bytes:
    """``frame`` decoded by decode_blosc with the device's default lanes and parameters."""
    import pyopencl as cl
    out = dev.buffer(nbytes)
    try:
        blosc.decode_blosc(dev, [frame], out)
        got = np.empty(nbytes, np.uint8)
        cl.enqueue_copy(dev.queue, got, out).wait()
    finally:
        out.release()
    return got.tobytes()


def test_measured_choice_for_the_device_is_what_decodes(dev, rng, monkeypatch):
    """A TUNED entry naming this device gives the lanes and parameters decode_blosc builds and runs by default."""
    a = data("walk", 5000, "float32", rng)
    frame = Blosc("lz4", 5, Blosc.SHUFFLE, 4096).encode(a)
    monkeypatch.setattr(blosc, "TUNED", (("no such device", 8, {}), (dev.info.name[:5], 2,
                                                                       {"LZ4_MODE": 1, "LZ4_BATCH": 5})))
    assert blosc.default_lanes(dev) == 2 and blosc.default_params(dev) == {"LZ4_MODE": 1, "LZ4_BATCH": 5}
    assert decoded_by_default(dev, frame, a.nbytes) == a.tobytes()
    from dgemm.opencl.codecs import _programs
    assert ("lz4.cl", (("LZ4_WG", 2), ("LZ4_BATCH", 5), ("LZ4_MODE", 1))) in _programs.built(dev)


# -- random LZ4 streams ------------------------------------------------------------------------
def _length(rng, small: int) -> int:
    """A literal or match length's extra part: mostly short, often at a nibble's or an extension byte's edge."""
    pick = rng.random()
    if pick < 0.45:
        return int(rng.integers(0, small))
    if pick < 0.8:          # the token's nibble full (15), then extension bytes ending in 0, 254, 255 + ...
        return 15 + int(rng.choice([0, 1, 254, 255, 256, 509, 510, 511]))
    return int(rng.integers(0, 3000))


def _extension(n: int) -> bytes:
    """LZ4's extension bytes for a length part ``n`` >= 15 (its token nibble 15)."""
    n -= 15
    return b"\xff" * (n // 255) + bytes([n % 255])


def random_stream(rng) -> tuple[bytes, int, str]:
    """An LZ4 stream built sequence by sequence, then maybe broken: ``(stream, output size, how)``.

    Lengths at every edge of their encoding, offsets from 1 to as far back as the output goes, sequence
    counts from one to thousands (past every variant's batches and groups many times); a few have an
    offset of 0 or one before the output's start, the output size off by a few bytes, bytes flipped, the
    stream cut short or bytes after its end.
    """
    alphabet = rng.integers(0, 256, int(rng.choice([2, 4, 256]))).astype(np.uint8)
    out_len, stream = 0, bytearray()
    how = set()
    nseq = int(rng.choice([0, 1, 2, 7, 60, 400, 2500]))
    for _ in range(nseq):
        lit, match = _length(rng, 15), _length(rng, 15)      # match: its length minus 4
        if out_len == 0 and lit == 0 and rng.random() < 0.9:
            lit = 1         # mostly a first match with something to copy: the stream goes on past it
        token = min(lit, 15) << 4 | min(match, 15)
        stream.append(token)
        if lit >= 15:
            stream += _extension(lit)
        stream += rng.choice(alphabet, lit).tobytes()
        out_len += lit
        if out_len == 0 or rng.random() < 0.002:
            offset = int(rng.choice([0, min(out_len + 1, 65535), 65535]))
            if offset == 0 or offset > out_len:
                how.add("a bad offset")
        elif rng.random() < 0.5:
            offset = int(rng.integers(1, min(out_len, 16) + 1))     # overlapping copies
        else:
            offset = int(rng.integers(1, min(out_len, 65535) + 1))
        stream += struct.pack("<H", offset)
        if match >= 15:
            stream += _extension(match)
        out_len += match + 4
    last = int(rng.choice([0, 1, 4, 5, 6, 15, 16, 300])) if rng.random() < 0.9 else 5
    if last < 5 and nseq:
        how.add("last literals under 5")    # (the format's end conditions broken)
    stream.append(min(last, 15) << 4)
    if last >= 15:
        stream += _extension(last)
    stream += rng.choice(alphabet, last).tobytes()
    out_len += last
    size = out_len
    if rng.random() < 0.1:
        size = max(1, out_len + int(rng.choice([-17, -5, -1, 1, 3, 64])))
        how.add("another output size")
    if rng.random() < 0.15 and stream:
        for _ in range(int(rng.integers(1, 4))):
            stream[int(rng.integers(0, len(stream)))] ^= int(rng.integers(1, 256))
        how.add("flipped bytes")
    if rng.random() < 0.05:
        stream = stream[:int(rng.integers(0, len(stream) + 1))]
        how.add("cut short")
    if rng.random() < 0.03:
        stream += bytes(int(rng.integers(1, 20)))
        how.add("bytes after its end")
    return bytes(stream), size, ", ".join(sorted(how)) or "valid"


# The GPUs' default (blosc.TUNED: 64 lanes, the wide parser, its own walking and grouping lanes) besides the
# variants above: the fuzz reaches the default's batch, window and group sizes too.
FUZZ_VARIANTS = VARIANTS + [pytest.param((blosc.TUNED[0][1], blosc.TUNED[0][2]), id="tuned-gpu")]


@pytest.mark.parametrize("variant", FUZZ_VARIANTS)
def test_random_lz4_streams_decode_as_lz4_does(dev, rng, variant):
    """Streams built at random (:func:`random_stream`), valid or broken: decoded as numcodecs' LZ4 does them,
    or refused where it refuses, and refused for the first rule the format's strict reading finds broken
    (:func:`strict_refusal`).  ``DGEMM_FUZZ_ROUNDS`` streams (40 by default; more for a longer search)."""
    counts: dict = {}
    kinds: dict = {}
    for _ in range(int(os.environ.get("DGEMM_FUZZ_ROUNDS") or 40)):
        stream, size, how = random_stream(rng)
        if size > 1 << 24:
            continue
        frame = lz4_frame(stream, size)
        try:
            check_like_numcodecs(dev, frame, variant, counts)
        except AssertionError as e:
            raise AssertionError(f"{how}: {e}") from None
        if 0 < size != len(stream):     # (a stream as long as its output is stored bytes, Blosc's rule)
            code, got = strict_refusal(stream, size), outcome(dev, frame, variant)
            want = f"block 0: {blosc.LZ4_ERRORS[code]} (" if code else None
            assert (want in got) if want else not got.startswith("error"), (how, code, got[:200], frame.hex())
        kinds[how] = kinds.get(how, 0) + 1
    print(counts, kinds)
    assert counts.get("decoded alike", 0) >= 5 and counts.get("both raised", 0) >= 1, counts


def test_a_cpu_device_not_in_tuned_takes_the_cpu_parameters(dev, rng, monkeypatch):
    """Where TUNED names no device, a CPU device gets CPU_PARAMS (the unshuffle four elements a work-item),
    which decode_blosc builds and runs by default, decoding byte-shuffled floats of both widths exactly."""
    if dev.info.type != "CPU":
        pytest.skip("CPU_PARAMS are a CPU device's; this device is a " + dev.info.type)
    monkeypatch.setattr(blosc, "TUNED", ())
    assert blosc.default_params(dev) == blosc.CPU_PARAMS and blosc.default_lanes(dev) == 1
    for dtype in ("float32", "float64"):
        a = data("walk", 30000, dtype, rng)
        frame = Blosc("lz4", 5, Blosc.SHUFFLE, 8192).encode(a)
        assert decoded_by_default(dev, frame, a.nbytes) == a.tobytes(), dtype
    from dgemm.opencl.codecs import _programs
    assert ("lz4.cl", (("LZ4_WG", 1), *sorted(blosc.CPU_PARAMS.items()))) in _programs.built(dev)

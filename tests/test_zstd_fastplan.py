"""The literal-only fast read of zstd frames (dgemm.opencl.codecs.zstd_fastplan) against the block-by-block one.

Every frame of a corpus (numcodecs ``Zstd`` at levels -5 to 19, with and
without checksum, on floats, random walks, integers, bytes, zeros and small
chunks) and of a fuzz corpus built from them (bytes flipped in block and
literals headers, jump tables, sequence counts; frames truncated): where the
fast read makes a plan, it is the block-by-block reader's, row for row; where
the block-by-block reader refuses the frame, the fast read makes none (so the
refusal, with its exact message, is always the block-by-block reader's).
"""
from __future__ import annotations

import numpy as np
import pytest

numcodecs = pytest.importorskip("numcodecs")
from numcodecs import Zstd  # noqa: E402

from dgemm.opencl.codecs import zstd_fastplan as fp  # noqa: E402
from dgemm.opencl.codecs import zstd_frames as zf  # noqa: E402


def _both(frame):
    data = memoryview(frame).cast("B")
    hsize, size, checksum = zf.header(data)
    try:
        slow = zf.slow_plan(data, "f", hsize, size, checksum)
    except (zf.ZstdFrameError, zf.ZstdUnsupported) as e:
        slow = e
    return fp._fast(data, hsize, size, checksum, "f"), slow


def _same(fast, slow):
    for k in ("name", "size", "csize", "checksum", "literals", "nseq"):
        assert getattr(fast, k) == getattr(slow, k), k
    for k in ("blocks", "streams", "trees", "fse"):
        a, b = getattr(fast, k), getattr(slow, k)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), k


def _corpus(rng):
    data = {"normal": rng.standard_normal(1 << 20, dtype=np.float32),
            "walk": np.cumsum(rng.standard_normal(1 << 20, dtype=np.float32)),
            "product": rng.standard_normal((1 << 14, 16), dtype=np.float32) @ rng.standard_normal((16, 16),
                                                                                                 dtype=np.float32),
            "ints": rng.integers(0, 1000, 1 << 18).astype(np.int32),
            "bytes": rng.integers(0, 256, 1 << 20, dtype=np.uint8),
            "zeros": np.zeros(1 << 18, np.float32),
            "small": rng.standard_normal(700, dtype=np.float32),
            # scales and a constant run: level 3 writes a treeless block whose own sizes would pick the
            # other Huffman decoder than its tree's block (libzstd keeps the tree's choice)
            "mixed": np.concatenate([rng.standard_normal(1 << 16, dtype=np.float32),
                                     rng.standard_normal(1 << 16, dtype=np.float32) * 1e-3,
                                     np.ones(1 << 12, np.float32),
                                     rng.standard_normal(1 << 16, dtype=np.float32).astype(np.float16)
                                     .astype(np.float32)])}
    return {(name, level, checksum): Zstd(level=level, checksum=checksum).encode(x)
            for name, x in data.items() for level in (-5, -1, 1, 3, 9, 19) for checksum in (False, True)}


def test_fast_plans_are_the_block_by_block_plans(rng):
    taken = []
    for key, frame in _corpus(rng).items():
        fast, slow = _both(frame)
        assert not isinstance(slow, Exception), (key, slow)
        if fast is not None:
            _same(fast, slow)
            taken.append(key)
    # Zarr's default (level 3) float32 chunks, with their few blocks of sequences, take the fast read
    assert {("normal", 3, False), ("walk", 3, False), ("product", 3, False), ("mixed", 3, False)} <= set(taken), taken


def test_streams_of_no_bytes_or_without_an_end_mark_are_left_to_the_block_by_block_read(rng):
    frame = Zstd(level=3).encode(rng.standard_normal(1 << 18, dtype=np.float32))
    fast, slow = _both(frame)
    assert fast is not None
    for row in slow.streams[:8]:
        bad = bytearray(frame)
        bad[row[zf.S_SRC] + row[zf.S_LEN] - 1] = 0            # the stream's last byte holds its end mark
        fast, refused = _both(bytes(bad))
        assert isinstance(refused, zf.ZstdFrameError) and "no end mark" in str(refused), refused
        assert fast is None
    jump = slow.streams[0, zf.S_SRC] - 6                         # the first block's jump table
    bad = bytearray(frame)
    bad[jump + 2:jump + 4] = (0).to_bytes(2, "little")           # stream 2 of no bytes
    fast, refused = _both(bytes(bad))
    assert isinstance(refused, zf.ZstdFrameError) and "of no bytes" in str(refused), refused
    assert fast is None


def test_fast_read_makes_no_plan_where_the_frame_is_refused(rng):
    """Bytes flipped in block headers, literals headers, jump tables and sequence sections; truncations."""
    frames = [f for (name, level, _), f in _corpus(rng).items() if level in (1, 3) and name != "zeros"]
    refused = planned = 0
    for frame in frames:
        data = np.frombuffer(frame, np.uint8)
        # the first blocks' headers and sections: every byte of the first 40 after the frame header, a few
        # bytes of each later block's start, then truncations
        hsize = zf.header(frame)[0]
        spots = list(range(hsize, min(len(data), hsize + 40)))
        spots += list(rng.integers(hsize, len(data), 30))
        for at in spots:
            for flip in (0x01, 0x10, 0x80, 0xFF):
                bad = data.copy()
                bad[at] ^= flip
                try:
                    fast, slow = _both(bad.tobytes())
                except (zf.ZstdFrameError, zf.ZstdUnsupported):
                    continue         # the frame header itself refused
                if isinstance(slow, Exception):
                    assert fast is None, (at, flip, slow)
                    refused += 1
                elif fast is not None:
                    _same(fast, slow)
                    planned += 1
        for cut in (1, 2, 3, 7, len(data) // 2):
            fast, slow = _both(frame[:-cut])
            assert isinstance(slow, Exception) and fast is None, cut
    assert refused > 100 and planned > 100, (refused, planned)

"""The host's read of a zstd frame made only of raw, RLE and literal-only blocks, all blocks at once.

Zarr's default zstd writes float chunks as such frames: 512 blocks of 128 KiB
a 64 MiB chunk, each a Huffman tree (or the last one repeated), four Huffman
streams and no sequences.  :func:`dgemm.opencl.codecs.zstd_frames.plan` reads
them block by block in Python, about 9 µs a block; with a worker's reader
threads sharing one interpreter lock, that bounds every device decode on a
host to a few GB/s.  Here only the walk from block header to block header is
a Python loop (it must be: each header says where the next one is); every
field and check of the blocks' literal sections is one numpy operation over
all of them.

The few blocks with sequences have their sequences sections read by the
block-by-block reader's own code, in order.  The rows made are exactly the
block-by-block reader's (a test compares them frame by frame).  Anything else —
single-stream, raw or RLE literals, any check that fails — gives None, and the
block-by-block reader reads the frame, with its exact errors: this path raises
nothing.
"""
from __future__ import annotations

import numpy as np

from dgemm.opencl.codecs import zstd_entropy as ent
from dgemm.opencl.codecs import zstd_frames as zf

_ALGO = np.array(ent._ALGO_TIME, np.int64)


def _u16(buf, at):
    return buf[at].astype(np.int64) | buf[at + 1].astype(np.int64) << 8


def plan(frame, name: str = "frame"):
    """:func:`dgemm.opencl.codecs.zstd_frames.plan`'s rows and errors, all blocks at once where they are
    literal-only (what the device decoder calls)."""
    data = memoryview(frame).cast("B")
    hsize, size, checksum = zf.header(data, name)
    fast = _fast(data, hsize, size, checksum, name)
    return fast if fast is not None else zf.slow_plan(data, name, hsize, size, checksum)


def _fast(data, hsize: int, size: int, checksum: bool, name: str):
    """The frame's :class:`~dgemm.opencl.codecs.zstd_frames.FramePlan`, or None (read it block by block).

    ``data``: the frame as a byte memoryview; ``hsize``, ``size``,
    ``checksum``: what :func:`~dgemm.opencl.codecs.zstd_frames.header` read.
    """
    n = len(data)
    heads, starts = [], []
    pos = hsize
    while True:          # the one serial part: each header says where the next one is
        if n - pos < 3:
            return None
        h = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        btype = (h >> 1) & 3
        if btype == 3:
            return None
        pos += 3
        csize = 1 if btype == zf.RLE else h >> 3
        if csize > n - pos:
            return None
        heads.append(h)
        starts.append(pos)
        pos += csize
        if h & 1:
            break
    expected = None
    if checksum:
        if n - pos < 4:
            return None
        expected = int.from_bytes(data[pos:pos + 4], "little")
        pos += 4
    if pos != n:
        return None
    buf = np.frombuffer(data, np.uint8)
    h = np.array(heads, np.int64)
    nblocks = len(h)
    btype, bsize, src = (h >> 1) & 3, h >> 3, np.array(starts, np.int64)
    blocks = np.zeros((nblocks, zf.BLOCK_COLUMNS), np.int64)
    blocks[:, zf.B_TYPE], blocks[:, zf.B_SRC], blocks[:, zf.B_SIZE] = btype, src, bsize
    blocks[:, zf.B_INDEX] = np.arange(nblocks)
    c = np.flatnonzero(btype == zf.COMPRESSED)
    streams = np.zeros((0, zf.STREAM_COLUMNS), np.int64)
    trees = np.zeros((0, zf.TREE_COLUMNS), np.int64)
    literals = 0
    if len(c):
        p, bs = src[c], bsize[c]
        if (bs > zf.BLOCK_MAX).any() or (bs < 5).any():
            return None
        b0 = buf[p].astype(np.int64)
        ltype, lhl = b0 & 3, (b0 >> 2) & 3
        if (ltype < 2).any() or (lhl == 0).any():       # raw, RLE or single-stream literals
            return None
        lhc = _u16(buf, p) | _u16(buf, p + 2) << 16
        lh = np.where(lhl == 1, 3, np.where(lhl == 2, 4, 5))
        lit = np.where(lhl == 1, (lhc >> 4) & 0x3FF, np.where(lhl == 2, (lhc >> 4) & 0x3FFF, (lhc >> 4) & 0x3FFFF))
        clit = np.where(lhl == 1, (lhc >> 14) & 0x3FF,
                        np.where(lhl == 2, lhc >> 18, (lhc >> 22) + (buf[np.minimum(p + 4, n - 1)].astype(np.int64) << 10)))
        if (lit > zf.BLOCK_MAX).any() or (lit < 6).any() or (clit + lh > bs).any() or (clit == 0).any():
            return None
        # the sequences section: most blocks hold none (one byte, 0, ending the block); the others are
        # read by the block-by-block reader's own code, in order (their tables carry from one to the next)
        seq_at = p + lh + clit
        with_seqs = np.flatnonzero((seq_at + 1 != p + bs) | (buf[np.minimum(seq_at, n - 1)] != 0))
        new = ltype == 2
        if not new[0]:                                    # treeless literals with no tree before them
            return None
        at, stop = p + lh, p + lh + clit
        head = buf[at].astype(np.int64)
        used = np.where(head >= 128, (head - 127 + 1) // 2 + 1, head + 1)
        if (new & (used >= clit)).any():
            return None
        first = at + np.where(new, used, 0)               # the jump table
        if (stop - first < 10).any():
            return None
        l1, l2, l3 = _u16(buf, first), _u16(buf, first + 2), _u16(buf, first + 4)
        l4 = stop - first - (l1 + l2 + l3 + 6)
        seg = (lit + 3) // 4
        if (l4 < 0).any() or (3 * seg > lit).any():
            return None
        lengths = np.stack([l1, l2, l3, l4], axis=1)
        s_src = first[:, None] + 6 + np.concatenate([np.zeros((len(c), 1), np.int64),
                                                     np.cumsum(lengths, axis=1)[:, :3]], axis=1)
        if (lengths < 1).any() or (buf[s_src + lengths - 1] == 0).any():
            return None
        # libzstd's choice of Huffman decoder, made where each tree is read and kept with it
        q = np.where(clit >= lit, 15, clit * 16 // np.maximum(lit, 1))
        t = _ALGO[q]
        d256 = lit >> 8
        t0, t1 = t[:, 0] + t[:, 1] * d256, t[:, 2] + t[:, 3] * d256
        x2_here = (t1 + (t1 >> 5)) < t0
        tree = np.cumsum(new) - 1                        # each block's tree row: its own or the last one
        tree_blocks = np.flatnonzero(new)
        x2 = x2_here[tree_blocks][tree].astype(np.int64)
        base = np.concatenate([[0], np.cumsum(lit)[:-1]])
        literals = int(lit.sum())
        rows = blocks[c]
        rows[:, zf.B_LITKIND], rows[:, zf.B_LITOFF], rows[:, zf.B_LITLEN] = zf.LIT_HUF, base, lit
        rows[:, zf.B_LIMIT] = zf.LIMIT_PLACED
        nseq, fse = 0, None
        if len(with_seqs):
            f = zf._Frame(data, name)
            for k in with_seqs:
                row = rows[k].tolist()
                try:
                    zf._sequences(f, row, int(seq_at[k]), int(p[k] + bs[k]), int(c[k]))
                except (zf.ZstdFrameError, zf.ZstdUnsupported, IndexError):
                    return None         # read block by block: its errors come in the frame's order
                rows[k] = row
            nseq, fse = f.nseq, (np.concatenate(f.fse) if f.fse else None)
        blocks[c] = rows
        trees = np.stack([at[tree_blocks], used[tree_blocks], c[tree_blocks]], axis=1)
        dst = base[:, None] + seg[:, None] * np.arange(4)[None, :]
        dlen = np.stack([seg, seg, seg, lit - 3 * seg], axis=1)
        streams = np.zeros((len(c), 4, zf.STREAM_COLUMNS), np.int64)
        streams[:, :, zf.S_SRC], streams[:, :, zf.S_LEN] = s_src, lengths
        streams[:, :, zf.S_DST], streams[:, :, zf.S_DLEN] = dst, dlen
        streams[:, :, zf.S_TABLE], streams[:, :, zf.S_X2] = tree[:, None], x2[:, None]
        streams[:, :, zf.S_BLOCK] = c[:, None]
        streams = streams.reshape(-1, zf.STREAM_COLUMNS)
    else:
        nseq, fse = 0, None
    zf._prefix_positions(blocks)
    return zf.FramePlan(name, size, n, expected, blocks, streams, trees,
                        fse if fse is not None else np.zeros((0, 2), np.uint32), literals, nseq)

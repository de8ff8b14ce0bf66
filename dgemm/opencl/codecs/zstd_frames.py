"""zstd frames (RFC 8878) read on the host into the tables that ``kernels/zstd_decode.cl`` decodes from.

One frame per chunk, as numcodecs and zarr write them: magic, frame header
with the content size, blocks (raw, RLE or compressed), an optional checksum.
For each frame :func:`plan` reads every header and sequence table description (a
few bytes per block; :mod:`.zstd_entropy` builds the decode tables) and checks every
length and offset against the frame, and makes rows:

* one per Huffman tree description (``TREE_COLUMNS``): where it is and its size,
  both told by its first byte; the kernel ``zstd_huf_trees`` decodes its weights
  and builds its lookup table, with :func:`.zstd_entropy.huffman_tree`'s arithmetic
  (decoding them here was most of the host's time: a tree every block or few);
* one per Huffman literal stream (``STREAM_COLUMNS``): where its bytes are, where
  its literals go in the literal buffer, and which tree it reads (a treeless block's
  streams name the frame's previous tree);
* one per block (``BLOCK_COLUMNS``): its type, where its literals and its
  sequence bitstream are, its sequence count and FSE tables.

What only decoding can tell (a Huffman or sequence bitstream that does not end
where it should, a literal or match length past its bounds, an offset before
the frame's start, the content size) the kernels check, each bounding its reads
by its own stream and its writes by its own output.

A frame is accepted or refused as libzstd 1.5.4/1.5.5 (the reference decoder
numcodecs and dgemm's ``storage.zstd`` use) accepts or refuses it, decoded to
the same bytes where accepted; where libzstd's result on a corrupt frame is
bytes of its own internal buffers the device path raises instead (a compressed
block whose output would reach past the place libzstd keeps the block's
literals: :data:`LIMIT_SPLIT`), and where it takes what RFC 8878 forbids and
libzstd 1.5.6 on refuse (the sequence modes' reserved bits set, an offset of
0: see :mod:`.zstd_decode`).  Left to the host (:class:`ZstdUnsupported`):
skippable and legacy-format frames, frames without a content size, and
bytes after the frame that could start another frame.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from dgemm.errors import DgemmError
from dgemm.opencl.codecs import zstd_entropy as ent

MAGIC = 0xFD2FB528
SKIPPABLE, SKIPPABLE_MASK = 0x184D2A50, 0xFFFFFFF0
LEGACY = range(0xFD2FB522, 0xFD2FB528)
BLOCK_MAX = 128 * 1024
WINDOWLOG_MAX = 31
LIT_EXTRA = 64 * 1024     # libzstd's literal side buffer (ZSTD_LITBUFFEREXTRASIZE)
WILDCOPY = 32

# How a compressed block's output is bounded, after where libzstd keeps its literals
# (ZSTD_allocateLiteralsBuffer): LIMIT_REMAINING: the frame's remaining output; LIMIT_PLACED: decided
# by the kernel from the remaining output (past 128 KiB + 64 + literals: the literals sit 128 KiB + 32
# past the block's start, which bounds it; else over 64 KiB of literals: the block's expected size,
# min(128 KiB, remaining), LIMIT_SPLIT's rule; else the remaining output).
LIMIT_REMAINING, LIMIT_PLACED = 0, 1

RAW, RLE, COMPRESSED = 0, 1, 2
LIT_HUF, LIT_SRC, LIT_RLE = 0, 1, 2
SEQ_FRAME = 3          # a sequence buffer row: literal length, match length | tag << 28, offset

# block rows
(B_TYPE, B_FRAME, B_SRC, B_SIZE, B_LITKIND, B_LITOFF, B_LITLEN, B_LIMIT, B_NSEQ, B_SEQ, B_SSRC, B_SLEN,
 B_LL, B_OF, B_ML, B_LOGS, B_INDEX, B_PRE) = range(18)
BLOCK_COLUMNS = 18
# stream rows (S_TABLE: the tree row; S_OUT: 0 here, where S_DST is a place among the literals; the device
# decode sets 1 where S_DST is a place in the output, the literals being the block's output; S_X2: whether
# libzstd takes its two-symbol decoder for these streams)
S_SRC, S_LEN, S_DST, S_DLEN, S_TABLE, S_OUT, S_X2, S_BLOCK = range(8)
STREAM_COLUMNS = 8
# tree rows: the description's first byte, its size, its block's row (kernels read the first two)
T_SRC, T_LEN, T_BLOCK = range(3)
TREE_COLUMNS = 3
# frame rows
F_OUT, F_SIZE, F_FIRST, F_NBLOCKS, F_CHECK, F_HASH = range(6)
FRAME_COLUMNS = 6

# The predefined sequence tables: plan-local table offsets below 0 name them.
DEFAULT_LL, DEFAULT_OF, DEFAULT_ML = -1, -2, -3


class ZstdFrameError(DgemmError, ValueError):
    """A zstd frame is corrupt or hostile: the message names the frame, the block and what is wrong."""


class ZstdUnsupported(DgemmError, ValueError):
    """A zstd frame this device path leaves to the host decoder (libzstd)."""


def default_tables():
    """The predefined LL, OF and ML decode tables (uint32 pairs) and their logs."""
    return [(ent.sequence_table(c, log, b, bits), log) for (c, log), b, bits in (
        (ent.LL_DEFAULT, ent.LL_BASE, ent.LL_BITS), (ent.OF_DEFAULT, ent.OF_BASE, ent.OF_BITS),
        (ent.ML_DEFAULT, ent.ML_BASE, ent.ML_BITS))]


_DEFAULTS = None


def defaults():
    global _DEFAULTS
    if _DEFAULTS is None:
        _DEFAULTS = default_tables()
    return _DEFAULTS


@dataclasses.dataclass
class FramePlan:
    """One frame's rows, offsets relative to the frame, its literal buffer and its tables.

    ``blocks``, ``streams`` and ``trees``: int64 rows (``BLOCK_COLUMNS``, ``STREAM_COLUMNS``,
    ``TREE_COLUMNS``), the Huffman tree descriptions decoded on the device; ``fse``: uint32 pairs of
    sequence tables back to back (``B_LL``... below 0 name the predefined ones);
    ``literals``: bytes of Huffman output; ``nseq``: sequences in all.
    """

    name: str
    size: int
    csize: int
    checksum: int | None
    blocks: np.ndarray
    streams: np.ndarray
    trees: np.ndarray
    fse: np.ndarray
    literals: int
    nseq: int


def header(frame, name: str = "frame"):
    """Read a frame header: (header size, content size, checksum flag); raises as :func:`plan`."""
    data = memoryview(frame).cast("B")
    n = len(data)

    def bad(what):
        return ZstdFrameError(f"zstd frame {name}: {what}")

    if n == 0:
        # libzstd decodes no bytes to no bytes; numcodecs refuses them: the caller's host path decides
        raise ZstdUnsupported(f"zstd frame {name}: no bytes")
    if n < 5:
        if n >= 4 and int.from_bytes(data[:4], "little") & SKIPPABLE_MASK == SKIPPABLE:
            raise ZstdUnsupported(f"zstd frame {name}: a skippable frame")
        raise bad(f"{n} bytes, shorter than a frame header")
    magic = int.from_bytes(data[:4], "little")
    if magic & SKIPPABLE_MASK == SKIPPABLE:
        raise ZstdUnsupported(f"zstd frame {name}: a skippable frame")
    if magic in LEGACY:
        raise ZstdUnsupported(f"zstd frame {name}: a legacy (pre-1.0) zstd frame")
    if magic != MAGIC:
        raise bad(f"magic number {magic:#010x}, not zstd's {MAGIC:#010x}")
    fhd = data[4]
    single = (fhd >> 5) & 1
    fcs_id = fhd >> 6
    did_size = (0, 1, 2, 4)[fhd & 3]
    fcs_size = (single, 2, 4, 8)[fcs_id]
    hsize = 5 + (not single) + did_size + fcs_size
    if n < 9 or n < hsize + 3:
        raise bad(f"{n} bytes, too short for its {hsize}-byte header and a block")
    if fhd & 0x08:
        raise bad("the frame header's reserved bit is set")
    pos = 5
    if not single:
        wl = data[pos]
        if (wl >> 3) + 10 > WINDOWLOG_MAX:
            raise bad(f"window log {(wl >> 3) + 10}, over {WINDOWLOG_MAX}")
        pos += 1
    dict_id = int.from_bytes(data[pos:pos + did_size], "little")
    pos += did_size
    if dict_id:
        raise bad(f"it needs dictionary {dict_id}, and none is loaded")
    if fcs_size == 0:
        raise ZstdUnsupported(f"zstd frame {name}: no content size in its header")
    size = int.from_bytes(data[pos:pos + fcs_size], "little") + (256 if fcs_size == 2 else 0)
    return hsize, size, bool(fhd & 4)


class _Frame:
    """The state carried from block to block while a frame is read."""

    def __init__(self, data, name):
        self.data, self.name = data, name
        self.blocks, self.streams, self.trees, self.fse = [], [], [], []
        self.tree_blocks = []          # each tree's block number, for the host's messages
        self.fse_at = self.literals = self.nseq = 0
        self.huf_table = None          # the last tree's row
        self.seq_tables = None         # ((offset, log) of LL, OF, ML) of the last block with sequences

    def bad(self, block, what):
        return ZstdFrameError(f"zstd frame {self.name}: block {block}: {what}")

    def add_tree(self, at, size, index):
        self.trees.append((at, size, len(self.blocks)))
        self.tree_blocks.append(index)
        return len(self.trees) - 1

    def check_trees(self):
        """Decode the trees on the host (a frame found corrupt after them): the first refused one raises.

        The device would have refused it in an earlier block (or earlier in the same
        block) than what the host found, which libzstd, reading in order, also does.
        """
        for (at, size, _), index in zip(self.trees, self.tree_blocks):
            try:
                ent.huffman_tree(self.data, at, at + size)
            except ent.Corrupt as e:
                raise self.bad(index, f"its Huffman tree: {e}") from None

    def add_fse(self, table):
        at = self.fse_at
        self.fse.append(table)
        self.fse_at += len(table)
        return at


def plan(frame, name: str = "frame") -> FramePlan:
    """Check a frame and make its rows; :class:`ZstdFrameError` for a corrupt one.

    Parameters
    ----------
    frame : bytes-like
        One zstd frame (a chunk's stored bytes).
    name : str
        What errors call it (a store key).

    Raises
    ------
    ZstdFrameError
        What libzstd refuses from the headers and descriptions alone.
    ZstdUnsupported
        A frame left to the host (see the module's notes).
    """
    data = memoryview(frame).cast("B")
    hsize, size, checksum = header(data, name)
    return slow_plan(data, name, hsize, size, checksum)


def slow_plan(data, name: str, hsize: int, size: int, checksum: bool) -> FramePlan:
    """:func:`plan` after :func:`header` (:mod:`.zstd_fastplan` falls back on it)."""
    f = _Frame(data, name)
    try:
        return _blocks(f, data, hsize, size, checksum)
    except (ZstdFrameError, ZstdUnsupported):
        f.check_trees()
        raise


def _blocks(f: _Frame, data, hsize: int, size: int, checksum: bool) -> FramePlan:
    n, name = len(data), f.name
    pos, index = hsize, 0
    while True:
        if n - pos < 3:
            raise f.bad(index, f"its header runs past the frame's {n} bytes")
        h = int.from_bytes(data[pos:pos + 3], "little")
        last, btype, bsize = h & 1, (h >> 1) & 3, h >> 3
        if btype == 3:
            raise f.bad(index, "block type 3 (reserved)")
        pos += 3
        csize = 1 if btype == RLE else bsize
        if csize > n - pos:
            raise f.bad(index, f"{csize} bytes at {pos} run past the frame's {n} bytes")
        row = [0] * BLOCK_COLUMNS     # a list: numpy's per-element writes cost more than the parse
        row[B_TYPE], row[B_SRC], row[B_SIZE], row[B_INDEX] = btype, pos, bsize, index
        if btype == COMPRESSED:
            _compressed(f, row, pos, bsize, index)
        f.blocks.append(row)
        pos += csize
        index += 1
        if last:
            break
    expected = None
    if checksum:
        if n - pos < 4:
            raise ZstdFrameError(f"zstd frame {name}: its checksum runs past the frame's {n} bytes")
        expected = int.from_bytes(data[pos:pos + 4], "little")
        pos += 4
    if pos < n:
        rest = n - pos
        magic = int.from_bytes(data[pos:pos + 4], "little") if rest >= 4 else None
        if rest >= 5 and (magic == MAGIC or magic in LEGACY or magic & SKIPPABLE_MASK == SKIPPABLE):
            raise ZstdUnsupported(f"zstd frame {name}: another frame follows it")
        raise ZstdFrameError(f"zstd frame {name}: {rest} bytes after the frame that are not a frame")
    blocks = np.array(f.blocks, np.int64).reshape(-1, BLOCK_COLUMNS)
    _prefix_positions(blocks)
    empty = np.zeros((0, 2), np.uint32)
    return FramePlan(name, size, n, expected, blocks,
                     np.array(f.streams, np.int64).reshape(-1, STREAM_COLUMNS),
                     np.array(f.trees, np.int64).reshape(-1, TREE_COLUMNS),
                     np.concatenate(f.fse) if f.fse else empty, f.literals, f.nseq)


def _prefix_positions(blocks) -> None:
    """Where each block's output starts, for the blocks before the first one with sequences (else -1).

    Raw, RLE and sequence-free blocks write a size the header tells, so these
    positions are known before anything is decoded, and ``zstd_copy_blocks``
    writes those blocks all at once (the frames of float chunks are mostly
    such blocks); the per-frame walk then checks them without copying them.
    """
    blocks[:, B_PRE] = -1
    sizes = np.where(blocks[:, B_TYPE] == COMPRESSED, blocks[:, B_LITLEN], blocks[:, B_SIZE])
    known = (blocks[:, B_TYPE] != COMPRESSED) | (blocks[:, B_NSEQ] == 0)
    upto = len(blocks) if known.all() else int(np.argmin(known))
    blocks[:upto, B_PRE] = np.concatenate([[0], np.cumsum(sizes[:upto])[:-1]]) if upto else []


def _literals(f: _Frame, row, p: int, end: int, index: int) -> int:
    """Read a compressed block's literals section at ``data[p:end]``; returns its size."""
    data = f.data
    size = end - p
    b0 = data[p]
    ltype, lhl = b0 & 3, (b0 >> 2) & 3
    if ltype in (0, 1):       # raw or RLE literals
        if lhl in (0, 2):
            lh, lit = 1, b0 >> 3
        elif lhl == 1:
            lh, lit = 2, int.from_bytes(data[p:p + 2], "little") >> 4
            if ltype == 1 and size < 3:
                raise f.bad(index, "its RLE literals section runs past the block")
        else:
            lh = 3
            if size < 3 + ltype:
                raise f.bad(index, "its literals section header runs past the block")
            lit = int.from_bytes(data[p:p + 3], "little") >> 4
        if lit > BLOCK_MAX:
            raise f.bad(index, f"{lit} literals, over {BLOCK_MAX}")
        row[B_LITLEN] = lit
        if ltype == 1:
            row[B_LITKIND], row[B_LITOFF], row[B_LIMIT] = LIT_RLE, data[p + lh], LIMIT_PLACED
            return lh + 1
        if lh + lit > size:
            raise f.bad(index, f"{lit} raw literals run past the block")
        row[B_LITKIND], row[B_LITOFF] = LIT_SRC, p + lh
        # libzstd reads raw literals in place unless they end within 32 bytes of the block's end
        row[B_LIMIT] = LIMIT_PLACED if lh + lit + WILDCOPY > size else LIMIT_REMAINING
        return lh + lit
    if ltype == 3 and f.huf_table is None:
        raise f.bad(index, "treeless literals, and no Huffman tree before them in the frame")
    if size < 5:
        raise f.bad(index, "its literals section header runs past the block")
    lhc = int.from_bytes(data[p:p + 4], "little")
    single = lhl == 0
    if lhl < 2:
        lh, lit, clit = 3, (lhc >> 4) & 0x3FF, (lhc >> 14) & 0x3FF
    elif lhl == 2:
        lh, lit, clit = 4, (lhc >> 4) & 0x3FFF, lhc >> 18
    else:
        lh, lit, clit = 5, (lhc >> 4) & 0x3FFFF, (lhc >> 22) + (data[p + 4] << 10)
    if lit > BLOCK_MAX:
        raise f.bad(index, f"{lit} literals, over {BLOCK_MAX}")
    if not single and lit < 6:
        raise f.bad(index, f"{lit} literals in 4 Huffman streams (6 at least)")
    if clit + lh > size:
        raise f.bad(index, f"{clit} bytes of Huffman literals run past the block")
    at, stop = p + lh, p + lh + clit
    if ltype == 2:
        if not single and clit == 0:
            raise f.bad(index, "Huffman literals of no bytes")
        x2 = int(not single and ent.two_symbol_decoder(lit, clit))
        # huffman_tree's checks of the description's size (the device decodes the rest, or the host does
        # when the frame is found corrupt after it: _Frame.check_trees)
        if stop <= at:
            raise f.bad(index, "its Huffman tree: no room for the Huffman tree description")
        used = ent.tree_size(data[at])
        if used > clit:
            raise f.bad(index, "its Huffman tree: the Huffman weights run past the literals section")
        f.huf_table = (f.add_tree(at, used, index), x2)
        if used >= clit:
            raise f.bad(index, "no Huffman streams after the tree")
        at += used
    tree, x2 = f.huf_table
    base = f.literals
    if single:
        spans = [(at, stop - at, 0, lit)]
    else:
        c = stop - at
        if c < 10:
            raise f.bad(index, f"{c} bytes for 4 Huffman streams and their jump table")
        l1, l2, l3 = (int.from_bytes(data[at + 2 * k:at + 2 * k + 2], "little") for k in range(3))
        l4 = c - (l1 + l2 + l3 + 6)
        if l4 < 0:
            raise f.bad(index, "the Huffman jump table's streams run past the literals")
        seg = (lit + 3) // 4
        if 3 * seg > lit:
            raise f.bad(index, f"{lit} literals cannot be split over 4 streams")
        s = at + 6
        spans = []
        for k, length in enumerate((l1, l2, l3, l4)):
            spans.append((s, length, k * seg, seg if k < 3 else lit - 3 * seg))
            s += length
    for k, (src, length, dst, dlen) in enumerate(spans):
        if length < 1:
            raise f.bad(index, f"Huffman stream {k} of no bytes")
        if data[src + length - 1] == 0:
            raise f.bad(index, f"Huffman stream {k} ends in a 0 byte (no end mark)")
        f.streams.append((src, length, base + dst, dlen, tree, 0, x2, len(f.blocks)))
    f.literals += lit
    row[B_LITKIND], row[B_LITOFF], row[B_LITLEN], row[B_LIMIT] = LIT_HUF, base, lit, LIMIT_PLACED
    return lh + clit


def _compressed(f: _Frame, row, p: int, bsize: int, index: int) -> None:
    data = f.data
    if bsize > BLOCK_MAX:
        raise f.bad(index, f"a compressed block of {bsize} bytes, over {BLOCK_MAX}")
    if bsize < 2:
        raise f.bad(index, f"a compressed block of {bsize} bytes")
    end = p + bsize
    p += _literals(f, row, p, end, index)
    _sequences(f, row, p, end, index)


def _sequences(f: _Frame, row, p: int, end: int, index: int) -> None:
    """Read a compressed block's sequences section at ``data[p:end]`` into ``row`` and ``f``'s tables."""
    data = f.data
    if p >= end:
        raise f.bad(index, "no sequences section")
    nb = data[p]
    p += 1
    if nb == 0:
        if p != end:
            raise f.bad(index, f"{end - p} bytes after a sequences section of no sequences")
        return
    if nb == 255:
        if p + 2 > end:
            raise f.bad(index, "its sequence count runs past the block")
        nb = int.from_bytes(data[p:p + 2], "little") + 0x7F00
        p += 2
    elif nb > 127:
        if p >= end:
            raise f.bad(index, "its sequence count runs past the block")
        nb = ((nb - 128) << 8) + data[p]
        p += 1
    if p >= end:
        raise f.bad(index, "its sequence compression modes run past the block")
    modes = data[p]
    if modes & 3:       # (libzstd up to 1.5.5 ignored them; later ones refuse, as zarr's numcodecs does)
        raise f.bad(index, "its sequence compression modes byte has its reserved bits set")
    p += 1
    tables = []
    previous = f.seq_tables
    for k, (what, mode, top, maxlog, bases, bits, default) in enumerate((
            ("literal length", modes >> 6, ent.MAX_LL, ent.LL_MAX_LOG, ent.LL_BASE, ent.LL_BITS, DEFAULT_LL),
            ("offset", (modes >> 4) & 3, ent.MAX_OF, ent.OF_MAX_LOG, ent.OF_BASE, ent.OF_BITS, DEFAULT_OF),
            ("match length", (modes >> 2) & 3, ent.MAX_ML, ent.ML_MAX_LOG, ent.ML_BASE, ent.ML_BITS,
             DEFAULT_ML))):
        if mode == 0:
            tables.append((default, defaults()[k][1]))
        elif mode == 1:
            if p >= end:
                raise f.bad(index, f"its RLE {what} code runs past the block")
            if data[p] > top:
                raise f.bad(index, f"RLE {what} code {data[p]}, over {top}")
            tables.append((f.add_fse(ent.rle_table(data[p], bases, bits)), 0))
            p += 1
        elif mode == 3:
            if previous is None:
                raise f.bad(index, f"a repeated {what} table, and no sequences before it in the frame")
            tables.append(previous[k])
        else:
            try:
                counts, log, used = ent.read_ncount(data, p, end, top)
            except ent.Corrupt as e:
                raise f.bad(index, f"its {what} table: {e}") from None
            if log > maxlog:
                raise f.bad(index, f"its {what} table log {log}, over {maxlog}")
            tables.append((f.add_fse(ent.sequence_table(counts, log, bases, bits)), log))
            p += used
    f.seq_tables = tables
    if p >= end:
        raise f.bad(index, "no sequence bitstream")
    if data[end - 1] == 0:
        raise f.bad(index, "its sequence bitstream ends in a 0 byte (no end mark)")
    row[B_NSEQ], row[B_SEQ], row[B_SSRC], row[B_SLEN] = nb, f.nseq, p, end - p
    row[B_LL], row[B_OF], row[B_ML] = (t[0] for t in tables)
    row[B_LOGS] = tables[0][1] | (tables[1][1] << 8) | (tables[2][1] << 16)
    f.nseq += nb

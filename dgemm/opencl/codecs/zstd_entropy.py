"""zstd's entropy descriptions read on the host: FSE table descriptions, Huffman trees, and their decode tables.

What RFC 8878 section 4 describes, read as libzstd (the reference decoder, 1.5.x)
reads it, so that a description libzstd refuses is refused here and one it
takes gives the same table:

* an FSE table description ("normalized counts", section 4.1.1), with
  libzstd's handling of a description that runs past its bytes (the bits
  past the end read as zeros, as long as the reader's 32-bit window still
  starts inside them);
* the decode table built from it (section 4.1.1's spreading of the symbols,
  then each cell's ``nbBits`` and ``baseline``), for sequences with each
  code's base value and extra bits (section 3.1.1.3.2.1.1);
* a Huffman tree description (section 4.2.1): direct 4-bit weights, or
  weights compressed with FSE, decoded here with libzstd's bit container
  exactly (its bit container's arithmetic), its over-reads included, since where such a
  stream ends is decided by them;
* the Huffman lookup table: ``2**tableLog`` entries of ``symbol | nbBits << 8``
  indexed by the next ``tableLog`` bits of a stream.

The Huffman trees of frames decoded on the device are decoded by the kernel
``zstd_huf_trees`` (``kernels/zstd_decode.cl``), a port of :func:`huffman_tree`
and what it calls, arithmetic for arithmetic; here they are its reference (the
tests compare tables entry for entry) and the host's fallback for a frame found
corrupt after its trees (so the first error stays the first).

Errors are :class:`Corrupt` with a short text; the frame parser adds the
frame's name and the block.
"""
from __future__ import annotations

import numpy as np

M64 = (1 << 64) - 1
FSE_MIN_LOG, FSE_ABSOLUTE_MAX_LOG = 5, 15
HUF_MAX_LOG = 12          # the largest Huffman code length (tableLog) libzstd takes
HUF_WEIGHTS_MAX_LOG = 6   # the FSE table of compressed Huffman weights
X2_LOG, X2_BIG_LOG = 11, 12   # the lookahead of libzstd's two-symbol Huffman decoder

# Sequence codes (RFC 8878 3.1.1.3.2.1.1): base value and extra bits of each code.
LL_BASE = list(range(16)) + [16, 18, 20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096,
                             8192, 16384, 32768, 65536]
LL_BITS = [0] * 16 + [1, 1, 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
ML_BASE = list(range(3, 35)) + [35, 37, 39, 41, 43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027, 2051,
                                4099, 8195, 16387, 32771, 65539]
ML_BITS = [0] * 32 + [1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
# Offsets: code c reads c extra bits; the value is (1 << c) + bits, an offset of value - 3 when c >= 2.
# Codes 0 and 1 are repeat offsets: their base here is libzstd's (0 and 1), the decoder adds the rest.
OF_BASE = [0, 1] + [(1 << c) - 3 for c in range(2, 32)]
OF_BITS = list(range(32))
MAX_LL, MAX_ML, MAX_OF = 35, 52, 31
LL_MAX_LOG, ML_MAX_LOG, OF_MAX_LOG = 9, 9, 8

# The predefined distributions (RFC 8878 3.1.1.3.2.2).
LL_DEFAULT = ([4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1]
              + [-1] * 4, 6)
ML_DEFAULT = ([1, 4, 3, 2, 2, 2, 2, 2, 2] + [1] * 37 + [-1] * 7, 6)
OF_DEFAULT = ([1, 1, 1, 1, 1, 1, 2, 2, 2] + [1] * 15 + [-1] * 5, 5)


class Corrupt(ValueError):
    """An entropy description libzstd refuses (the text says what)."""


def highbit(v: int) -> int:
    return v.bit_length() - 1


# -- FSE table descriptions ---------------------------------------------------------------------------
def read_ncount(buf, pos: int, end: int, max_symbol: int):
    """Read an FSE table description at ``buf[pos:end]``; returns (counts, table_log, bytes used).

    Where the description runs past ``end``, libzstd reads it from a zero-padded
    copy when fewer than 8 bytes are left, and otherwise keeps a 32-bit window
    whose start stops 4 bytes before the end: both are followed here, so that
    the same descriptions are taken and refused.
    """
    size = end - pos
    if size < 8:
        padded = bytes(buf[pos:end]) + bytes(8 - size)
        counts, log, used = read_ncount(padded, 0, 8, max_symbol)
        if used > size:
            raise Corrupt("an FSE table description runs past its bytes")
        return counts, log, used
    data = bytes(buf[pos:end])

    def le32(i):
        return int.from_bytes(data[i:i + 4], "little")

    ip = 0
    last = size - 4          # the window's start never goes past here
    stream = le32(0)
    nbits = (stream & 0xF) + FSE_MIN_LOG
    if nbits > FSE_ABSOLUTE_MAX_LOG:
        raise Corrupt(f"an FSE table log of {nbits}, over {FSE_ABSOLUTE_MAX_LOG}")
    log = nbits
    stream >>= 4
    bitcount = 4
    remaining = (1 << nbits) + 1
    threshold = 1 << nbits
    nbits += 1
    counts = [0] * (max_symbol + 1)
    symbol = 0
    previous0 = False

    def advance(ip, bitcount):
        if ip <= size - 7 or ip + (bitcount >> 3) <= last:
            return ip + (bitcount >> 3), bitcount & 7
        return last, (bitcount - 8 * (last - ip)) & 31

    while True:
        if previous0:
            # runs of zero counts: 2-bit repeat fields, 3 meaning "3 more and another field"
            repeats = _trailing_ones(stream) >> 1
            while repeats >= 12:
                symbol += 36
                if ip <= size - 7:
                    ip += 3
                else:
                    bitcount = (bitcount - 8 * (size - 7 - ip)) & 31
                    ip = last
                stream = le32(ip) >> bitcount
                repeats = _trailing_ones(stream) >> 1
            symbol += 3 * repeats
            stream >>= 2 * repeats
            bitcount += 2 * repeats
            symbol += stream & 3
            bitcount += 2
            if symbol >= max_symbol + 1:
                break
            ip, bitcount = advance(ip, bitcount)
            stream = le32(ip) >> bitcount
        top = (2 * threshold - 1) - remaining
        if (stream & (threshold - 1)) < top:
            count = stream & (threshold - 1)
            bitcount += nbits - 1
        else:
            count = stream & (2 * threshold - 1)
            if count >= threshold:
                count -= top
            bitcount += nbits
        count -= 1
        remaining -= count if count >= 0 else 1
        counts[symbol] = count
        symbol += 1
        previous0 = count == 0
        if remaining < threshold:
            if remaining <= 1:
                break
            nbits = highbit(remaining) + 1
            threshold = 1 << (nbits - 1)
        if symbol >= max_symbol + 1:
            break
        ip, bitcount = advance(ip, bitcount)
        stream = le32(ip) >> bitcount
    if remaining != 1:
        raise Corrupt("an FSE table description whose counts do not add up to its table size")
    if symbol > max_symbol + 1:
        raise Corrupt(f"an FSE table description with symbols past {max_symbol}")
    if bitcount > 32:
        raise Corrupt("an FSE table description runs past its bytes")
    used = ip + ((bitcount + 7) >> 3)
    return counts[:symbol], log, used


def _trailing_ones(v: int) -> int:
    v = (~v | 0x80000000) & 0xFFFFFFFF
    return (v & -v).bit_length() - 1


def fse_cells(counts, log: int):
    """Spread the symbols over a table of ``2**log`` cells; returns (symbol, nbBits, next-state base) arrays."""
    size = 1 << log
    counts = np.asarray(counts, np.int64)
    nsym = len(counts)
    cells = np.zeros(size, np.int64)
    low = np.nonzero(counts == -1)[0]
    high = size - 1 - len(low)
    cells[size - 1 - np.arange(len(low))] = low          # low-probability symbols fill the top, in order
    step = (size >> 1) + (size >> 3) + 3
    order = (np.arange(size, dtype=np.int64) * step) & (size - 1)
    order = order[order <= high]
    cells[order] = np.repeat(np.arange(nsym), np.maximum(counts, 0))
    start = np.where(counts == -1, 1, counts)             # each symbol's first state number
    # the state numbers a symbol's cells get, in cell order: start, start+1, ...
    sort = np.argsort(cells, kind="stable")
    sorted_cells = cells[sort]
    first = np.searchsorted(sorted_cells, sorted_cells, side="left")
    rank = np.empty(size, np.int64)
    rank[sort] = np.arange(size) - first
    state = start[cells] + rank
    nbbits = log - (np.frexp(state.astype(np.float64))[1] - 1)
    base = (state << nbbits) - size
    return cells, nbbits, base


def sequence_table(counts, log: int, bases, bits) -> np.ndarray:
    """A sequence decode table: per cell (base value, nextState | nbBits << 16 | extra bits << 24) as uint32 pairs."""
    cells, nbbits, nxt = fse_cells(counts, log)
    out = np.empty((1 << log, 2), np.uint32)
    out[:, 0] = np.asarray(bases, np.int64)[cells]
    out[:, 1] = nxt | (nbbits << 16) | (np.asarray(bits, np.int64)[cells] << 24)
    return out


def rle_table(symbol: int, bases, bits) -> np.ndarray:
    """The one-cell table of an RLE-coded sequence field (table log 0)."""
    return np.array([[bases[symbol], bits[symbol] << 24]], np.uint32)


# -- the Huffman weights' FSE stream, read with libzstd's bit container -------------------------------------
def small_cells(counts, log: int):
    """:func:`fse_cells` for the small tables of Huffman weights, in plain Python (faster there)."""
    size = 1 << log
    mask = size - 1
    cells = [0] * size
    high = size - 1
    for s, c in enumerate(counts):
        if c == -1:
            cells[high] = s
            high -= 1
    step = (size >> 1) + (size >> 3) + 3
    p = 0
    for s, c in enumerate(counts):
        for _ in range(c if c > 0 else 0):
            cells[p] = s
            p = (p + step) & mask
            while p > high:
                p = (p + step) & mask
    nexts = [1 if c == -1 else c for c in counts]
    nb, base = [0] * size, [0] * size
    for u in range(size):
        s = cells[u]
        st = nexts[s]
        nexts[s] = st + 1
        b = log - (st.bit_length() - 1)
        nb[u] = b
        base[u] = (st << b) - size
    return cells, nb, base

def _fse_weights(buf, pos: int, size: int) -> list:
    """Huffman weights compressed with FSE (RFC 8878 4.2.1.2), decoded as libzstd decodes them.

    libzstd's backward bit reader (a 64-bit container refilled a byte at a time), reproduced
    arithmetic for arithmetic: where the stream ends is decided by it, over-reads included.
    """
    counts, log, used = read_ncount(buf, pos, pos + size, 255)
    if log > HUF_WEIGHTS_MAX_LOG:
        raise Corrupt(f"Huffman weights' FSE table log {log}, over {HUF_WEIGHTS_MAX_LOG}")
    cells, nbbits, nxt = small_cells(counts, log)
    fast = not any(c >= (1 << (log - 1)) for c in counts)
    data = bytes(buf[pos + used:pos + size])
    n = len(data)
    if n < 1:
        raise Corrupt("an empty bitstream")
    last = data[-1]
    if last == 0:
        raise Corrupt("a bitstream whose last byte is 0 (no end mark)")
    if n >= 8:
        ptr = n - 8
        cont = int.from_bytes(data[ptr:ptr + 8], "little")
        consumed = 8 - (last.bit_length() - 1)
    else:
        ptr = 0
        cont = int.from_bytes(data, "little")
        consumed = 8 - (last.bit_length() - 1) + (8 - n) * 8
    data8 = data + bytes(8)

    def reload():
        nonlocal ptr, cont, consumed
        if consumed > 64:
            return 3
        if ptr >= 8:
            ptr -= consumed >> 3
            consumed &= 7
            cont = int.from_bytes(data8[ptr:ptr + 8], "little")
            return 0
        if ptr == 0:
            return 1 if consumed < 64 else 2
        k = consumed >> 3
        r = 0
        if ptr - k < 0:
            k = ptr
            r = 1
        ptr -= k
        consumed -= k * 8
        cont = int.from_bytes(data8[ptr:ptr + 8], "little")
        return r

    def rd(k):
        nonlocal consumed
        v = (cont >> ((64 - consumed - k) & 63)) & ((1 << k) - 1)
        consumed += k
        return v

    s1 = rd(log)
    reload()
    s2 = rd(log)
    reload()
    out = []

    def sym(s):
        nonlocal consumed
        b = nbbits[s]
        if fast:
            v = ((cont << (consumed & 63)) & M64) >> ((64 - b) & 63)
        else:
            v = (cont >> ((64 - consumed - b) & 63)) & ((1 << b) - 1)
        consumed += b
        return cells[s], nxt[s] + v

    # 4 symbols per reload while the reload finds whole bytes to load (libzstd's loop, 64-bit build)
    while reload() == 0 and len(out) < 252:
        a, s1 = sym(s1)
        b, s2 = sym(s2)
        c, s1 = sym(s1)
        d, s2 = sym(s2)
        out += (a, b, c, d)
    while True:
        if len(out) > 253:
            raise Corrupt("more than 255 Huffman weights")
        a, s1 = sym(s1)
        out.append(a)
        if reload() == 3:
            out.append(sym(s2)[0])
            break
        if len(out) > 253:
            raise Corrupt("more than 255 Huffman weights")
        a, s2 = sym(s2)
        out.append(a)
        if reload() == 3:
            out.append(sym(s1)[0])
            break
    return out


def tree_size(head: int) -> int:
    """The size of a Huffman tree description whose first byte is ``head`` (RFC 8878 4.2.1)."""
    return (head - 127 + 1) // 2 + 1 if head >= 128 else head + 1


def huffman_tree(buf, pos: int, end: int):
    """Read a Huffman tree description at ``buf[pos:end]``; returns (lookup table, table log, bytes used).

    The table has ``2**log`` uint16 entries ``symbol | code length << 8``,
    indexed by the next ``log`` bits of a stream (most significant first).
    """
    if end <= pos:
        raise Corrupt("no room for the Huffman tree description")
    head = buf[pos]
    if head >= 128:
        n = head - 127
        used = (n + 1) // 2 + 1
        if used > end - pos:
            raise Corrupt("the Huffman weights run past the literals section")
        if n >= 256:
            raise Corrupt(f"{n} Huffman weights")
        raw = np.frombuffer(bytes(buf[pos + 1:pos + used]), np.uint8)
        weights = np.stack([raw >> 4, raw & 15], axis=1).reshape(-1)[:n].astype(np.int64)
    else:
        used = head + 1
        if used > end - pos:
            raise Corrupt("the Huffman weights run past the literals section")
        weights = np.asarray(_fse_weights(buf, pos + 1, head), np.int64)
    if (weights > HUF_MAX_LOG).any():
        raise Corrupt(f"a Huffman weight over {HUF_MAX_LOG}")
    total = int(((1 << weights) >> 1).sum())
    if total == 0:
        raise Corrupt("Huffman weights all 0")
    log = highbit(total) + 1
    if log > HUF_MAX_LOG:
        raise Corrupt(f"a Huffman tree of depth {log}, over {HUF_MAX_LOG}")
    rest = (1 << log) - total
    if rest & (rest - 1):
        raise Corrupt("Huffman weights whose implied last weight is not a power of 2")
    weights = np.append(weights, highbit(rest) + 1)
    ones = int((weights == 1).sum())
    if ones < 2 or ones & 1:
        raise Corrupt("a Huffman tree with an odd number (or fewer than 2) of longest codes")
    symbols = np.nonzero(weights)[0]
    w = weights[symbols]
    order = np.lexsort((symbols, w))
    symbols, w = symbols[order], w[order]
    entries = (symbols | ((log + 1 - w) << 8)).astype(np.uint16)
    table = np.repeat(entries, 1 << (w - 1))
    assert len(table) == 1 << log
    return table, log, used


# libzstd's choice between its one- and two-symbol Huffman decoders (huf_decompress.c, algoTime), which
# decides how the last symbol of a stream is checked (see zstd_decode.cl, huf_streams).
_ALGO_TIME = ((0, 0, 1, 1), (0, 0, 1, 1), (150, 216, 381, 119), (170, 205, 514, 112), (177, 199, 539, 110),
              (197, 194, 644, 107), (221, 192, 735, 107), (256, 189, 881, 106), (359, 188, 1167, 109),
              (582, 187, 1570, 114), (688, 187, 1712, 122), (825, 186, 1965, 136), (976, 185, 2131, 150),
              (1180, 186, 2070, 175), (1377, 185, 1731, 202), (1412, 185, 1695, 202))


def two_symbol_decoder(lit_size: int, lit_csize: int) -> bool:
    """Whether libzstd decodes 4 Huffman streams of this size with its two-symbol decoder."""
    q = 15 if lit_csize >= lit_size else lit_csize * 16 // lit_size
    d256 = lit_size >> 8
    t = _ALGO_TIME[q]
    t0 = t[0] + t[1] * d256
    t1 = t[2] + t[3] * d256
    t1 += t1 >> 5
    return t1 < t0

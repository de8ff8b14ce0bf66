"""Huffman tables for zstd's literals, built on the host from a histogram (RFC 8878 section 4.2.1).

What the device encoder (:mod:`~dgemm.opencl.codecs.zstd_encode`) needs from a
region's byte histogram, a few hundred bytes of work per region:

* :func:`code_lengths`: a Huffman code's lengths, limited to
  :data:`MAX_BITS` (11, libzstd's default for literals; the format allows
  up to 11): Huffman's lengths, then, if the longest exceeds the limit, the
  long codes cut to it and the Kraft sum brought back to exactly 1 by
  lengthening the least frequent shorter codes (only rare symbols are
  touched; the cost is a few bytes in a region);
* :func:`codes`: zstd's canonical codes for those lengths, as the
  decoder's table assigns them (weights ascending, symbols ascending within
  a weight), each a ``code | length << 16`` word the kernel looks up;
* :func:`tree_description`: the Huffman tree description a
  Compressed_Literals_Block starts with: the weights of every symbol but
  the last present one (whose weight the decoder deduces), 4 bits each
  when there are at most 128 of them, or FSE-compressed (always for float
  data, whose bytes take all 256 values) with an accuracy log of 6 (section
  4.1.1's table description, then a bitstream of two interleaved states read
  backwards), whichever is shorter; the tables of recent code lengths are
  kept (:func:`table`).

The FSE encoder follows libzstd's ``FSE_compress_usingCTable`` in its
bitstream: the decoder (``FSE_decompress_wksp``, ``HUF_readStats``) finds the
number of weights only by where the stream runs out, so the last two
weights' states are the first (lowest) cells of their symbols, whose update
reads at least one bit: that read overruns the stream and ends decoding
with the other state's weight.  Nothing here needs a device or pyopencl.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

MAX_BITS = 11              # the longest Huffman code (libzstd's HUF_TABLELOG_DEFAULT for literals)
MAX_DIRECT_WEIGHTS = 128   # weights stored 4 bits each: at most this many
FSE_LOGS = (6,)            # accuracy logs tried for compressed weights (6, the format's maximum here: 5 saves
                           # a byte or two of a 64 MiB frame at times, and costs as much time again)
MAX_FSE_DESCRIPTION = 127  # the header byte of FSE-compressed weights gives their size, below 128


class BitWriter:
    """Bits appended from the least significant end, as zstd's backward streams are written."""

    def __init__(self):
        self.value = 0
        self.count = 0

    def put(self, value: int, nbits: int) -> None:
        self.value |= (int(value) & ((1 << nbits) - 1)) << self.count
        self.count += nbits

    def bytes(self) -> bytes:
        """The bits so far, the last byte padded with zeros."""
        return self.value.to_bytes((self.count + 7) // 8, "little")

    def close(self) -> bytes:
        """The stream closed as a backward stream: a 1 bit after the last, then zeros to the byte."""
        self.put(1, 1)
        return self.bytes()


def code_lengths(counts, max_bits: int = MAX_BITS) -> np.ndarray:
    """Each byte's code length (0: absent) for a histogram of 256 counts with at least 2 symbols present.

    Examples
    --------
    >>> code_lengths([5, 3, 1, 1] + [0] * 252)[:4].tolist()
    [1, 2, 3, 3]
    """
    counts = np.asarray(counts, np.int64).reshape(-1)
    present = np.flatnonzero(counts)
    n = len(present)
    if n < 2:
        raise ValueError(f"a Huffman code needs at least 2 symbols, the histogram has {n}")
    if n > 1 << max_bits:
        raise ValueError(f"{n} symbols do not fit codes of at most {max_bits} bits")
    # Huffman's merges with two queues (the leaves sorted, the merged nodes in the order made)
    order = np.argsort(counts[present], kind="stable")
    weight = counts[present][order].tolist() + [0] * (n - 1)
    parent = [0] * (2 * n - 1)
    i, j = 0, n                   # the next leaf, the next merged node
    for node in range(n, 2 * n - 1):
        pair = []
        for _ in range(2):
            if j < node and (i >= n or weight[j] < weight[i]):
                pair.append(j)
                j += 1
            else:
                pair.append(i)
                i += 1
        parent[pair[0]] = parent[pair[1]] = node
        weight[node] = weight[pair[0]] + weight[pair[1]]
    depth = [0] * (2 * n - 1)
    for i in range(2 * n - 3, -1, -1):     # a parent's number is above its children's
        depth[i] = depth[parent[i]] + 1
    lens = np.empty(n, np.int64)
    lens[order] = depth[:n]
    if lens.max() > max_bits:
        lens = _limit(lens, counts[present], max_bits)
    out = np.zeros(counts.size, np.uint8)
    out[present] = lens
    return out


def _limit(lens: np.ndarray, counts: np.ndarray, limit: int) -> np.ndarray:
    """Lengths cut to ``limit`` and made a complete code again (Kraft sum exactly 1), losing little."""
    lens = np.minimum(lens, limit)
    target = 1 << limit
    kraft = int((1 << (limit - lens)).sum())     # in units of 2**-limit
    scale = int(counts.max()) + 1
    while kraft > target:
        # lengthen a code shorter than the limit: the longest such (the smallest step), least frequent first
        key = np.where(lens < limit, lens * scale - counts, -1)
        k = int(np.argmax(key))
        kraft -= 1 << (limit - lens[k] - 1)
        lens[k] += 1
    while kraft < target:
        # a step too far: shorten the most frequent code whose step still fits
        step = 1 << (limit - lens)
        fits = (lens > 1) & (step <= target - kraft)
        k = int(np.argmax(np.where(fits, counts, -1)))
        kraft += 1 << (limit - lens[k])
        lens[k] -= 1
    return lens


def weights(lengths) -> tuple[np.ndarray, int]:
    """zstd's weights of a code (``max_bits + 1 - length``, 0 for absent symbols) and ``max_bits``."""
    lengths = np.asarray(lengths, np.int64)
    top = int(lengths.max())
    return np.where(lengths > 0, top + 1 - lengths, 0).astype(np.uint8), top


def codes(lengths) -> np.ndarray:
    """Each symbol's ``code | length << 16`` (0 for absent symbols), as zstd's decoder assigns the codes.

    The decoder's table gives each weight's symbols, weights ascending and
    symbols ascending within a weight, consecutive ranges of ``2**(weight-1)``
    entries; a code is its range's start shifted down by ``weight - 1``.
    """
    w, top = weights(lengths)
    out = np.zeros(w.size, np.uint32)
    start = 0
    for weight in range(1, top + 1):
        syms = np.flatnonzero(w == weight)
        starts = start + (np.arange(syms.size, dtype=np.int64) << (weight - 1))
        out[syms] = (starts >> (weight - 1)).astype(np.uint32) | np.uint32((top + 1 - weight) << 16)
        start += syms.size << (weight - 1)
    if start != 1 << top:
        raise ValueError(f"code lengths are not a complete code (Kraft sum {start} / {1 << top})")
    return out


def tree_description(lengths) -> bytes | None:
    """The Huffman tree description of a code, or None when the format cannot describe it.

    None where the weights are too many for 4 bits each and do not compress
    to under 128 bytes with FSE (libzstd gives up there too: such a code
    saves nothing on a block).
    """
    w, _ = weights(lengths)
    last = int(np.flatnonzero(w)[-1])
    explicit = [int(x) for x in w[:last]]
    found = []
    if len(explicit) <= MAX_DIRECT_WEIGHTS:
        padded = explicit + [0] * (len(explicit) & 1)
        found.append(bytes([127 + len(explicit)]) + bytes((padded[i] << 4) | padded[i + 1]
                                                          for i in range(0, len(padded), 2)))
    for log in FSE_LOGS:
        body = fse_compress(explicit, log)
        if body is not None and len(body) <= MAX_FSE_DESCRIPTION:
            found.append(bytes([len(body)]) + body)
    return min(found, key=len) if found else None


def normalize(counts, log: int) -> list[int]:
    """Counts scaled to sum to ``2**log``, every present symbol at least 1 (no "less than 1" cells)."""
    counts = np.asarray(counts, np.float64)
    size = 1 << log
    share = counts * size / counts.sum()
    norm = np.where(counts > 0, np.maximum(1, np.floor(share)), 0).astype(np.int64)
    short = size - int(norm.sum())
    if short > 0:       # the largest remainders get one more
        norm[np.argsort(np.where(counts > 0, share - norm, -np.inf))[::-1][:short]] += 1
    while norm.sum() > size:
        norm[int(np.argmax(np.where(norm > 1, norm - share, -np.inf)))] -= 1
    return [int(x) for x in norm]


def write_ncount(norm, log: int) -> bytes:
    """An FSE table description (RFC 8878 4.1.1) of normalized counts, as libzstd's FSE_writeNCount writes it."""
    bits = BitWriter()
    bits.put(log - 5, 4)
    size = 1 << log
    remaining, threshold, nbits = size + 1, size, log + 1
    symbol, previous0 = 0, False
    while symbol < len(norm) and remaining > 1:
        if previous0:
            start = symbol
            while norm[symbol] == 0:
                symbol += 1
            while symbol >= start + 24:
                start += 24
                bits.put(0xFFFF, 16)
            while symbol >= start + 3:
                start += 3
                bits.put(3, 2)
            bits.put(symbol - start, 2)
        count = norm[symbol]
        symbol += 1
        most = 2 * threshold - 1 - remaining
        remaining -= abs(count)
        count += 1
        if count >= threshold:
            count += most
        bits.put(count, nbits - (count < most))
        previous0 = count == 1
        while remaining < threshold:
            nbits -= 1
            threshold >>= 1
    if remaining != 1:
        raise ValueError("normalized counts do not sum to the table size")
    return bits.bytes()


def fse_cells(norm, log: int) -> list[tuple[int, int, int]]:
    """The decoder's cells ``(symbol, nbBits, baseline)``: section 4.1.1's spread, then each cell's state."""
    size = 1 << log
    step, mask = (size >> 1) + (size >> 3) + 3, size - 1
    spread = [0] * size
    pos = 0
    for s, n in enumerate(norm):
        for _ in range(n):
            spread[pos] = s
            pos = (pos + step) & mask
    following = list(norm)
    cells = []
    for s in spread:
        x = following[s]
        following[s] += 1
        nb = log - (x.bit_length() - 1)
        cells.append((s, nb, (x << nb) - size))
    return cells


def fse_compress(symbols, log: int) -> bytes | None:
    """``symbols`` FSE-compressed as zstd's Huffman weights are (table description, then the bitstream).

    None when FSE cannot carry them: fewer than 3 symbols, or a single distinct
    value (a one-symbol table never runs out of bits, so the decoder would not stop).
    """
    n = len(symbols)
    counts = np.bincount(np.asarray(symbols, np.int64)) if n else np.zeros(0, np.int64)
    if n < 3 or np.count_nonzero(counts) < 2 or np.count_nonzero(counts) > 1 << log:
        return None
    norm = normalize(counts, log)
    cells = fse_cells(norm, log)
    first = {}
    # encode[s][x]: the cell of symbol s whose update lands on state x
    encode = {s: [0] * (1 << log) for s in range(len(norm)) if norm[s]}
    for u, (s, nb, base) in enumerate(cells):
        first.setdefault(s, u)
        for x in range(base, base + (1 << nb)):
            encode[s][x] = u
    # the decoder: state 1 and state 2 read first; symbol i from state 1 (even i) or 2 (odd i), each
    # followed by its state's update, until the update after symbol n-2 runs past the stream
    state = [0] * n
    state[n - 1], state[n - 2] = first[symbols[n - 1]], first[symbols[n - 2]]
    updates = [None] * n
    for i in range(n - 3, -1, -1):
        target = state[i + 2]
        u = encode[symbols[i]][target]
        state[i] = u
        _, nb, base = cells[u]
        updates[i] = (target - base, nb)
    value, count = 0, 0
    for i in range(n - 3, -1, -1):      # read last, written first
        v, nb = updates[i]
        value |= v << count
        count += nb
    bits = BitWriter()
    bits.value, bits.count = value, count
    bits.put(state[1], log)
    bits.put(state[0], log)
    return write_ncount(norm, log) + bits.close()


# Tables by their code lengths: the regions of one product (stationary data) mostly get the same
# lengths, and the codes and the description depend on nothing else.
_TABLES: OrderedDict = OrderedDict()
_TABLES_KEPT = 64
_TABLES_LOCK = threading.Lock()


def table(counts, max_bits: int = MAX_BITS):
    """``(codes, description, lengths)`` for a histogram, or None where no Huffman table applies.

    None for fewer than 2 symbols present and for codes the format cannot
    describe (see :func:`tree_description`).  ``codes`` and ``lengths`` are
    read-only: the codes and description of recent lengths are kept and shared.
    """
    counts = np.asarray(counts, np.int64)
    if np.count_nonzero(counts) < 2:
        return None
    lens = code_lengths(counts, max_bits)
    key = lens.tobytes()
    with _TABLES_LOCK:
        kept = _TABLES.get(key)
        if kept is not None:
            _TABLES.move_to_end(key)
            return kept
    desc = tree_description(lens)
    made = None
    if desc is not None:
        codes_ = codes(lens)
        codes_.setflags(write=False)
        lens.setflags(write=False)
        made = codes_, desc, lens
    with _TABLES_LOCK:
        _TABLES[key] = made
        while len(_TABLES) > _TABLES_KEPT:
            _TABLES.popitem(last=False)
    return made

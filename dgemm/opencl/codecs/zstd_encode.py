"""zstd frames written on the device: literal-only blocks, only the compressed bytes downloaded.

A GEMM's products hardly repeat, so what zstd gains on them comes from
entropy-coding their bytes, not from matches.  A block of nothing but
Huffman-coded literals (a Compressed_Literals_Block, or a
Treeless_Literals_Block reusing the frame's table, and 0 sequences) is valid
zstd (RFC 8878), and every byte of it can be written in parallel: here each
region of a device buffer becomes one frame of such blocks, readable by
libzstd, numcodecs and zarr, with its content size in the header and no
checksum (numcodecs' and zarr's default).

The steps (kernels in ``dgemm/kernels/zstd_encode.cl``):

1. the host cuts each region into 128 KiB blocks and each block into its
   literal streams (4, or 1 for a block under 256 bytes), one row each;
2. ``zstd_histogram`` counts each stream's bytes and sums each region's
   counts; the region histograms come down (1 KiB each);
3. the host builds one Huffman table per region (:mod:`.huffman`: code
   lengths of at most 11 bits, their tree description); products are
   stationary, so one table per region costs almost nothing against one per
   block (``bench/notes/issue-28/zstd_encode.py`` measures it);
4. ``zstd_stream_bits`` gives each stream's exact size under its region's
   table (and whether its block is one repeated byte); 12 bytes per stream
   come down;
5. the host lays the frames out: each block is an RLE block (one repeated
   byte), a compressed block where that is smaller than the block (the
   frame's first one carries the table, later ones reuse it), else a raw
   block; it writes every header, tree description and jump table;
6. ``zstd_encode_streams`` writes every stream at its final offset, and
   ``copy_rows`` puts the host's bytes and the raw blocks around them;
   the frames, back to back in one device buffer, come down in one copy.

:func:`encode_zstd` blocks until the frames are on the host.
"""
from __future__ import annotations

import time

import numpy as np

from dgemm.errors import DgemmError
from dgemm.opencl import nogil
from dgemm.opencl.codecs import _programs, huffman

MAGIC = b"\x28\xb5\x2f\xfd"
BLOCK = 128 * 1024            # zstd's largest block
SINGLE_STREAM_MAX = 255       # literals in one stream below 256 bytes (libzstd's choice), 4 streams above
STREAM_WORDS = 8200           # ZE_STREAM_WORDS: a stream of 32 KiB literals coded in up to 8 bits each, and slack
RAW, RLE, COMPRESSED = 0, 1, 2              # block types (RFC 8878 3.1.1.2)
LIT_COMPRESSED, LIT_TREELESS = 2, 3         # literals block types (3.1.1.3.1.1)
ENCODE_ERRORS = {1: "the kernel coded a different number of bits than zstd_stream_bits counted",
                 2: "a stream does not fit the kernel's local memory"}


class ZstdEncodeError(DgemmError, RuntimeError):
    """The device's zstd encoder failed a check of its own: a bug, not bad input; the message names the region."""


def frame_header(nbytes: int) -> bytes:
    """A single-segment frame header (no window descriptor) with the content size in the fewest bytes.

    >>> frame_header(0).hex(), frame_header(300).hex()
    ('28b52ffd2000', '28b52ffd602c00')
    """
    if nbytes < 256:
        return MAGIC + bytes([0x20, nbytes])
    if nbytes < 65536 + 256:
        return MAGIC + bytes([0x60]) + (nbytes - 256).to_bytes(2, "little")
    if nbytes < 1 << 32:
        return MAGIC + bytes([0xA0]) + nbytes.to_bytes(4, "little")
    return MAGIC + bytes([0xE0]) + nbytes.to_bytes(8, "little")


def _header_length(nbytes: np.ndarray) -> np.ndarray:
    return 5 + np.select([nbytes < 256, nbytes < 65536 + 256, nbytes < 1 << 32], [1, 2, 4], 8)


class Layout:
    """Blocks and literal streams of the regions, before anything is known of their bytes.

    Block arrays (one entry per block, regions in order): ``region``,
    ``index`` (within its region), ``src`` (offset in the buffer), ``size``,
    ``first`` (its first stream row), ``nstreams`` (0, 1 or 4).  ``rows``:
    per stream (source offset, literals, region, destination offset: 0 until laid out).
    """

    def __init__(self, offsets, nbytes):
        self.offsets = np.asarray(offsets, np.int64).reshape(-1)
        self.nbytes = np.asarray(nbytes, np.int64).reshape(-1)
        counts = np.maximum(1, -(-self.nbytes // BLOCK))        # an empty region: one empty block
        self.region = np.repeat(np.arange(len(counts)), counts)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.index = np.arange(len(self.region)) - starts[self.region]
        self.src = self.offsets[self.region] + self.index * BLOCK
        self.size = np.minimum(BLOCK, self.nbytes[self.region] - self.index * BLOCK)
        self.nstreams = np.select([self.size == 0, self.size <= SINGLE_STREAM_MAX], [0, 1], 4)
        self.first = np.concatenate([[0], np.cumsum(self.nstreams)[:-1]]).astype(np.int64)
        block = np.repeat(np.arange(len(self.size)), self.nstreams)
        k = np.arange(len(block)) - self.first[block]
        seg = np.where(self.nstreams == 4, (self.size + 3) // 4, self.size)[block]
        length = np.where(k < 3, seg, self.size[block] - 3 * seg)
        length = np.where(self.nstreams[block] == 1, self.size[block], length)
        self.stream_block = block
        self.rows = np.zeros((len(block), 4), np.uint64)
        self.rows[:, 0] = self.src[block] + k * seg
        self.rows[:, 1] = length
        self.rows[:, 2] = self.region[block]


def _lit_header(kind, regen, csize, nstreams):
    """Literals section headers (RFC 8878 3.1.1.3.1.1) as (value, length): 1 stream 3 bytes, else 3, 4 or 5."""
    most = np.maximum(regen, csize)
    length = np.where(nstreams == 1, 3, np.select([most < 1024, most < 16384], [3, 4], 5))
    fmt = np.where(nstreams == 1, 0, length - 2)
    shift = np.select([length == 3, length == 4], [14, 18], 22)
    value = (kind.astype(np.uint64) | (fmt.astype(np.uint64) << np.uint64(2)) | (regen.astype(np.uint64) << np.uint64(4))
             | (csize.astype(np.uint64) << shift.astype(np.uint64)))
    return value, length


class Frames:
    """The frames laid out: every block's kind and offset, the stream rows to encode and the bytes to copy.

    Built from the stream sizes (``stream_bits``: bits, distinct bytes,
    largest byte per stream) and each region's table (``tables``: None or
    ``(codes, description, lengths)``).
    """

    def __init__(self, layout: Layout, stream_bits: np.ndarray, tables: list):
        lay = layout
        nblocks, nregions = len(lay.size), len(lay.nbytes)
        bits = stream_bits[:, 0].astype(np.int64)
        sbytes = bits // 8 + 1
        desc_len = np.array([len(t[1]) if t is not None else 0 for t in tables], np.int64)
        has_table = np.array([t is not None for t in tables], bool)
        has = lay.nstreams > 0
        firsts = lay.first[has]

        def per_block(values, ufunc, empty):
            out = np.full(nblocks, empty, values.dtype)
            if firsts.size:
                out[has] = ufunc.reduceat(values, firsts)
            return out
        streams_bytes = per_block(sbytes, np.add, 0)
        fits = per_block(((24 + bits + 1 + 31) // 32 <= STREAM_WORDS), np.logical_and, True)
        distinct = stream_bits[:, 1].astype(np.int64)
        symbol = stream_bits[:, 2].astype(np.int64)
        # one repeated byte: no stream has two distinct bytes and all agree on which
        single = has & (per_block(distinct, np.maximum, 0) <= 1)
        top = per_block(np.where(distinct > 0, symbol, -1), np.maximum, -1)
        low = per_block(np.where(distinct > 0, symbol, 256), np.minimum, 256)
        rle = single & (top == low) & (lay.size >= 2)
        jump = np.where(lay.nstreams == 4, 6, 0)
        region = lay.region
        content = {}
        for carried in (True, False):
            csize = jump + streams_bytes + np.where(carried, desc_len[region], 0)
            kind = np.full(nblocks, LIT_COMPRESSED if carried else LIT_TREELESS)
            value, length = _lit_header(kind, lay.size, csize, lay.nstreams)
            total = length + csize + 1         # and the sequences section: one byte, 0 sequences
            ok = has & has_table[region] & ~rle & fits & (total < lay.size)
            content[carried] = (ok, total, value, length)
        ok_first = content[True][0]
        # the table goes with the region's first block that still gains with it; later blocks reuse it
        candidate = np.where(ok_first, lay.index, np.iinfo(np.int64).max)
        first_table = np.full(nregions, np.iinfo(np.int64).max)
        np.minimum.at(first_table, region, candidate)
        carries = lay.index == first_table[region]
        treeless = content[False][0] & (lay.index > first_table[region])
        compressed = carries | treeless
        self.kind = np.select([rle, compressed], [RLE, COMPRESSED], RAW)
        comp_total, lit_value, lit_length = (np.where(carries, content[True][i], content[False][i])
                                             for i in (1, 2, 3))
        body = np.select([rle, compressed], [1, comp_total], lay.size)
        block_total = 3 + body
        header_len = _header_length(lay.nbytes)
        first_block = np.concatenate([[0], np.cumsum(np.bincount(region, minlength=nregions))[:-1]])
        before = np.concatenate([[0], np.cumsum(block_total)[:-1]])
        headers_through = np.cumsum(header_len)
        self.block_offset = before + headers_through[region]
        self.frame_offset = self.block_offset[first_block] - header_len
        self.frame_size = np.bincount(region, block_total, minlength=nregions).astype(np.int64) + header_len
        self.total = int(self.frame_size.sum())
        self.desc = np.where(carries, desc_len[region], 0)
        streams_at = self.block_offset + 3 + lit_length + self.desc + jump
        # the streams of compressed blocks, at their offsets
        enc = compressed[lay.stream_block]
        run = np.cumsum(sbytes) - sbytes
        start_of_block = run[lay.first[lay.stream_block]] if len(sbytes) else run
        rows = lay.rows.copy()
        rows[:, 3] = streams_at[lay.stream_block] + run - start_of_block
        self.encode_rows = np.ascontiguousarray(rows[enc])
        self.encode_bits = np.ascontiguousarray(bits[enc].astype(np.uint32))
        self.encode_owner = lay.stream_block[enc]
        # the host's bytes: per block 16 (block header and literals header, jump table, sequences byte)
        last = lay.index == np.bincount(region, minlength=nregions)[region] - 1
        size_field = np.where(self.kind == RLE, lay.size, body)
        bh = (last.astype(np.int64) | (self.kind << 1) | (size_field << 3)).astype("<u4")
        patch = np.zeros((nblocks, 16), np.uint8)
        patch[:, 0:3] = bh.view(np.uint8).reshape(-1, 4)[:, :3]
        lh = lit_value.astype("<u8").view(np.uint8).reshape(-1, 8)
        patch[:, 3:8] = np.where(compressed[:, None], lh[:, :5], 0)
        patch[:, 3] = np.where(rle, top, patch[:, 3])
        nstream = lay.nstreams
        jt = np.zeros((nblocks, 3), "<u2")
        four = np.flatnonzero(nstream == 4)
        if four.size:
            jt[four] = sbytes[lay.first[four][:, None] + np.arange(3)]
        patch[:, 8:14] = jt.view(np.uint8)
        self.region_tables = tables
        self.body = body
        self.patch = patch
        self.lit_length = lit_length
        self.compressed, self.rle, self.carries = compressed, rle, carries
        self.layout = lay

    def host_bytes(self):
        """``(bytes, rows from them, rows from the source buffer)``: what ``copy_rows`` puts around the streams."""
        lay, nregions = self.layout, len(self.layout.nbytes)
        heads = np.zeros((nregions, 16), np.uint8)
        descs = np.zeros((nregions, 128), np.uint8)
        for r in range(nregions):
            h = frame_header(int(lay.nbytes[r]))
            heads[r, :len(h)] = np.frombuffer(h, np.uint8)
            if self.region_tables[r] is not None:
                d = self.region_tables[r][1]
                descs[r, :len(d)] = np.frombuffer(d, np.uint8)
        data = np.concatenate([heads.reshape(-1), descs.reshape(-1), self.patch.reshape(-1)])
        desc_base, patch_base = 16 * nregions, 16 * nregions + 128 * nregions
        blocks = np.arange(len(lay.size))
        at = self.block_offset
        comp = self.compressed
        head_len = np.select([self.rle, comp], [4, 3 + self.lit_length], 3)
        pieces = [
            np.stack([16 * np.arange(nregions), self.frame_offset, _header_length(lay.nbytes)], axis=1),
            np.stack([patch_base + 16 * blocks, at, head_len], axis=1),
            np.stack([desc_base + 128 * lay.region, at + 3 + self.lit_length, self.desc], axis=1)[self.carries],
            np.stack([patch_base + 16 * blocks + 8, at + 3 + self.lit_length + self.desc,
                      np.full(len(at), 6)], axis=1)[comp & (lay.nstreams == 4)],
            np.stack([patch_base + 16 * blocks + 14, at + 2 + self.body, np.ones(len(at), np.int64)], axis=1)[comp],
        ]
        rows = np.ascontiguousarray(np.concatenate(pieces).astype(np.uint64))
        raw = (self.kind == RAW) & (lay.size > 0)
        raw_rows = np.ascontiguousarray(np.stack([lay.src, at + 3, lay.size], axis=1)[raw].astype(np.uint64))
        return data, rows, raw_rows


# -- the device side -------------------------------------------------------------------------------


def default_lanes(device) -> int:
    """Work-items per stream (``ZE_WG``): 256 on a GPU, 16 on a CPU device (few lanes, little to share)."""
    return 16 if device.info.type == "CPU" else 256


def program(device, lanes: int):
    """``zstd_encode.cl`` built for ``device`` with ``ZE_WG=lanes``, once per (device, lanes)."""
    # (2 on a CPU device, where lanes do not contend, so that the tests sum copies too)
    copies = 2 if device.info.type == "CPU" else 8
    return _programs.program(device, "zstd_encode.cl",
                             (("ZE_WG", lanes), ("ZE_STREAM_WORDS", STREAM_WORDS), ("ZE_HIST_COPIES", copies)),
                             (("histogram", "zstd_histogram"), ("stream_bits", "zstd_stream_bits"),
                              ("encode", "zstd_encode_streams"), ("copy", "copy_rows")),
                             lanes=lanes)


def frame_bound(nbytes: int) -> int:
    """The most bytes :func:`encode_zstd` writes for a region of ``nbytes`` (all raw blocks).

    >>> frame_bound(0), frame_bound(BLOCK + 1)
    (9, 131088)
    """
    return int(_header_length(np.array([nbytes]))[0]) + 3 * max(1, -(-nbytes // BLOCK)) + nbytes


def region_tables(hists: np.ndarray) -> list:
    """Each region's Huffman table from its histogram (:func:`huffman.table`), None where none applies."""
    return [huffman.table(h) for h in hists]


def encode_zstd(device, buf, offsets, nbytes, names=None, events: list | None = None, lanes: int | None = None,
                timings: dict | None = None, host: np.ndarray | None = None, keep: bool = False,
                queue=None, wait_for=None) -> list:
    """Encode regions of a device buffer as zstd frames on the device; returns one frame per region.

    Parameters
    ----------
    device : dgemm.opencl.device.Device
        Where ``buf`` lives.
    buf : pyopencl.Buffer
        The bytes to encode.
    offsets, nbytes : sequence of int
        Region ``i`` is ``buf[offsets[i] : offsets[i] + nbytes[i]]``.
    names : sequence of str, optional
        What errors call each region (store keys); by default ``region 0``, ``region 1``...
    events : list, optional
        Gets ``(what, event)`` for each kernel and copy (``histogram``, ``stream_bits``,
        ``encode``, ``copy``, ``upload``, ``download``), for their profiling times.
    lanes : int, optional
        Work-items per stream (``ZE_WG``); :func:`default_lanes` by default.
    timings : dict, optional
        Gets the host's seconds: ``tables`` (Huffman tables and their descriptions), ``layout``.
    host : numpy.ndarray, optional
        A uint8 host array (page-locked, ideally) of at least the sum of
        :func:`frame_bound` over the regions: the frames are downloaded into it,
        back to back from its start, and returned as memoryviews of it, with no
        copy (the copy into ``bytes`` of a large frame costs more than its download).
    keep : bool
        Take the device buffers from the slot of :attr:`Device.encode_scratch` that the caller holds
        (``with device.encode_scratch.slot():``), kept for the next call and given back by
        ``Device.trim``, instead of allocating and releasing them: NVIDIA's driver releases a
        buffer only once the device is idle, so a release waits for the kernels running beside it.
    queue : pyopencl.CommandQueue, optional
        An in-order queue of the device's where every command of the call runs, the frames' download
        among them; the device's queue (the GEMMs') by default.
    wait_for : list of pyopencl.Event, optional
        What writes ``buf``: the first command that reads it waits for these (another queue's).

    Returns
    -------
    list of bytes (or of memoryview, with ``host``)
        Standard zstd frames (single segment, content size, no checksum).

    Raises
    ------
    ValueError
        A region outside ``buf``.
    ZstdEncodeError
        A kernel's own check failed (a bug; the frames would be wrong).
    """
    import pyopencl as cl

    offsets = [int(o) for o in offsets]
    nbytes = [int(n) for n in nbytes]
    if len(offsets) != len(nbytes):
        raise ValueError(f"{len(offsets)} offsets for {len(nbytes)} region sizes")
    names = list(names) if names is not None else [f"region {i}" for i in range(len(offsets))]
    for o, n, name in zip(offsets, nbytes, names):
        if o < 0 or n < 0 or o + n > buf.size:
            raise ValueError(f"{name}: its {n} bytes at {o} are outside the {buf.size}-byte buffer")
    if not offsets:
        return []
    if host is not None and host.nbytes < sum(frame_bound(n) for n in nbytes):
        raise ValueError(f"the host array's {host.nbytes} bytes may not hold the frames "
                         f"(up to {sum(frame_bound(n) for n in nbytes)} bytes)")
    if keep and not device.encode_scratch.holding():
        raise RuntimeError("encode_zstd(keep=True) outside the device's encoder slot (device.encode_scratch.slot())")
    lanes = lanes or default_lanes(device)
    prog = program(device, lanes)
    layout = Layout(offsets, nbytes)
    nrows, nregions = len(layout.rows), len(offsets)
    queue = queue if queue is not None else device.queue
    buffers = []

    def record(what, event):
        if events is not None:
            events.append((what, event))

    def take(nbytes, what):
        if keep:
            return device.encode_scratch.buffer(what, nbytes)
        out = device.buffer(max(nbytes, 1), what)
        buffers.append(out)
        return out

    def upload(host, what):
        out = take(host.nbytes, what)
        if host.nbytes:
            record("upload", cl.enqueue_copy(queue, out, host, is_blocking=False))
        return out

    try:
        with device.failing("encoding zstd frames"):
            stream_bits = np.zeros((0, 3), np.uint32)
            tables = [None] * nregions
            if nrows:
                rows = upload(layout.rows, "zstd stream rows")
                hists = take(nrows * 1024, "zstd stream histograms")
                region_hists = take(nregions * 1024, "zstd region histograms")
                record("upload", cl.enqueue_fill_buffer(queue, region_hists, np.uint32(0), 0, nregions * 1024))
                with prog.lock:
                    record("histogram", prog.histogram(queue, (nrows * lanes,), (lanes,), buf, rows, hists,
                                                       region_hists, wait_for=wait_for))
                wait_for = None     # (what follows on the in-order queue runs after the histograms)
                counts = np.empty((nregions, 256), np.uint32)
                # behind the block's last GEMMs: waited for outside the driver (there a blocking read or
                # clWaitForEvents spins a core as long, and a blocking read holds NVIDIA's driver lock)
                record("download", nogil.copied(queue, counts, region_hists))
                t0 = time.perf_counter()
                tables = region_tables(counts)
                if timings is not None:
                    timings["tables"] = timings.get("tables", 0.0) + time.perf_counter() - t0
                codes = np.zeros((nregions, 256), np.uint32)
                for r, t in enumerate(tables):
                    if t is not None:
                        codes[r] = t[0]
                codes_buf = upload(codes, "zstd Huffman codes")
                bits_buf = take(nrows * 12, "zstd stream sizes")
                width = -(-nrows // 64) * 64
                with prog.lock:
                    record("stream_bits", prog.stream_bits(queue, (width,), None, hists, rows, codes_buf, bits_buf,
                                                           np.uint32(nrows)))
                stream_bits = np.empty((nrows, 3), np.uint32)
                record("download", nogil.copied(queue, stream_bits, bits_buf))
            t0 = time.perf_counter()
            frames = Frames(layout, stream_bits, tables)
            data, patch_rows, raw_rows = frames.host_bytes()
            if timings is not None:
                timings["layout"] = timings.get("layout", 0.0) + time.perf_counter() - t0
            out = take(frames.total, "zstd frames")
            errors = np.empty(len(frames.encode_rows), np.uint32)
            launched = []
            patches = upload(data, "zstd headers")
            patch_buf = upload(patch_rows, "zstd header rows")
            raw_buf = upload(raw_rows, "zstd raw block rows") if len(raw_rows) else None
            if len(errors):
                enc_rows = upload(frames.encode_rows, "zstd encode rows")
                enc_bits = upload(frames.encode_bits, "zstd encode sizes")
                err_buf = take(errors.nbytes, "zstd encode errors")
            with prog.lock:
                if len(errors):
                    launched.append(("encode", prog.encode(queue, (len(errors) * lanes,), (lanes,), buf, enc_rows,
                                                           codes_buf, enc_bits, out, err_buf, wait_for=wait_for)))
                    wait_for = None
                launched.append(("copy", prog.copy(queue, (len(patch_rows) * lanes,), (lanes,), patches, out,
                                                   patch_buf)))
                if raw_buf is not None:
                    launched.append(("copy", prog.copy(queue, (len(raw_rows) * lanes,), (lanes,), buf, out, raw_buf,
                                                       wait_for=wait_for)))
            for what, event in launched:
                record(what, event)
            # waited for by event, not by the queue's finish: other calls' commands may follow on it
            reads = [cl.enqueue_copy(queue, errors, err_buf, is_blocking=False)] if len(errors) else []
            into = np.empty(frames.total, np.uint8) if host is None else host.reshape(-1).view(np.uint8)[:frames.total]
            reads.append(cl.enqueue_copy(queue, into, out, is_blocking=False))
            for r in reads:
                record("download", r)
            queue.flush()
            nogil.wait(reads)
    finally:
        for b in buffers:
            b.release()
    bad = np.flatnonzero(errors)
    if bad.size:
        k = int(bad[0])
        block = int(frames.encode_owner[k])
        region = int(layout.region[block])
        what = ENCODE_ERRORS.get(int(errors[k]), f"error {int(errors[k])}")
        raise ZstdEncodeError(f"{names[region]}: zstd encode of block {int(layout.index[block])}: {what}")
    spans = zip(frames.frame_offset.tolist(), frames.frame_size.tolist())
    if host is not None:
        view = memoryview(into)
        return [view[o:o + n] for o, n in spans]
    return [into[o:o + n].tobytes() for o, n in spans]

"""zstd frames (numcodecs' and zarr's ``Zstd``, Zarr's default compressor) decoded on the device.

The host reads each frame's headers and sequence table descriptions
(:mod:`.zstd_frames`, a few bytes per block, with the decode tables from
:mod:`.zstd_entropy`) and finds its Huffman tree descriptions, and uploads the
frames with compact tables; kernels of ``dgemm/kernels/zstd_decode.cl`` do the rest:

0. ``zstd_huf_trees``: every Huffman tree description, one work-group each
   (its first lane decodes the weights, with :func:`.zstd_entropy.huffman_tree`'s
   arithmetic, its lanes fill the lookup table) into a slot of 4096 entries
   per tree; a refused description's error code becomes the message the host
   would have given (:data:`TREE_ERRORS`);
1. ``zstd_huf_streams``: every Huffman literal stream of every block of every
   frame at once, into a literal buffer (a work-group per block holds the
   block's lookup table in local memory: a symbol's time is a table lookup's
   latency), or, for a block of the prefix below whose literals are its output
   (most blocks of float chunks), straight into the output.  Each stream is
   split among :data:`HUF_SPLIT` work-items: each counts the symbols starting
   in its part from the part's first bit, the parts re-read from the true
   symbol starts until they meet their first reads (a Huffman code
   resynchronizes within a few symbols), and each decodes its symbols into
   place (``zstd_decode.cl``'s reader 6: twice the symbol work of one
   work-item a stream, at 16 times its parallelism);
2. ``zstd_sequences``: every compressed block's FSE sequence bitstream, one
   work-item per block (sequential within a block, blocks in parallel), into
   rows of (literal length, match length, offset code);
3. ``zstd_copy_blocks``: the blocks whose output position the headers tell (every
   raw, RLE and sequence-free block before a frame's first block with
   sequences), but for those the Huffman kernel wrote there, copied or filled
   all at once, one work-group per block, each write bounded by its frame's
   output;
4. the sequences executed (``zstd_decode.cl``'s "Sequence execution" notes): a
   block's output position and incoming repeat offsets need no output byte, so
   ``zstd_block_scan`` (a work-item per block after the copied prefix) sums each
   block's decoded size and reduces its effect on the repeat offsets to a small
   function, ``zstd_frame_scan`` (a work-group per frame) checks the copied
   prefix's blocks at once and runs through the rest's sizes and functions,
   integers only; ``zstd_blocks`` (a work-group per block) resolves the block's
   offsets, makes the serial walk's checks, marks the matches that read bytes of
   earlier blocks (or bytes such a match wrote), copies all its literals, then
   the other matches in order, and follows the marked matches' chains within the
   block to each byte's origin (an earlier block's byte or an unmarked one);
   ``zstd_origin_jump`` (a few rounds of pointer jumping) and ``zstd_origin_gather``
   (a work-item per 32 bytes of all frames) follow origins back across blocks to
   unmarked bytes and copy every marked byte at once; ``zstd_execute`` (a
   work-group per frame) takes the earliest failing block's error, checks
   the content size and, for a frame with a checksum, its first lane computes
   XXH64 of the output and compares its low 32 bits with the frame's (libzstd
   refuses a mismatch; so does this path).

Every kernel bounds every read by its own stream and every write by its frame's
output; error rows come back and become :class:`ZstdFrameError` messages naming
the frame, the block and what is wrong.

Compared with libzstd 1.5.4 (the reference the tests use): every frame this
path decodes, libzstd decodes to the same bytes, and every frame libzstd
refuses, this path refuses.  The converse does not hold for bitstreams that do
not end where their last symbol or sequence does (RFC 8878 requires that they
do): libzstd 1.5.4 decodes some of those (its 4-stream Huffman fast path does
not check where a stream ends; it reads the last sequence's state updates and
then takes a stream read past its start), to bytes of its own choosing, and
this path refuses them, as libzstd 1.5.6 does for sequences.  Nor for two
things RFC 8878 forbids that libzstd up to 1.5.5 took and later versions refuse
(zstd's doc/decompressor_permissive.md), as zarr's own reader (numcodecs) does:
an offset of 0 (repeat offset 1 less 1, where that is 1; taken as 1) and the
sequence modes' reserved bits (ignored).  This path refuses both.
"""
from __future__ import annotations

import numpy as np

from dgemm.opencl import nogil
from dgemm.opencl.codecs import _programs
from dgemm.opencl.codecs import zstd_devplan, zstd_fastplan
from dgemm.opencl.codecs import zstd_frames as zf
from dgemm.opencl.codecs.zstd_frames import ZstdFrameError, ZstdUnsupported

__all__ = ["ZstdFrameError", "ZstdUnsupported", "decode_zstd", "unsupported_reason", "supported",
           "default_lanes"]

STREAM_ERRORS = {1: "a Huffman literal stream runs out of bits before its last literal",
                 2: "a Huffman literal stream has bits left after its last literal"}
SEQUENCE_ERRORS = {1: "the sequence bitstream runs out of bits before its last sequence",
                   2: "the sequence bitstream has bits left after its last sequence"}
EXECUTE_ERRORS = {
    11: "a raw block of {d} bytes runs past the frame's content size",
    12: "an RLE block of {d} bytes runs past the frame's content size",
    13: "{d} literals, more than the block may hold (128 KiB or the rest of the content)",
    14: "sequence {d}'s literal length runs past the block's literals",
    15: "sequence {d} runs past the block's output bound",
    16: "sequence {d}'s offset reaches before the frame's start",
    17: "the last {d} literals run past the block's output bound",
    18: "the frame decodes to {d} bytes, not its content size",
    19: "the checksum of the decoded content does not match the frame's",
    20: "sequence {d}'s offset is 0 (repeat offset 1 less 1, after no literals)",
}
# zstd_huf_trees' codes: zstd_entropy.huffman_tree's Corrupt messages ({d}: the kernel's detail)
TREE_ERRORS = {
    1: "an FSE table description runs past its bytes",
    2: "an FSE table log of {d}, over 15",
    3: "an FSE table description whose counts do not add up to its table size",
    4: "an FSE table description with symbols past {d}",
    5: "Huffman weights' FSE table log {d}, over 6",
    6: "an empty bitstream",
    7: "a bitstream whose last byte is 0 (no end mark)",
    8: "more than 255 Huffman weights",
    9: "a Huffman weight over {d}",
    10: "Huffman weights all 0",
    11: "a Huffman tree of depth {d}, over 12",
    12: "Huffman weights whose implied last weight is not a power of 2",
    13: "a Huffman tree with an odd number (or fewer than 2) of longest codes",
}
HUF_SLOT = 4096     # lookup-table entries per tree (zstd_decode.cl's HUF_SLOT)
TREE_INFO = 4       # zstd_huf_trees' output per tree: log (0: refused), error code, detail, weights
STATE_COLUMNS = 11  # zstd_decode.cl's per-block state of the sequence execution (ST_...)
FSTATE_COLUMNS = 7  # and per frame (FS_...)
FS_ORG, FS_SERIAL = 5, 6    # where a frame's bytes start in the origins (a multiple of 32); no origins
# the messages of frames libzstd 1.5.4 may take: bitstreams (see the module's notes; its 4-stream Huffman fast
# path also takes a stream whose last byte, which holds the end mark, is 0), and what libzstd up to 1.5.5
# took and later ones refuse, as zarr's numcodecs does (zstd's doc/decompressor_permissive.md): an offset
# of 0, taken as 1, and the sequence modes' reserved bits, ignored
STRICT = ("runs out of bits", "has bits left", "no end mark", "offset is 0", "reserved bits")


def unsupported_reason(frame, name: str = "frame") -> str | None:
    """Why the device path leaves this frame to the host decoder, or None when it takes it.

    Corrupt frames are taken (the device path raises for them as libzstd
    does); left to the host: skippable and legacy frames, frames without a
    content size, and a frame followed by another.
    """
    return _programs.unsupported_reason(zstd_fastplan.plan, ZstdUnsupported, ZstdFrameError, frame, name)


def checked(frame, name: str = "frame") -> tuple:
    """``(unsupported_reason(frame, name), the frame's plan or None)``: the plan goes to the decode's ``plans``."""
    return _programs.checked(zstd_fastplan.plan, ZstdUnsupported, ZstdFrameError, frame, name)


# What decode_zstd raises where a frame given its head alone (headed) needs the host's plan: the caller asks again
# with every frame checked (codecs.Decoder.refused_light).
LIGHT_REFUSED = (ZstdUnsupported,)


def headed(frame, name: str = "frame") -> tuple:
    """``(unsupported_reason, head)``: :func:`checked`'s answer from the frame's header alone, its plan left to the
    device (a :class:`.zstd_devplan.FrameHead` for :func:`decode_zstd`'s ``plans``).

    What the worker's readers ask: planned in the readers, a 32768² product under ``on`` took 1.81 s against
    1.58 with every plan kept from run to run (one H200, 16 cores; bench/NOTES.md, issue 28, twenty-second
    session).  A frame whose header is corrupt gets ``(None, None)`` (the decode call plans it on the host and
    raises its error); one left to the host by what only its blocks tell (bytes after it that could be a
    frame) makes :func:`decode_zstd` raise :class:`ZstdUnsupported` before it enqueues a kernel.
    """
    try:
        return None, zstd_devplan.head(frame, name)
    except ZstdUnsupported as e:
        return str(e), None
    except ZstdFrameError:
        return None, None


def supported(frame) -> bool:
    """Whether :func:`decode_zstd` decodes this frame (else the host decoder must)."""
    return unsupported_reason(frame) is None


def default_lanes(device) -> int:
    """Lanes per block or frame in execution: 128 on a GPU (each copies 16 bytes a step), 1 (no barriers) on a CPU."""
    return 1 if device.info.type == "CPU" else 128


# zstd_decode.cl's ZSTD_HUF_READER (the Huffman streams' bit reader and stores), where set, its
# ZSTD_HUF_LANES (work-items per block's streams), ZSTD_HUF_LOCAL and ZSTD_HUF_FAST (reader 1's unchecked
# symbols where no check can fail), and reader 5's ZSTD_HUF_ILP (streams a work-item decodes in step) and
# ZSTD_HUF_BLOCKS (blocks a work-group decodes) and ZSTD_HUF_AHEAD (words loaded ahead): what program()
# builds (the decode bench sweeps them)
HUF_READER = 6
# reader 6's work-items a stream (ZSTD_HUF_SPLIT; ZSTD_HUF_LANES is 4 times it, or HUF_LANES where set): 16 was
# the fastest alone on an H200 (188 GB/s against 182 at 32 and 126 at 8), and 16 and 32 took the GEMMs beside
# them as little time (9-14 ms a decoded GB)
HUF_SPLIT = 16
HUF_LANES = None
HUF_LOCAL = 1
HUF_FAST = 1
HUF_ILP = 1
HUF_BLOCKS = 1
HUF_AHEAD = 1


def program(device, lanes: int):
    """``zstd_decode.cl`` built for ``device`` with ``ZSTD_LANES=lanes``, once per (device, lanes)."""
    huf = 4 if lanes < 32 else 32        # lanes per tree, and per block's Huffman streams (readers 0-5)
    # reader 5's blocks a work-group: one on a CPU device, where PoCL 3's compiler crashes on more
    blocks = HUF_BLOCKS if HUF_READER == 5 and device.info.type != "CPU" else 1
    split = (HUF_LANES // 4 if HUF_LANES else HUF_SPLIT) if HUF_READER == 6 else 1
    hlanes = 4 * split if HUF_READER == 6 else HUF_LANES or huf
    plan = 1 if lanes < 32 else 64      # zstd_plan's lanes a frame (its blocks' literal sections)
    return _programs.program(device, "zstd_decode.cl",
                             (("ZSTD_LANES", lanes), ("ZSTD_HUF_LANES", hlanes), ("ZSTD_TREE_LANES", huf),
                              ("ZSTD_PLAN_LANES", plan),
                              ("ZSTD_HUF_READER", HUF_READER), ("ZSTD_HUF_LOCAL", HUF_LOCAL),
                              ("ZSTD_HUF_FAST", HUF_FAST), ("ZSTD_HUF_ILP", HUF_ILP if HUF_READER == 5 else 1),
                              ("ZSTD_HUF_BLOCKS", blocks), ("ZSTD_HUF_AHEAD", HUF_AHEAD),
                              ("ZSTD_HUF_SPLIT", split)),
                             (("trees", "zstd_huf_trees"), ("streams", "zstd_huf_streams"),
                              ("sequences", "zstd_sequences"), ("execute", "zstd_execute"),
                              ("copy", "zstd_copy_blocks"), ("block_scan", "zstd_block_scan"),
                              ("frame_scan", "zstd_frame_scan"), ("blocks", "zstd_blocks"),
                              ("jump", "zstd_origin_jump"), ("gather", "zstd_origin_gather"),
                              ("plan", "zstd_plan")),
                             huf_lanes=hlanes, tree_lanes=huf, huf_blocks=blocks, plan_lanes=plan)


class Batch:
    """The frames' rows concatenated, offsets made global: what is uploaded.

    A few numpy operations over all the call's rows at once, not per frame: the call is made where
    every reader of a worker plans and enqueues at once, and Python's lock, which each operation holds,
    is what they wait for (bench/NOTES.md, issue 28, twenty-second session).
    """

    def __init__(self, plans, offsets, src=None):
        # src: where each frame starts in the bytes uploaded (None: the frames one after another from 0)
        nf = len(plans)
        count, before = _lengths, _before
        nb, ns, nt = (count([getattr(p, k) for p in plans]) for k in ("blocks", "streams", "trees"))
        src = (np.array(src, np.int64) if src is not None
               else before(np.array([p.csize for p in plans], np.int64)))
        lit = before(np.array([p.literals for p in plans], np.int64))
        seq = before(np.array([p.nseq for p in plans], np.int64))
        defaults = [t for t, _ in zf.defaults()]
        default_at = np.cumsum([0] + [len(t) for t in defaults])[:3]
        fse = int(sum(len(t) for t in defaults)) + before(count([p.fse for p in plans]))
        block_base, tree_base = before(nb), before(nt)
        size, out = np.array([p.size for p in plans], np.int64), np.array(offsets, np.int64)

        local = np.concatenate([p.blocks for p in plans])      # (as planned: offsets within each frame)
        fb = np.repeat(np.arange(nf), nb)
        b = local.copy()
        b[:, zf.B_FRAME] = fb
        b[:, zf.B_SRC] += src[fb]
        b[:, zf.B_SSRC] += src[fb]
        kind = local[:, zf.B_LITKIND]
        b[:, zf.B_LITOFF] += np.where(kind == zf.LIT_HUF, lit[fb], np.where(kind == zf.LIT_SRC, src[fb], 0))
        b[:, zf.B_SEQ] += seq[fb]
        for col, k in ((zf.B_LL, 0), (zf.B_OF, 1), (zf.B_ML, 2)):
            b[:, col] = np.where(local[:, col] < 0, default_at[k], local[:, col] + fse[fb])
        # Huffman literals of a prefix block (no sequences: its output is its literals) that fits the frame's
        # output go straight there; zstd_copy_blocks would copy them there unchanged
        pre = local[:, zf.B_PRE]
        self.direct = ((pre >= 0) & (local[:, zf.B_TYPE] == 2) & (kind == zf.LIT_HUF)
                       & (local[:, zf.B_LITLEN] <= size[fb] - pre))
        s = np.concatenate([p.streams for p in plans])
        fs = np.repeat(np.arange(nf), ns)
        g = s[:, zf.S_BLOCK] + block_base[fs]                   # each stream's block among the call's
        mine = self.direct[g]
        dst = s[:, zf.S_DST]
        s[:, zf.S_DST] = np.where(mine, out[fs] + pre[g] + dst - local[g, zf.B_LITOFF], dst + lit[fs])
        s[:, zf.S_OUT] = mine
        s[:, zf.S_SRC] += src[fs]
        s[:, zf.S_TABLE] += tree_base[fs]
        s[:, zf.S_BLOCK] = g
        t = np.concatenate([p.trees for p in plans])
        ft = np.repeat(np.arange(nf), nt)
        t[:, zf.T_SRC] += src[ft]
        t[:, zf.T_BLOCK] += block_base[ft]
        self.blocks, self.streams, self.trees = b, np.ascontiguousarray(s), np.ascontiguousarray(t)
        self.fse = np.ascontiguousarray(np.concatenate(defaults + [p.fse for p in plans]).astype(np.uint32))
        self.frames = np.stack([out, size, block_base, nb, np.array([p.checksum is not None for p in plans]),
                                np.array([p.checksum or 0 for p in plans], np.int64)], axis=1).astype(np.int64)
        self.literals, self.nseq = int(lit[-1] + plans[-1].literals), int(seq[-1] + plans[-1].nseq)
        self.with_seqs = np.flatnonzero(self.blocks[:, zf.B_NSEQ] > 0).astype(np.int64)
        self.prefix = np.flatnonzero((pre >= 0) & ~self.direct).astype(np.int64)
        owner = g
        starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]]) if len(owner) else np.zeros(0, np.int64)
        counts = np.diff(np.r_[starts, len(owner)])
        self.huf_groups = np.ascontiguousarray(np.stack([starts, counts], axis=1).astype(np.int64))


def _lengths(rows) -> np.ndarray:
    return np.array([len(r) for r in rows], np.int64)


def _before(sizes) -> np.ndarray:
    """Exclusive sums: where each of ``sizes`` starts, one after another from 0."""
    return np.cumsum(sizes) - sizes


def _segments(csizes, packed) -> tuple[list, list]:
    """``(segments, base)``: the host arrays to upload, as ``(offset in the device's copy, bytes)``, 16-byte
    aligned one after another, and each frame's place in that copy, from ``packed``: ``(host, starts)`` or
    a list of them, each holding the next frames (:func:`decode_zstd`); ``csizes``: each frame's bytes."""
    segments, base, at, i = [], [], 0, 0
    for host, starts in (packed if isinstance(packed, list) else [packed]):
        starts = [int(st) for st in starts]
        end = max((st + csizes[i + k] for k, st in enumerate(starts)), default=0)
        segments.append((at, host[:end]))
        base += [at + st for st in starts]
        i += len(starts)
        at = (at + end + 15) & ~15
    if i != len(csizes):
        raise ValueError(f"packed places {i} frames, the call has {len(csizes)}")
    return segments, base


def _packed(frames) -> tuple:
    """``(host, starts)``: the frames copied one after another, each 16-byte aligned (what a reader's staging holds)."""
    starts, at = [], 0
    for f in frames:
        starts.append(at)
        at = (at + len(memoryview(f).cast("B")) + 15) & ~15
    host = np.zeros(at, np.uint8)
    for st, f in zip(starts, frames):
        view = memoryview(f).cast("B")
        host[st:st + len(view)] = np.frombuffer(view, np.uint8)
    return host, starts


def decode_zstd(device, frames, out, offsets=None, names=None, lanes: int | None = None,
                events: list | None = None, queue=None, plans=None, packed=None,
                keep: bool = False, pending: list | None = None) -> list[int]:
    """Decode zstd frames on the device into ``out``; returns each frame's decoded size.

    Parameters
    ----------
    device : dgemm.opencl.device.Device
        Where to decode.
    frames : sequence of bytes-like
        zstd frames, one per chunk, each supported (:func:`supported`).
    out : pyopencl.Buffer
        The device buffer the output goes to.
    offsets : sequence of int, optional
        Where in ``out`` each frame's output starts; by default one after the other from 0.
    names : sequence of str, optional
        What errors call each frame (store keys); by default ``frame 0``, ``frame 1``...
    lanes : int, optional
        Work-items per block or frame in execution; :func:`default_lanes` by default.
    events : list, optional
        Gets ``(what, event)`` for each upload and kernel (``what``: ``upload``, ``plan``,
        ``trees``, ``huffman``, ``sequences``, ``copy``, ``execute``), for their profiling times.
    queue : pyopencl.CommandQueue, optional
        Where the commands go (the device's queue by default); the call waits for this queue.
    plans : sequence, optional
        Each frame's :func:`.zstd_fastplan.plan` where the caller made it already (None entries are
        made here), so that a frame is read on the host once.
    packed : (numpy.ndarray, sequence of int), or a list of them, optional
        A uint8 host array holding every frame, and where each starts in it: the array is uploaded
        as it is (page-locked memory goes over the bus at its full speed) instead of a copy of the frames.
        A list: several such arrays (each reader thread's staging), each holding the next frames in
        order, uploaded side by side.
    keep : bool
        Take the device buffers from this thread's :attr:`Device.scratch` (kept for the thread's
        next call, given back by ``Device.trim``) instead of allocating and releasing them.
    pending : list, optional
        Return once everything is enqueued, without waiting: ``pending`` gets ``(event, check)``,
        ``event`` the call's last command (what reads ``out`` must wait for), ``check()`` waits for
        the error rows and raises what this call would have raised (``check(only=frames)``: the
        first error of those frames, given by index, alone).  The frames' bytes may be read
        until the call's first upload has run (the ``("upload", event)`` of ``events``).

    Raises
    ------
    ZstdFrameError
        A corrupt frame, found on the host or by a kernel; the output is then undefined.
    ZstdUnsupported
        A frame that only the host decodes.

    Notes
    -----
    Blocks until done (the error rows are read back), unless ``pending`` is given.
    """
    import pyopencl as cl

    names = list(names) if names is not None else [f"frame {i}" for i in range(len(frames))]
    plans = _host_plans(frames, names, list(plans) if plans is not None else [None] * len(frames))
    if not plans:
        return []
    heads = [i for i, p in enumerate(plans) if isinstance(p, zstd_devplan.FrameHead)]
    if packed is None:      # (one host array to upload, the frames aligned as a reader's staging holds them)
        packed = _packed(frames)
    if offsets is None:
        offsets = np.concatenate([[0], np.cumsum([p.size for p in plans])[:-1]]).astype(np.int64)
    offsets = [int(o) for o in offsets]
    for p, o in zip(plans, offsets):
        if o < 0 or o + p.size > out.size:
            raise ZstdFrameError(f"zstd frame {p.name}: its content size {p.size} at {o} does not fit the "
                                 f"{out.size}-byte output buffer")
    lanes = lanes or default_lanes(device)
    prog = program(device, lanes)
    queue = queue if queue is not None else device.queue
    buffers = []
    # Every upload of the call is enqueued before its first kernel. A reader waits for its call's uploads
    # (they read its staging), and on an in-order queue an upload behind a kernel would hold it until that
    # kernel had run, beside the GEMMs a GEMM launch or more each. Their events are kept to the end: deleting
    # pyopencl's event of a copy from host memory waits for the copy with Python's lock held.
    uploads = []

    def take(nbytes, what):
        if keep:
            return device.scratch.buffer(what, nbytes)
        buf = device.buffer(max(nbytes, 1), what)
        buffers.append(buf)
        return buf

    def upload(buf, host, at=0):
        if host.nbytes:
            uploads.append(cl.enqueue_copy(queue, buf, host, dst_offset=at, is_blocking=False))

    def buffer(host, what, send=True, pad=0):
        buf = take(host.nbytes + pad, what)
        if send:
            upload(buf, host)
        return buf

    try:
        with device.failing("decoding zstd frames"):
            # padded: the Huffman kernel reads whole aligned words, the last one past the last frame's end
            segments, base = _segments([p.csize for p in plans], packed)     # (each host array into its place)
            at, last = segments[-1]
            src = take(at + last.nbytes + 16, "zstd frames")
            for at, host in segments:
                upload(src, host, at)
            planned: list = []      # (the plan kernel's event, reported with the call's)
            if heads:
                done = zstd_devplan.plan(prog, queue, src, [frames[i] for i in heads], [base[i] for i in heads],
                                         [plans[i] for i in heads], take, nogil.wait, planned)
                for i, p in zip(heads, done):       # (where the kernel gave up, the host plans: its errors)
                    plans[i] = p if p is not None else zstd_fastplan.plan(frames[i], names[i])
            batch = Batch(plans, offsets, base)
            nstreams, nseqblocks, nframes = len(batch.streams), len(batch.with_seqs), len(plans)
            ntrees = len(batch.trees)
            tree_info = np.zeros((max(ntrees, 1), TREE_INFO), np.int32)
            stream_err = np.zeros(max(nstreams, 1), np.int32)
            seq_err = np.zeros(max(nseqblocks, 1), np.int32)
            exec_err = np.zeros((nframes, 3), np.int64)
            hb, hl = prog.huf_blocks, prog.huf_lanes
            wgs = -(-len(batch.huf_groups) // hb)      # empty rows fill the last work-group
            group_rows = batch.huf_groups
            if len(group_rows) < wgs * hb:
                group_rows = np.concatenate([group_rows, np.zeros((wgs * hb - len(group_rows), 2), np.int64)])
            rest, fstate, span, serial = _execute_tables(batch.blocks, batch.frames)
            blocks = buffer(batch.blocks, "zstd block table")
            frames_buf = buffer(batch.frames, "zstd frame table")
            if nstreams:      # streams name trees: a block with Huffman literals has one or repeats one
                trees = buffer(batch.trees, "zstd Huffman tree descriptions")
                streams = buffer(batch.streams, "zstd literal streams")
                groups = buffer(group_rows, "zstd Huffman blocks")
            if nseqblocks:
                which = buffer(batch.with_seqs, "zstd blocks with sequences")
                fse = buffer(batch.fse, "zstd FSE tables")
            if len(batch.prefix):
                prefix = buffer(batch.prefix, "zstd blocks copied at once")
            fstate_buf = buffer(fstate, "zstd frame state")
            rest_buf = buffer(rest, "zstd blocks after the copied prefix") if len(rest) else None
            lit = take(batch.literals, "zstd literals")
            seqs = take(batch.nseq * 16, "zstd sequences")
            err_e = buffer(exec_err, "zstd errors", send=False)
            launched = []
            with prog.lock:
                if nstreams:
                    huf = take(ntrees * HUF_SLOT * 2, "zstd Huffman tables")
                    info = buffer(tree_info, "zstd Huffman tree logs and errors", send=False)
                    tl = prog.tree_lanes
                    launched.append(("trees", prog.trees(queue, (ntrees * tl,), (tl,), src, trees, huf, info)))
                    err_s = buffer(stream_err, "zstd stream errors", send=False)
                    launched.append(("huffman", prog.streams(
                        queue, (wgs * hl,), (hl,), src, streams, groups, huf, info, lit, out, err_s)))
                if nseqblocks:
                    err_q = buffer(seq_err, "zstd sequence errors", send=False)
                    launched.append(("sequences", prog.sequences(
                        queue, (_round(nseqblocks, 64),), None, src, blocks, which, fse, seqs, err_q,
                        np.uint32(nseqblocks))))
                if len(batch.prefix):
                    launched.append(("copy", prog.copy(
                        queue, (len(batch.prefix) * lanes,), (lanes,), src, blocks, prefix, frames_buf, lit, out)))
                launched += _execute(prog, queue, lanes, len(batch.blocks), len(rest), nframes, span, serial, take,
                                     src, blocks, frames_buf, lit, seqs, out, err_e, rest_buf, fstate_buf)
            if events is not None:
                events.extend(("upload", e) for e in uploads)
                events.extend(planned + launched)
            rows = [(tree_info, info), (stream_err, err_s)] if nstreams else []
            rows += [(seq_err, err_q)] if nseqblocks else []
            rows += [(exec_err, err_e)]
            if pending is not None:     # the error rows come back behind the kernels; checked later
                reads = [cl.enqueue_copy(queue, host, dev, is_blocking=False) for host, dev in rows]
                queue.flush()
                kept = uploads + reads      # (their host arrays live while these events do)

                def check(only=None):
                    nogil.wait(kept)
                    _raise_first(plans, batch, tree_info[:ntrees], stream_err[:nstreams], seq_err[:nseqblocks],
                                 exec_err, only)

                pending.append((launched[-1][1], check))
                return [p.size for p in plans]
            # Waited for by event and read without blocking (dgemm.opencl.nogil): NVIDIA's driver holds its own
            # lock through a blocking read, and every other reader thread's OpenCL call waits with it; its
            # clWaitForEvents spins a core.  (The queue is in order; a finish would also wait for other threads'
            # commands on a shared queue.)
            nogil.wait([launched[-1][1]] + uploads)
            for host, dev in rows:
                nogil.copied(queue, host, dev)
    except BaseException:
        if uploads:     # (not left to the events' deletion, which would wait holding Python's lock)
            nogil.wait(uploads)
        raise
    finally:
        for buf in buffers:
            buf.release()   # (deferred: OpenCL frees each once the commands using it have run)
    _raise_first(plans, batch, tree_info[:ntrees], stream_err[:nstreams], seq_err[:nseqblocks], exec_err)
    return [p.size for p in plans]


def _host_plans(frames, names, plans) -> list:
    """``plans`` with its None entries planned on the host; where a frame's plan raises, the first error in the
    frames' order is raised, as planning every frame on the host in turn would (the heads before it, left to
    the device, are planned on the host then)."""
    for i, p in enumerate(plans):
        if p is None:
            try:
                plans[i] = zstd_fastplan.plan(frames[i], names[i])
            except (ZstdFrameError, ZstdUnsupported):
                for k in range(i):
                    if isinstance(plans[k], zstd_devplan.FrameHead):
                        zstd_fastplan.plan(frames[k], names[k])
                raise
    return plans


def _execute_tables(block_rows, frame_rows) -> tuple:
    """The sequence execution's host tables (``zstd_decode.cl``'s notes): ``(rest, fstate, span, serial)``, the
    blocks after the copied prefix (the last first), each frame's state row, the origins' bytes and whether the
    frames walk in order."""
    # the blocks after the copied prefix, the last first: the groups of zstd_blocks may run in any order, and
    # on a device that runs them in order (PoCL) a block that reads an earlier one too soon then reads bytes
    # not written yet, which the tests see
    rest = np.ascontiguousarray(np.nonzero(block_rows[:, zf.B_PRE] < 0)[0][::-1].astype(np.int64))
    sizes = -(-frame_rows[:, zf.F_SIZE] // 32) * 32          # each frame's bytes from a word of its own
    total = max(int(sizes.sum()), 32)
    fstate = np.zeros((len(frame_rows), FSTATE_COLUMNS), np.int64)
    fstate[:, FS_ORG] = np.cumsum(sizes) - sizes
    serial = total > 1 << 32                    # origins are uint32 positions: the frames walk in order then
    fstate[:, FS_SERIAL] = serial
    return rest, fstate, (32 if serial else total), serial


def _execute(prog, queue, lanes, nblocks, nrest, nframes, span, serial, take, src, blocks, frames_buf, lit, seqs,
             out, err, which, fstate) -> list:
    """Enqueue the sequence execution (``zstd_decode.cl``'s notes): block scan, frame scan, blocks, origins, frames.

    ``take(nbytes, what)`` gives a device buffer (released later); ``which`` and ``fstate`` hold
    :func:`_execute_tables`' ``rest`` and ``fstate``, uploaded; the other buffers are ``decode_zstd``'s.
    Returns the ``(what, event)`` pairs.
    """
    import pyopencl as cl

    state = take(STATE_COLUMNS * 8 * max(nblocks, 1), "zstd block state")     # (a row per block of the call)
    # an origin (uint32) and a bit per decoded byte, used only where a match waits for earlier blocks
    org = take(4 * span, "zstd origins")
    wait = take(span // 8, "zstd waiting bytes")
    words = np.uint64(span // 32)
    launched = [("origins", cl.enqueue_fill_buffer(queue, wait, np.uint32(0), 0, span // 8))]
    if nrest:
        launched.append(("block_scan", prog.block_scan(queue, (_round(nrest, 64),), None, blocks, which, seqs,
                                                       state, np.uint32(nrest))))
    launched.append(("frame_scan", prog.frame_scan(queue, (nframes * lanes,), (lanes,), blocks, frames_buf,
                                                   state, fstate)))
    if nrest:
        launched.append(("blocks", prog.blocks(queue, (nrest * lanes,), (lanes,), src, blocks, which,
                                               frames_buf, lit, seqs, state, fstate, org, wait, out)))
    if nrest and not serial:
        grid = (_round(int(words), 256),)
        launched.append(("origins", prog.jump(queue, grid, None, wait, org, words)))    # chains followed to their ends
        launched.append(("origins", prog.gather(queue, grid, None, wait, org, frames_buf, fstate, out, words,
                                                np.uint32(nframes))))
    launched.append(("execute", prog.execute(queue, (nframes * lanes,), (lanes,), blocks, frames_buf, seqs, state,
                                             fstate, out, err)))
    return launched


def _round(n: int, m: int) -> int:
    return -(-n // m) * m


def tree_error(code: int, detail: int) -> str:
    """The text of a ``zstd_huf_trees`` error code (zstd_entropy.huffman_tree's message)."""
    return TREE_ERRORS.get(code, "error {d}").format(d=detail)


def _raise_first(plans, batch, tree_info, stream_err, seq_err, exec_err, only=None) -> None:
    """The error of the earliest block of the first frame that has one, as a message (of the frames ``only``,
    indices, where given: one caller's frames of a call shared with others).

    A block's tree comes before its streams (they read it), so its error wins.
    """
    found = []      # (frame, block or large for the frame's end, tree first, message)
    for k in np.nonzero(tree_info[:, 1])[0]:
        row = batch.blocks[batch.trees[k, zf.T_BLOCK]]
        text = tree_error(int(tree_info[k, 1]), int(tree_info[k, 2]))
        found.append((int(row[zf.B_FRAME]), int(row[zf.B_INDEX]), 0, f"its Huffman tree: {text}"))
    for k in np.nonzero(stream_err)[0]:
        row = batch.blocks[batch.streams[k, zf.S_BLOCK]]
        found.append((int(row[zf.B_FRAME]), int(row[zf.B_INDEX]), 1, STREAM_ERRORS.get(int(stream_err[k]), "?")))
    for k in np.nonzero(seq_err)[0]:
        row = batch.blocks[batch.with_seqs[k]]
        found.append((int(row[zf.B_FRAME]), int(row[zf.B_INDEX]), 1,
                      SEQUENCE_ERRORS.get(int(seq_err[k]), "?")))
    for f in np.nonzero(exec_err[:, 0])[0]:
        code, block, detail = (int(x) for x in exec_err[f])
        text = EXECUTE_ERRORS.get(code, "error {d}").format(d=detail)
        found.append((int(f), block if block >= 0 else 1 << 40, 1, text))
    if only is not None:
        only = set(only)
        found = [x for x in found if x[0] in only]
    if found:
        f, block, _, text = min(found, key=lambda x: x[:3])
        where = f"block {block}: " if block < 1 << 40 else ""
        raise ZstdFrameError(f"zstd frame {plans[f].name}: {where}{text}")


def huffman_tables(device, descriptions, lanes: int | None = None):
    """Decode Huffman tree descriptions with ``zstd_huf_trees`` alone (what the frame decoder runs first).

    Parameters
    ----------
    device : dgemm.opencl.device.Device
        Where to decode.
    descriptions : sequence of bytes
        Each a whole description (its first byte and :func:`.zstd_entropy.tree_size` bytes in all).
    lanes : int, optional
        As :func:`decode_zstd`'s (it picks the kernel's work-group size).

    Returns
    -------
    list
        Per description, ``(table, log)`` with the ``2**log`` uint16 entries, or the error text
        (:func:`.zstd_entropy.huffman_tree`'s ``Corrupt`` message) where it is refused.
    """
    import pyopencl as cl

    from dgemm.opencl.codecs import zstd_entropy as ent

    descriptions = [bytes(d) for d in descriptions]
    if not descriptions:
        return []
    for d in descriptions:
        if not d or len(d) != ent.tree_size(d[0]):
            raise ValueError("each description must be its first byte and tree_size(first byte) bytes")
    prog = program(device, lanes or default_lanes(device))
    sizes = np.array([len(d) for d in descriptions], np.int64)
    rows = np.zeros((len(descriptions), zf.TREE_COLUMNS), np.int64)
    rows[:, zf.T_SRC] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rows[:, zf.T_LEN] = sizes
    src = np.frombuffer(b"".join(descriptions), np.uint8)
    tables = np.zeros((len(descriptions), HUF_SLOT), np.uint16)
    info = np.zeros((len(descriptions), TREE_INFO), np.int32)
    q = device.queue
    bufs = [device.buffer(src.nbytes, "tree descriptions"), device.buffer(rows.nbytes, "tree rows"),
            device.buffer(tables.nbytes, "Huffman tables"), device.buffer(info.nbytes, "tree logs")]
    try:
        cl.enqueue_copy(q, bufs[0], src)
        cl.enqueue_copy(q, bufs[1], rows)
        cl.enqueue_fill_buffer(q, bufs[2], np.uint16(0xFFFF), 0, tables.nbytes)
        with prog.lock:
            tl = prog.tree_lanes
            prog.trees(q, (len(descriptions) * tl,), (tl,), *bufs)
        cl.enqueue_copy(q, tables, bufs[2])
        cl.enqueue_copy(q, info, bufs[3])
        q.finish()
    finally:
        for b in bufs:
            b.release()
    return [(tables[k], int(log)) if not code else tree_error(int(code), int(detail))
            for k, (log, code, detail, _) in enumerate(info)]

"""Blosc frames with LZ4 (Zarr v2's default compressor, zarr v3's ``BloscCodec``) decoded on the device.

The host reads each frame's 16-byte header, its table of block starts and
each block's stream lengths (a few bytes per block), checks every length and
offset against the frame and the output, and turns the frame into rows of a
table: one per LZ4 stream (or stored run of bytes), with where its input is,
where its output goes and both lengths.  ``dgemm/kernels/lz4.cl`` decodes one
stream per work-group, each bounded by its own row, and un-shuffles byte- or
bit-shuffled blocks.  Nothing here knows Zarr: the caller passes the frames and a
name for each (its store key) to put in errors.

The frame format is c-blosc 1.x's (format version 2), which numcodecs writes:

* header: version, compressor version, flags (bit 0 byte shuffle, bit 1
  stored uncompressed ("memcpyed"), bit 2 bit shuffle, bit 3 reserved, bit 4
  "blocks not split", bits 5-7 the compressor), typesize, then little-endian
  int32 ``nbytes`` (output size), ``blocksize`` and ``cbytes`` (frame size);
* a memcpyed frame holds the ``nbytes`` bytes after the header;
* otherwise an int32 start offset per block, and at each block's start one
  stream per split (``typesize`` splits of a full block when it is split, one
  otherwise), each an int32 length and that many bytes: stored as they are
  when the length equals the split's output size, else one LZ4 block.

A frame is decoded as c-blosc decodes it, or refused with the error it gives;
:func:`unsupported_reason` says which frames this path leaves to the host
(other compressors).  Where c-blosc's result is not defined by
the frame, this path raises instead of guessing: a frame shorter than its
header's ``cbytes`` (c-blosc reads past it), split streams that do not cover
their block (c-blosc leaves bytes of its scratch memory there), and an LZ4
match offset of 0 (invalid in LZ4's format; lz4's decoder writes bytes of its
own choosing).  LZ4 blocks that break the format's end conditions (a match
starting in the output's last 12 bytes or ending in its last 5) are refused,
as the format allows, also where lz4's fast paths let one through (which ones
depends on the platform lz4 was built for); no LZ4 encoder writes them.
"""
from __future__ import annotations

import dataclasses
import struct

import numpy as np

from dgemm.errors import DgemmError
from dgemm.opencl import nogil
from dgemm.opencl.codecs import _programs

VERSION_FORMAT = 2
HEADER = 16
MAX_TYPESIZE = 255
MAX_BUFFERSIZE = 2**31 - 1 - HEADER
MAX_BLOCKSIZE = (2**31 - 1 - MAX_TYPESIZE * 4) // 3
MIN_SPLIT = 128        # a full block is split only when each split is at least this long
MAX_SPLITS = 16
DOSHUFFLE, MEMCPYED, DOBITSHUFFLE, RESERVED, DONT_SPLIT = 0x1, 0x2, 0x4, 0x8, 0x10
LZ4_FORMAT = 1
COMPRESSORS = {0: "blosclz", 1: "lz4", 2: "snappy", 3: "zlib", 4: "zstd"}

# The kernel's error codes (lz4.cl), as messages.
LZ4_ERRORS = {
    1: "an LZ4 stream of no bytes",
    2: "an LZ4 literal length runs past the stream's end",
    3: "the LZ4 stream's last literals do not end it exactly, or overrun the output",
    4: "an LZ4 match length runs into the stream's last 5 bytes",
    5: "an LZ4 match offset of 0",
    6: "an LZ4 match starts before the output's start",
    7: "an LZ4 match runs into the output's last 5 bytes",
    8: "the LZ4 stream ends short of its output length",
}


class BloscFrameError(DgemmError, ValueError):
    """A Blosc frame is corrupt or hostile: the message names the frame and what is wrong."""


class BloscUnsupported(DgemmError, ValueError):
    """A valid-looking Blosc frame this device path does not decode (the host decoder must)."""


@dataclasses.dataclass
class FramePlan:
    """What the device does for one frame, offsets relative to the frame and to its output.

    ``direct``: rows (src offset, dst offset, src length, dst length) whose
    output is final; ``shuffled``: rows whose output is byte or bit planes, written
    to the scratch buffer at the same offsets; ``jobs``: (offset, size,
    typesize, mode: 1 byte shuffle, 2 bit shuffle) per block to un-shuffle from scratch.  ``blocks`` gives each
    row's block number, for errors.
    """

    name: str
    nbytes: int
    cbytes: int
    direct: np.ndarray
    direct_blocks: np.ndarray
    shuffled: np.ndarray
    shuffled_blocks: np.ndarray
    jobs: np.ndarray


def _header(frame, name: str) -> tuple:
    if len(frame) < HEADER:
        raise BloscFrameError(f"Blosc frame {name}: {len(frame)} bytes, shorter than the {HEADER}-byte header")
    version, versionlz, flags, typesize = frame[0], frame[1], frame[2], frame[3]
    nbytes, blocksize, cbytes = struct.unpack_from("<3i", frame, 4)
    return version, versionlz, flags, typesize, nbytes, blocksize, cbytes


def unsupported_reason(frame, name: str = "frame") -> str | None:
    """Why the device path leaves this frame to the host decoder, or None when it takes it.

    Corrupt frames are taken (the device path raises for them as the host
    would); only valid-looking frames of another compressor are left to
    the host.
    """
    return _programs.unsupported_reason(plan, BloscUnsupported, BloscFrameError, frame, name)


def checked(frame, name: str = "frame") -> tuple:
    """``(unsupported_reason(frame, name), the frame's plan or None)``: the plan goes to the decode's ``plans``."""
    return _programs.checked(plan, BloscUnsupported, BloscFrameError, frame, name)


def supported(frame) -> bool:
    """Whether :func:`decode_blosc` decodes this frame (else the host decoder must); see :func:`unsupported_reason`."""
    return unsupported_reason(frame) is None


def plan(frame, name: str = "frame") -> FramePlan:
    """Check a frame and make its rows; :class:`BloscFrameError` for a corrupt one.

    Parameters
    ----------
    frame : bytes-like
        One Blosc frame (a chunk's stored bytes).
    name : str
        What errors call it (a store key).

    Raises
    ------
    BloscFrameError
        Anything c-blosc refuses, and what it would decode from outside the
        frame or from its own scratch memory (see the module's notes).
    BloscUnsupported
        A compressor other than LZ4.
    """
    frame = memoryview(frame).cast("B")
    version, versionlz, flags, ts, nbytes, blocksize, cbytes = _header(frame, name)

    def bad(what):
        return BloscFrameError(f"Blosc frame {name}: {what}")

    if cbytes > len(frame):
        raise bad(f"its header says {cbytes} bytes, the frame has {len(frame)}")
    if nbytes <= 0 or nbytes > MAX_BUFFERSIZE:
        raise bad(f"output size {nbytes} outside 1..{MAX_BUFFERSIZE}")
    if blocksize <= 0 or blocksize > nbytes or blocksize > MAX_BLOCKSIZE:
        raise bad(f"block size {blocksize} outside 1..{min(nbytes, MAX_BLOCKSIZE)}")
    if ts == 0:
        raise bad("type size 0")
    if version != VERSION_FORMAT:
        raise bad(f"format version {version}, not {VERSION_FORMAT}")
    if flags & RESERVED:
        raise bad(f"reserved flag bit 3 set (flags {flags:#04x})")
    nblocks, leftover = divmod(nbytes, blocksize)
    nblocks += leftover > 0
    sizes = np.full(nblocks, blocksize, dtype=np.int64)
    if leftover:
        sizes[-1] = leftover
    starts = np.arange(nblocks, dtype=np.int64) * blocksize
    empty = np.zeros((0, 4), np.uint64), np.zeros(0, np.int64)
    if flags & MEMCPYED:
        if nbytes + HEADER != cbytes:
            raise bad(f"stored uncompressed, but {cbytes} bytes is not the header and {nbytes} bytes")
        rows = np.stack([HEADER + starts, starts, sizes, sizes], axis=1).astype(np.uint64)
        return FramePlan(name, nbytes, cbytes, rows, np.arange(nblocks), *empty, np.zeros((0, 4), np.uint64))
    compformat = flags >> 5
    if compformat != LZ4_FORMAT or versionlz != 1:
        cname = COMPRESSORS.get(compformat)
        if cname is None or versionlz != 1:
            raise bad(f"compressor {compformat} version {versionlz}, which c-blosc does not know")
        raise BloscUnsupported(f"Blosc frame {name}: compressor {cname}; only lz4 is decoded on the device")
    # c-blosc's precedence: byte shuffle (of types wider than a byte), else bit shuffle
    mode = 1 if flags & DOSHUFFLE and ts > 1 else 2 if flags & DOBITSHUFFLE else 0
    if nblocks * 4 > cbytes - HEADER:
        raise bad(f"{nblocks} block starts do not fit in its {cbytes} bytes")
    data = np.frombuffer(frame, np.uint8, count=cbytes)
    offsets = np.frombuffer(frame, "<i4", count=nblocks, offset=HEADER).astype(np.int64)
    # c-blosc's rule for splitting a full block into typesize streams (the leftover block never is)
    split = (not flags & DONT_SPLIT and ts <= MAX_SPLITS and blocksize // ts >= MIN_SPLIT)
    nsplits = np.where((sizes == blocksize) & split, ts, 1)
    neblock = sizes // nsplits
    if (neblock * nsplits != sizes).any():
        raise bad(f"its {ts} split streams do not cover a {blocksize}-byte block (c-blosc leaves the "
                  f"remaining bytes undefined)")
    rows, blocks = [], []
    for j in range(int(nsplits.max())):
        sel = np.nonzero(nsplits > j)[0]
        off = offsets[sel]
        outside = (off < 0) | (off > cbytes - 4)
        if outside.any():
            k = int(np.argmax(outside))
            raise bad(f"block {sel[k]}: stream {j} starts at {off[k]}, outside its {cbytes} bytes")
        length = (data[off] | (data[off + 1].astype(np.int64) << 8) | (data[off + 2].astype(np.int64) << 16)
                  | (data[off + 3].astype(np.int64) << 24)).astype(np.int64)
        length = np.where(length >= 2**31, length - 2**32, length)
        off = off + 4
        wrong = (length < 0) | (length > cbytes - off)
        if wrong.any():
            k = int(np.argmax(wrong))
            raise bad(f"block {sel[k]}: stream {j} of {length[k]} bytes at {off[k]} runs outside its "
                      f"{cbytes} bytes")
        rows.append(np.stack([off, starts[sel] + j * neblock[sel], length, neblock[sel]], axis=1))
        blocks.append(sel)
        offsets[sel] = off + length
    rows = np.concatenate(rows).astype(np.uint64)
    blocks = np.concatenate(blocks)
    if mode:
        jobs = np.stack([starts, sizes, np.full(nblocks, ts), np.full(nblocks, mode)], axis=1).astype(np.uint64)
        return FramePlan(name, nbytes, cbytes, *empty, rows, blocks, jobs)
    return FramePlan(name, nbytes, cbytes, rows, blocks, *empty, np.zeros((0, 4), np.uint64))


# -- the device side -------------------------------------------------------------------------------

# Measured choices, CLBlast-style: (a substring of the device's name, lanes, lz4.cl's parameters); the
# first that names the device wins.  Fill from ``bench/notes/issue-28/blosc_decode.py --variants sweep``.
# H100: the token table with 32 lanes was the fastest or within 6 % of it on every case swept
# (results/2026-11-26-nvidia-h100-blosc-lz4-variants-b64bfae.json: normal floats shuffled 38.9 GB/s
# against 26.6 for the lockstep kernel, random walk 30.5 against 28.9, clevel 1 101.5 against 77.5).  Its
# wide parser (LZ4_PARSE 2) on 64 lanes, the walking lane in a warp apart from the 32 copying ones, the
# first of which makes phase 2's groups (LZ4_GROUP_LANE 32), was faster in every case
# (results/2026-11-27-nvidia-h100-blosc-lz4-wide8-ddd5f54.json, same run: 108.3 against 40.8, 50.2 against
# 31.5, 205.3 against 106.1; 32 lanes: 72.7, 39.9, 180.5; 96 lanes: 99.4, 50.1, 179.5).
# The unshuffle four elements a work-item (LZ4_UNSHUFFLE 2) against the byte-wise default and 1, same run, the
# whole decode (results/2026-11-27-nvidia-h100-blosc-unshuffle-43a8855.json): 100.2 against 85.1 and 98.2 GB/s,
# 48.4 against 44.5 and 47.1, 180.2 against 137.0 and 172.8 (the LZ4 kernel alone unchanged: 108, 50, 205).
# H200: the same GH100 chip and SMs, with more and faster memory; not swept on its own.
TUNED: tuple = (("H100", 64, {"LZ4_MODE": 1, "LZ4_PARSE": 2, "LZ4_GROUP_LANE": 32, "LZ4_UNSHUFFLE": 2}),
                ("H200", 64, {"LZ4_MODE": 1, "LZ4_PARSE": 2, "LZ4_GROUP_LANE": 32, "LZ4_UNSHUFFLE": 2}))

# lz4.cl's parameters other than LZ4_WG (the lanes), with what each may be; see the kernel's notes.
PARAMS = {"LZ4_MODE": (0, 1), "LZ4_BATCH": range(1, 1025), "LZ4_LONG": range(1 << 20),
          "LZ4_COPY_FROM": range(1024), "LZ4_STAGE": range(1 << 16), "LZ4_UNSHUFFLE": (0, 1, 2), "LZ4_PARSE": (0, 2),
          "LZ4_GROUP_LANE": range(1024)}


# Bytes lz4.cl's wide parser's walk may read past a row's end (18 at most; never using them): the frames'
# buffer is that much longer.
PAD_READ = 32


def _tuned(device):
    name = str(getattr(device.info, "name", ""))
    return next((t for t in TUNED if t[0] in name), None)


def default_lanes(device) -> int:
    """Lanes per stream: :data:`TUNED`'s for this device, else a warp's worth on a GPU, 1 (no barriers) on a CPU."""
    tuned = _tuned(device)
    if tuned is not None:
        return tuned[1]
    return 1 if device.info.type == "CPU" else 32


# A CPU device's parameters where TUNED names none: the unshuffle four elements a work-item, 4.6x the
# byte-wise one's rate on PoCL (2 cores of an AMD EPYC, 2 x 16 MiB of float32 a call; the whole decode 2.4x:
# bench/results/2026-11-27-pocl-cpu-blosc-unshuffle-91d4217.json).
CPU_PARAMS = {"LZ4_UNSHUFFLE": 2}


def default_params(device) -> dict:
    """lz4.cl's parameters (beyond the lanes) for ``device``: :data:`TUNED`'s, else :data:`CPU_PARAMS` on a CPU,
    else the kernel's own defaults."""
    tuned = _tuned(device)
    if tuned is not None:
        return dict(tuned[2])
    return dict(CPU_PARAMS) if device.info.type == "CPU" else {}


def _options(lanes: int, params: dict) -> tuple:
    if not isinstance(lanes, int) or not 1 <= lanes <= 1024:
        raise ValueError(f"lz4.cl: LZ4_WG={lanes!r}, not a lane count in 1..1024")
    for name, value in params.items():
        if name not in PARAMS or not isinstance(value, int) or value not in PARAMS[name]:
            raise ValueError(f"lz4.cl: {name}={value!r} is not one of its parameters' values {sorted(PARAMS)}")
    if params.get("LZ4_COPY_FROM", 0) >= lanes:
        raise ValueError(f"lz4.cl: LZ4_COPY_FROM={params['LZ4_COPY_FROM']} leaves none of {lanes} lanes to copy")
    if params.get("LZ4_GROUP_LANE", 0) >= lanes:
        raise ValueError(f"lz4.cl: LZ4_GROUP_LANE={params['LZ4_GROUP_LANE']} is not one of its {lanes} lanes")
    return (("LZ4_WG", lanes),) + tuple(sorted(params.items()))


def program(device, lanes: int, params: dict | None = None):
    """``lz4.cl`` built for ``device`` with ``LZ4_WG=lanes`` and ``params``, once per the three."""
    return _programs.program(device, "lz4.cl", _options(lanes, dict(params or {})),
                             (("streams", "lz4_streams"), ("unshuffle", "unshuffle_blocks")))


def decode_blosc(device, frames, out, offsets=None, names=None, lanes: int | None = None,
                 events: list | None = None, queue=None, params: dict | None = None, plans=None,
                 packed=None, keep: bool = False) -> list[int]:
    """Decode Blosc-LZ4 frames on the device into ``out``; returns each frame's decoded size.

    Parameters
    ----------
    device : dgemm.opencl.device.Device
        Where to decode.
    frames : sequence of bytes-like
        Blosc frames, each supported (:func:`supported`).
    out : pyopencl.Buffer
        The device buffer the output goes to.
    offsets : sequence of int, optional
        Where in ``out`` each frame's output starts; by default one after the other from 0.
    names : sequence of str, optional
        What errors call each frame (store keys); by default ``frame 0``, ``frame 1``...
    lanes : int, optional
        Work-items per stream (``LZ4_WG``); :func:`default_lanes` by default.
    events : list, optional
        Gets ``(what, event)`` for each upload and kernel (``what``: ``upload``, ``lz4``,
        ``unshuffle``), for their profiling times.
    queue : pyopencl.CommandQueue, optional
        An in-order queue of the device to decode on (the engine's transfer queue, where the
        padding kernels that read ``out`` next run); ``device.queue`` by default.
    params : dict, optional
        ``lz4.cl``'s other parameters (:data:`PARAMS`, e.g. ``{"LZ4_MODE": 1}``);
        :func:`default_params` by default.
    plans, packed, keep
        As :func:`dgemm.opencl.codecs.zstd_decode.decode_zstd`'s: frames already read on the host
        (:func:`plan`), frames already in one (page-locked) host array, device buffers kept per thread.

    Raises
    ------
    BloscFrameError
        A corrupt frame, found on the host or by the kernel; the output is then undefined.
    BloscUnsupported
        A frame that only the host decodes.

    Notes
    -----
    Blocks until done (the error flags are read back).  Each frame's output
    is written exactly once, byte for byte.
    """
    import pyopencl as cl

    names = list(names) if names is not None else [f"frame {i}" for i in range(len(frames))]
    plans = [p if p is not None else plan(f, n)
             for f, n, p in zip(frames, names, plans if plans is not None else [None] * len(frames))]
    if offsets is None:
        offsets = np.concatenate([[0], np.cumsum([p.nbytes for p in plans])[:-1]]).astype(np.int64)
    offsets = [int(o) for o in offsets]
    for p, o in zip(plans, offsets):
        if o < 0 or o + p.nbytes > out.size:
            raise ValueError(f"Blosc frame {p.name}: its {p.nbytes} bytes at {o} do not fit the "
                             f"{out.size}-byte output buffer")
    if not plans:
        return []
    lanes = lanes or default_lanes(device)
    prog = program(device, lanes, default_params(device) if params is None else params)
    if packed is not None:       # already in one host array: uploaded as it is
        bases = np.asarray(packed[1], np.int64)
        upload = packed[0][:max(int(b) + p.cbytes for p, b in zip(plans, bases))]
    else:
        bases = np.concatenate([[0], np.cumsum([p.cbytes for p in plans])]).astype(np.int64)
        upload = np.empty(max(int(bases[-1]), 1), np.uint8)
        for p, f, b in zip(plans, frames, bases):
            upload[b:b + p.cbytes] = np.frombuffer(memoryview(f).cast("B")[:p.cbytes], np.uint8)

    def table(kind):
        parts, owners = [], []
        for i, (p, b, o) in enumerate(zip(plans, bases, offsets)):
            rows = getattr(p, kind).copy()
            rows[:, 0] += np.uint64(b)
            rows[:, 1] += np.uint64(o)
            parts.append(rows)
            owners.append(np.stack([np.full(len(rows), i), getattr(p, kind + "_blocks")], axis=1))
        return np.ascontiguousarray(np.concatenate(parts)), np.concatenate(owners)

    direct, direct_owner = table("direct")
    shuffled, shuffled_owner = table("shuffled")
    jobs = np.concatenate([p.jobs + np.array([o, 0, 0, 0], np.uint64) for p, o in zip(plans, offsets)])
    queue = queue if queue is not None else device.queue
    buffers = []

    def take(nbytes, what):
        if keep:
            return device.scratch.buffer(what, nbytes)
        buf = device.buffer(max(nbytes, 1), what)
        buffers.append(buf)
        return buf

    def buffer(host, what, pad=0):
        buf = take(host.nbytes + pad, what)
        if host.nbytes:
            event = cl.enqueue_copy(queue, buf, host, is_blocking=False)
            if events is not None:
                events.append(("upload", event))
        return buf

    errors = []
    try:
        with device.failing("decoding Blosc-LZ4 streams"):
            src = buffer(upload, "Blosc frames", pad=PAD_READ)
            launches = []
            if len(direct):
                launches.append((direct, direct_owner, out))
            if len(shuffled):
                # planes go to scratch at their block's own offsets, then unshuffle_blocks puts them in out
                extent = max(o + p.nbytes for p, o in zip(plans, offsets) if len(p.shuffled))
                scratch = take(extent, "Blosc unshuffle scratch")
                launches.append((shuffled, shuffled_owner, scratch))
            args = [(rows, owner, dst, buffer(rows, f"LZ4 stream table {i}"),
                     np.empty(len(rows), np.int32)) for i, (rows, owner, dst) in enumerate(launches)]
            args = [(*a, buffer(a[4], f"LZ4 error flags {i}")) for i, a in enumerate(args)]
            job_table = buffer(jobs, "unshuffle jobs") if len(jobs) else None
            with prog.lock:
                launched = [("lz4", prog.streams(queue, (len(rows) * lanes,), (lanes,), src, dst, rows_buf, err_buf))
                            for rows, _, dst, rows_buf, _, err_buf in args]
                if job_table is not None:
                    width = int(min(max(int(jobs[:, 1].max()), 1), 1024))
                    launched.append(("unshuffle", prog.unshuffle(queue, (width, len(jobs)), None, scratch, out,
                                                                 job_table)))
            if events is not None:
                events.extend(launched)
            # the last kernel first, then the flags, neither inside the driver (dgemm.opencl.nogil: a blocking
            # read holds NVIDIA's driver lock, clWaitForEvents spins a core; and a finish would also wait for
            # other threads' commands on a shared queue)
            if launched:
                nogil.wait([launched[-1][1]])
            for rows, owner, _, _, err, err_buf in args:
                nogil.copied(queue, err, err_buf)
                errors.append((err, rows, owner))
    finally:
        for buf in buffers:
            buf.release()
    for err, rows, owner in errors:
        bad = np.nonzero(err)[0]
        if bad.size:
            k = bad[0]
            frame, block = owner[k]
            p = plans[frame]
            what = LZ4_ERRORS.get(int(err[k]), f"LZ4 error {int(err[k])}")
            raise BloscFrameError(f"Blosc frame {p.name}: block {block}: {what} "
                                  f"({int(rows[k, 2])} compressed bytes for {int(rows[k, 3])})")
    return [p.nbytes for p in plans]

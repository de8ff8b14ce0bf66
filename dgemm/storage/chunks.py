"""Reading Zarr chunks straight into a worker's buffers, decoded in parallel outside the GIL.

zarr's own indexing reads a region through its event loop and codec
pipeline: correct for every array, but on one H100 host it stopped scaling
at four threads (1.56 GB/s of zstd chunks with eight; bench/NOTES.md, "Issue
15 baseline").  This module reads the chunk bytes itself (a file read for
local stores, the store's own ``get`` with byte ranges for the others) and
hands them to numcodecs' decoders, which release the GIL, writing each
chunk's elements straight into the caller's buffer (the page-locked staging
buffer a block is uploaded from) when the chunk covers whole rows of it.

zarr stays the source of truth for the format: everything comes from the
array's parsed metadata (its codec objects, chunk grid, chunk key encoding
and fill value); nothing here reads ``zarr.json`` or ``.zarray``.  What the
layer does not know (a transpose codec, v2 filters, Fortran order, a codec
outside numcodecs' compressors) is left to zarr: :func:`read_into` returns
False and the caller reads through zarr.
"""
from __future__ import annotations

import itertools
import os
import re
import struct
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dgemm.storage import fastpaths
from dgemm.storage import threads as threads_mod
from dgemm.storage.source import Source, scratch

# numcodecs codecs that decode straight into a caller's buffer (``decode(buf, out=...)``) in C, without the GIL.
_INTO = {"zstd", "blosc", "lz4"}
# numcodecs compressors whose decode is a plain bytes-to-bytes function (any other codec id is left to zarr).
_COMPRESSORS = _INTO | {"gzip", "zlib", "bz2", "lzma"}
_EMPTY = 2**64 - 1      # a shard index entry (offset and length) for an inner chunk that was never written


@dataclass(frozen=True)
class Layout:
    """How one array's chunks are stored: what :func:`read_into` needs, from zarr's metadata."""

    grid: tuple[int, ...]          # the shape of what a store key holds (a chunk, or a shard)
    chunk: tuple[int, ...]         # the shape of what one decode gives (the chunk, or a shard's inner chunk)
    dtype: np.dtype                # the elements as stored, byte order included
    steps: tuple                   # bytes-to-bytes decoders, in the order they apply to stored bytes
    shard: ShardIndex | None       # how inner chunks are found in a shard; None when unsharded
    fill: Any                      # what a chunk never written reads as
    key: Callable[[tuple], str]    # chunk (or shard) coordinates -> store key, relative to the array


@dataclass(frozen=True)
class ShardIndex:
    """Where a shard keeps its index: ``count`` inner chunks of 16 bytes, then a crc32c when ``checked``."""

    per_shard: tuple[int, ...]
    at_end: bool
    checked: bool
    little: bool

    @property
    def nbytes(self) -> int:
        return 16 * int(np.prod(self.per_shard)) + (4 if self.checked else 0)

    def parse(self, raw, what: str) -> np.ndarray:
        """The index, as (inner chunk coordinates..., [offset, length]) uint64."""
        raw = memoryview(raw).cast("B")
        if len(raw) != self.nbytes:
            raise ValueError(f"{what}: shard index has {len(raw)} bytes, expected {self.nbytes}")
        if self.checked:
            raw = _checked(raw, what + " (shard index)")
        idx = np.frombuffer(raw, dtype="<u8" if self.little else ">u8")
        return idx.reshape(*self.per_shard, 2)


class Unsupported(Exception):
    """The array's layout is one this module leaves to zarr."""


def copies(array) -> bool:
    """Whether reading ``array`` is only copying file bytes (raw chunks, local): no decoding, little CPU."""
    try:
        return not layout(array).steps and Source(array).root is not None
    except Unsupported:
        return False


def why_not(array) -> str | None:
    """None when :func:`read_into` reads ``array`` itself; otherwise why it is left to zarr."""
    try:
        layout(array)
    except Unsupported as e:
        return str(e)
    return None


def layout(array) -> Layout:
    """The :class:`Layout` of a ``zarr.Array``; raises :class:`Unsupported` for what zarr must read."""
    meta = getattr(array, "metadata", None)
    fmt = getattr(meta, "zarr_format", None)
    if fmt == 3:
        return _layout_v3(array, meta)
    if fmt == 2:
        return _layout_v2(array, meta)
    raise Unsupported(f"zarr_format {fmt!r}")


def _layout_v3(array, meta) -> Layout:
    from zarr.codecs import BytesCodec, ShardingCodec

    grid = tuple(int(c) for c in meta.chunk_grid.chunk_shape)
    codecs = list(meta.codecs)
    shard = None
    if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec):
        sc = codecs[0]
        inner = tuple(int(c) for c in sc.chunk_shape)
        if any(g % c for g, c in zip(grid, inner)):
            raise Unsupported("inner chunks that do not divide the shard")
        index = list(sc.index_codecs)
        if not index or not isinstance(index[0], BytesCodec) or len(index) > 2 or (
                len(index) == 2 and _codec_name(index[1]) != "crc32c"):
            raise Unsupported(f"shard index codecs {index}")
        location = getattr(sc.index_location, "value", sc.index_location)
        shard = ShardIndex(tuple(g // c for g, c in zip(grid, inner)), location == "end", len(index) == 2,
                           _endian(index[0]) != "big")
        codecs = list(sc.codecs)
    else:
        inner = grid
    if not codecs or not isinstance(codecs[0], BytesCodec):
        raise Unsupported(f"codec {type(codecs[0]).__name__ if codecs else None}")
    dtype = np.dtype(array.dtype).newbyteorder("<" if _endian(codecs[0]) == "little" else ">") \
        if np.dtype(array.dtype).itemsize > 1 else np.dtype(array.dtype)
    if dtype.kind not in "fiuc":
        raise Unsupported(f"dtype {array.dtype}")
    steps = tuple(_step(c) for c in reversed(codecs[1:]))
    return Layout(grid, inner, dtype, steps, shard, _fill(meta.fill_value, dtype), meta.encode_chunk_key)


def _layout_v2(array, meta) -> Layout:
    if meta.filters:
        raise Unsupported(f"v2 filters {list(meta.filters)}")
    if meta.order != "C":
        raise Unsupported(f"v2 order {meta.order!r}")
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "fiuc":
        raise Unsupported(f"dtype {dtype}")
    steps = () if meta.compressor is None else (_step(meta.compressor),)
    grid = tuple(int(c) for c in meta.chunks)
    return Layout(grid, grid, dtype, steps, None, _fill(meta.fill_value, dtype), meta.encode_chunk_key)


def _endian(codec) -> str | None:
    e = codec.endian
    return getattr(e, "value", e)


def _codec_name(codec) -> str:
    """A codec's name: a numcodecs codec's id, a zarr v3 codec's registered name."""
    if hasattr(codec, "codec_id"):
        return str(codec.codec_id).removeprefix("numcodecs.")
    return {"ZstdCodec": "zstd", "BloscCodec": "blosc", "GzipCodec": "gzip",
            "Crc32cCodec": "crc32c"}.get(type(codec).__name__, type(codec).__name__)


def _step(codec):
    """The numcodecs implementation of one bytes-to-bytes codec: ``decode(buf, out)`` and ``encode(buf)``."""
    import numcodecs

    name = _codec_name(codec)
    if name == "crc32c":
        return Crc32c()
    encodes = True
    if type(codec).__module__.startswith("numcodecs"):
        impl = codec
    elif hasattr(codec, "_codec") and type(codec).__module__.startswith("zarr.codecs.numcodecs"):
        impl = codec._codec          # zarr's wrapper of a numcodecs codec
    elif name == "zstd":
        impl = numcodecs.Zstd(level=codec.level, checksum=codec.checksum)
    elif name == "blosc":
        impl, encodes = _blosc(codec)
    elif name == "gzip":
        impl = numcodecs.GZip(level=codec.level)
    else:
        raise Unsupported(f"codec {type(codec).__name__}")
    name = str(impl.codec_id)
    if name not in _COMPRESSORS:
        raise Unsupported(f"codec {name}")
    fast = None
    if name == "zstd":
        from dgemm.storage import zstd

        fast = zstd.codec(impl.level, getattr(impl, "checksum", False))
    return _Numcodec(impl, name, encodes, fast)


def _blosc(codec):
    """numcodecs' Blosc as zarr's BloscCodec configures it, and whether it encodes as zarr would.

    A blosc frame describes itself, so any Blosc decodes it; encoding needs
    the codec's settings, typesize included (numcodecs 0.16 and later take
    it, as zarr passes it).
    """
    import re

    import numcodecs

    try:
        config = {"cname": codec.cname.name, "clevel": int(codec.clevel), "blocksize": int(codec.blocksize),
                  "shuffle": {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[getattr(codec.shuffle, "name", "")]}
        if codec.typesize is None or tuple(int(v) for v in re.findall(r"\d+", numcodecs.__version__)[:2]) < (0, 16):
            raise KeyError("typesize")
        config["typesize"] = int(codec.typesize)
        return numcodecs.Blosc.from_config(config), True
    except (AttributeError, KeyError, TypeError, ValueError):
        return numcodecs.Blosc(), False


class _Numcodec:
    """One numcodecs compressor; decodes into the caller's buffer where it can.

    ``fast`` (zstd: :class:`dgemm.storage.zstd.Zstd`, where libzstd loads)
    decodes into the buffer and encodes with this thread's reused context and
    buffer (an encoded chunk is then ``transient``: reused by the thread's
    next encode), on libzstd's threads too (``parallel``: ``encode(workers=)``).
    """

    def __init__(self, codec, name: str, encodes: bool = True, fast=None):
        self.codec, self.name, self.encodes, self.fast = codec, name, encodes, fast
        self.transient = self.parallel = fast is not None

    def decode(self, buf, out, what: str):
        if out is not None and self.name in _INTO and _content_size(self.name, buf) == out.nbytes:
            # decode() checks that the frame fits ``out``; its declared size, checked above, says it fills it
            if self.fast is not None:
                return self.fast.decode(buf, out, what)
            self.codec.decode(buf, out=out)
            return out
        return self.codec.decode(buf)

    def encode(self, buf, workers: int = 0):
        return self.codec.encode(buf) if self.fast is None else self.fast.encode(buf, workers)

    def __repr__(self):
        return f"{self.name} codec"


class Crc32c:
    """zarr's crc32c codec: a little-endian crc32c of the payload after it."""

    encodes = True

    def decode(self, buf, out, what: str):
        return _checked(buf, what)

    def encode(self, buf):
        import google_crc32c

        payload = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1).view(np.uint8)
        return np.concatenate([payload, np.frombuffer(struct.pack("<I", google_crc32c.value(payload)), np.uint8)])

    def __repr__(self):
        return "crc32c codec"


def _content_size(name: str, buf) -> int | None:
    """The decoded size a frame declares in its header (None when it does not say)."""
    b = memoryview(buf).cast("B")
    if name == "blosc" and len(b) >= 16:
        return struct.unpack_from("<I", b, 4)[0]
    if name == "lz4" and len(b) >= 4:        # numcodecs' LZ4 frame: the size first, then lz4's block
        return struct.unpack_from("<I", b, 0)[0]
    if name == "zstd" and len(b) >= 6 and struct.unpack_from("<I", b, 0)[0] == 0xFD2FB528:
        desc = b[4]
        fcs, single, dict_id = desc >> 6, (desc >> 5) & 1, desc & 3
        at = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_id]
        size = (1 if single else 0, 2, 4, 8)[fcs]
        if size == 0 or len(b) < at + size:
            return None
        value = int.from_bytes(b[at:at + size], "little")
        return value + 256 if size == 2 else value
    return None


def _checked(buf, what: str = "chunk"):
    """A crc32c-checked payload without its checksum; raises on a mismatch."""
    import google_crc32c

    b = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1).view(np.uint8)
    if len(b) < 4:
        raise ValueError(f"{what}: {len(b)} bytes, too short for its crc32c checksum")
    payload = b[:-4]
    want = struct.unpack_from("<I", b, len(b) - 4)[0]
    got = google_crc32c.value(payload)    # takes an array (a memoryview it refuses)
    if got != want:
        raise ValueError(f"{what}: crc32c checksum mismatch (stored {want:#010x}, computed {got:#010x})")
    return payload


def _fill(value, dtype: np.dtype):
    return np.zeros((), dtype)[()] if value is None else np.asarray(value).astype(dtype)[()]


# -- reading a region ------------------------------------------------------

# The arrays this process has seen in their stores (store, path): checked once each.
_SEEN: set = set()
_SEEN_LOCK = threading.Lock()


def visible(array) -> None:
    """Raise :class:`OSError` unless this process sees ``array``'s metadata in its store (checked once).

    An array arrives with its metadata inside it, so a worker that does not
    see the store (another host without the mount, a container without the
    volume, a path that means another folder here) would read every chunk
    as missing: the fill value, a wrong product marked complete.
    """
    from zarr.core.sync import sync

    key = (repr(array.store), array.path)
    if key in _SEEN:
        return
    node = array.path.strip("/")
    names = ("zarr.json",) if array.metadata.zarr_format == 3 else (".zarray",)
    meta = [f"{node}/{n}" if node else n for n in names]
    if not any(sync(array.store.exists(m)) for m in meta):
        raise OSError(f"this worker does not see the Zarr array {array.store_path}: its metadata ({meta[0]}) is not "
                      "in the store here (another host without the same files or mount?); every chunk would read "
                      "as the fill value, so dgemm stops")
    with _SEEN_LOCK:
        _SEEN.add(key)



def read_into(block, out: np.ndarray) -> bool:
    """Read a :class:`~dgemm.storage.blocks.ZarrBlock` into ``out``; False (``out`` untouched) if zarr must.

    ``out`` is C-contiguous, of the block's shape and of the array's dtype
    in this machine's byte order.  It ends up holding what zarr's indexing
    returns for the region: missing chunks read as the fill value.  Chunks
    that cover whole rows of ``out`` are decoded straight into it; others
    through this thread's scratch buffer.  A chunk that does not decode to
    its size, or fails its checksum, raises.
    """
    arr = block.array
    if not out.flags.c_contiguous or tuple(out.shape) != tuple(block.shape) \
            or out.dtype != np.dtype(arr.dtype).newbyteorder("="):
        return _declined("read_zarr", out)
    try:
        lay = layout(arr)
    except Unsupported:
        return _declined("read_zarr", out)
    visible(arr)
    if block.expand is None:
        region = (slice(*block.rows), slice(*block.cols))
    else:
        region = (slice(*(block.cols if block.expand == 0 else block.rows)),)
    if len(region) != arr.ndim:
        return _declined("read_zarr", out)
    _read_region(Source(arr), lay, tuple(arr.shape), region, out.reshape([s.stop - s.start for s in region]))
    return True


def _declined(path: str, data) -> bool:
    """False, counted: the caller reads (or writes) ``data``'s region through zarr."""
    fastpaths.record(path, getattr(data, "nbytes", 0))
    return False


def _read_region(src: Source, lay: Layout, shape, region, out: np.ndarray) -> None:
    # every stored chunk (inner chunk, for shards) the region touches, grouped by the store key holding it
    per_key: dict = {}
    ranges = [range(s.start // c, -(-s.stop // c)) for s, c in zip(region, lay.chunk)]
    for idx in itertools.product(*ranges):
        outer = tuple(i * c // g for i, c, g in zip(idx, lay.chunk, lay.grid))
        per_key.setdefault(outer, []).append(idx)
    if lay.shard is None:
        if not lay.steps and src.root is not None:
            return _read_raw_local(src, lay, shape, region, out, per_key)
        keys = [lay.key(outer) for outer in per_key]
        for key, idxs, data in zip(keys, per_key.values(), src.fetch([(k, None) for k in keys])):
            _place(lay, shape, region, out, idxs[0], data, key)
        return
    shard = lay.shard
    keys = [lay.key(outer) for outer in per_key]
    where = ("suffix", shard.nbytes) if shard.at_end else (0, shard.nbytes)
    # indexes are small: copied out of the reader's buffer, which the inner chunks' reads reuse
    indexes = [None if raw is None else shard.parse(raw, f"shard {key!r}").copy()
               for key, raw in zip(keys, src.fetch([(k, where) for k in keys]))]
    requests, places = [], []
    for key, idxs, index in zip(keys, per_key.values(), indexes):
        for idx in idxs:
            local = tuple(i % p for i, p in zip(idx, shard.per_shard))
            offset, length = (int(v) for v in index[local]) if index is not None else (_EMPTY, _EMPTY)
            if offset == _EMPTY and length == _EMPTY:
                _place(lay, shape, region, out, idx, None, key)
            else:
                places.append((idx, f"{key} inner chunk {local}"))
                requests.append((key, (offset, offset + length)))
    for (idx, what), data in zip(places, src.fetch(requests)):
        if data is None:
            raise OSError(f"{what}: the shard vanished while it was read")
        _place(lay, shape, region, out, idx, data, what)


def _cover(idx, lay: Layout, shape, region):
    """(slices into the decoded chunk, slices into out, whether the chunk lies whole inside the region and array)."""
    inside, outs, whole = [], [], True
    for i, c, n, s in zip(idx, lay.chunk, shape, region):
        lo, hi = i * c, min((i + 1) * c, n)
        a, b = max(lo, s.start), min(hi, s.stop)
        inside.append(slice(a - lo, b - lo))
        outs.append(slice(a - s.start, b - s.start))
        whole = whole and (a, b) == (i * c, (i + 1) * c)
    return tuple(inside), tuple(outs), whole


def _place(lay: Layout, shape, region, out: np.ndarray, idx, data, what: str) -> None:
    """Decode one chunk's bytes (None: missing) into its part of ``out``."""
    inside, outs, whole = _cover(idx, lay, shape, region)
    dest = out[outs]
    if data is None:
        dest[...] = lay.fill
        fastpaths.record("read_fill", dest.nbytes)
        return
    nbytes = int(np.prod(lay.chunk)) * lay.dtype.itemsize
    if whole and dest.flags.c_contiguous:
        target = dest.reshape(-1).view(np.uint8)      # straight into the caller's buffer
        got = _decode(lay.steps, data, target, what)
        if got is not target:
            target[...] = got
        if not lay.dtype.isnative:
            dest.view(lay.dtype).byteswap(inplace=True)   # swap in place: the bytes were stored big-endian
        fastpaths.record("read_decoded_into" if got is target else "read_copied", dest.nbytes)
        return
    aside = scratch("chunk", nbytes)
    got = _decode(lay.steps, data, aside, what)
    chunk = np.frombuffer(got, dtype=lay.dtype).reshape(lay.chunk)
    np.copyto(dest, chunk[inside])
    fastpaths.record("read_copied", dest.nbytes)


def _decode(steps, data, target: np.ndarray, what: str):
    """Apply ``steps`` to ``data``; returns a buffer of exactly ``target.nbytes`` (``target`` itself when decoded into it)."""
    buf = data
    for n, step in enumerate(steps):
        last = n == len(steps) - 1
        try:
            buf = step.decode(buf, target if last else None, what)
        except Exception as e:
            raise ValueError(f"{what}: {step!r} failed: {type(e).__name__}: {e}") from e
    got = target if buf is target else \
        np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1).view(np.uint8)
    if got.nbytes != target.nbytes:
        raise ValueError(f"{what}: decodes to {got.nbytes} bytes, a chunk of this array has {target.nbytes}")
    if any(isinstance(step, _Numcodec) for step in steps):   # a compressor ran here (not a crc32c alone)
        fastpaths.codec("host_decoded_bytes", got.nbytes)
    return got


def _read_raw_local(src: Source, lay: Layout, shape, region, out, per_key) -> None:
    """Raw chunks in local files: whole ones read straight into ``out``, others through scratch."""
    for outer, idxs in per_key.items():
        idx = idxs[0]
        key = lay.key(outer)
        inside, outs, whole = _cover(idx, lay, shape, region)
        dest = out[outs]
        if whole and dest.flags.c_contiguous:
            if not src.read_raw_into(key, dest):
                dest[...] = lay.fill
                fastpaths.record("read_fill", dest.nbytes)
                continue
            if not lay.dtype.isnative:
                dest.view(lay.dtype).byteswap(inplace=True)
            fastpaths.record("read_direct", dest.nbytes)
            continue
        data = next(src.fetch([(key, None)]))
        _place(lay, shape, region, out, idx, data, key)


# -- writing whole chunks --------------------------------------------------

def write_region(array, region: tuple[slice, ...], data: np.ndarray, threads: int = 1) -> bool:
    """Write ``data`` to ``array[region]``, encoding its chunks here; False (nothing written) when zarr must.

    Handles unsharded arrays on local stores (and on S3 through s3fs:
    :func:`dgemm.storage.remote.put_many`) whose codecs this module can
    encode (zstd, blosc, gzip, crc32c, v2 compressors) and regions made of
    whole chunks (an edge chunk whole up to the array's edge): each chunk is
    encoded (numcodecs or libzstd, outside the GIL) and written as zarr's
    local store writes it, to a temporary file moved into place.  ``threads``:
    with ``threads - 1`` helpers (:func:`dgemm.storage.threads.shared`).
    """
    data = np.asarray(data)
    try:
        lay = layout(array)
    except Unsupported:
        return _declined("write_zarr", data)
    from dgemm.storage import remote

    src = Source(array)
    if lay.shard is not None or getattr(array, "read_only", True) \
            or not all(getattr(step, "encodes", False) for step in lay.steps) \
            or (src.root is None and not remote.handles(array.store)):
        return _declined("write_zarr", data)
    shape = tuple(array.shape)
    if len(region) != len(shape) or data.shape != tuple(s.stop - s.start for s in region):
        return _declined("write_zarr", data)
    idxs = list(itertools.product(*[range(s.start // c, -(-s.stop // c)) for s, c in zip(region, lay.chunk)]))
    for idx in idxs:
        for i, c, n, s in zip(idx, lay.chunk, shape, region):
            if s.start > i * c or s.stop < min((i + 1) * c, n):
                return _declined("write_zarr", data)    # a part of a chunk: zarr reads, merges, rewrites it
    visible(array)
    inner = int(threads) // max(len(idxs), 1)   # threads beyond one a chunk: libzstd's, inside each (the default C's)

    def put(idx, helper: bool):
        """Chunk ``idx`` encoded and written (local), or its object (S3)."""
        inside, outs, whole = _cover(idx, lay, shape, region)
        part = data[outs]
        if whole and part.flags.c_contiguous and part.dtype == lay.dtype:
            buf = part.reshape(-1).view(np.uint8)
        else:
            nbytes = int(np.prod(lay.chunk)) * lay.dtype.itemsize    # a helper keeps no scratch (for ever)
            chunk = (np.empty(nbytes, np.uint8) if helper else scratch("chunk", nbytes)).view(lay.dtype).reshape(lay.chunk)
            chunk[...] = lay.fill      # what zarr stores beyond the array's edge
            chunk[inside] = part
            buf = chunk.reshape(-1).view(np.uint8)
        if any(isinstance(step, _Numcodec) for step in lay.steps):
            fastpaths.codec("host_encoded_bytes", buf.nbytes)
        for step in reversed(lay.steps):
            buf = step.encode(buf, workers=inner) if inner > 1 and getattr(step, "parallel", False) else \
                step.encode(buf)
        if helper or (inner > 1 and any(getattr(step, "parallel", False) for step in lay.steps)):
            fastpaths.record("write_helped", part.nbytes)
        if src.root is None:
            # a raw chunk's buf may be this thread's scratch, and a zstd chunk's this thread's encoder
            # buffer (dgemm.storage.zstd), both reused by the next chunk: copied now
            reused = not lay.steps or getattr(lay.steps[0], "transient", False)
            return src._key(lay.key(idx)), (bytes(memoryview(buf).cast("B")) if reused else buf), part.nbytes
        _write_file(src.file(lay.key(idx)), buf)
        fastpaths.record("write_direct", part.nbytes)
        return None

    done = threads_mod.shared(put, idxs, threads)
    items = [(key, buf) for key, buf, _ in filter(None, done)]
    if items and remote.put_many(array.store, items) is None:
        return _declined("write_zarr", data)    # an object too large for one PUT: nothing written, zarr writes it
    fastpaths.record("write_batched", sum(n for *_, n in filter(None, done)), len(items))
    return True


def _write_file(path: str, buf) -> None:
    """Write ``buf`` to ``path`` through a temporary file beside it, so a reader never sees half a chunk."""
    import uuid

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.partial"
    try:
        view = memoryview(buf).cast("B")
        with open(tmp, "wb", buffering=0) as f:     # unbuffered: no copy through Python's buffer
            done = 0
            while done < len(view):                 # one write() stops short of 2 GiB
                done += f.write(view[done:])
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise

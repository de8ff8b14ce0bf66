"""dgemm.storage.chunks: a block of a Zarr array read straight into the caller's buffer, without zarr's reading.

Every layout :func:`chunks.read_into` says it handles must give exactly
what zarr's own indexing gives for the region (``np.asarray(arr[region])``,
never dgemm's reader, which is under test here): edge chunks
cut short, chunks never written (the fill value), empty inner chunks of a
shard, big-endian data, both dtypes.  The output buffer is poisoned first,
so an element left unwritten shows; zarr's own reading is made to raise
during the call, so a fast path that quietly falls back to zarr fails.  A
layout it does not handle must return False with the buffer untouched, and
corrupt data must raise, never read as numbers.  The arrays are small (two
cores in CI): 37 x 53 in chunks of 8 x 16, shards of 16 x 32.
"""
from __future__ import annotations

import contextlib
import os
import pickle
from concurrent.futures import ThreadPoolExecutor

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec
from zarr.storage import FsspecStore, LocalStore

from dgemm.storage import chunks
from dgemm.storage.blocks import ZarrBlock

SHAPE, CHUNKS, SHARDS = (37, 53), (8, 16), (16, 32)
# Chunks (in the 5 x 4 grid of 8 x 16 chunks) never written: (1, 1) alone in its shard (an empty inner
# chunk), (2..3, 2..3) all of shard (1, 1) (a missing shard), (4, 0) an edge chunk next to a written one.
MISSING = {(1, 1), (2, 2), (2, 3), (3, 2), (3, 3), (4, 0)}
REGIONS = {
    "one chunk": ((8, 16), (32, 48)),
    "one missing chunk": ((8, 16), (16, 32)),
    "several chunks": ((0, 24), (16, 48)),
    "one shard": ((0, 16), (0, 32)),
    "a missing shard": ((16, 32), (32, 53)),
    "not aligned": ((3, 29), (5, 50)),
    "across shards": ((10, 20), (20, 40)),
    "edge chunk": ((32, 37), (48, 53)),
    "in the edge, not aligned": ((27, 37), (39, 53)),
    "whole array": ((0, 37), (0, 53)),
    "one element": ((13, 14), (30, 31)),
    "one row": ((20, 21), (0, 53)),
    "one column": ((0, 37), (47, 48)),
}
SHAPE_1D, CHUNKS_1D, SHARDS_1D = (53,), (16,), (32,)
MISSING_1D = {(1,)}
REGIONS_1D = {"one chunk": (0, 16), "missing chunk": (16, 32), "not aligned": (5, 50), "edge": (48, 53),
              "whole": (0, 53), "one element": (20, 21)}


# -- layouts: keyword arguments of zarr.create_array, for a chunk shape and a shard shape ----------------------
def v3(serializer=None, compressors=None, shards=None, index="end", keys=None):
    def kwargs(chunk, shard):
        kw = {"chunks": chunk, "serializer": serializer or BytesCodec(), "compressors": compressors}
        if keys:
            kw["chunk_key_encoding"] = {"name": keys[0], "separator": keys[1]}
        if shards:
            kw["shards"] = {"shape": shard, "index_location": index}
        return kw
    return kwargs


def v2(compressor=None, separator=".", endian="<", order="C", filters=None):
    def kwargs(chunk, shard):
        return {"chunks": chunk, "zarr_format": 2, "compressors": compressor, "filters": filters, "order": order,
                "chunk_key_encoding": {"name": "v2", "separator": separator}, "endian": endian}
    return kwargs


def sharding_codec(codecs, index_codecs=None, index="end"):
    """A sharded layout given as the serializer: inner codecs (and index codecs) zarr.create_array cannot name."""
    def kwargs(chunk, shard):
        kw = {"chunk_shape": chunk, "codecs": codecs(chunk), "index_location": index}
        if index_codecs is not None:
            kw["index_codecs"] = index_codecs
        return {"chunks": shard, "serializer": ShardingCodec(**kw), "compressors": None}
    return kwargs


BE = BytesCodec(endian="big")
INNER = {  # (serializer, compressors) of a chunk, alone or inside a shard
    "bytes": (None, None),
    "bytes-big": (BE, None),
    "zstd": (None, ZstdCodec(level=1)),
    "zstd-checksum": (None, ZstdCodec(level=1, checksum=True)),
    "blosc-lz4-shuffle": (None, BloscCodec(cname="lz4", shuffle="shuffle")),
    "blosc-lz4-bitshuffle": (None, BloscCodec(cname="lz4", shuffle="bitshuffle")),
    "blosc-lz4-noshuffle": (None, BloscCodec(cname="lz4", shuffle="noshuffle")),
    "blosc-zstd-shuffle": (None, BloscCodec(cname="zstd", shuffle="shuffle")),
    "blosc-zstd-bitshuffle-big": (BE, BloscCodec(cname="zstd", shuffle="bitshuffle")),
    "gzip": (None, GzipCodec(level=1)),
    "bytes+crc32c": (None, [Crc32cCodec()]),
    "bytes-big+crc32c": (BE, [Crc32cCodec()]),
    "zstd+crc32c": (None, [ZstdCodec(level=1), Crc32cCodec()]),
    "zstd-checksum+crc32c": (None, [ZstdCodec(level=1, checksum=True), Crc32cCodec()]),
    "blosc-lz4+crc32c": (None, [BloscCodec(cname="lz4", shuffle="shuffle"), Crc32cCodec()]),
    "gzip+crc32c": (None, [GzipCodec(level=1), Crc32cCodec()]),
}
SHARDED_START = ("bytes", "bytes-big", "zstd", "blosc-lz4-bitshuffle", "gzip", "zstd+crc32c", "bytes+crc32c")

HANDLED = {f"v3 {name}": v3(s, c) for name, (s, c) in INNER.items()}
HANDLED |= {f"v3 sharded {name}": v3(s, c, shards=True) for name, (s, c) in INNER.items()}
HANDLED |= {f"v3 sharded index-start {name}": v3(*INNER[name], shards=True, index="start") for name in SHARDED_START}
HANDLED |= {"v3 zstd keys 'default' '.'": v3(None, ZstdCodec(level=1), keys=("default", ".")),
            "v3 bytes keys 'v2' '.'": v3(keys=("v2", ".")),
            "v3 sharded zstd keys 'v2' '/'": v3(None, ZstdCodec(level=1), shards=True, keys=("v2", "/"))}
V2_COMPRESSORS = {"none": None, "zstd": numcodecs.Zstd(level=1), "gzip": numcodecs.GZip(level=1),
                  "blosc-lz4": numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE),
                  "blosc-zstd-bitshuffle": numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.BITSHUFFLE)}
HANDLED |= {f"v2 {name} sep{sep!r} {'big' if e == '>' else 'little'}": v2(comp, sep, e)
            for name, comp in V2_COMPRESSORS.items() for sep in "./" for e in "<>"}

UNHANDLED = {
    "v3 transpose": lambda chunk, shard: {"chunks": chunk, "filters": [TransposeCodec(order=(1, 0))],
                                          "compressors": None},
    "v3 transpose + zstd": lambda chunk, shard: {"chunks": chunk, "filters": [TransposeCodec(order=(1, 0))],
                                                 "compressors": ZstdCodec(level=1)},
    "v3 sharded, inner transpose": sharding_codec(lambda c: [TransposeCodec(order=(1, 0)), BytesCodec()]),
    "v2 filter shuffle": v2(None, filters=[numcodecs.Shuffle(elementsize=8)]),
    "v2 filter shuffle + zstd": v2(numcodecs.Zstd(level=1), filters=[numcodecs.Shuffle(elementsize=8)]),
    "v2 order F": v2(None, order="F"),
    "v2 order F zstd big": v2(numcodecs.Zstd(level=1), endian=">", order="F"),
}

# Outside the contract either way: read_into may handle them or decline, but never give wrong numbers.
EITHER = {
    "v2 lz4": v2(numcodecs.LZ4()),
    "v2 zlib": v2(numcodecs.Zlib(level=1)),
    "v3 zstd then gzip": v3(None, [ZstdCodec(level=1), GzipCodec(level=1)]),
    "v3 sharded, index without crc32c": sharding_codec(lambda c: [BytesCodec(), ZstdCodec(level=1)],
                                                       index_codecs=[BytesCodec()]),
    "v3 sharded, big-endian index at start": sharding_codec(lambda c: [BytesCodec()], index="start",
                                                            index_codecs=[BytesCodec(endian="big"), Crc32cCodec()]),
    "v3 sharded in sharded": sharding_codec(lambda c: [ShardingCodec(chunk_shape=tuple(n // 2 for n in c))]),
}


# -- helpers --------------------------------------------------------------------------------------------------
def fill_for(rng) -> float:
    """A nonzero fill value exact in float32 and float64."""
    return float(rng.integers(1, 400)) / -8.0


def make(layout, where, dtype, rng, *, ndim=2, fill="random", missing=True, shape=None):
    """A Zarr array of ``layout`` with random data and (with ``missing``) some chunks never written.

    Returns the array and what it holds (as numpy, fill value in the missing chunks).
    """
    default, chunk, shard = (SHAPE, CHUNKS, SHARDS) if ndim == 2 else (SHAPE_1D, CHUNKS_1D, SHARDS_1D)
    shape = shape or default
    kw = dict(layout(chunk, shard))
    dt = np.dtype(dtype)
    endian = kw.pop("endian", None)
    if endian:
        dt = dt.newbyteorder(endian)
    fill = fill_for(rng) if fill == "random" else fill
    data = rng.standard_normal(shape).astype(dtype)
    if missing:
        for idx in (MISSING if ndim == 2 else MISSING_1D):
            # a fill value of None (v2) reads as 0
            data[tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunk))] = 0 if fill is None else fill
    arr = zarr.create_array(where, shape=shape, dtype=dt, fill_value=fill, **kw)
    # Chunks equal to the fill value everywhere are not stored (write_empty_chunks is off): never written.
    arr[...] = data
    return arr, data


def stores(tmp_path, kind):
    """Where an array is created: a path, or a store and a name."""
    if kind == "local":
        return {"store": LocalStore(str(tmp_path / "a.zarr"))}
    if kind == "local, in a group":
        return {"store": LocalStore(str(tmp_path / "root.zarr")), "name": "group/sub/a"}
    if kind == "fsspec file://":
        return {"store": FsspecStore.from_url(f"file://{tmp_path}/f.zarr", storage_options={"auto_mkdir": True})}
    if kind == "fsspec file://, in a group":
        return {"store": FsspecStore.from_url(f"file://{tmp_path}/root.zarr", storage_options={"auto_mkdir": True}),
                "name": "group/a"}
    raise ValueError(kind)


def create(layout, tmp_path, dtype, rng, kind="local", **kw):
    """:func:`make` in the store ``kind`` names (see :func:`stores`)."""
    where = stores(tmp_path, kind)
    store, name = where["store"], where.get("name")

    def named(chunk, shard):
        return dict(layout(chunk, shard), **({"name": name} if name else {}))
    return make(named, store, dtype, rng, **kw)


def native(arr) -> np.dtype:
    return np.dtype(arr.dtype).newbyteorder("=")


def poisoned(block, arr, value=np.nan) -> np.ndarray:
    return np.full(block.shape, value, dtype=native(arr))


@contextlib.contextmanager
def zarr_cannot_read():
    """zarr's reading raises inside: a read_into that goes through it (or through ZarrBlock.load) fails."""
    def through_zarr(*args, **kwargs):
        raise AssertionError("read_into read through zarr instead of its own fast path")

    targets = [(zarr.Array, "__getitem__"), (zarr.Array, "get_basic_selection"),
               (zarr.Array, "get_orthogonal_selection"), (zarr.AsyncArray, "getitem"),
               (zarr.AsyncArray, "_get_selection"), (ZarrBlock, "load")]
    try:  # zarr's codec pipeline (internal: guarded, its name may change)
        from zarr.core.codec_pipeline import BatchedCodecPipeline
        targets += [(BatchedCodecPipeline, "read"), (BatchedCodecPipeline, "decode")]
    except ImportError:
        pass
    with pytest.MonkeyPatch.context() as mp:
        for owner, name in targets:
            if hasattr(owner, name):
                mp.setattr(owner, name, through_zarr)
        yield


def through_zarr(arr, rows, cols, expand=None) -> np.ndarray:
    """The region as zarr's own indexing reads it (2-D, as a block of it), in native byte order: the reference."""
    if expand is None:
        got = np.asarray(arr[rows[0]:rows[1], cols[0]:cols[1]])
    else:
        lo, hi = cols if expand == 0 else rows
        got = np.asarray(arr[lo:hi])
        got = got[None, :] if expand == 0 else got[:, None]
    return got.astype(native(arr))


def check_region(arr, data, rows, cols, *, expand=None, label="", poison=np.nan):
    """read_into gives True and exactly what zarr reads (and what was written) for one region."""
    block = ZarrBlock(arr, rows=rows, cols=cols, expand=expand)
    expected = through_zarr(arr, rows, cols, expand)
    want = data[rows[0]:rows[1], cols[0]:cols[1]] if expand is None else (
        data[cols[0]:cols[1]][None, :] if expand == 0 else data[rows[0]:rows[1]][:, None])
    assert np.array_equal(expected, want, equal_nan=True), f"{label}: zarr itself does not read what was written"
    out = poisoned(block, arr, poison)
    with zarr_cannot_read():
        took = chunks.read_into(block, out)
    assert took is True, f"{label}: read_into declined (returned {took!r}), why_not: {chunks.why_not(arr)!r}"
    bad = ~((out == expected) | (np.isnan(out) & np.isnan(expected)))
    assert not bad.any(), (f"{label} rows {rows} cols {cols}: {bad.sum()} of {bad.size} elements wrong, first at "
                           f"{tuple(int(i) for i in np.argwhere(bad)[0])}")
    assert np.array_equal(out, expected, equal_nan=True)


def check_all_regions(arr, data, label=""):
    for name, (rows, cols) in REGIONS.items():
        check_region(arr, data, rows, cols, label=f"{label} {name}")


def chunk_file(arr, idx) -> str:
    """The file of chunk (or shard) ``idx`` of an array on a LocalStore."""
    return os.path.join(str(arr.store.root), arr.path.strip("/"), arr.metadata.encode_chunk_key(idx))


# -- handled layouts: the fast path is taken and gives exactly zarr's values ---------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("layout", list(HANDLED), ids=list(HANDLED))
def test_handled_layouts_read_exactly_what_zarr_reads(tmp_path, rng, layout, dtype):
    arr, data = create(HANDLED[layout], tmp_path, dtype, rng)
    assert chunks.why_not(arr) is None
    # the chunks meant to be missing are (a test whose chunks all exist would not check the fill value)
    sharded = getattr(arr, "shards", None) is not None
    assert not os.path.exists(chunk_file(arr, (1, 1) if sharded else (2, 2)))
    assert os.path.exists(chunk_file(arr, (0, 0)))
    check_all_regions(arr, data, layout)


@pytest.mark.parametrize("kind", ["local, in a group", "fsspec file://", "fsspec file://, in a group"])
@pytest.mark.parametrize("layout", ["v3 zstd", "v3 bytes-big+crc32c", "v3 sharded zstd+crc32c",
                                    "v3 sharded index-start blosc-lz4-bitshuffle", "v2 zstd sep'/' big",
                                    "v2 none sep'.' little"])
def test_handled_layouts_in_other_stores_and_groups(tmp_path, rng, layout, kind):
    arr, data = create(HANDLED[layout], tmp_path, "float64", rng, kind=kind)
    assert chunks.why_not(arr) is None
    check_all_regions(arr, data, f"{layout} ({kind})")
    # as a worker opens it: a fresh read-only array from the store
    again = zarr.open_array(arr.store.with_read_only(True) if hasattr(arr.store, "with_read_only") else arr.store,
                            path=arr.path, mode="r")
    check_region(again, data, (3, 29), (5, 50), label=f"{layout} ({kind}, reopened)")
    # as a worker gets it: pickled with the task
    check_region(pickle.loads(pickle.dumps(arr)), data, (8, 37), (0, 53), label=f"{layout} ({kind}, pickled)")


@pytest.mark.parametrize("fill", [np.nan, -np.inf, 0.1], ids=["nan", "-inf", "0.1"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("layout", ["v3 bytes", "v3 zstd", "v3 sharded blosc-lz4-shuffle",
                                    "v3 sharded index-start zstd+crc32c", "v2 gzip sep'/' big"])
def test_special_fill_values(tmp_path, rng, layout, dtype, fill):
    """NaN (v2's usual fill), -inf, 0.1 (not exact in float32): a sentinel poison shows what is unwritten."""
    arr, data = create(HANDLED[layout], tmp_path, dtype, rng, fill=fill)
    for name, (rows, cols) in REGIONS.items():
        check_region(arr, data, rows, cols, label=f"{layout} {name}", poison=1e30)


@pytest.mark.parametrize("layout", ["v2 zstd sep'.' little", "v2 none sep'/' big"])
def test_v2_fill_value_none_reads_zero(tmp_path, rng, layout):
    arr, data = create(HANDLED[layout], tmp_path, "float64", rng, fill=None)
    assert arr.metadata.fill_value is None
    for name, (rows, cols) in REGIONS.items():
        check_region(arr, data, rows, cols, label=f"{layout} {name}")


@pytest.mark.parametrize("layout", ["v3 bytes", "v3 zstd", "v3 sharded gzip", "v2 zstd sep'.' little",
                                    "v2 blosc-lz4 sep'/' big"])
def test_chunk_larger_than_the_array(tmp_path, rng, layout):
    """A 5 x 7 array in one 8 x 16 chunk (or shard): only its edge."""
    arr, data = create(HANDLED[layout], tmp_path, "float64", rng, missing=False, shape=(5, 7))
    for rows, cols in [((0, 5), (0, 7)), ((1, 4), (2, 6)), ((4, 5), (6, 7))]:
        check_region(arr, data, rows, cols, label=layout)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("layout", ["v3 bytes", "v3 bytes-big", "v3 zstd-checksum+crc32c", "v3 sharded zstd",
                                    "v3 sharded index-start bytes+crc32c", "v2 blosc-zstd-bitshuffle sep'/' big",
                                    "v2 none sep'.' little"])
@pytest.mark.parametrize("expand", [0, 1])
def test_one_dimensional_arrays(tmp_path, rng, layout, dtype, expand):
    """A 1-D array read as a row (expand=0: the region is cols) or a column (expand=1: rows)."""
    arr, data = create(HANDLED[layout], tmp_path, dtype, rng, ndim=1)
    assert chunks.why_not(arr) is None
    for name, (lo, hi) in REGIONS_1D.items():
        rows, cols = ((0, 1), (lo, hi)) if expand == 0 else ((lo, hi), (0, 1))
        check_region(arr, data, rows, cols, expand=expand, label=f"{layout} 1-D {name}")


# -- layouts not handled: False, the buffer untouched ------------------------------------------------------------
@pytest.mark.parametrize("layout", list(UNHANDLED), ids=list(UNHANDLED))
def test_unhandled_layouts_return_false_and_leave_out_untouched(tmp_path, rng, layout):
    arr, data = create(UNHANDLED[layout], tmp_path, "float64", rng)
    reason = chunks.why_not(arr)
    assert isinstance(reason, str) and reason.strip(), f"why_not gave {reason!r}"
    for name, (rows, cols) in REGIONS.items():
        block = ZarrBlock(arr, rows=rows, cols=cols)
        assert np.array_equal(through_zarr(arr, rows, cols), data[rows[0]:rows[1], cols[0]:cols[1]])
        out = rng.standard_normal(block.shape).astype(native(arr))
        before = out.copy()
        assert chunks.read_into(block, out) is False, f"{layout} {name}: read_into claims a layout it should decline"
        assert np.array_equal(out, before), f"{layout} {name}: read_into wrote into out and returned False"


@pytest.mark.parametrize("layout", list(EITHER), ids=list(EITHER))
def test_other_layouts_are_read_right_or_declined(tmp_path, rng, layout):
    """Layouts outside the contract: handled exactly as zarr reads them, or declined with out untouched."""
    arr, data = create(EITHER[layout], tmp_path, "float64", rng)
    reason = chunks.why_not(arr)
    assert reason is None or (isinstance(reason, str) and reason.strip())
    for name, (rows, cols) in REGIONS.items():
        block = ZarrBlock(arr, rows=rows, cols=cols)
        expected = through_zarr(arr, rows, cols)
        assert np.array_equal(expected, data[rows[0]:rows[1], cols[0]:cols[1]])
        out = np.full(block.shape, np.nan)
        took = chunks.read_into(block, out)
        assert took is (reason is None), f"{layout} {name}: read_into returned {took!r}, why_not {reason!r}"
        if took:
            assert np.array_equal(out, expected), f"{layout} {name}: handled, but wrong values"
        else:
            assert np.isnan(out).all(), f"{layout} {name}: declined, but wrote into out"


# -- corrupt data raises ------------------------------------------------------------------------------------------
def garbage(rng, b: bytes) -> bytes:
    return rng.bytes(len(b))


def truncated(rng, b: bytes) -> bytes:
    return b[:-8]


def flip_at(where):
    def flip(rng, b: bytes) -> bytes:
        i = where(len(b))
        return b[:i] + bytes([b[i] ^ 0x5A]) + b[i + 1:]
    return flip


INDEX_BYTES = 2 * 2 * 16 + 4   # a 16 x 32 shard holds 2 x 2 inner chunks: (offset, length) each, then a crc32c
CORRUPTIONS = {
    # (layout, damage): whatever the codec, zarr itself cannot read the damaged chunk
    "zstd garbage": ("v3 zstd", garbage),
    "zstd-checksum flipped": ("v3 zstd-checksum", flip_at(lambda n: n // 2)),
    "blosc-lz4 garbage": ("v3 blosc-lz4-shuffle", garbage),
    "blosc-zstd garbage": ("v3 blosc-zstd-shuffle", garbage),
    "gzip garbage": ("v3 gzip", garbage),
    "gzip flipped": ("v3 gzip", flip_at(lambda n: n // 2)),
    "bytes truncated": ("v3 bytes", truncated),
    "zstd truncated": ("v3 zstd", truncated),
    # crc32c: the payload still decodes (raw bytes), only the checksum tells
    "bytes+crc32c payload flipped": ("v3 bytes+crc32c", flip_at(lambda n: 5)),
    "bytes-big+crc32c payload flipped": ("v3 bytes-big+crc32c", flip_at(lambda n: n // 2)),
    "bytes+crc32c checksum flipped": ("v3 bytes+crc32c", flip_at(lambda n: n - 2)),
    "zstd+crc32c payload flipped": ("v3 zstd+crc32c", flip_at(lambda n: n // 2)),
    "blosc+crc32c payload flipped": ("v3 blosc-lz4+crc32c", flip_at(lambda n: n - 10)),
    "sharded garbage": ("v3 sharded zstd", garbage),
    "sharded index-start garbage": ("v3 sharded index-start zstd", garbage),
    "sharded inner bytes+crc32c flipped": ("v3 sharded bytes+crc32c", flip_at(lambda n: 3)),
    "sharded index-start inner bytes+crc32c flipped": ("v3 sharded index-start bytes+crc32c",
                                                      flip_at(lambda n: INDEX_BYTES + 3)),
    "sharded index flipped (end)": ("v3 sharded bytes", flip_at(lambda n: n - INDEX_BYTES + 1)),
    "sharded index flipped (start)": ("v3 sharded index-start bytes", flip_at(lambda n: 1)),
    "sharded truncated": ("v3 sharded zstd+crc32c", truncated),
    "v2 zstd garbage": ("v2 zstd sep'.' little", garbage),
    "v2 blosc garbage": ("v2 blosc-lz4 sep'/' big", garbage),
    "v2 gzip garbage": ("v2 gzip sep'/' little", garbage),
    "v2 raw truncated": ("v2 none sep'.' big", truncated),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS), ids=list(CORRUPTIONS))
def test_corrupt_chunk_raises(tmp_path, rng, case):
    layout, damage = CORRUPTIONS[case]
    arr, data = create(HANDLED[layout], tmp_path, "float64", rng, missing=False)
    path = chunk_file(arr, (0, 0))
    with open(path, "rb") as f:
        good = f.read()
    bad = damage(rng, good)
    assert bad != good
    with open(path, "wb") as f:
        f.write(bad)
    block = ZarrBlock(arr, rows=(0, 16), cols=(0, 32))   # holds chunk (0, 0): the whole first shard
    with pytest.raises(Exception):
        through_zarr(arr, (0, 16), (0, 32))   # the damage is one zarr sees: read_into must see it too
    out = np.full(block.shape, np.nan)
    try:
        took = chunks.read_into(block, out)
    except Exception:
        return
    pytest.fail(f"{case}: read_into returned {took!r} on a corrupt chunk instead of raising "
                f"({np.isnan(out).sum()} of {out.size} elements left unwritten)")


def test_corrupt_chunk_outside_the_region_is_not_read(tmp_path, rng):
    """Damage to a chunk the block does not touch does not stop the read (read_into reads only what it needs)."""
    arr, data = create(HANDLED["v3 zstd+crc32c"], tmp_path, "float64", rng, missing=False)
    with open(chunk_file(arr, (4, 3)), "wb") as f:
        f.write(b"not a chunk")
    check_region(arr, data, (0, 16), (0, 32), label="next to a corrupt chunk")


@pytest.mark.parametrize("layout", ["v3 bytes", "v3 zstd", "v3 sharded zstd", "v2 none sep'.' little",
                                    "v2 zstd sep'/' big", "v3 zstd keys 'default' '.'"])
def test_a_chunk_that_is_a_folder_is_a_read_error_naming_the_chunk(tmp_path, rng, layout):
    """A chunk key whose path is a folder read as a bare '[Errno 21] Is a directory' (and zarr reads one as a
    missing chunk, silently): the read error names the array, the rows and columns, the chunk and its key."""
    from dgemm.storage.blocks import read_block

    arr, data = create(HANDLED[layout], tmp_path, "float64", rng, missing=False)
    idx = (0, 1) if arr.shards else (1, 2)           # the shard, or the chunk, holding rows 8:16, columns 32:48
    path = chunk_file(arr, idx)
    os.remove(path)
    os.mkdir(path)
    key = arr.metadata.encode_chunk_key(idx)
    key = f"{arr.path.strip('/')}/{key}" if arr.path.strip("/") else key
    block = ZarrBlock(arr, rows=(8, 16), cols=(32, 48))
    for read in (lambda: block.fill_into(np.empty(block.shape, native(arr))), lambda: read_block(block)):
        with pytest.raises(OSError) as e:
            read()
        msg = str(e.value)
        assert msg.startswith(f"dgemm could not read Zarr array {arr.store_path} rows 8:16, columns 32:48"), msg
        assert f"chunk {idx} (store key {key!r}) is a folder, not a file" in msg, msg


# -- S3 --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout,group", [("v3 zstd", ""), ("v3 zstd", "group/sub"),
                                          ("v3 sharded index-start zstd+crc32c", "group"),
                                          ("v2 zstd sep'/' big", "")])
def test_s3_fsspec_store(s3, rng, layout, group):
    root = f"chunks/{layout.replace(' ', '-')}-{rng.integers(1 << 30)}.zarr"
    store = FsspecStore.from_url(s3.url(root), storage_options=s3.storage_options)

    def named(chunk, shard):
        return dict(HANDLED[layout](chunk, shard), **({"name": group} if group else {}))
    arr, data = make(named, store, "float64", rng)
    assert isinstance(arr.store, FsspecStore)
    # as a worker opens it
    name = f"{root}/{group}" if group else root
    opened = zarr.open_array(s3.url(name), mode="r", storage_options=s3.storage_options)
    assert isinstance(opened.store, FsspecStore)
    assert chunks.why_not(opened) is None
    for region in ("one chunk", "one missing chunk", "a missing shard", "not aligned", "in the edge, not aligned",
                   "whole array"):
        rows, cols = REGIONS[region]
        check_region(opened, data, rows, cols, label=f"s3 {layout} {region}")


# -- threads ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout,kind", [("v3 sharded zstd+crc32c", "local"),
                                         ("v3 blosc-lz4-bitshuffle", "fsspec file://"),
                                         ("v2 zstd sep'/' big", "local")])
def test_many_threads_reading_one_array(tmp_path, rng, layout, kind):
    arr, data = create(HANDLED[layout], tmp_path, "float32", rng, kind=kind)
    row_cuts, col_cuts = [0, 5, 13, 16, 24, 30, 37], [0, 7, 16, 20, 33, 41, 53]
    blocks = [ZarrBlock(arr, rows=(r0, r1), cols=(c0, c1))
              for r0, r1 in zip(row_cuts, row_cuts[1:]) for c0, c1 in zip(col_cuts, col_cuts[1:])] * 4
    wants = [data[b.rows[0]:b.rows[1], b.cols[0]:b.cols[1]] for b in blocks]

    def read(block):
        out = poisoned(block, arr)
        return chunks.read_into(block, out), out

    with zarr_cannot_read(), ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(read, blocks))
    for block, want, (took, out) in zip(blocks, wants, results):
        assert took is True
        assert np.array_equal(out, want), f"rows {block.rows} cols {block.cols} wrong when read among threads"


def test_many_threads_reading_one_array_on_s3(s3, rng):
    name = f"chunks/threads-{rng.integers(1 << 30)}.zarr"
    store = FsspecStore.from_url(s3.url(name), storage_options=s3.storage_options)
    _, data = make(HANDLED["v3 sharded zstd+crc32c"], store, "float64", rng)
    arr = zarr.open_array(s3.url(name), mode="r", storage_options=s3.storage_options)
    cuts = [0, 13, 24, 37], [0, 20, 41, 53]
    blocks = [ZarrBlock(arr, rows=(r0, r1), cols=(c0, c1))
              for r0, r1 in zip(cuts[0], cuts[0][1:]) for c0, c1 in zip(cuts[1], cuts[1][1:])] * 2

    def read(block):
        out = poisoned(block, arr)
        return chunks.read_into(block, out), out

    with zarr_cannot_read(), ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(read, blocks))
    for block, (took, out) in zip(blocks, results):
        assert took is True
        assert np.array_equal(out, data[block.rows[0]:block.rows[1], block.cols[0]:block.cols[1]]), \
            f"rows {block.rows} cols {block.cols} wrong when read among threads"

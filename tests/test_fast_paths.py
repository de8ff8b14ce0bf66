"""Which path read and wrote each chunk: dgemm's own (:mod:`dgemm.storage.chunks`) or zarr's.

When a fast path declines a case it should take, zarr reads or writes the
same values more slowly, so a check of values alone passes.  These tests
check the path, from the counters of :mod:`dgemm.storage.fastpaths`: what
each read and write added to them, against what the chunk geometry says
(computed here, from the shapes alone).  A whole chunk inside the region
that spans the region's columns (a block as wide as a chunk: its part of the
buffer is contiguous) is read straight into the caller's buffer
(``read_direct`` for raw local chunks, ``read_decoded_into`` for zstd and
blosc); any other chunk (cut by the region or the array's edge, or one of
several across) is decoded aside and copied (``read_copied``); a chunk never
written is the fill value (``read_fill``).  Writes of whole chunks
(an edge chunk whole up to the array's edge) are dgemm's: ``write_direct``
to files, ``write_batched`` in one batch of PUTs (``s3_put_batch``) on S3.
What dgemm leaves to zarr on purpose (see :func:`chunks.why_not`: a
transpose codec; for writes shards and parts of chunks) must count as
``read_zarr`` / ``write_zarr``.  Values are checked too, against numpy and
zarr's own indexing.  The last test reads the counters back from real
worker processes after a ``dgemm.matmul``.  Arrays are small (two cores in
CI), in chunks from 64 bytes to 256 KiB.
"""
from __future__ import annotations

import itertools

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec

import dgemm
from _check import check_product
from dgemm.names import STORAGE_PATHS
from dgemm.storage import chunks, fastpaths, store_block
from dgemm.storage.blocks import ZarrBlock

READS = ("read_direct", "read_decoded_into", "read_copied", "read_fill", "read_zarr")
WRITES = ("write_direct", "write_batched", "write_zarr", "s3_put_batch")

# name: (keyword arguments of zarr.create_array but chunks, the path of a whole chunk inside the region)
LAYOUTS = {
    "v3 zstd": ({"compressors": ZstdCodec(level=1)}, "read_decoded_into"),
    "v3 zstd+crc32c": ({"compressors": [ZstdCodec(level=1), Crc32cCodec()]}, "read_decoded_into"),
    "v3 blosc-lz4": ({"compressors": BloscCodec(cname="lz4", shuffle="shuffle")}, "read_decoded_into"),
    "v3 raw": ({"compressors": None}, "read_direct"),
    "v3 raw big-endian": ({"compressors": None, "serializer": BytesCodec(endian="big")}, "read_direct"),
    "v3 sharded zstd": ({"compressors": ZstdCodec(level=1), "shards": "2x"}, "read_decoded_into"),
    "v2 zstd": ({"compressors": numcodecs.Zstd(level=1), "zarr_format": 2}, "read_decoded_into"),
    "v2 blosc big-endian": ({"compressors": numcodecs.Blosc(cname="zstd"), "zarr_format": 2, "endian": ">"},
                            "read_decoded_into"),
    "v2 raw": ({"compressors": None, "zarr_format": 2}, "read_direct"),
    # legitimately aside: gzip cannot decode into a buffer; a crc32c alone leaves the payload in the chunk's bytes
    "v3 gzip": ({"compressors": GzipCodec(level=1)}, "read_copied"),
    "v3 raw+crc32c": ({"compressors": [Crc32cCodec()]}, "read_copied"),
}
SIZES = {"small": (2, 4), "mid": (8, 16), "large": (128, 256)}    # float64: 64 B, 1 KiB, 256 KiB chunks


def shape_for(chunk) -> tuple[int, int]:
    """Three and a half chunks down, two and a bit across: edge chunks on both axes."""
    return (3 * chunk[0] + chunk[0] // 2, 2 * chunk[1] + chunk[1] // 4 + 1)


def regions(shape, chunk) -> dict:
    """Regions as (rows, cols): aligned inside, the corner edge chunk, cut, and the whole array."""
    c0, c1 = chunk
    return {"one chunk": ((c0, 2 * c0), (0, c1)),
            "one chunk column": ((c0, 3 * c0), (c1, 2 * c1)),
            "two chunk columns": ((c0, 3 * c0), (0, 2 * c1)),
            "edge column": ((0, 2 * c0), (2 * c1, shape[1])),
            "edge chunk": ((3 * c0, shape[0]), (2 * c1, shape[1])),
            "cut": ((c0 // 2, shape[0] - 1), (1, shape[1] - c1 // 2)),
            "whole array": ((0, shape[0]), (0, shape[1]))}


def census(shape, chunk, rows, cols, missing=()) -> tuple[int, int, int]:
    """(whole, others, missing) chunks of a region: whole inside it and the array, and as wide as it; the rest."""
    whole = cut = gone = 0
    for idx in itertools.product(range(rows[0] // chunk[0], -(-rows[1] // chunk[0])),
                                 range(cols[0] // chunk[1], -(-cols[1] // chunk[1]))):
        if idx in missing:
            gone += 1
            continue
        lo = [i * c for i, c in zip(idx, chunk)]
        inside = all(r0 <= a and a + c <= min(r1, n)
                     for a, c, (r0, r1), n in zip(lo, chunk, (rows, cols), shape)) and cols == (lo[1], lo[1] + chunk[1])
        whole, cut = whole + inside, cut + (not inside)
    return whole, cut, gone


def create(where, layout: str, chunk, rng, *, dtype="float64", fill=0.0, missing=(), shape=None, **extra):
    """A Zarr array of ``layout`` with random data (``missing`` chunks never written); (array, data)."""
    kw = dict(LAYOUTS[layout][0] if layout in LAYOUTS else {}, **extra)
    shape = shape or shape_for(chunk)
    dt = np.dtype(dtype).newbyteorder(kw.pop("endian", "="))
    if kw.get("shards") == "2x":
        kw["shards"] = tuple(2 * c for c in chunk)
    if kw.get("zarr_format") == 2:
        kw["chunk_key_encoding"] = {"name": "v2", "separator": "."}
    arr = zarr.create_array(where, shape=shape, chunks=chunk, dtype=dt, fill_value=fill, **kw)
    data = rng.standard_normal(shape).astype(dtype)
    for idx in missing:
        data[tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunk))] = fill
    arr[...] = data         # chunks all fill are not stored (write_empty_chunks is off): never written
    return arr, data


def counted(fn):
    """What ``fn()`` added to this process's path counters: ``(result, {path: (count, bytes)})``."""
    before = fastpaths.snapshot()
    result = fn()
    grew = fastpaths.since(before)
    return result, {p: (grew[f"storage_{p}"], grew[f"storage_{p}_bytes"]) for p in STORAGE_PATHS}


def read(arr, rows, cols) -> tuple[np.ndarray, dict]:
    """The block as a worker reads it (:meth:`ZarrBlock.load`: dgemm's reader, else zarr), and the paths taken."""
    return counted(lambda: ZarrBlock(arr, rows=rows, cols=cols).load())


def zarr_region(arr, rows, cols) -> np.ndarray:
    return np.asarray(arr[rows[0]:rows[1], cols[0]:cols[1]])


def expect_reads(paths, label, **want):
    """Each read path's (count, bytes) as ``want`` names it; any other read path untouched."""
    got = {p: paths[p] for p in READS}
    full = {p: want.get(p, (0, 0)) for p in READS}
    assert got == full, f"{label}: read paths (count, bytes) {got}, expected {full}"


def expect_writes(paths, label, **want):
    got = {p: paths[p] for p in WRITES}
    full = {p: want.get(p, (0, 0)) for p in WRITES}
    assert got == full, f"{label}: write paths (count, bytes) {got}, expected {full}"


def expected_reads(layout, shape, chunk, rows, cols, itemsize, missing=()):
    """{path: (count, bytes)} of a region's read, from the geometry: whole chunks on the layout's path."""
    whole, cut, gone = census(shape, chunk, rows, cols, missing)
    fast = LAYOUTS[layout][1]
    chunk_bytes = chunk[0] * chunk[1] * itemsize
    region_bytes = (rows[1] - rows[0]) * (cols[1] - cols[0]) * itemsize
    want: dict = {}
    if gone:
        # the missing chunks of the tests below lie whole inside the regions that touch them
        want["read_fill"] = (gone, gone * chunk_bytes)
    if whole:
        want[fast] = (whole, whole * chunk_bytes)
    if cut:
        n, b = want.get("read_copied", (0, 0))
        want["read_copied"] = (n + cut, b + region_bytes - (whole + gone) * chunk_bytes)
    return want


# -- reads ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_reads_take_the_fast_path_for_every_chunk_they_should(tmp_path, rng, layout, size):
    chunk = SIZES[size]
    arr, data = create(str(tmp_path / "a.zarr"), layout, chunk, rng)
    assert chunks.why_not(arr) is None
    for name, (rows, cols) in regions(arr.shape, chunk).items():
        got, paths = read(arr, rows, cols)
        assert np.array_equal(got, zarr_region(arr, rows, cols)) and np.array_equal(
            got, data[rows[0]:rows[1], cols[0]:cols[1]]), f"{layout} {size} {name}: wrong values"
        expect_reads(paths, f"{layout} {size} {name}",
                     **expected_reads(layout, arr.shape, chunk, rows, cols, arr.dtype.itemsize))


@pytest.mark.parametrize("layout", ["v3 zstd", "v3 raw", "v3 sharded zstd", "v2 zstd"])
def test_chunks_never_written_read_as_the_fill_value(tmp_path, rng, layout):
    chunk, missing = (8, 16), {(1, 0), (2, 1)}    # in a shard, (1, 0) is an empty inner chunk of a written shard
    arr, data = create(str(tmp_path / "a.zarr"), layout, chunk, rng, fill=-2.5, missing=missing)
    for name, (rows, cols) in {"one chunk column": ((8, 24), (0, 16)), "two chunk columns": ((8, 24), (0, 32)),
                               "whole array": ((0, 28), (0, 37))}.items():
        got, paths = read(arr, rows, cols)
        assert np.array_equal(got, data[rows[0]:rows[1], cols[0]:cols[1]])
        expect_reads(paths, f"{layout} {name}",
                     **expected_reads(layout, arr.shape, chunk, rows, cols, 8, missing))


@pytest.mark.parametrize("layout", ["v3 transpose", "v3 transpose + zstd"])
def test_layouts_left_to_zarr_count_as_zarr_reads(tmp_path, rng, layout):
    compressors = ZstdCodec(level=1) if "zstd" in layout else None
    arr, data = create(str(tmp_path / "a.zarr"), layout, (8, 16), rng, filters=[TransposeCodec(order=(1, 0))],
                       compressors=compressors)
    assert chunks.why_not(arr)
    rows, cols = (8, 24), (0, 32)
    got, paths = read(arr, rows, cols)
    assert np.array_equal(got, data[8:24, 0:32])
    expect_reads(paths, layout, read_zarr=(1, got.nbytes))


@pytest.mark.parametrize("size", ["small", "mid"])
@pytest.mark.parametrize("layout", ["v3 zstd", "v3 sharded zstd", "v2 zstd", "v3 raw"])
def test_reads_on_s3(s3, rng, layout, size):
    """On S3 a raw chunk is fetched, then copied (``read_copied``); compressed ones are decoded into the buffer."""
    chunk = SIZES[size]
    url = s3.url(f"fast-paths/read-{layout.replace(' ', '-')}-{size}-{rng.integers(1 << 30)}.zarr")
    create(url, layout, chunk, rng, storage_options=s3.storage_options)
    arr = zarr.open_array(url, mode="r", storage_options=s3.storage_options)    # as a worker opens it
    assert chunks.why_not(arr) is None
    fast = "read_copied" if layout == "v3 raw" else LAYOUTS[layout][1]
    for name, (rows, cols) in regions(arr.shape, chunk).items():
        got, paths = read(arr, rows, cols)
        assert np.array_equal(got, zarr_region(arr, rows, cols)), f"s3 {layout} {size} {name}: wrong values"
        want = expected_reads(layout, arr.shape, chunk, rows, cols, 8)
        if fast != LAYOUTS[layout][1] and LAYOUTS[layout][1] in want:
            n, b = want.pop(LAYOUTS[layout][1])
            m, c = want.get(fast, (0, 0))
            want[fast] = (n + m, b + c)
        expect_reads(paths, f"s3 {layout} {size} {name}", **want)


def test_reads_from_many_threads_are_all_counted(tmp_path, rng):
    """The reader threads of a worker share the counters: none of their chunks is lost."""
    from concurrent.futures import ThreadPoolExecutor

    arr, data = create(str(tmp_path / "a.zarr"), "v3 zstd", (8, 16), rng)
    blocks = [ZarrBlock(arr, rows=(0, 24), cols=(16, 32)), ZarrBlock(arr, rows=(8, 16), cols=(0, 37))] * 64

    def all_of_them():
        with ThreadPoolExecutor(max_workers=16) as pool:
            return list(pool.map(lambda b: b.load(), blocks))
    got, paths = counted(all_of_them)
    assert all(np.array_equal(g, data[b.rows[0]:b.rows[1], b.cols[0]:b.cols[1]]) for g, b in zip(got, blocks))
    # each first block: 3 whole chunks one chunk wide; each second: 3 chunks across, one of them cut by the edge
    expect_reads(paths, "16 threads", read_decoded_into=(64 * 3, 64 * 3 * 1024),
                 read_copied=(64 * 3, 64 * 8 * 37 * 8))


# -- writes -----------------------------------------------------------------------------------------------------
WRITE_LAYOUTS = ["v3 zstd", "v3 zstd+crc32c", "v3 blosc-lz4", "v3 raw", "v3 raw big-endian", "v2 zstd", "v2 raw",
                 "v3 gzip"]


def write(arr, rows, cols, block) -> dict:
    """Store ``block`` at ``arr[rows, cols]`` as a worker's store task does; the paths taken."""
    return counted(lambda: store_block(arr, rows, cols, block))[1]


def write_regions(shape, chunk) -> dict:
    c0, c1 = chunk
    return {"aligned": ((c0, 3 * c0), (0, 2 * c1)),
            "edge chunk": ((3 * c0, shape[0]), (2 * c1, shape[1])),
            "edge row": ((3 * c0, shape[0]), (0, shape[1])),
            "whole array": ((0, shape[0]), (0, shape[1]))}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("layout", WRITE_LAYOUTS)
def test_writes_of_whole_chunks_are_dgemms_edge_chunks_too(tmp_path, rng, layout, size):
    chunk = SIZES[size]
    arr, data = create(str(tmp_path / "a.zarr"), layout, chunk, rng)
    for name, (rows, cols) in write_regions(arr.shape, chunk).items():
        block = rng.standard_normal((rows[1] - rows[0], cols[1] - cols[0]))
        paths = write(arr, rows, cols, block)
        data[rows[0]:rows[1], cols[0]:cols[1]] = block
        whole, cut, _ = census(arr.shape, chunk, rows, cols)
        expect_writes(paths, f"{layout} {size} {name}", write_direct=(whole + cut, block.nbytes))
        again = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
        assert np.array_equal(np.asarray(again[...]), data), f"{layout} {size} {name}: zarr reads other values"


@pytest.mark.parametrize("case", ["sharded", "part of a chunk", "transpose"])
def test_writes_left_to_zarr_count_as_zarr_writes(tmp_path, rng, case):
    chunk = (8, 16)
    if case == "transpose":
        arr, data = create(str(tmp_path / "a.zarr"), "v3 zstd", chunk, rng, filters=[TransposeCodec(order=(1, 0))])
    else:
        arr, data = create(str(tmp_path / "a.zarr"), "v3 sharded zstd" if case == "sharded" else "v3 zstd", chunk,
                           rng)
    rows, cols = ((8, 24), (0, 32)) if case != "part of a chunk" else ((8, 20), (0, 32))
    block = rng.standard_normal((rows[1] - rows[0], cols[1] - cols[0]))
    paths = write(arr, rows, cols, block)
    data[rows[0]:rows[1], cols[0]:cols[1]] = block
    expect_writes(paths, case, write_zarr=(1, block.nbytes))
    assert np.array_equal(np.asarray(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...]), data)


@pytest.mark.parametrize("size", ["small", "mid"])
@pytest.mark.parametrize("layout", ["v3 zstd", "v3 raw", "v2 zstd"])
def test_writes_on_s3_are_one_batch_of_puts(s3, rng, layout, size):
    chunk = SIZES[size]
    url = s3.url(f"fast-paths/write-{layout.replace(' ', '-')}-{size}-{rng.integers(1 << 30)}.zarr")
    arr, data = create(url, layout, chunk, rng, storage_options=s3.storage_options)
    arr = zarr.open_array(url, mode="r+", storage_options=s3.storage_options)     # as a worker opens it
    for name, (rows, cols) in write_regions(arr.shape, chunk).items():
        block = rng.standard_normal((rows[1] - rows[0], cols[1] - cols[0]))
        paths = write(arr, rows, cols, block)
        data[rows[0]:rows[1], cols[0]:cols[1]] = block
        whole, cut, _ = census(arr.shape, chunk, rows, cols)
        label = f"s3 {layout} {size} {name}"
        assert paths["s3_put_batch"][0] == 1, f"{label}: {paths['s3_put_batch'][0]} batches of PUTs, expected 1"
        assert paths["s3_put_batch"][1] > 0
        expect_writes(paths, label, write_batched=(whole + cut, block.nbytes), s3_put_batch=paths["s3_put_batch"])
        got = np.asarray(zarr.open_array(url, mode="r", storage_options=s3.storage_options)[...])
        assert np.array_equal(got, data), f"{label}: zarr reads other values"


# -- where the counters are reported ---------------------------------------------------------------------------
def test_the_prometheus_collector_reports_each_path():
    pytest.importorskip("prometheus_client")
    from dgemm import metrics

    snap = {"device": "dev", "ok": True, "storage_read_decoded_into": 7, "storage_read_decoded_into_bytes": 7168,
            "storage_write_zarr": 2}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics, "_worker_sources", [lambda: [("tcp://w:1", "w1", snap)]])
        mp.setattr(metrics, "_scheduler_sources", [])
        fams = {f.name: {s.labels["path"]: s.value for s in f.samples} for f in metrics.DgemmCollector().collect()
                if f.name.startswith("dgemm_storage")}
    assert set(fams["dgemm_storage_chunks"]) == set(STORAGE_PATHS) == set(fams["dgemm_storage_bytes"])
    assert fams["dgemm_storage_chunks"]["read_decoded_into"] == 7
    assert fams["dgemm_storage_bytes"]["read_decoded_into"] == 7168
    assert fams["dgemm_storage_chunks"]["write_zarr"] == 2 and fams["dgemm_storage_chunks"]["read_zarr"] == 0


def _worker_paths(dask_worker):
    """On a worker: its dgemm metric's path counters (what its heartbeats carry to the scheduler)."""
    from dgemm.names import WORKER_PLUGIN

    snap = dask_worker.plugins[WORKER_PLUGIN].metric(dask_worker)
    return {k: v for k, v in snap.items() if k.startswith("storage_")}


def test_a_matmul_on_workers_reads_and_writes_through_dgemms_paths(client, tmp_path, rng):
    """zstd inputs and output with edge chunks: no region goes to zarr, every C chunk is written by dgemm."""
    block = 32
    A, B = rng.standard_normal((80, 72)), rng.standard_normal((72, 56))
    paths = {}
    for name, value in (("a", A), ("b", B)):
        paths[name] = str(tmp_path / f"{name}.zarr")
        zarr.create_array(paths[name], shape=value.shape, chunks=(block, block), dtype=value.dtype,
                          compressors=ZstdCodec(level=1))[...] = value
    out = str(tmp_path / "c.zarr")
    before = client.run(_worker_paths)
    assert before and all({f"storage_{p}" for p in STORAGE_PATHS} <= set(v) for v in before.values()), before
    dgemm.matmul(paths["a"], paths["b"], out=out, client=client, block=block)
    after = client.run(_worker_paths)
    grew = {k: sum(after[w][k] - before[w].get(k, 0) for w in after) for k in next(iter(after.values()))}
    c = zarr.open_array(out, mode="r")
    check_product(np.asarray(c[...]), A, B, dtype="float64")
    assert chunks.why_not(c) is None
    assert grew["storage_read_zarr"] == 0 and grew["storage_write_zarr"] == 0, grew
    # every chunk of C (3 x 2, edges included) written once, by dgemm, with all of C's bytes
    assert (grew["storage_write_direct"], grew["storage_write_direct_bytes"]) == (c.nchunks, c.nbytes), grew
    # A and B: their whole chunks decoded into the staging buffers, at least once each; edge chunks copied
    whole = 2 * 2 + 2 * 1            # A: 3 x 3 chunks, 2 x 2 whole; B: 3 x 2 chunks, 2 x 1 whole
    assert grew["storage_read_decoded_into"] >= whole, grew
    assert grew["storage_read_copied"] >= (9 - 4) + (6 - 2), grew
    assert grew["storage_read_decoded_into_bytes"] % (block * block * 8) == 0, grew

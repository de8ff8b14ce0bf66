"""Operands and outputs: wrapping inputs, block references, output checks (no cluster)."""
from __future__ import annotations

import os

import dask.array as da
import numpy as np
import pytest
import zarr

from dgemm.dtypes import check_dtype
from dgemm.storage import (COMPLETE_ATTR, Operand, ZarrBlock, check_output, create_output, load, location,
                           mark_complete, store_block)


def zarr_array(path, data, chunks):
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype)
    arr[...] = data
    return arr


# -- dtypes -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int8", "int64", "uint16", "complex128", "float16", "bool", "O", "U4",
                                   "datetime64[s]"])
def test_check_dtype_refuses(dtype):
    with pytest.raises(TypeError, match=r"x has dtype .*float32 and float64 only"):
        check_dtype(dtype, "x")


def test_check_dtype_accepts():
    assert check_dtype(np.float32, "x") == np.float32 and check_dtype("float64", "x") == np.float64


# -- operands -----------------------------------------------------------------
def test_zarr_operand(tmp_path, rng):
    data = rng.standard_normal((70, 45))
    arr = zarr_array(tmp_path / "a.zarr", data, (20, 16))
    for x in (arr, str(tmp_path / "a.zarr"), tmp_path / "a.zarr"):
        op = Operand(x, "a")
        assert op.zarr is not None and op.data is None
        assert (op.shape, op.stored_shape, op.chunks, op.ndim, op.dtype) == ((70, 45), (70, 45), (20, 16), 2,
                                                                             np.float64)
        assert "a.zarr" in op.label
    op = Operand(str(tmp_path / "a.zarr"), "a")
    assert op.zarr.read_only                    # paths are opened read-only
    op.transpose()
    assert (op.shape, op.stored_shape, op.chunks, op.trans) == ((45, 70), (70, 45), (16, 20), True)


def test_dask_and_numpy_operands(rng):
    data = rng.standard_normal((30, 20)).astype("f4")
    op = Operand(da.from_array(data, chunks=((7, 23), (20,))), "b")
    assert op.data is not None and op.zarr is None and op.chunks == (7, 20) and op.dtype == np.float32
    op = Operand(data, "b")
    assert op.chunks == (None, None) and op.shape == (30, 20)
    op = Operand(data.tolist(), "b")
    assert op.dtype == np.float64 and op.shape == (30, 20)


@pytest.mark.parametrize("axis,shape", [(0, (1, 9)), (1, (9, 1))])
def test_promote_1d(tmp_path, rng, axis, shape):
    v = rng.standard_normal(9)
    for x in (v, zarr_array(tmp_path / f"v{axis}.zarr", v, (4,))):
        op = Operand(x, "v")
        assert op.ndim == 1
        op.promote(axis)
        assert op.stored_shape == shape and op.expand == axis
        ref, coll = op.block_refs(((0, shape[0]),), ((0, shape[1]),))
        got = load(ref(0, 0)) if op.zarr is not None else coll.compute(scheduler="sync")
        np.testing.assert_array_equal(got, v.reshape(shape))
    z = Operand(zarr_array(tmp_path / "c.zarr", v, (4,)), "v")
    z.promote(axis)
    assert z.chunks == ((1, 4) if axis == 0 else (4, 1))


def test_bad_operands(tmp_path):
    with pytest.raises(ValueError, match="0-dimensional"):
        Operand(np.float64(3.0), "a")
    with pytest.raises(ValueError, match=r"a has 3 dimensions \(2, 3, 4\)"):
        Operand(np.zeros((2, 3, 4)), "a")
    with pytest.raises(TypeError, match="int64"):
        Operand(np.arange(6).reshape(2, 3), "a")
    with pytest.raises(TypeError, match="must be a zarr.Array, a path or URL of one, a dask array or a numpy array, "
                                        "not object"):
        Operand(object(), "a")
    with pytest.raises(TypeError, match="not dict"):
        Operand({"x": 1}, "a")


def test_paths_that_are_not_arrays(tmp_path):
    (tmp_path / "empty").mkdir()
    zarr.open_group(str(tmp_path / "group.zarr"), mode="w")
    (tmp_path / "file.txt").write_text("hello")
    for p in ("empty", "group.zarr", "file.txt", "missing.zarr"):
        with pytest.raises(ValueError, match=f"b: .*{p} is not a Zarr array"):
            Operand(str(tmp_path / p), "b")


@pytest.mark.parametrize("trans", [False, True])
def test_zarr_block_refs(tmp_path, rng, trans):
    data = rng.standard_normal((50, 30))
    op = Operand(zarr_array(tmp_path / "a.zarr", data, (20, 16)), "a")
    if trans:
        op.transpose()
    logical = data.T if trans else data
    rows = ((0, 17), (17, logical.shape[0]))
    cols = ((0, 9), (9, 21), (21, logical.shape[1]))
    ref, coll = op.block_refs(rows, cols)
    assert coll is None                         # Zarr blocks are read by the workers
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            blk = ref(i, j)
            assert isinstance(blk, ZarrBlock)
            got = load(blk)
            # stored orientation: the device does the transpose
            np.testing.assert_array_equal(got, logical[r0:r1, c0:c1].T if trans else logical[r0:r1, c0:c1])
    assert "a.zarr rows" in ref(0, 0).describe()


@pytest.mark.parametrize("kind", ["numpy", "dask"])
@pytest.mark.parametrize("trans", [False, True])
def test_dask_block_refs(rng, kind, trans):
    data = rng.standard_normal((40, 25))
    x = data if kind == "numpy" else da.from_array(data, chunks=((13, 27), (6, 19)))
    op = Operand(x, "b")
    if trans:
        op.transpose()
    logical = data.T if trans else data
    rows = ((0, 10), (10, logical.shape[0]))
    cols = ((0, 7), (7, logical.shape[1]))
    ref, coll = op.block_refs(rows, cols)
    assert isinstance(coll, da.Array)
    blocks = dict(zip([k for k in coll.__dask_keys__() for k in k], coll.to_delayed().ravel()))
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            key = ref(i, j)
            assert key[0] == coll.name
            got = blocks[key].compute(scheduler="sync")
            np.testing.assert_array_equal(got, logical[r0:r1, c0:c1].T if trans else logical[r0:r1, c0:c1])


@pytest.mark.parametrize("kind", ["numpy", "dask", "zarr"])
def test_block_refs_of_an_empty_axis(tmp_path, kind):
    data = np.empty((6, 0), "f4")
    x = {"numpy": lambda: data, "dask": lambda: da.from_array(data),
         "zarr": lambda: zarr_array(tmp_path / "e.zarr", data, (3, 1))}[kind]()
    ref, coll = Operand(x, "a").block_refs(((0, 3), (3, 6)), ())
    assert coll is None                         # K == 0: no blocks, no load tasks


def test_location(tmp_path):
    arr = zarr.create_array(store=str(tmp_path / "x.zarr"), shape=(2, 2), dtype="f4")
    assert location(arr) == location(str(tmp_path / "x.zarr")) == location(tmp_path / "x.zarr/")
    assert location("s3://bucket/x.zarr/") == "s3://bucket/x.zarr"
    assert location(np.zeros(2)) is None


# -- outputs ------------------------------------------------------------------
def test_check_output_new_path(tmp_path):
    spec = check_output(str(tmp_path / "c.zarr"), (3, 4), np.dtype("f4"), False)
    assert (spec.shape, spec.dtype, spec.chunks) == ((3, 4), np.float32, None)
    assert not (tmp_path / "c.zarr").exists()   # checking writes nothing
    spec = check_output(tmp_path / "deeper" / "still" / "c.zarr", (3,), np.dtype("f8"), False)
    assert not (tmp_path / "deeper").exists()
    # a file:// URL is the local path it names (fsspec would not create its folder)
    assert check_output("file://" + str(tmp_path / "d.zarr"), (1, 1), np.dtype("f8"), False).target == \
        str(tmp_path / "d.zarr")


def test_check_output_existing(tmp_path):
    zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(3, 4), dtype="f4")
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        check_output(str(tmp_path / "c.zarr"), (3, 4), np.dtype("f4"), False)
    assert check_output(str(tmp_path / "c.zarr"), (5, 5), np.dtype("f8"), True).overwrite
    (tmp_path / "plain").write_text("x")
    with pytest.raises(FileExistsError, match="already exists"):
        check_output(str(tmp_path / "plain"), (3, 4), np.dtype("f4"), False)
    with pytest.raises(FileExistsError, match="is a file, not a Zarr store"):
        check_output(str(tmp_path / "plain"), (3, 4), np.dtype("f4"), True)


def test_check_output_zarr_array(tmp_path):
    arr = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(6, 8), chunks=(4, 3), dtype="f4")
    spec = check_output(arr, (6, 8), np.dtype("f4"), False)
    assert spec.array is arr and spec.chunks == (4, 3)
    with pytest.raises(ValueError, match=r"out has shape \(6, 8\), but the result has shape \(8, 6\)"):
        check_output(arr, (8, 6), np.dtype("f4"), False)
    with pytest.raises(ValueError, match="out has dtype float32, but the result is float64"):
        check_output(arr, (6, 8), np.dtype("f8"), False)
    ro = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")
    with pytest.raises(PermissionError, match="read-only"):
        check_output(ro, (6, 8), np.dtype("f4"), False)
    sharded = zarr.create_array(store=str(tmp_path / "s.zarr"), shape=(8, 8), chunks=(2, 2), shards=(4, 4),
                                dtype="f8")
    assert check_output(sharded, (8, 8), np.dtype("f8"), False).chunks == (4, 4)


def test_check_output_memory(tmp_path):
    from zarr.storage import MemoryStore
    mem = zarr.create_array(store=MemoryStore(), shape=(2, 2), dtype="f4")
    for out in (mem, MemoryStore(), "memory://x"):
        with pytest.raises(ValueError, match="in-memory Zarr store"):
            check_output(out, (2, 2), np.dtype("f4"), False)


def test_check_output_bad_type():
    with pytest.raises(TypeError, match="out must be a path, URL, zarr store or zarr.Array, not ndarray"):
        check_output(np.zeros((2, 2)), (2, 2), np.dtype("f8"), False)


def test_check_output_not_writable(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: a read-only directory is still writable, so there is nothing to refuse")
        with pytest.raises(PermissionError, match="not writable"):
            check_output(str(ro / "c.zarr"), (2, 2), np.dtype("f8"), False)
    finally:
        ro.chmod(0o755)


def test_check_output_unwritable_parent_is_refused(tmp_path, monkeypatch):
    """The same check without relying on file permissions (which root ignores)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real(p, mode))
    with pytest.raises(PermissionError, match=f"{tmp_path} does not allow writing"):
        check_output(str(tmp_path / "new" / "c.zarr"), (2, 2), np.dtype("f8"), False)


def test_create_mark_and_store(tmp_path, rng):
    spec = check_output(str(tmp_path / "c.zarr"), (5, 7), np.dtype("f8"), False)
    arr = create_output(spec, (2, 3), {"operation": "test"})
    assert arr.chunks == (2, 3) and arr.attrs[COMPLETE_ATTR] == {"complete": False, "operation": "test"}
    blk = rng.standard_normal((2, 3))
    store_block(arr, (2, 4), (3, 6), blk)
    np.testing.assert_array_equal(arr[2:4, 3:6], blk)
    mark_complete(arr, {"seconds": 1.5})
    again = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")
    assert again.attrs[COMPLETE_ATTR] == {"complete": True, "operation": "test", "seconds": 1.5}


@pytest.mark.parametrize("drop,shape,region", [((0,), (7,), np.s_[3:6]), ((1,), (5,), np.s_[2:4]),
                                                ((0, 1), (), ())])
def test_store_block_drops_vector_axes(tmp_path, rng, drop, shape, region):
    arr = zarr.create_array(store=str(tmp_path / "v.zarr"), shape=shape, dtype="f8", fill_value=np.nan)
    if drop == (0, 1):
        blk = rng.standard_normal((1, 1))
        store_block(arr, (0, 1), (0, 1), blk, drop)
        assert arr[()] == blk[0, 0]
        return
    rows, cols = ((0, 1), (3, 6)) if drop == (0,) else ((2, 4), (0, 1))
    blk = rng.standard_normal((rows[1] - rows[0], cols[1] - cols[0]))
    store_block(arr, rows, cols, blk, drop)
    np.testing.assert_array_equal(arr[region], blk.ravel())


def test_existing_array_as_output_keeps_chunks(tmp_path):
    arr = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(6, 8), chunks=(4, 3), dtype="f4",
                            attributes={"mine": 1})
    spec = check_output(arr, (6, 8), np.dtype("f4"), False)
    out = create_output(spec, (99, 99), {"operation": "x"})
    assert out is arr and out.chunks == (4, 3)
    assert out.attrs["mine"] == 1 and out.attrs[COMPLETE_ATTR]["complete"] is False


# -- per-block completion markers ---------------------------------------------
def test_block_markers_mark_list_and_reset(tmp_path):
    from dgemm.storage import BlockMarkers

    arr = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(6, 6), chunks=(3, 3), dtype="f8")
    m = BlockMarkers(arr, "run1")
    assert m.done() == set()
    for ij in [(0, 0), (1, 1), (0, 1)]:
        m.mark(*ij)
    m.mark(1, 1)                                          # marking twice is harmless
    assert m.done() == {(0, 0), (1, 1), (0, 1)}
    assert BlockMarkers(arr, "run2").done() == set()      # another run's markers do not count
    # one tiny object per block, next to the array's own keys; Zarr does not see them
    assert (tmp_path / "c.zarr" / ".dgemm" / "done" / "run1" / "1.1").read_bytes() == b"1"
    again = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")
    assert again.shape == (6, 6) and again.nchunks_initialized == 0
    m.reset()
    assert m.done() == set() and not (tmp_path / "c.zarr" / ".dgemm").exists()
    # overwriting the array removes them too
    m.mark(0, 0)
    zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(6, 6), chunks=(3, 3), dtype="f8", overwrite=True)
    assert m.done() == set()


def test_block_markers_in_a_group_and_without_listing(tmp_path):
    from dgemm.storage import BlockMarkers

    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    arr = g.create_array("sub/c", shape=(4, 4), chunks=(2, 2), dtype="f4")
    m = BlockMarkers(arr, "r")
    m.mark(1, 0)
    assert (tmp_path / "g.zarr" / "sub" / "c" / ".dgemm" / "done" / "r" / "1.0").is_file()
    assert m.done() == {(1, 0)}
    assert set(zarr.open_group(str(tmp_path / "g.zarr"), mode="r").group_keys()) == {"sub"}

    class NoListing:                       # a store that cannot list keys: markers are checked one by one
        def __init__(self, store):
            self._s = store
            self.supports_listing = False

        def __getattr__(self, name):
            return getattr(self._s, name)

    m.store = NoListing(m.store)
    assert m.done(grid=(2, 2)) == {(1, 0)}
    with pytest.raises(ValueError, match="cannot list keys; pass the block grid"):
        m.done()


def test_store_task_marks_its_block_after_writing(tmp_path, rng):
    from dgemm.worker.tasks import store
    from dgemm.storage import BlockMarkers

    arr = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(4, 6), chunks=(2, 3), dtype="f8",
                            fill_value=np.nan)
    m = BlockMarkers(arr, "r")
    blk = rng.standard_normal((2, 3))
    assert store(arr, (2, 4), (3, 6), blk, (), (m, 1, 1)) == (2, 3)
    np.testing.assert_array_equal(arr[2:4, 3:6], blk)
    assert m.done() == {(1, 1)}

    class Failing:
        def __setitem__(self, key, value):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        store(Failing(), (0, 2), (0, 3), blk, (), (m, 0, 0))
    assert m.done() == {(1, 1)}                              # a block that was not written is not marked


# -- read errors name the chunk -------------------------------------------------
@pytest.mark.parametrize("shards", [None, (4, 4)])
def test_read_error_names_the_chunk_and_its_key(tmp_path, shards):
    from dgemm.storage import read_error

    arr = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(8, 8), chunks=(2, 2), shards=shards,
                            dtype="f8", compressors=None)
    arr[...] = 1.0
    key = "c/1/1" if shards else "c/2/3"
    (tmp_path / "a.zarr" / key).write_bytes(b"bad")
    ref = ZarrBlock(arr, (4, 6), (4, 8))
    # the reader's own error, unwrapped (the tasks raise an OSError with read_error's message): the
    # shard's index is cut short, or a raw chunk has the wrong size
    with pytest.raises(ValueError, match="shard index has 3 bytes" if shards else "to 3 bytes") as err:
        ref.load()
    msg = read_error(ref, err.value)
    idx = "(1, 1)" if shards else "(2, 3)"
    assert msg.startswith(f"dgemm could not read Zarr array file://{tmp_path}/a.zarr rows 4:6, columns 4:8, "
                          f"chunk {idx} (store key '{key}'): ")
    assert ZarrBlock(arr, (0, 2), (0, 2)).bad_chunk() is None                 # a good region has none
    assert read_error(np.ones(2), ValueError("x")) == "dgemm could not read an input block: ValueError: x"


def test_read_error_of_a_vector_and_in_a_group(tmp_path):
    from dgemm.storage import read_error

    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    v = g.create_array("v", shape=(10,), chunks=(4,), dtype="f4", compressors=None)
    v[...] = 2.0
    (tmp_path / "g.zarr" / "v" / "c" / "1").write_bytes(b"x")
    ref = ZarrBlock(v, (0, 1), (0, 10), expand=0)
    with pytest.raises(ValueError, match="1 bytes") as err:   # a 1-byte chunk is not a float32 chunk
        ref.load()
    assert "chunk (1,) (store key 'v/c/1')" in read_error(ref, err.value)


# -- fill_into: the device engine's one read call -------------------------------------
@pytest.mark.parametrize("layout", ["raw", "zstd", "left to zarr"])
def test_fill_into_fills_a_poisoned_buffer_or_raises_the_one_read_error(tmp_path, layout):
    """A good block fills every element of a NaN-poisoned buffer (dgemm's reader, or zarr's for a layout
    left to it); a damaged chunk raises one OSError naming array, rows, columns, chunk and store key,
    the reader's own error as its cause, the same one :func:`read_block` raises."""
    from zarr.codecs import TransposeCodec, ZstdCodec

    from dgemm.storage import read_block, read_error, unreadable
    from dgemm.storage.chunks import why_not

    kw = {"raw": {"compressors": None}, "zstd": {"compressors": ZstdCodec()},
          "left to zarr": {"compressors": None, "filters": [TransposeCodec(order=(1, 0))]}}[layout]
    data = np.arange(1.0, 65.0).reshape(8, 8)
    arr = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(8, 8), chunks=(2, 4), dtype="f8", **kw)
    arr[...] = data
    assert (why_not(arr) is None) == (layout != "left to zarr")
    ref = ZarrBlock(arr, (3, 7), (1, 8))                     # cut chunks on every side
    assert ref.dtype == np.dtype("f8") and ref.copies == (layout == "raw")
    out = np.full(ref.shape, np.nan)
    assert ref.fill_into(out) is None
    np.testing.assert_array_equal(out, data[3:7, 1:8])
    (tmp_path / "a.zarr" / "c" / "2" / "1").write_bytes(b"bad")   # chunk (2, 1): rows 4:6, columns 4:8
    with pytest.raises(OSError) as err:
        ref.fill_into(np.full(ref.shape, np.nan))
    with pytest.raises(Exception) as own:                          # the same read, unexplained
        ref.decode_into(np.full(ref.shape, np.nan))
    msg = str(err.value)
    assert msg.startswith(f"dgemm could not read Zarr array file://{tmp_path}/a.zarr rows 3:7, columns 1:8, "
                          f"chunk (2, 1) (store key 'c/2/1'): ")
    assert msg == read_error(ref, own.value) == str(unreadable(ref, own.value))
    assert type(err.value.__cause__) is type(own.value) and not isinstance(own.value, OSError)
    with pytest.raises(OSError) as again:
        read_block(ref)
    assert str(again.value) == msg
    np.testing.assert_array_equal(read_block(ZarrBlock(arr, (0, 2), (0, 8))), data[:2])
    np.testing.assert_array_equal(read_block(data), data)


# -- resume: outputs and run identities ---------------------------------------------
def test_check_output_for_resume(tmp_path):
    path = str(tmp_path / "c.zarr")
    fresh = check_output(path, (4, 5), np.dtype("f4"), False, resume=True)    # nothing there: a fresh output
    assert fresh.array is None and not fresh.resume
    arr = create_output(fresh, (2, 5), {"operation": "matmul"})
    spec = check_output(path, (4, 5), np.dtype("f4"), False, resume=True)
    assert spec.resume and spec.array is not None and spec.array.chunks == (2, 5) and not spec.array.read_only
    with pytest.raises(ValueError, match=r"out has shape \(4, 5\), but the result has shape \(5, 4\)"):
        check_output(path, (5, 4), np.dtype("f4"), False, resume=True)
    with pytest.raises(ValueError, match="out has dtype float32, but the result is float64"):
        check_output(path, (4, 5), np.dtype("f8"), False, resume=True)
    assert check_output(arr, (4, 5), np.dtype("f4"), False, resume=True).resume
    with pytest.raises(PermissionError, match="read-only"):
        check_output(zarr.open_array(path, mode="r"), (4, 5), np.dtype("f4"), False, resume=True)


def test_open_existing_is_the_one_way_to_open_an_output_that_may_be_there(tmp_path, monkeypatch):
    """An array (relative paths made absolute), nothing, or something that is no array, told apart."""
    from zarr.storage import LocalStore

    from dgemm.storage.outputs import NotAnArrayError, open_existing

    monkeypatch.chdir(tmp_path)
    assert open_existing("c.zarr") is None                                   # no such path
    assert open_existing(LocalStore(str(tmp_path / "nothing"))) is None      # a store with no Zarr data
    assert open_existing(object()) is None                                   # check_output says why
    arr = zarr.create_array(store="c.zarr", shape=(2, 2), dtype="f8")
    assert open_existing(arr) is arr
    got = open_existing("c.zarr")
    assert got.read_only and str(got.store_path) == f"file://{tmp_path / 'c.zarr'}"
    assert not open_existing(f"file://{tmp_path / 'c.zarr'}", mode="r+").read_only
    zarr.open_group("grp.zarr", mode="w")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("mine")
    for there in ("grp.zarr", LocalStore(str(tmp_path / "grp.zarr")), "docs"):
        with pytest.raises(NotAnArrayError):
            open_existing(there)
    with pytest.raises(ValueError, match=r"cannot resume: out 'docs' exists but is not a Zarr array \("):
        check_output("docs", (2, 2), np.dtype("f8"), False, resume=True)


def test_operand_identity(tmp_path):
    from dgemm.storage import run_id

    z = zarr_array(tmp_path / "a.zarr", np.ones((4, 3), "f4"), (2, 3))
    ident = Operand(str(tmp_path / "a.zarr"), "a").identity()
    assert ident == {"shape": [4, 3], "dtype": "<f4", "trans": False, "expand": None,
                     "zarr": f"file://{tmp_path}/a.zarr", "chunks": [2, 3]}
    assert Operand(z, "a").identity() == ident                       # a path and the opened array alike
    x = np.arange(12.0).reshape(4, 3)
    assert Operand(x, "a").identity() == Operand(x.copy(), "a").identity()
    y = x.copy()
    y[0, 0] = -1
    assert Operand(x, "a").identity() != Operand(y, "a").identity()   # numpy: by content
    d = da.from_array(x, chunks=2)
    assert Operand(d, "a").identity()["dask"] == d.name
    t = Operand(x, "a")
    t.transpose()
    assert t.identity()["trans"] is True
    assert run_id({"x": [1, 2]}) == run_id({"x": [1, 2]}) != run_id({"x": [2, 1]})


# -- chunks read without zarr (dgemm.storage.chunks; tests/test_chunks.py has the layouts) ----------
def test_a_block_is_read_by_dgemms_reader_and_zarr_only_for_what_it_leaves(tmp_path, rng, monkeypatch):
    import zarr
    from zarr.codecs import TransposeCodec
    from dgemm.storage import ZarrBlock

    x = rng.standard_normal((10, 7)).astype("f4")
    packed = zarr.create_array(store=str(tmp_path / "z.zarr"), shape=(10, 7), chunks=(4, 3), dtype="f4")
    packed[...] = x
    odd = zarr.create_array(store=str(tmp_path / "t.zarr"), shape=(10, 7), chunks=(4, 3), dtype="f4",
                            filters=[TransposeCodec(order=(1, 0))])
    odd[...] = x
    calls = []
    getitem = zarr.Array.__getitem__
    monkeypatch.setattr(zarr.Array, "__getitem__", lambda self, sel: calls.append(sel) or getitem(self, sel))
    out = np.full((6, 5), np.nan, "f4")
    assert ZarrBlock(packed, (3, 9), (1, 6)).read_into(out)          # zstd, across chunks, unaligned
    np.testing.assert_array_equal(out, x[3:9, 1:6])
    np.testing.assert_array_equal(ZarrBlock(packed, (8, 10), (0, 7)).load(), x[8:10])
    assert calls == []
    out[...] = np.nan
    assert not ZarrBlock(odd, (3, 9), (1, 6)).read_into(out) and np.isnan(out).all()   # untouched
    np.testing.assert_array_equal(ZarrBlock(odd, (3, 9), (1, 6)).load(), x[3:9, 1:6])  # through zarr
    assert len(calls) == 1


# -- paths and stores as users spell them (dgemm.storage.locations) --------------------------
def test_a_relative_operand_reads_the_clients_array_in_any_folder(tmp_path, rng, monkeypatch):
    """Case 1: a relative path is resolved here; a worker in another folder (with a decoy) reads the same data."""
    import pickle

    data = rng.standard_normal((6, 4))
    (tmp_path / "client").mkdir()
    (tmp_path / "worker").mkdir()
    zarr_array(tmp_path / "client" / "a.zarr", data, (3, 4))
    zarr_array(tmp_path / "worker" / "a.zarr", rng.standard_normal((6, 4)), (3, 4))   # a decoy
    monkeypatch.chdir(tmp_path / "client")
    refs = [Operand(x, "a").block_refs(((0, 3), (3, 6)), ((0, 4),))[0](1, 0)
            for x in ("a.zarr", zarr.open_array("a.zarr", mode="r"), da.from_zarr(zarr.open_array("a.zarr")))]
    assert all(isinstance(r, ZarrBlock) for r in refs)        # da.from_zarr(z) is read as z, straight from Zarr
    blobs = [pickle.dumps(r) for r in refs]
    monkeypatch.chdir(tmp_path / "worker")
    for blob in blobs:
        np.testing.assert_array_equal(load(pickle.loads(blob)), data[3:6])


def test_process_local_operands_are_refused(no_client):
    """Case 3: inputs only this process holds would read as nothing on a worker: refused, naming the fix."""
    from zarr.storage import FsspecStore, MemoryStore

    mem = zarr_array(MemoryStore(), np.ones((2, 2)), (2, 2))
    zarr.open_array("memory://h1-storage/a", mode="w", shape=(2, 2), dtype="f8")[...] = 1
    for x in (mem, MemoryStore(), "memory://h1-storage/a", FsspecStore.from_url("memory://h1-storage/a"),
              zarr.open_array("memory://h1-storage/a", mode="r"), da.from_zarr("memory://h1-storage/a")):
        with pytest.raises(ValueError, match=r"a is stored in .*in-memory.*np\.asarray"):
            Operand(x, "a")


def test_check_output_makes_every_local_spelling_absolute(tmp_path, monkeypatch):
    """Case 1 and 7: a relative or file:// out, and stores with relative roots, reach the workers absolute."""
    from zarr.storage import FsspecStore, LocalStore

    monkeypatch.chdir(tmp_path)
    shape, f8 = (2, 2), np.dtype("f8")
    assert check_output("c.zarr", shape, f8, False).target == str(tmp_path / "c.zarr")
    assert check_output(f"file://{tmp_path}/new/c.zarr", shape, f8, False).target == str(tmp_path / "new/c.zarr")
    store = check_output(LocalStore("c.zarr"), shape, f8, False).target
    assert isinstance(store, LocalStore) and str(store.root) == str(tmp_path / "c.zarr")
    store = check_output(FsspecStore.from_url(f"file://{tmp_path}/d.zarr"), shape, f8, False).target
    assert isinstance(store, LocalStore)       # fsspec's local filesystem would not create the folders it writes
    zarr.create_array("e.zarr", shape=shape, dtype="f8")
    spec = check_output(zarr.open_array("e.zarr", mode="r+"), shape, f8, False)
    assert str(spec.array.store.root) == str(tmp_path / "e.zarr") and not spec.array.read_only


def test_check_output_refuses_stores_workers_cannot_write(tmp_path):
    """Case 7: a zip file (no concurrent writers) and fsspec's memory filesystem, as stores or arrays."""
    from zarr.storage import FsspecStore, ZipStore

    shape, f8 = (2, 2), np.dtype("f8")
    with pytest.raises(ValueError, match="ZipStore.*cannot be written concurrently"):
        check_output(ZipStore(tmp_path / "c.zip", mode="w"), shape, f8, False)
    with ZipStore(tmp_path / "d.zip", mode="w") as zs:
        zarr.create_array(store=zs, shape=shape, dtype="f8")
    with pytest.raises(ValueError, match="ZipStore"):
        check_output(zarr.open_array(ZipStore(tmp_path / "d.zip", mode="a"), mode="r+"), shape, f8, False)
    with pytest.raises(ValueError, match="in-memory Zarr store"):
        check_output(FsspecStore.from_url("memory://h1-storage/out"), shape, f8, False)
    with pytest.raises(ValueError, match="in-memory Zarr store"):
        check_output(zarr.create_array("memory://h1-storage/out2", shape=shape, dtype="f8"), shape, f8, False)
    assert not (tmp_path / "c.zip").exists() or (tmp_path / "c.zip").stat().st_size == 0


def test_overwrite_replaces_only_zarr_data(tmp_path):
    """Case 5: overwrite=True takes an existing array, group or empty folder, never a folder of other files."""
    from zarr.storage import LocalStore

    shape, f8 = (2, 2), np.dtype("f8")
    zarr.create_array(str(tmp_path / "arr.zarr"), shape=shape, dtype="f8")
    zarr.open_group(str(tmp_path / "grp.zarr"), mode="w")
    zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    (tmp_path / "empty").mkdir()
    for name in ("arr.zarr", "grp.zarr", "v2.zarr", "empty"):
        assert check_output(str(tmp_path / name), shape, f8, True).overwrite
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match="holds files but no Zarr array or group.*never other files"):
        check_output(str(tmp_path / "docs"), shape, f8, True)
    with pytest.raises(FileExistsError, match="holds files but no Zarr array or group"):
        check_output(LocalStore(tmp_path / "docs"), shape, f8, True)
    assert (tmp_path / "docs" / "thesis.tex").read_text() == "years of work"


def test_check_output_refuses_unknown_protocols_and_missing_packages(monkeypatch):
    """Case 7: before any work, not after the product is computed."""
    import sys

    shape, f8 = (2, 2), np.dtype("f8")
    with pytest.raises(ValueError, match="fsspec knows no protocol 'nosuch'"):
        check_output("nosuch://bucket/c.zarr", shape, f8, False)
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "s3", raising=False)
    monkeypatch.setitem(sys.modules, "s3fs", None)                    # as if s3fs were not installed
    with pytest.raises(ImportError, match="s3:// protocol needs a package .*s3fs"):
        check_output("s3://bucket/c.zarr", shape, f8, False)
    with pytest.raises(ImportError, match="s3fs"):
        Operand("s3://bucket/a.zarr", "a")


def test_output_codecs_are_checked_without_writing(tmp_path):
    """Case 7: compressors= is built by zarr for the output's dtype now, not after the work."""
    from zarr.codecs import ZstdCodec

    from dgemm.storage.outputs import output_codecs

    assert output_codecs(None, (3, 4), np.dtype("f4")) == []
    assert output_codecs(ZstdCodec(level=5), (3,), np.dtype("f8")) == [ZstdCodec(level=5).to_dict()]
    assert output_codecs([{"name": "zstd", "configuration": {"level": 5}}], (), np.dtype("f8")) == \
        output_codecs(ZstdCodec(level=5), (3, 4), np.dtype("f8"))
    for bad in ("zstd", 3, [object()], {"name": "bogus"}):
        with pytest.raises(ValueError, match=r"compressors=.* cannot compress a float32 Zarr v3 array"):
            output_codecs(bad, (3, 4), np.dtype("f4"))
    assert list(tmp_path.iterdir()) == []


def test_a_worker_that_does_not_see_an_input_stops_instead_of_reading_fill_values(client, tmp_path, rng):
    """An input whose store a worker cannot see (another host, no mount) is an error, not zeros marked complete.

    Here the array is opened on the client and its files then moved away, so
    the workers find no metadata where the array says it lives.
    """
    import os

    import dgemm
    from _check import randn

    A, B = randn(rng, (40, 30)), randn(rng, (30, 20))
    a = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=A.shape, chunks=(20, 30), dtype="f8")
    a[...] = A
    os.rename(tmp_path / "a.zarr", tmp_path / "moved.zarr")
    with pytest.raises(OSError, match="does not see the Zarr array"):
        dgemm.matmul(a, B, out=str(tmp_path / "c.zarr"), client=client, block=16)
    with pytest.raises(dgemm.IncompleteResultError):
        dgemm.open_result(str(tmp_path / "c.zarr"))


# -- overwrite: the old chunks are moved aside and deleted in the background -----------------------
def test_a_replaced_outputs_chunks_are_set_aside_and_deleted_in_the_background(tmp_path, monkeypatch):
    import shutil
    import threading

    from zarr.storage import LocalStore, MemoryStore

    from dgemm.storage import keys

    root = tmp_path / "c.zarr"
    (root / "c" / "0").mkdir(parents=True)
    for i in range(3):
        (root / "c" / "0" / str(i)).write_bytes(b"x" * 1000)
    (root / "zarr.json").write_text("{}")
    (tmp_path / "mine.txt").write_text("the user's")
    release, started = threading.Event(), threading.Event()
    real_rmtree = shutil.rmtree

    def slow_rmtree(path, **kwargs):      # the deletion blocks until the test lets it go
        started.set()
        release.wait(30)
        real_rmtree(path, **kwargs)
    monkeypatch.setattr(shutil, "rmtree", slow_rmtree)
    store = LocalStore(str(root))
    keys.clear_except(store, "", {"zarr.json"})          # returns while the deletion is still blocked
    assert started.wait(10) and not (root / "c").exists() and (root / "zarr.json").exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(".c.zarr.dgemm-discarded-")]   # outside the array
    assert len(aside) == 1 and sorted(p.name for p in aside[0].rglob("*") if p.is_file()) == ["0", "1", "2"]
    release.set()
    for thread in list(keys._DISCARDING):
        thread.join(30)
    assert not aside[0].exists() and (tmp_path / "mine.txt").read_text() == "the user's"
    assert not keys.set_aside(MemoryStore(), "c")           # other stores: the caller deletes the keys itself
    assert not keys.set_aside(store, "missing")


def test_a_file_url_store_is_local_too(tmp_path):
    """``file://`` (an fsspec store) reads chunks and sets folders aside as a LocalStore does."""
    from zarr.storage import FsspecStore, LocalStore, MemoryStore

    from dgemm.storage import keys
    from dgemm.storage.locations import local_folder

    (tmp_path / "c.zarr" / "c" / "0").mkdir(parents=True)
    (tmp_path / "c.zarr" / "c" / "0" / "0").write_bytes(b"x")
    store = FsspecStore.from_url(f"file://{tmp_path}/c.zarr")
    assert local_folder(store) == local_folder(LocalStore(str(tmp_path / "c.zarr"))) == str(tmp_path / "c.zarr")
    assert local_folder(MemoryStore()) is None
    assert keys.set_aside(store, "c") and not (tmp_path / "c.zarr" / "c").exists()
    for thread in list(keys._DISCARDING):
        thread.join(30)
    assert not [p for p in tmp_path.iterdir() if "dgemm-discarded" in p.name]

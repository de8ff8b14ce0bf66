"""dgemm.matmul and dgemm.gemm end to end on the session's two-worker cluster.

Every result is compared with numpy in float64 on fresh random inputs;
outputs given as existing arrays are pre-filled with NaN so a block that is
never written shows up.
"""
from __future__ import annotations

import json
import os
import re

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dgemm
from _check import assert_nonfinite_like, check_product, randn, reference
from dgemm.storage import COMPLETE_ATTR


def zarr_in(path, data, chunks):
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype)
    arr[...] = data
    return arr


def nan_out(path, shape, chunks, dtype):
    """An existing output array whose every chunk holds NaN."""
    arr = zarr.create_array(store=str(path), shape=shape, chunks=chunks, dtype=dtype, fill_value=0,
                            config={"write_empty_chunks": True})
    arr[...] = np.nan
    return arr


def assert_chunks_written(arr, ref, k):
    """Every chunk of ``arr`` holds its part of ``ref`` (a chunk never written still holds NaN)."""
    import itertools

    grid = [range(0, s, c) for s, c in zip(arr.shape, arr.chunks)]
    for start in itertools.product(*grid):
        sl = tuple(slice(s, min(s + c, n)) for s, c, n in zip(start, arr.chunks, arr.shape))
        got = arr[sl]
        assert np.isfinite(got).all(), f"chunk at {start} was not written (holds NaN)"
        np.testing.assert_allclose(got, ref[sl], rtol=1e-3, atol=1e-3 * np.sqrt(max(k, 1)),
                                   err_msg=f"chunk at {start}")
    assert arr.nchunks_initialized == arr.nchunks


@pytest.fixture
def as_current(client):
    """Make the session client the scheduler for dask's compute() within the test."""
    with client.as_current():
        yield client


# -- Zarr to Zarr -------------------------------------------------------------
def test_output_compressors(client, tmp_path, rng):
    """compressors=None writes raw chunks (the fast read path's format); "auto" keeps zarr's default."""
    from zarr.codecs import BytesCodec

    A, B = randn(rng, (96, 64), "float32"), randn(rng, (64, 80), "float32")
    raw = dgemm.matmul(A, B, out=str(tmp_path / "raw.zarr"), client=client, compressors=None)
    assert [type(c) for c in raw.metadata.codecs] == [BytesCodec]
    check_product(raw[...], A, B, dtype="float32")
    packed = dgemm.matmul(A, B, out=str(tmp_path / "packed.zarr"), client=client)
    assert len(packed.metadata.codecs) > 1
    with pytest.raises(ValueError, match="lazy result"):
        dgemm.matmul(A, B, client=client, compressors=None)
    with pytest.raises(ValueError, match="keeps its own codecs"):
        dgemm.matmul(A, B, out=packed, client=client, compressors=None, overwrite=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_zarr_inputs_with_different_chunkings(client, tmp_path, rng, dtype):
    A, B = randn(rng, (300, 200), dtype), randn(rng, (200, 170), dtype)
    a = zarr_in(tmp_path / "a.zarr", A, (70, 33))
    b = zarr_in(tmp_path / "b.zarr", B, (45, 64))
    out = dgemm.matmul(tmp_path / "a.zarr", b, out=str(tmp_path / "c.zarr"), client=client, block=64)
    assert isinstance(out, zarr.Array) and out.dtype == np.dtype(dtype)
    check_product(out[...], A, B, dtype=dtype)
    meta = out.attrs[COMPLETE_ATTR]
    assert meta["complete"] is True and meta["operation"] == "matmul"
    assert "C[300 x 170] = A[300 x 200] @ B[200 x 170]" in meta["plan"]
    assert "a.zarr" in meta["a"]
    reread = dgemm.open_result(str(tmp_path / "c.zarr"))
    check_product(reread[...], A, B, dtype=dtype)
    assert reread.nchunks_initialized == reread.nchunks
    assert a.attrs.get(COMPLETE_ATTR) is None          # inputs are left alone


@pytest.mark.parametrize("out_chunks", [(37, 50), (300, 7), (64, 64)])
def test_existing_out_with_its_own_chunks(client, tmp_path, rng, out_chunks):
    A, B = randn(rng, (300, 150), "float32"), randn(rng, (150, 170), "float32")
    a = zarr_in(tmp_path / "a.zarr", A, (70, 33))
    out = nan_out(tmp_path / "c.zarr", (300, 170), out_chunks, "float32")
    got = dgemm.matmul(a, B, out=out, client=client, block=64)
    assert got.chunks == out_chunks
    check_product(got[...], A, B, dtype="float32")
    ref, _ = reference(A, B)
    assert_chunks_written(zarr.open_array(str(tmp_path / "c.zarr"), mode="r"), ref, 150)
    assert dgemm.open_result(str(tmp_path / "c.zarr")).attrs[COMPLETE_ATTR]["complete"]


def test_mixed_dtypes_promote_to_float64(client, tmp_path, rng):
    A, B = randn(rng, (90, 70), "float32"), randn(rng, (70, 80), "float64")
    out = dgemm.matmul(zarr_in(tmp_path / "a.zarr", A, (30, 30)), B, out=str(tmp_path / "c.zarr"),
                       client=client)
    assert out.dtype == np.float64
    check_product(out[...], A, B, dtype="float64")
    C = randn(rng, (90, 80), "float32")
    lazy = dgemm.gemm(A, B.astype("f4"), c=C.astype("f8"), beta=1.0, client=client)
    assert lazy.dtype == np.float64


SHAPES = {
    "1x1": (1, 1, 1),
    "K=1": (40, 30, 1),
    "tall-skinny": (2000, 3, 4),
    "skinny-k-long": (5, 6, 1500),
    "primes": (127, 211, 97),
    "block-multiples": (128, 64, 192),
    "just-above-blocks": (129, 65, 193),
    "just-below-blocks": (127, 63, 191),
}


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_shapes(client, tmp_path, rng, shape):
    m, n, k = shape
    A, B = randn(rng, (m, k), "float32"), randn(rng, (k, n), "float32")
    a = zarr_in(tmp_path / "a.zarr", A, (max(1, m // 2), max(1, k // 3)))
    out = dgemm.matmul(a, B, out=str(tmp_path / "c.zarr"), client=client, block=64)
    check_product(out[...], A, B, dtype="float32")


# -- other inputs -------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dask_inputs_with_irregular_chunks(as_current, rng, dtype):
    A, B = randn(rng, (150, 130), dtype), randn(rng, (130, 110), dtype)
    a = da.from_array(A, chunks=((10, 60, 80), (7, 100, 23)))
    b = da.from_array(B, chunks=((50, 50, 30), (11, 99)))
    lazy = dgemm.matmul(a, b, client=as_current, block=(64, 32, 48))
    assert isinstance(lazy, da.Array) and lazy.shape == (150, 110) and lazy.dtype == np.dtype(dtype)
    check_product(lazy.compute(), A, B, dtype=dtype)


def test_dask_input_from_a_computation(as_current, rng):
    A, B = randn(rng, (64, 50), "float64"), randn(rng, (50, 40), "float64")
    a = da.from_array(A, chunks=(20, 20)) * 2 + 1         # a graph, not just stored blocks
    check_product(dgemm.matmul(a, B, client=as_current).compute(), 2 * A + 1, B, dtype="float64")


@pytest.mark.parametrize("small_flops", [0, 1e30], ids=["devices", "numpy-here"])
def test_numpy_inputs_and_lists(as_current, rng, small_flops):
    """numpy in, numpy out: computed at once, on the devices or (small products) by numpy here."""
    A, B = randn(rng, (33, 44), "float64"), randn(rng, (44, 22), "float64")
    with dask.config.set({"dgemm.small-flops": small_flops}):
        got = dgemm.matmul(A, B, client=as_current, block=16)
        assert type(got) is np.ndarray
        check_product(got, A, B, dtype="float64")
        check_product(dgemm.matmul(A.tolist(), B, client=as_current), A, B, dtype="float64")


def test_lazy_result_compute_and_to_zarr(as_current, tmp_path, rng):
    A, B = randn(rng, (100, 80), "float32"), randn(rng, (80, 90), "float32")
    lazy = dgemm.matmul(zarr_in(tmp_path / "a.zarr", A, (50, 40)), B, client=as_current, block=32)
    assert isinstance(lazy, da.Array)
    assert any(name.startswith("dgemm-gemm-") for name in lazy.dask.layers)
    check_product(lazy.compute(), A, B, dtype="float32")
    lazy.to_zarr(str(tmp_path / "lazy.zarr"))
    check_product(zarr.open_array(str(tmp_path / "lazy.zarr"), mode="r")[...], A, B, dtype="float32")
    # and it composes with other dask operations
    total = (lazy + 1).sum().compute()
    ref, _ = reference(A, B)
    np.testing.assert_allclose(total, (ref + 1).sum(), rtol=1e-4)


# -- gemm ---------------------------------------------------------------------
@pytest.mark.parametrize("trans_a", [False, True], ids=["A", "At"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["B", "Bt"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm_transposes(client, tmp_path, rng, trans_a, trans_b, dtype):
    m, n, k = 130, 90, 110
    A = randn(rng, (k, m) if trans_a else (m, k), dtype)
    B = randn(rng, (n, k) if trans_b else (k, n), dtype)
    a = zarr_in(tmp_path / "a.zarr", A, (70, 33))
    b = zarr_in(tmp_path / "b.zarr", B, (45, 64))
    out = nan_out(tmp_path / "c.zarr", (m, n), (40, 40), dtype)
    got = dgemm.gemm(a, b, trans_a=trans_a, trans_b=trans_b, out=out, client=client, block=64)
    check_product(got[...], A, B, dtype=dtype, trans_a=trans_a, trans_b=trans_b)
    assert got.attrs[COMPLETE_ATTR]["operation"] == "gemm"


@pytest.mark.parametrize("c_kind", ["zarr", "dask", "numpy"])
@pytest.mark.parametrize("alpha,beta", [(2.0, 0.5), (-1.0, 1.0), (0.25, -3.0)])
def test_gemm_alpha_beta_c(client, tmp_path, rng, c_kind, alpha, beta):
    A, B, C = randn(rng, (120, 70)), randn(rng, (70, 100)), randn(rng, (120, 100))
    c = {"zarr": lambda: zarr_in(tmp_path / "cin.zarr", C, (50, 30)),
         "dask": lambda: da.from_array(C, chunks=(33, 70)),
         "numpy": lambda: C}[c_kind]()
    out = dgemm.gemm(A, zarr_in(tmp_path / "b.zarr", B, (35, 50)), c=c, alpha=alpha, beta=beta,
                     out=str(tmp_path / "c.zarr"), client=client, block=64)
    check_product(out[...], A, B, alpha=alpha, beta=beta, c=C, dtype="float64")


def test_gemm_numpy_scalars(client, rng):
    A, B, C = randn(rng, (40, 30), "f4"), randn(rng, (30, 20), "f4"), randn(rng, (40, 20), "f4")
    got = dgemm.gemm(A, B, c=C, alpha=np.float32(0.5), beta=np.int64(2), client=client)
    check_product(got, A, B, alpha=0.5, beta=2.0, c=C, dtype="float32")


def test_gemm_beta_zero_ignores_c(client, tmp_path, rng):
    A, B = randn(rng, (50, 40)), randn(rng, (40, 30))
    C = np.full((50, 30), np.nan)
    out = dgemm.gemm(A, B, c=C, alpha=3.0, beta=0.0, out=str(tmp_path / "c.zarr"), client=client)
    check_product(out[...], A, B, alpha=3.0, dtype="float64")


@pytest.mark.parametrize("same", ["array", "path"])
def test_gemm_in_place_on_c(client, tmp_path, rng, same):
    A, B, C = randn(rng, (100, 60)), randn(rng, (60, 80)), randn(rng, (100, 80))
    c = zarr_in(tmp_path / "c.zarr", C, (30, 25))
    out = c if same == "array" else str(tmp_path / "c.zarr")
    got = dgemm.gemm(A, B, c=c if same == "array" else str(tmp_path / "c.zarr"), beta=-1.0, out=out,
                     client=client, overwrite=same == "path", block=32)
    assert got.chunks == (30, 25)
    after = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")
    check_product(after[...], A, B, beta=-1.0, c=C, dtype="float64")
    assert after.attrs[COMPLETE_ATTR]["complete"]


# -- 1-D operands -------------------------------------------------------------
@pytest.mark.parametrize("case", ["vec@mat", "mat@vec", "vec@vec"])
@pytest.mark.parametrize("where", ["lazy", "zarr"])
def test_vectors_like_numpy(as_current, tmp_path, rng, case, where):
    M = randn(rng, (70, 90), "float32")
    if case == "vec@mat":
        a, b = randn(rng, 70, "float32"), M
    elif case == "mat@vec":
        a, b = M, randn(rng, 90, "float32")
    else:
        a, b = randn(rng, 150, "float32"), randn(rng, 150, "float32")
    expected_shape = np.matmul(a, b).shape
    za = zarr_in(tmp_path / "a.zarr", a, (33,) if a.ndim == 1 else (20, 40))
    if where == "lazy":
        res = dgemm.matmul(za, b, client=as_current, block=32)
        assert res.shape == expected_shape
        got = res.compute()
    else:
        res = dgemm.matmul(za, b, out=str(tmp_path / "c.zarr"), client=as_current, block=32)
        assert res.shape == expected_shape and res.attrs[COMPLETE_ATTR]["complete"]
        got = res[...]
    got = np.asarray(got)
    assert got.shape == expected_shape
    check_product(got, a, b, dtype="float32")


# -- empty and degenerate -----------------------------------------------------
def test_k_zero(client, tmp_path, rng):
    A, B = np.empty((6, 0), "f4"), np.empty((0, 5), "f4")
    out = dgemm.matmul(zarr_in(tmp_path / "a.zarr", A, (3, 1)), B, out=str(tmp_path / "c.zarr"), client=client)
    np.testing.assert_array_equal(out[...], np.zeros((6, 5)))
    assert out.attrs[COMPLETE_ATTR]["complete"]
    C = randn(rng, (6, 5), "f4")
    got = dgemm.gemm(A, B, c=C, alpha=2.0, beta=-0.5, out=str(tmp_path / "g.zarr"), client=client)
    np.testing.assert_array_equal(got[...], (-0.5 * C.astype("f8")).astype("f4"))
    lazy = dgemm.gemm(da.from_array(A), da.from_array(B), c=da.from_array(C, chunks=(2, 5)), beta=3.0,
                      client=client)
    np.testing.assert_array_equal(client.compute(lazy).result(), (3.0 * C.astype("f8")).astype("f4"))
    vv = dgemm.matmul(np.empty(0, "f8"), np.empty(0, "f8"), client=client)    # numpy: 0.0
    assert np.shape(vv) == () and vv == 0.0


@pytest.mark.parametrize("shape", [(0, 5, 4), (5, 0, 4), (0, 0, 3), (0, 4, 0)])
def test_empty_results(client, tmp_path, rng, shape):
    m, n, k = shape
    A, B = randn(rng, (m, k), "f4"), randn(rng, (k, n), "f4")
    lazy = dgemm.matmul(A, B, client=client)
    assert lazy.shape == (m, n) and lazy.dtype == np.float32
    out = dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=client)
    assert out.shape == (m, n) and out.dtype == np.float32
    assert dgemm.open_result(str(tmp_path / "c.zarr")).attrs[COMPLETE_ATTR]["complete"]


def test_nan_and_inf_propagate_like_numpy(client, tmp_path, rng):
    A, B = randn(rng, (60, 50)), randn(rng, (50, 40))
    A[3, 7] = np.nan
    A[20, 1] = np.inf
    B[4, 30] = -np.inf
    B[9, 11] = np.inf
    B[10, 11] = -np.inf
    out = dgemm.matmul(zarr_in(tmp_path / "a.zarr", A, (25, 20)), B, out=str(tmp_path / "c.zarr"),
                       client=client, block=32)
    with np.errstate(invalid="ignore"):
        ref = np.matmul(A, B)
    assert np.isnan(ref).any() and np.isinf(ref).any()
    assert_nonfinite_like(out[...], ref)


# -- k split and blocks -------------------------------------------------------
def test_k_split_over_workers(client, tmp_path, rng):
    A, B = randn(rng, (40, 600), "float64"), randn(rng, (600, 30), "float64")
    lazy = dgemm.matmul(zarr_in(tmp_path / "a.zarr", A, (40, 100)), B, client=client, block=(64, 64, 128))
    assert any(n.startswith("dgemm-reduce-") for n in lazy.dask.layers)
    check_product(client.compute(lazy).result(), A, B, dtype="float64")
    out = dgemm.matmul(str(tmp_path / "a.zarr"), B, out=str(tmp_path / "c.zarr"), client=client,
                       block=(64, 64, 128))
    check_product(out[...], A, B, dtype="float64")
    assert "k split into 2 segment(s)" in out.attrs[COMPLETE_ATTR]["plan"]


@pytest.mark.parametrize("block", [1, 16, 100, (32, 48, 16), (1000, 1000, 1000)])
def test_block_option(client, rng, block):
    A, B = randn(rng, (70, 50), "float32"), randn(rng, (50, 60), "float32")
    check_product(dgemm.matmul(A, B, client=client, block=block), A, B, dtype="float32")


def test_progress_bar(client, tmp_path, rng, capsys):
    """progress=True draws the share of the flops done (dgemm.client.progress); outside a notebook that is
    text on stdout, ``[####...] | 100% of the flops | 0.3s``, the bar full once every block is stored.
    Without it, nothing."""
    A, B = randn(rng, (50, 40), "float32"), randn(rng, (40, 30), "float32")
    capsys.readouterr()
    out = dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=client, progress=True)
    check_product(out[...], A, B, dtype="float32")
    drawn = capsys.readouterr().out
    assert re.search(r"\[#{40}\] \| 100% of the flops \| ", drawn), repr(drawn)
    dgemm.matmul(A, B, out=str(tmp_path / "d.zarr"), client=client)
    assert "of the flops" not in capsys.readouterr().out


# -- outputs: overwrite, completion -------------------------------------------
def test_overwrite_semantics(client, tmp_path, rng):
    path = str(tmp_path / "c.zarr")
    old = zarr.create_array(store=path, shape=(3, 3), dtype="f8")
    old[...] = 7.0
    A, B = randn(rng, (20, 10), "f4"), randn(rng, (10, 15), "f4")
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        dgemm.matmul(A, B, out=path, client=client)
    kept = zarr.open_array(path, mode="r")
    assert kept.shape == (3, 3) and (kept[...] == 7.0).all() and COMPLETE_ATTR not in kept.attrs
    out = dgemm.matmul(A, B, out=path, client=client, overwrite=True)
    assert out.shape == (20, 15) and out.dtype == np.float32
    check_product(zarr.open_array(path, mode="r")[...], A, B, dtype="float32")
    # running again over a finished result also needs overwrite
    with pytest.raises(FileExistsError):
        dgemm.matmul(A, B, out=path, client=client)
    A2 = randn(rng, (20, 10), "f4")
    dgemm.matmul(A2, B, out=path, client=client, overwrite=True)
    check_product(dgemm.open_result(path)[...], A2, B, dtype="float32")


def test_open_result_refuses_incomplete(tmp_path, rng):
    plain = zarr.create_array(store=str(tmp_path / "plain.zarr"), shape=(2, 2), dtype="f8")
    with pytest.raises(dgemm.IncompleteResultError, match="was not written by dgemm"):
        dgemm.open_result(str(tmp_path / "plain.zarr"))
    plain.attrs[COMPLETE_ATTR] = {"complete": False}
    with pytest.raises(dgemm.IncompleteResultError, match="is incomplete"):
        dgemm.open_result(str(tmp_path / "plain.zarr"))


def test_failed_run_leaves_an_incomplete_output(client, tmp_path, rng):
    A, B = randn(rng, (40, 30)), randn(rng, (30, 20))
    a = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=A.shape, chunks=(20, 30), dtype="f8",
                          compressors=None)
    a[...] = A
    (tmp_path / "a.zarr" / "c" / "1" / "0").write_bytes(b"corrupt")      # one unreadable input chunk
    with pytest.raises(OSError, match="could not read Zarr array"):   # the worker's, raised again here
        dgemm.matmul(str(tmp_path / "a.zarr"), B, out=str(tmp_path / "c.zarr"), client=client, block=16)
    assert (tmp_path / "c.zarr").exists()
    with pytest.raises(dgemm.IncompleteResultError, match="did not finish"):
        dgemm.open_result(str(tmp_path / "c.zarr"))


# -- bad inputs: clear errors before any work, nothing written ----------------
def _bad_cases():
    """The bad-input table: ``name: (operation, make kwargs(tmp_path), exception, message regex)``.

    Every row must fail with that exception and message *before any work*
    (``client`` is a stand-in that fails the test if touched) and write
    nothing.  Kinds: shape mismatches, dimensions, dtypes, scalars, option
    values (block, booleans, resume), outputs (exists, read-only, wrong
    shape/dtype, in-memory, not a store, the same as an input), paths that
    are not Zarr arrays, inputs that are unfinished dgemm outputs or dask
    arrays of unknown shape, and sizes beyond the kernels' 32-bit indexing.
    Valid but special inputs are tested where they work: NaN/Inf follow
    numpy (``test_nan_and_inf_propagate_like_numpy``), zero-size dimensions
    give empty or zero results (``test_empty_results``, ``test_k_zero``).
    """
    f4 = np.ones((4, 3), "f4")
    g4 = np.ones((3, 5), "f4")

    def existing(tmp, shape=(4, 5), dtype="f4", **kw):
        return zarr.create_array(store=str(tmp / "existing.zarr"), shape=shape, dtype=dtype, **kw)

    def group(tmp):
        zarr.open_group(str(tmp / "group.zarr"), mode="w")
        return str(tmp / "group.zarr")

    def empty_dir(tmp):
        (tmp / "empty").mkdir()
        return str(tmp / "empty")

    def plain_file(tmp):
        (tmp / "file.bin").write_bytes(b"123")
        return str(tmp / "file.bin")

    def out_exists(tmp):
        existing(tmp)
        return dict(a=f4, b=g4, out=str(tmp / "existing.zarr"))

    def out_is_a(tmp):
        a = zarr_in(tmp / "a.zarr", np.ones((4, 4), "f4"), (2, 2))
        return dict(a=a, b=np.ones((4, 4), "f4"), out=str(tmp / "a.zarr"), overwrite=True)

    def read_only_out(tmp):
        existing(tmp)
        return dict(a=f4, b=g4, out=zarr.open_array(str(tmp / "existing.zarr"), mode="r"))

    def huge(tmp, name, shape, chunks):
        """A Zarr array of ``shape`` with no chunk written (metadata only: any size costs nothing)."""
        return zarr.create_array(store=str(tmp / name), shape=shape, chunks=chunks, dtype="f4")

    def incomplete(tmp):
        arr = zarr_in(tmp / "half.zarr", np.ones((4, 3), "f4"), (2, 3))
        arr.attrs[COMPLETE_ATTR] = {"complete": False, "operation": "matmul"}
        return dict(a=arr, b=g4)

    def incomplete_derived(tmp):
        incomplete(tmp)
        return dict(a=da.from_zarr(str(tmp / "half.zarr")) * 2, b=g4)

    def out_with_notes(tmp):
        existing(tmp)[...] = 1
        (tmp / "existing.zarr" / "notes.txt").write_text("mine")
        return dict(a=f4, b=g4, out=str(tmp / "existing.zarr"), overwrite=True)

    def out_dangling_link(tmp):
        os.symlink(tmp / "gone.zarr", tmp / "link.zarr")
        return dict(a=f4, b=g4, out=str(tmp / "link.zarr"))

    def zero_chunks(tmp):
        zarr_in(tmp / "z.zarr", np.ones((4, 3), "f4"), (2, 3))
        meta = json.loads((tmp / "z.zarr" / "zarr.json").read_text())
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [0, 3]
        (tmp / "z.zarr" / "zarr.json").write_text(json.dumps(meta))
        return dict(a=str(tmp / "z.zarr"), b=g4)

    def out_zero_chunks(tmp):
        existing(tmp, chunks=(2, 5))
        meta = json.loads((tmp / "existing.zarr" / "zarr.json").read_text())
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [2, 0]
        (tmp / "existing.zarr" / "zarr.json").write_text(json.dumps(meta))
        return dict(a=f4, b=g4, out=zarr.open_array(str(tmp / "existing.zarr"), mode="r+"))

    def unknown_shape(tmp):
        d = da.ones((4, 3), chunks=2, dtype="f4")
        return dict(a=d[d[:, 0] > 0], b=g4)

    def resume_plain(tmp):
        existing(tmp)
        return dict(a=f4, b=g4, out=str(tmp / "existing.zarr"), resume=True)

    def resume_in_place(tmp):
        c = zarr_in(tmp / "cc.zarr", np.ones((4, 5), "f4"), (2, 5))
        return dict(a=f4, b=g4, c=c, beta=1.0, out=c, resume=True)

    def resume_not_zarr(tmp):
        (tmp / "junk").mkdir()
        (tmp / "junk" / "x.txt").write_text("x")
        return dict(a=f4, b=g4, out=str(tmp / "junk"), resume=True)

    def out_chunks_overflow(tmp):
        a = huge(tmp, "ha.zarr", (60000, 8), (10000, 8))
        b = huge(tmp, "hb.zarr", (8, 60000), (8, 10000))
        out = existing(tmp, shape=(60000, 60000), chunks=(50000, 50000))
        return dict(a=a, b=b, out=out)

    from zarr.storage import MemoryStore
    M = "matmul"
    G = "gemm"
    return {
        # name: (op, make kwargs(tmp), exception, message regex)
        "shape-mismatch": (M, lambda t: dict(a=np.ones((5, 4)), b=np.ones((3, 6))), ValueError,
                           r"a has shape \(5, 4\) and b has shape \(3, 6\).*\(4 != 3\)"),
        "shape-mismatch-trans": (G, lambda t: dict(a=np.ones((5, 4)), b=np.ones((5, 6)), trans_a=False,
                                                   trans_b=True), ValueError,
                                 r"a has shape \(5, 4\) and b.T has shape \(5, 6\)"),
        "shape-mismatch-vector": (M, lambda t: dict(a=np.ones(3), b=np.ones((4, 2))), ValueError,
                                  r"a has shape \(3,\) and b has shape \(4, 2\)"),
        "0-d": (M, lambda t: dict(a=np.float64(2.0), b=g4), ValueError, "0-dimensional"),
        "3-d": (M, lambda t: dict(a=np.ones((2, 4, 3)), b=g4), ValueError, r"3 dimensions \(2, 4, 3\)"),
        "gemm-1-d": (G, lambda t: dict(a=np.ones(3), b=g4), ValueError, r"gemm needs 2-D operands; a has shape"),
        "int": (M, lambda t: dict(a=np.ones((4, 3), "i4"), b=g4), TypeError, "a has dtype int32"),
        "complex": (M, lambda t: dict(a=f4, b=np.ones((3, 5), "c8")), TypeError, "b has dtype complex64"),
        "float16": (M, lambda t: dict(a=np.ones((4, 3), "f2"), b=g4), TypeError, "a has dtype float16"),
        "bool": (M, lambda t: dict(a=np.ones((4, 3), bool), b=g4), TypeError, "a has dtype bool"),
        "object": (M, lambda t: dict(a=np.ones((4, 3), object), b=g4), TypeError, "a has dtype object"),
        "string": (M, lambda t: dict(a=np.full((4, 3), "x"), b=g4), TypeError, "a has dtype <U1"),
        "c-int": (G, lambda t: dict(a=f4, b=g4, c=np.ones((4, 5), "i8"), beta=1.0), TypeError, "c has dtype int64"),
        "not-an-array": (M, lambda t: dict(a={"a": 1}, b=g4), TypeError, "a must be a zarr.Array"),
        "out-exists": (M, out_exists, FileExistsError, "already exists; pass overwrite=True"),
        "a-empty-dir": (M, lambda t: dict(a=empty_dir(t), b=g4), ValueError, "empty is not a Zarr array"),
        "a-group": (M, lambda t: dict(a=group(t), b=g4), ValueError, "group.zarr is not a Zarr array"),
        "b-plain-file": (M, lambda t: dict(a=f4, b=plain_file(t)), ValueError, "file.bin is not a Zarr array"),
        "a-missing": (M, lambda t: dict(a=str(t / "nope.zarr"), b=g4), ValueError, "nope.zarr is not a Zarr array"),
        "out-plain-file": (M, lambda t: dict(a=f4, b=g4, out=plain_file(t), overwrite=True), FileExistsError,
                           "is a file, not a Zarr store"),
        "c-wrong-shape": (G, lambda t: dict(a=f4, b=g4, c=np.ones((5, 4)), beta=1.0), ValueError,
                          r"c has shape \(5, 4\), but op\(a\) @ op\(b\) has shape \(4, 5\)"),
        "c-1-d": (G, lambda t: dict(a=f4, b=g4, c=np.ones(5), beta=1.0), ValueError, r"c has shape \(5,\)"),
        "beta-without-c": (G, lambda t: dict(a=f4, b=g4, beta=0.5), ValueError, "beta=0.5 needs c"),
        "block-zero": (M, lambda t: dict(a=f4, b=g4, block=0), ValueError, "block must be a positive int"),
        "block-negative": (M, lambda t: dict(a=f4, b=g4, block=(64, -1, 64)), ValueError, r"not \(64, -1, 64\)"),
        "block-two": (M, lambda t: dict(a=f4, b=g4, block=(64, 64)), ValueError, "three positive ints"),
        "block-float": (M, lambda t: dict(a=f4, b=g4, block=1.5), (ValueError, TypeError), "block"),
        "block-bool": (M, lambda t: dict(a=f4, b=g4, block=(True, 1, 1)), ValueError, "block must be"),
        "block-string": (M, lambda t: dict(a=f4, b=g4, block="64"), ValueError, "block must be"),
        "alpha-string": (G, lambda t: dict(a=f4, b=g4, alpha="2"), TypeError, "alpha must be a real number, not str"),
        "alpha-none": (G, lambda t: dict(a=f4, b=g4, alpha=None), TypeError, "alpha must be a real number"),
        "alpha-complex": (G, lambda t: dict(a=f4, b=g4, alpha=1j), TypeError, "not complex"),
        "beta-bool": (G, lambda t: dict(a=f4, b=g4, c=np.ones((4, 5), "f4"), beta=True), TypeError,
                      "beta must be a real number, not bool"),
        "out-wrong-shape": (M, lambda t: dict(a=f4, b=g4, out=existing(t, shape=(5, 4))), ValueError,
                            r"out has shape \(5, 4\), but the result has shape \(4, 5\)"),
        "out-wrong-dtype": (M, lambda t: dict(a=f4, b=g4, out=existing(t, dtype="f8")), ValueError,
                            "out has dtype float64, but the result is float32"),
        "out-read-only-array": (M, read_only_out, PermissionError, "read-only"),
        "out-memory-array": (M, lambda t: dict(a=f4, b=g4, out=zarr.create_array(
            store=MemoryStore(), shape=(4, 5), dtype="f4")), ValueError, "in-memory Zarr store"),
        "out-memory-store": (M, lambda t: dict(a=f4, b=g4, out=MemoryStore()), ValueError, "in-memory"),
        "out-memory-url": (M, lambda t: dict(a=f4, b=g4, out="memory://c"), ValueError, "in-memory"),
        "out-numpy": (M, lambda t: dict(a=f4, b=g4, out=np.empty((4, 5), "f4")), TypeError,
                      "out must be a path, URL, zarr store or zarr.Array, not ndarray"),
        "out-is-a": (M, out_is_a, ValueError, "is also the input a"),
        "a-incomplete-dgemm-output": (M, incomplete, ValueError, r"half\.zarr\) is an incomplete dgemm output"),
        "a-incomplete-through-dask": (M, incomplete_derived, ValueError,
                                      r"half\.zarr\) is an incomplete dgemm output"),
        "out-holds-other-files": (M, out_with_notes, FileExistsError,
                                  r"holds 1 file\(s\) or folder\(s\) that neither Zarr nor dgemm wrote "
                                  r"\('notes.txt'\)"),
        "out-under-a-file": (M, lambda t: dict(a=f4, b=g4, out=os.path.join(plain_file(t), "c.zarr")),
                             NotADirectoryError, r"file\.bin/c\.zarr' cannot be created: .*file\.bin is a file"),
        "out-name-too-long": (M, lambda t: dict(a=f4, b=g4, out=str(t / ("c" * 300))), ValueError,
                              "300 bytes long, more than the"),
        "out-dangling-link": (M, out_dangling_link, FileExistsError,
                              r"is a symbolic link to .*gone\.zarr'.*does not exist"),
        "a-zero-chunk-size": (M, zero_chunks, ValueError, r"z\.zarr\) has a chunk size of 0 in its metadata"),
        "out-zero-chunk-size": (M, out_zero_chunks, ValueError,
                                r"existing\.zarr\) has a chunk size of 0 in its metadata \(chunks \(2, 0\)\)"),
        "a-dask-unknown-shape": (M, unknown_shape, ValueError, r"unknown shape \(nan, 3\).*compute_chunk_sizes"),
        "overwrite-not-bool": (M, lambda t: dict(a=f4, b=g4, overwrite="no"), TypeError,
                               "overwrite must be True or False, not 'no'"),
        "progress-not-bool": (M, lambda t: dict(a=f4, b=g4, progress=None), TypeError, "progress must be True or False"),
        "trans-not-bool": (G, lambda t: dict(a=f4, b=np.ones((5, 3), "f4"), trans_b="T"), TypeError,
                           "trans_b must be True or False, not 'T'"),
        "resume-not-bool": (M, lambda t: dict(a=f4, b=g4, resume=1), TypeError, "resume must be True or False"),
        "resume-without-out": (M, lambda t: dict(a=f4, b=g4, out=None, resume=True), ValueError,
                               "resume=True finishes an interrupted run into out; give out"),
        "resume-and-overwrite": (M, lambda t: dict(a=f4, b=g4, resume=True, overwrite=True), ValueError,
                                 "choose one"),
        "resume-not-dgemm-output": (M, resume_plain, ValueError, "cannot resume: .* was not written by dgemm"),
        "resume-in-place-not-dgemm": (G, resume_in_place, ValueError, "cannot resume: .* was not written by dgemm"),
        "resume-out-not-zarr": (M, resume_not_zarr, ValueError, "cannot resume: .*junk' exists but is not a Zarr"),
        "block-int32-overflow-c": (M, lambda t: dict(a=huge(t, "ha.zarr", (100000, 64), (10000, 64)),
                                                     b=huge(t, "hb.zarr", (64, 100000), (64, 10000)),
                                                     block=(50000, 50000, 64)), ValueError,
                                   r"block=\(50000, 50000, 64\) is too large: a C block of 50000 x 50000 padded elements exceeds 2\*\*31 - 1"),
        "block-int32-overflow-a": (M, lambda t: dict(a=huge(t, "ha.zarr", (100000, 100000), (10000, 10000)),
                                                     b=huge(t, "hb.zarr", (100000, 8), (10000, 8)),
                                                     block=(60000, 8, 60000)), ValueError, "is too large: an A block of 60000 x 60000 padded elements"),
        "out-chunks-int32-overflow": (M, out_chunks_overflow, ValueError,
                                      r"out's chunks \(50000, 50000\) are too large for dgemm: a C block of 50000 x 50000"),
    }


BAD = _bad_cases()


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(tmp_path, no_client, name):
    op, make, exc, msg = BAD[name]
    kwargs = make(tmp_path)
    kwargs.setdefault("out", str(tmp_path / "out.zarr"))
    if kwargs["out"] is None:
        del kwargs["out"]
    before = sorted(p.name for p in tmp_path.iterdir())
    existing = kwargs.get("out") if isinstance(kwargs.get("out"), zarr.Array) else None
    fn = dgemm.matmul if op == "matmul" else dgemm.gemm
    with pytest.raises(exc, match=msg):
        fn(client=no_client, **kwargs)
    assert not (tmp_path / "out.zarr").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "something was written"
    if existing is not None:
        assert COMPLETE_ATTR not in zarr.open_array(existing.store_path, mode="r").attrs
    if os.path.isdir(tmp_path / "existing.zarr"):
        assert COMPLETE_ATTR not in zarr.open_array(str(tmp_path / "existing.zarr"), mode="r").attrs


def test_bad_input_out_not_writable(tmp_path, no_client):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: a read-only directory is still writable, so there is nothing to refuse "
                        "(test_storage checks the refusal with a patched os.access)")
        with pytest.raises(PermissionError, match="not writable"):
            dgemm.matmul(np.ones((2, 2)), np.ones((2, 2)), out=str(ro / "c.zarr"), client=no_client)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_bad_input_out_not_writable_patched(tmp_path, no_client, monkeypatch):
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path / "ro") else real(p, mode))
    (tmp_path / "ro").mkdir()
    with pytest.raises(PermissionError, match="not writable"):
        dgemm.matmul(np.ones((2, 2)), np.ones((2, 2)), out=str(tmp_path / "ro" / "c.zarr"), client=no_client)
    assert list((tmp_path / "ro").iterdir()) == []


# -- property test ------------------------------------------------------------
@st.composite
def products(draw):
    """Shapes, chunks, blocks, dtype and seed of a random product.

    Half of them are *k-split* cases: blocks larger than twice any m or n give C a
    single block, fewer than the session's two workers, and k longer than any
    K block (``block_size`` gives at most max(block k, kernel tile k), and the
    tiles are at most 64) makes several k blocks, so the plan splits k over the
    workers and adds their segments (``make_plan``'s ``segments``).
    """
    split = draw(st.booleans(), label="k split")
    m, n = (draw(st.integers(1, 150), label=x) for x in "mn")
    k = draw(st.integers(65, 150) if split else st.integers(1, 150), label="k")
    if split:
        block = (draw(st.integers(300, 4096), label="block m"), draw(st.integers(300, 4096), label="block n"),
                 draw(st.integers(1, 32), label="block k"))
    else:
        block = draw(st.tuples(*[st.integers(1, 160)] * 3), label="block")
    a_chunks = draw(st.tuples(st.integers(1, m), st.integers(1, k)), label="a_chunks")
    b_chunks = draw(st.tuples(st.integers(1, k), st.integers(1, n)), label="b_chunks")
    dtype = draw(st.sampled_from(["float32", "float64"]), label="dtype")
    seed = draw(st.integers(0, 2**32 - 1), label="seed")
    return dict(split=split, m=m, n=n, k=k, block=block, a_chunks=a_chunks, b_chunks=b_chunks, dtype=dtype,
                seed=seed)


def _splits_k(lazy) -> bool:
    """Whether a lazy product's graph adds k segments (``dgemm-reduce``: only when k is split)."""
    return any(name.startswith("dgemm-reduce-") for name in lazy.dask.layers)


def test_random_shapes_and_blocks(client):
    """Random products against numpy, k splits over the workers among them (every run: the explicit example
    is one, and the drawn k-split cases must each split)."""
    workers = len(client.scheduler_info()["workers"])
    if workers < 2:
        pytest.skip(f"the cluster has {workers} worker(s): k is split over two or more")
    seen = []

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=products())
    @example(case=dict(split=True, m=7, n=5, k=100, block=(512, 512, 16), a_chunks=(7, 30), b_chunks=(40, 5),
                       dtype="float64", seed=None))
    def check(case):
        seed = np.random.SeedSequence().entropy % 2**32 if case["seed"] is None else case["seed"]
        print(f"seed={seed}")   # shown with a failure: the explicit example's inputs are fresh each run
        rng = np.random.default_rng(seed)
        A, B = randn(rng, (case["m"], case["k"]), case["dtype"]), randn(rng, (case["k"], case["n"]), case["dtype"])
        lazy = dgemm.matmul(da.from_array(A, chunks=case["a_chunks"]), da.from_array(B, chunks=case["b_chunks"]),
                            client=client, block=case["block"])
        split = _splits_k(lazy)
        seen.append(split)
        assert split or not case["split"], f"a k-split case did not split k: {case}"
        check_product(client.compute(lazy).result(), A, B, dtype=case["dtype"])

    check()
    assert any(seen), "no example split k over the workers"


# -- on the GPUs (skipped elsewhere) ------------------------------------------
@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_large_product_on_gpu_workers(tmp_path, rng, dtype):
    from distributed import Client

    A, B = randn(rng, (5000, 3000), dtype), randn(rng, (3000, 4500), dtype)
    a = zarr_in(tmp_path / "a.zarr", A, (1000, 700))
    b = zarr_in(tmp_path / "b.zarr", B, (500, 1500))
    with dgemm.DeviceCluster("gpu", dashboard_address=":0") as cl, Client(cl, set_as_default=False) as c:
        out = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=c, block=2048)
    check_product(dgemm.open_result(str(tmp_path / "c.zarr"))[...], A, B, dtype=dtype)
    assert out.attrs[COMPLETE_ATTR]["complete"]


# -- paths and stores as users spell them (issue 14: cases 3, 6, 7, 8) --------------------------
@pytest.mark.parametrize("spelling", ["relative-array", "file-url", "symlink", "array", "fsspec-store", "dask-a",
                                      "dask-b"])
def test_out_is_an_input_however_spelt(tmp_path, monkeypatch, no_client, rng, spelling):
    """Case 6: out = a or b is refused before any work for every spelling; the input is left as it was."""
    from zarr.storage import FsspecStore

    monkeypatch.chdir(tmp_path)
    A, B = randn(rng, (8, 6)), randn(rng, (6, 5))
    zarr_in(tmp_path / "a.zarr", A, (4, 6))
    zarr_in(tmp_path / "b.zarr", B, (6, 5))
    os.symlink(tmp_path / "a.zarr", tmp_path / "link.zarr")
    a, b, name = str(tmp_path / "a.zarr"), B, "a"
    if spelling == "relative-array":
        a, out = zarr.open_array("a.zarr", mode="r"), str(tmp_path / "a.zarr")
    elif spelling == "file-url":
        a, out = zarr.open_array(f"file://{tmp_path}/a.zarr/", mode="r"), "a.zarr"
    elif spelling == "dask-a":
        a, out = da.from_zarr(zarr.open_array("a.zarr", mode="r")), "a.zarr"
    elif spelling == "dask-b":
        b, out, name = da.from_zarr(zarr.open_array("b.zarr", mode="r")).astype("f4") * 2, f"file://{tmp_path}/b.zarr", "b"
    else:
        out = {"symlink": "link.zarr",
               "array": zarr.open_array("a.zarr", mode="r+"),
               "fsspec-store": FsspecStore.from_url(f"file://{tmp_path}/a.zarr")}[spelling]
    with pytest.raises(ValueError, match=f"is also the input {name}"):
        dgemm.matmul(a, b, out=out, overwrite=True, client=no_client)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...], A)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "b.zarr"), mode="r")[...], B)


def test_out_inside_an_input_or_read_by_a_dask_c_is_refused(tmp_path, no_client, rng):
    """Case 6: out within a's folder would change a; an in-place out that a dask c computes from would be read late."""
    A, B, C = randn(rng, (8, 6)), randn(rng, (6, 5)), randn(rng, (8, 5))
    a = zarr_in(tmp_path / "a.zarr", A, (4, 6))
    c = zarr_in(tmp_path / "c.zarr", C, (4, 5))
    for inside in ("c", "sub/c.zarr"):   # "c": a's own chunk folder (Zarr v3)
        with pytest.raises(ValueError, match=r"lies inside the input a"):
            dgemm.matmul(a, B, out=str(tmp_path / "a.zarr" / inside), overwrite=True, client=no_client)
    with pytest.raises(ValueError, match=r"is read by c, a dask array computed from it"):
        dgemm.gemm(a, B, c=da.from_zarr(c) * 1.0, beta=1.0, out=str(tmp_path / "c.zarr"), client=no_client)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...], A)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "c.zarr"), mode="r")[...], C)
    assert not (tmp_path / "a.zarr" / "sub").exists()


def _unreachable_cases():
    """``name: (make kwargs(tmp_path), exception, message regex)``: refused before any work (cases 3 and 7)."""
    from zarr.storage import FsspecStore, MemoryStore, ZipStore

    f4, g4 = np.ones((4, 3), "f4"), np.ones((3, 5), "f4")

    def in_memory(t):
        z = zarr.create_array(store=MemoryStore(), shape=(4, 3), dtype="f4")
        z[...] = 1
        return z

    def memory_url(t):
        zarr.open_array("memory://h1-api/a", mode="w", shape=(4, 3), dtype="f4")[...] = 1
        return "memory://h1-api/a"

    fix = r".*exists only in this process.*np\.asarray"
    return {
        "a-memory-store": (lambda t: dict(a=in_memory(t), b=g4), ValueError, "a is stored in an in-memory Zarr store" + fix),
        "a-memory-url": (lambda t: dict(a=memory_url(t), b=g4), ValueError, "fsspec's in-memory filesystem" + fix),
        "b-memory-fsspec-store": (lambda t: dict(a=f4, b=FsspecStore.from_url(memory_url(t))), ValueError,
                                  "b is stored in fsspec's in-memory" + fix),
        "a-dask-over-memory-url": (lambda t: dict(a=da.from_zarr(memory_url(t)), b=g4), ValueError, fix),
        "out-zip-store": (lambda t: dict(a=f4, b=g4, out=ZipStore(t / "c.zip", mode="w")), ValueError,
                          "ZipStore.*cannot be written concurrently"),
        "out-memory-fsspec-store": (lambda t: dict(a=f4, b=g4, out=FsspecStore.from_url("memory://h1-api/c")),
                                    ValueError, "in-memory Zarr store"),
        "compressors-string": (lambda t: dict(a=f4, b=g4, compressors="zstd"), ValueError,
                               r"compressors='zstd' cannot compress a float32 Zarr v3 array"),
        "compressors-unknown": (lambda t: dict(a=f4, b=g4, compressors={"name": "bogus"}), ValueError,
                                "cannot compress"),
        "a-unknown-protocol": (lambda t: dict(a="nosuch://bucket/a.zarr", b=g4), ValueError,
                               r"a \('nosuch://bucket/a.zarr'\): fsspec knows no protocol 'nosuch'"),
        "out-unknown-protocol": (lambda t: dict(a=f4, b=g4, out="nosuch://bucket/c.zarr"), ValueError,
                                 "fsspec knows no protocol 'nosuch'"),
    }


UNREACHABLE = _unreachable_cases()


@pytest.mark.parametrize("name", list(UNREACHABLE))
def test_unreachable_stores_and_bad_codecs_are_refused_up_front(tmp_path, no_client, name):
    make, exc, msg = UNREACHABLE[name]
    kwargs = make(tmp_path)
    kwargs.setdefault("out", str(tmp_path / "out.zarr"))
    if kwargs["out"] is None:
        del kwargs["out"]
    with pytest.raises(exc, match=msg):
        dgemm.matmul(client=no_client, **kwargs)
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize("which", ["a", "out"])
def test_s3_without_s3fs_is_refused_up_front(no_client, monkeypatch, which):
    """Case 7: fsspec names the package to install, before any work."""
    import sys

    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "s3", raising=False)
    monkeypatch.setitem(sys.modules, "s3fs", None)                    # as if s3fs were not installed
    kwargs = dict(a="s3://bucket/a.zarr", b=np.ones((3, 5)), out=None) if which == "a" else \
        dict(a=np.ones((4, 3)), b=np.ones((3, 5)), out="s3://bucket/c.zarr")
    with pytest.raises(ImportError, match=rf"{which} \('s3://bucket/.\.zarr'\): the s3:// protocol needs .*s3fs"):
        dgemm.matmul(client=no_client, **kwargs)


def test_file_url_out_is_written_like_a_path(client, tmp_path, rng):
    """Case 7: a file:// out into folders that do not exist yet (fsspec would not create them)."""
    A, B = randn(rng, (40, 30)), randn(rng, (30, 20))
    out = dgemm.matmul(A, B, out=f"file://{tmp_path}/new/deeper/c.zarr", client=client, block=16)
    check_product(dgemm.open_result(str(tmp_path / "new" / "deeper" / "c.zarr"))[...], A, B, dtype="float64")
    assert out.attrs[COMPLETE_ATTR]["complete"]


def test_resume_with_the_same_compressors(client, tmp_path, rng):
    """Case 8: resume=True takes the interrupted call's compressors=; others are refused, naming both."""
    from zarr.codecs import BytesCodec, ZstdCodec

    A, B = randn(rng, (48, 40)), randn(rng, (40, 36))
    a, b = zarr_in(tmp_path / "a.zarr", A, (16, 40)), zarr_in(tmp_path / "b.zarr", B, (40, 12))
    path = str(tmp_path / "c.zarr")
    # resume into an out that does not exist yet: a fresh run, with the codecs asked for
    first = dgemm.matmul(a, b, out=path, client=client, block=16, compressors=None, resume=True)
    assert [type(c) for c in first.metadata.codecs] == [BytesCodec]
    # as if that run had been interrupted after its blocks were stored
    meta = dict(first.attrs[COMPLETE_ATTR])
    meta["complete"] = False
    first.attrs[COMPLETE_ATTR] = meta
    again = dgemm.matmul(a, b, out=path, client=client, block=16, compressors=None, resume=True)
    check_product(dgemm.open_result(path)[...], A, B, dtype="float64")
    assert again.attrs[COMPLETE_ATTR]["resumed"]
    with pytest.raises(ValueError, match=r"cannot resume: .* written with compressors \[\], but this call asks "
                                         r"for \[\{'name': 'zstd'"):
        dgemm.matmul(a, b, out=path, client=client, block=16, compressors=ZstdCodec(), resume=True)

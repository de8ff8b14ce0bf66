"""xarray in, xarray out (dgemm.client.dataarrays): dims and coordinates kept, dask data never computed here."""
from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from _check import assert_close, check_product, randn

import dgemm

xr = pytest.importorskip("xarray", reason="xarray is not installed (pip install xarray)")


def labelled(rng, dims, shape, dtype="float64", chunks=None):
    data = randn(rng, shape, dtype)
    # labels follow the dim's name: the contracted dim of a and b has the same labels (xarray aligns on them)
    coords = {d: np.arange(n) * 10 + sum(map(ord, d)) % 7 for d, n in zip(dims, shape)}
    coords[f"{dims[0]}_label"] = (dims[0], [f"{dims[0]}{i}" for i in range(shape[0])])
    x = xr.DataArray(da.from_array(data, chunks=chunks) if chunks else data, dims=dims, coords=coords)
    return x, data


def test_numpy_backed_dataarrays_give_a_dataarray_with_their_coordinates(rng):
    a, A = labelled(rng, ("time", "space"), (40, 30))
    b, B = labelled(rng, ("space", "mode"), (30, 20))
    with dask.config.set({"dgemm.small-flops": 1e12}):
        got = dgemm.matmul(a, b)
    assert isinstance(got, xr.DataArray) and got.dims == ("time", "mode")
    check_product(got.values, A, B, dtype="float64")
    np.testing.assert_array_equal(got["time"], a["time"])
    np.testing.assert_array_equal(got["mode"], b["mode"])
    assert list(got["time_label"].values) == list(a["time_label"].values)
    assert "space" not in got.coords and "space_label" not in got.coords   # the contracted dim goes


def in_a_worker_only(block):
    """Raises on the client: the DataArray's dask data must be computed by the workers."""
    from distributed import get_worker
    get_worker()       # ValueError outside a worker task
    return block


def test_dask_backed_dataarrays_stay_lazy_and_are_never_computed_here(client, rng):
    a, A = labelled(rng, ("row", "k"), (64, 48), chunks=32)
    b, B = labelled(rng, ("k", "col"), (48, 40), chunks=24)
    a = a.copy(data=a.data.map_blocks(in_a_worker_only, dtype=A.dtype, meta=np.empty((0, 0), A.dtype)))
    got = dgemm.gemm(a.T, b.T, trans_a=True, trans_b=True, alpha=2.0, client=client, block=16)
    assert isinstance(got, xr.DataArray) and got.dims == ("row", "col")
    assert isinstance(got.data, da.Array)
    check_product(client.compute(got.data).result(), A, B, alpha=2.0, dtype="float64")
    np.testing.assert_array_equal(got["row"], a["row"])


def test_a_written_out_comes_back_as_a_dataarray(client, tmp_path, rng):
    a, A = labelled(rng, ("i", "j"), (30, 20))
    b, B = labelled(rng, ("j", "l"), (20, 10))
    got = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client)
    assert isinstance(got, xr.DataArray) and got.dims == ("i", "l")
    check_product(got.values, A, B, dtype="float64")


def test_a_dimension_twice_is_refused_before_any_work(no_client, rng):
    a, _ = labelled(rng, ("x", "y"), (6, 5))
    with pytest.raises(ValueError, match="dimension 'x' twice"):
        dgemm.matmul(a, a.T, client=no_client)     # rows "x", columns "x"


def test_out_naming_the_zarr_array_behind_an_opened_dataset_is_refused(no_client, tmp_path, rng):
    """xr.open_zarr(...) data is a dask graph around xarray's wrappers of the zarr array: still an input.

    With ``overwrite=True`` the input would be deleted before it is read and
    the fill values marked complete.
    """
    V = randn(rng, (20, 10))
    xr.Dataset({"v": (("x", "y"), V)}).to_zarr(str(tmp_path / "ds.zarr"), mode="w")
    ds = xr.open_zarr(str(tmp_path / "ds.zarr"))
    b = np.ones((10, 4))
    with pytest.raises(ValueError, match="input a"):
        dgemm.matmul(ds.v, b, out=str(tmp_path / "ds.zarr" / "v"), overwrite=True, client=no_client)
    np.testing.assert_array_equal(xr.open_zarr(str(tmp_path / "ds.zarr")).v.values, V)


# -- xarray's rules (issue 26): align on the contracted dimension, refuse what xr.dot would not contract --------

def against_xr_dot(got, a, b, dtype):
    """``got`` against ``xr.dot(a, b)`` computed in float64 (labels aligned by xarray), with the element-wise bound."""
    a64, b64 = a.astype("float64"), b.astype("float64")
    ref = xr.dot(a64, b64).transpose(*got.dims)
    absref = xr.dot(abs(a64), abs(b64)).transpose(*got.dims)
    assert got.dims == ref.dims
    for d in got.dims:
        np.testing.assert_array_equal(got[d], ref[d])
    k = len(xr.align(a, b, join="inner")[0][b.dims[0]])
    assert_close(np.asarray(got.values), np.asarray(ref.values), np.asarray(absref.values), dtype, k)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_the_contracted_dimension_is_aligned_by_label_as_xr_dot_does(rng, dtype, lazy):
    """A reversed (and partly disjoint) ``feature`` coordinate: labels meet labels, not positions."""
    A, B = randn(rng, (40, 30), dtype), randn(rng, (26, 20), dtype)
    a = xr.DataArray(A, dims=("sample", "feature"),
                     coords={"sample": np.arange(40), "feature": np.arange(30)})
    # b's labels (28 down to 3) run backwards, and a has four that b lacks (0, 1, 2, 29): the inner join keeps 26
    b = xr.DataArray(B, dims=("feature", "mode"), coords={"feature": np.arange(28, 2, -1), "mode": np.arange(20)})
    if lazy:
        a, b = a.chunk({"sample": 16, "feature": 8}), b.chunk({"feature": 7, "mode": 8})
    with dask.config.set({"dgemm.small-flops": 0 if lazy else 1e12}, scheduler="threads"):
        got = dgemm.matmul(a, b)
        assert isinstance(got.data, da.Array) == lazy           # aligned lazily: nothing computed yet
        got = got.compute()
    against_xr_dot(got, a, b, dtype)


def test_aligning_a_lazy_operand_computes_nothing_here(client, rng):
    A, B = randn(rng, (32, 24)), randn(rng, (24, 16))
    a = xr.DataArray(da.from_array(A, chunks=8), dims=("r", "k"), coords={"k": np.arange(24)})
    a = a.copy(data=a.data.map_blocks(in_a_worker_only, dtype=A.dtype, meta=np.empty((0, 0), A.dtype)))
    b = xr.DataArray(B, dims=("k", "c"), coords={"k": np.arange(24)[::-1]})
    got = dgemm.matmul(a, b, client=client, block=16)
    assert isinstance(got.data, da.Array)
    check_product(client.compute(got.data).result(), A, B[::-1], dtype="float64")


def test_exact_join_is_refused_when_labels_differ(no_client, rng):
    a = xr.DataArray(randn(rng, (4, 3)), dims=("x", "k"), coords={"k": [0, 1, 2]})
    b = xr.DataArray(randn(rng, (3, 2)), dims=("k", "y"), coords={"k": [2, 1, 0]})
    with xr.set_options(arithmetic_join="exact"), pytest.raises(ValueError, match="'k'"):
        dgemm.matmul(a, b, client=no_client)


def test_inner_dimensions_of_different_names_are_refused_naming_both(no_client, rng):
    a, _ = labelled(rng, ("x", "space"), (6, 5))
    b, _ = labelled(rng, ("distance", "y"), (5, 4))
    with pytest.raises(ValueError, match="'space'.*'distance'"):
        dgemm.matmul(a, b, client=no_client)
    with pytest.raises(ValueError, match="'x'.*'distance'"):
        dgemm.gemm(a, b.T, trans_a=True, trans_b=True, client=no_client)   # op(a) is (space, x)


def test_the_result_is_named_as_xr_dot_names_it(rng):
    a, _ = labelled(rng, ("x", "k"), (6, 5))
    b, _ = labelled(rng, ("k", "y"), (5, 4))
    with dask.config.set({"dgemm.small-flops": 1e12}, scheduler="threads"):
        assert dgemm.matmul(a, b).name is None                        # unnamed operands: None, as xr.dot
        assert dgemm.matmul(a.chunk(3), b.chunk(3)).name is None      # not the dask key of the lazy result
        assert dgemm.matmul(a.rename("v"), b.rename("w")).name is None
        assert dgemm.matmul(a.rename("v"), b.rename("v")).name == xr.dot(a.rename("v"), b.rename("v")).name == "v"


# -- out=: dims and coordinates written where xarray reads them (issue 26) ----------------------------------------
def test_out_in_the_operands_dataset_reads_back_with_xr_open_zarr(client, tmp_path, rng):
    """The common workflow: operands from a Zarr dataset, the product written into the same group.

    Coordinates the group already holds (equal) are shared; the product's
    own are added beside it; the group's consolidated metadata (which
    xarray writes and reads first) is brought up to date.
    """
    a, A = labelled(rng, ("time", "space"), (40, 30))
    b, B = labelled(rng, ("space", "mode"), (30, 20))
    path = str(tmp_path / "ds.zarr")
    xr.Dataset({"a": a}).to_zarr(path, mode="w")
    ds = xr.open_zarr(path)
    got = dgemm.matmul(ds.a, b, out=f"{path}/c", client=client)
    back = xr.open_zarr(path, consolidated=True)     # xarray's default reads the consolidated metadata first
    assert set(back.data_vars) == {"a", "c"}
    c = back["c"]
    assert c.dims == got.dims == ("time", "mode") and c.name == got.name == "c"
    check_product(c.values, A, B, dtype="float64")
    for name in ("time", "mode", "time_label"):
        np.testing.assert_array_equal(c[name].values, got[name].values)
    assert "time_label" in c.coords and "space" not in c.coords
    assert dgemm.open_result(f"{path}/c").attrs["dgemm"]["complete"]      # still dgemm's finished output


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_out_in_a_fresh_group_opens_as_a_dataarray(client, tmp_path, rng, zarr_format):
    import zarr

    a, A = labelled(rng, ("i", "j"), (30, 20))
    b, B = labelled(rng, ("j", "l"), (20, 10))
    group = str(tmp_path / "g.zarr")
    g = zarr.open_group(group, mode="w", zarr_format=zarr_format)
    out = g.create_array("prod", shape=(30, 10), chunks=(30, 10), dtype="float64")   # an existing array as out
    dgemm.matmul(a.rename("p"), b.rename("p"), out=out, client=client)
    back = xr.open_dataarray(group, engine="zarr", consolidated=False)   # a group made without consolidated metadata
    assert back.name == "prod" and back.dims == ("i", "l")
    check_product(back.values, A, B, dtype="float64")
    np.testing.assert_array_equal(back["i_label"].values, a["i_label"].values)
    np.testing.assert_array_equal(back["l"].values, b["l"].values)


def test_a_top_level_out_records_its_dims(client, tmp_path, rng):
    """No group holds it, so no coordinates have a place xarray would read; the dims are in the array's metadata."""
    import zarr

    a, _ = labelled(rng, ("i", "j"), (12, 8))
    b, _ = labelled(rng, ("j", "l"), (8, 6))
    dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client)
    assert zarr.open_array(str(tmp_path / "c.zarr")).metadata.dimension_names == ("i", "l")
    assert not (tmp_path / "zarr.json").exists() and not (tmp_path / "i").exists()   # nothing written beside it


def test_a_coordinate_the_group_holds_otherwise_is_refused_before_any_work(no_client, tmp_path, rng):
    a, _ = labelled(rng, ("time", "space"), (10, 8))
    b, _ = labelled(rng, ("space", "mode"), (8, 6))
    path = str(tmp_path / "ds.zarr")
    xr.Dataset(coords={"time": np.arange(10) + 1000}).to_zarr(path, mode="w")   # the same name, other labels
    with pytest.raises(ValueError, match="'time'"):
        dgemm.matmul(a, b, out=f"{path}/c", client=no_client)
    assert "c" not in xr.open_zarr(path).variables and not (tmp_path / "ds.zarr" / "c").exists()


def test_out_in_a_group_on_s3_reads_back_with_the_storage_options(s3, client, rng):
    """The group around an s3:// out is found and written with the call's storage options (the server wants them)."""
    a, A = labelled(rng, ("time", "space"), (24, 16))
    b, B = labelled(rng, ("space", "mode"), (16, 8))
    group = s3.url("xarray/ds.zarr")
    xr.Dataset({"a": a}).to_zarr(group, mode="w", storage_options=s3.storage_options)
    got = dgemm.matmul(a, b, out=f"{group}/c", client=client, storage_options=s3.storage_options)
    back = xr.open_zarr(group, storage_options=s3.storage_options, consolidated=True)["c"]
    assert back.dims == got.dims == ("time", "mode") and got.name == "c"
    check_product(back.values, A, B, dtype="float64")
    np.testing.assert_array_equal(back["mode"].values, b["mode"].values)


def test_a_new_out_in_a_zarr_v2_group_is_named_as_xarray_would_not_find(client, tmp_path, rng):
    """dgemm creates a new out in Zarr v3, which a v2 group does not list: said, not silently unreadable."""
    import zarr

    a, _ = labelled(rng, ("i", "j"), (12, 8))
    b, _ = labelled(rng, ("j", "l"), (8, 6))
    path = str(tmp_path / "v2.zarr")
    xr.Dataset({"a": a}).to_zarr(path, mode="w", zarr_format=2)
    with pytest.warns(RuntimeWarning, match="v3 array in a Zarr v2 group"):
        dgemm.matmul(a, b, out=f"{path}/c", client=client)
    assert zarr.open_array(f"{path}/c").metadata.dimension_names == ("i", "l")
    assert "l" not in xr.open_zarr(path).variables          # nothing written where nobody would read it

"""xarray in, xarray out (dgemm.client.dataarrays): dims and coordinates kept, dask data never computed here."""
from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import dgemm
from _check import check_product, randn

xr = pytest.importorskip("xarray", reason="xarray is not installed (pip install xarray)")


def labelled(rng, dims, shape, dtype="float64", chunks=None):
    data = randn(rng, shape, dtype)
    coords = {d: np.arange(n) * 10 + i for i, (d, n) in enumerate(zip(dims, shape))}
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

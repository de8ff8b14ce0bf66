"""xarray in, xarray out: a :class:`xarray.DataArray` operand gives a DataArray result.

The product is positional, as :func:`numpy.matmul`: the result's dims are
``op(a)``'s first and ``op(b)``'s last, with the coordinates that lie along
them.  A DataArray's data goes in as it is (dask stays lazy, numpy stays in
memory): nothing is computed on the client to unwrap it.  xarray is
imported only when a DataArray is passed.
"""
from __future__ import annotations

import sys


def is_dataarray(x) -> bool:
    """Whether ``x`` is an :class:`xarray.DataArray` (without importing xarray when it is not loaded)."""
    xr = sys.modules.get("xarray")
    return xr is not None and isinstance(x, xr.DataArray)


def unwrap(x):
    """The array inside a DataArray (dask or numpy, as it is), anything else as given."""
    return x.data if is_dataarray(x) else x


def result_dims(a, b, *, trans_a: bool = False, trans_b: bool = False) -> tuple:
    """The dims of ``op(a) @ op(b)`` for DataArrays ``a`` and ``b`` (either may be something else: None).

    1-D operands lose their axis as in :func:`numpy.matmul`; an operand that
    is not a DataArray gives ``dim_<axis>`` names for its axis.
    """
    def kept(x, first: bool, trans: bool, fallback: str):
        if not is_dataarray(x):
            return fallback if getattr(x, "ndim", 2) == 2 else None
        if x.ndim == 1:
            return None
        rows, cols = x.dims
        if trans:
            rows, cols = cols, rows
        return rows if first else cols

    dims = [d for d in (kept(a, True, trans_a, "dim_0"), kept(b, False, trans_b, "dim_1")) if d is not None]
    if len(dims) == 2 and dims[0] == dims[1]:
        raise ValueError(f"the result would have the dimension {dims[0]!r} twice (the rows of a and the columns of "
                         f"b share the name), which xarray does not allow; rename one, e.g. "
                         f"b.rename({{{dims[1]!r}: {dims[1] + '_2'!r}}})")
    return tuple(dims)


def wrap(result, a, b, *, trans_a: bool = False, trans_b: bool = False, name: str | None = None):
    """``result`` (numpy, dask or a written zarr.Array) as a DataArray with the dims and coords of ``a`` and ``b``.

    A written zarr.Array is wrapped lazily (:func:`dask.array.from_zarr`),
    so the DataArray reads the stored product when it is used.
    """
    import xarray as xr

    from dgemm.storage import is_zarr_array

    if is_zarr_array(result):
        import dask.array as da
        result = da.from_zarr(result)
    dims = result_dims(a, b, trans_a=trans_a, trans_b=trans_b)
    coords = {}
    for x in (a, b):
        if not is_dataarray(x):
            continue
        for cname, coord in x.coords.items():
            # only coordinates that lie along the kept dims: those along the contracted one do not
            if coord.dims and set(coord.dims) <= set(dims) and cname not in coords:
                coords[cname] = coord.variable
    return xr.DataArray(result, dims=dims, coords=coords, name=name)

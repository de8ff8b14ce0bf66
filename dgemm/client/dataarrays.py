"""xarray in, xarray out: a :class:`xarray.DataArray` operand gives a DataArray result.

The product follows :func:`xarray.dot`'s rules where both operands are
DataArrays: the contracted dimension must have the same name in both
(``op(a)``'s last and ``op(b)``'s first; other names are refused, since
xr.dot would not contract them), and the operands are aligned on its labels
before the product (:func:`align`: an inner join, or ``"exact"`` when
``xarray.set_options(arithmetic_join="exact")`` asks for it, as xr.dot).
The result's dims are ``op(a)``'s first and ``op(b)``'s last, with the
coordinates that lie along them, and its name is xr.dot's: the operands'
common name, else None.  An operand that is not a DataArray is positional,
as in :func:`numpy.matmul`.  A DataArray's data goes in as it is (dask stays
lazy, numpy stays in memory): nothing is computed on the client to unwrap or
align it.  xarray is imported only when a DataArray is passed.
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


def _op_dims(x, trans: bool) -> tuple:
    """The dims of ``op(x)`` for a DataArray ``x`` (1-D: its one dim)."""
    return tuple(reversed(x.dims)) if trans and x.ndim == 2 else tuple(x.dims)


def contracted_dims(a, b, *, trans_a: bool = False, trans_b: bool = False) -> tuple[str, str] | None:
    """The names of the contracted dimension in ``op(a)`` and ``op(b)``; None unless both are DataArrays."""
    if not (is_dataarray(a) and is_dataarray(b)):
        return None
    return _op_dims(a, trans_a)[-1], _op_dims(b, trans_b)[0]


def check(a, b, *, trans_a: bool = False, trans_b: bool = False) -> None:
    """Refuse, before any work, DataArray operands that xarray would not multiply so.

    The contracted dimension must have one name: :func:`xarray.dot` contracts
    only the dims the operands share, so with two different names it would
    give an outer product over both, never the matrix product that
    :func:`dgemm.matmul` computes.  The result may not have one dim twice.
    """
    inner = contracted_dims(a, b, trans_a=trans_a, trans_b=trans_b)
    if inner is not None and inner[0] != inner[1]:
        sa, sb = ("a.T" if trans_a else "a"), ("b.T" if trans_b else "b")
        raise ValueError(f"the contracted dimensions have different names: {inner[0]!r} (the last of {sa}) and "
                         f"{inner[1]!r} (the first of {sb}); xarray contracts only a dimension the operands "
                         f"share (xr.dot would not contract these), so rename one, e.g. "
                         f"b.rename({{{inner[1]!r}: {inner[0]!r}}})")
    result_dims(a, b, trans_a=trans_a, trans_b=trans_b)


def align(a, b, *, trans_a: bool = False, trans_b: bool = False):
    """``a`` and ``b`` aligned on the labels of their contracted dimension, as :func:`xarray.dot` aligns them.

    The join is xr.dot's: ``"inner"`` (labels both have, in the first
    operand's order), or ``"exact"`` (labels must be equal, else a
    ValueError) when ``xarray.set_options(arithmetic_join="exact")`` is set.
    Only the contracted dimension is aligned (the others are not shared:
    :func:`check`).  Index labels are always in memory (pandas indexes), so
    aligning never computes data: an operand whose labels are already the
    joined ones is returned as it is (a Zarr-backed dask array is still read
    straight from its store); one that must be reordered or cut is reindexed
    lazily (dask indexing, computed with the product on the workers), or in
    memory for numpy data.  Where only one operand is dask, the other's
    order is followed when both have the same labels, so the dask one is
    left as it is.  Anything that is not two DataArrays is returned unchanged.
    """
    inner = contracted_dims(a, b, trans_a=trans_a, trans_b=trans_b)
    if inner is None:
        return a, b
    import xarray as xr

    dim = inner[0]
    join = "exact" if xr.get_options()["arithmetic_join"] == "exact" else "inner"   # as xr.dot
    others = (set(a.dims) | set(b.dims)) - {dim}
    # the inner join follows the first operand's order: put the one not to reindex first
    swap = _is_lazy(a) and not _is_lazy(b) and _same_labels(a, b, dim)
    try:
        x, y = xr.align(*((b, a) if swap else (a, b)), join=join, exclude=others)
    except ValueError as e:
        raise ValueError(f"cannot align a and b on their contracted dimension {dim!r} (join={join!r}, as "
                         f"xr.dot): {e}") from None
    return (y, x) if swap else (x, y)


def _is_lazy(x) -> bool:
    return type(x.data).__module__.startswith("dask")


def _same_labels(a, b, dim: str) -> bool:
    ia, ib = a.indexes.get(dim), b.indexes.get(dim)
    return ia is not None and ib is not None and len(ia) == len(ib) and ia.isin(ib).all()


def result_name(a, b):
    """The result's name as :func:`xarray.dot` gives it: the DataArray operands' common name, else None."""
    names = {x.name for x in (a, b) if is_dataarray(x)}
    return names.pop() if len(names) == 1 else None


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

    ``a`` and ``b`` are the aligned operands (:func:`align`); the name is
    ``name``, else :func:`result_name`'s.

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
    out = xr.DataArray(result, dims=dims, coords=coords)
    # set, not passed: given name=None, xarray takes the data's ``.name``, a dask array's graph key
    out.name = result_name(a, b) if name is None else name
    return out

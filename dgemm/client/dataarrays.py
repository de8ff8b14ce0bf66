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

With ``out=``, the product's dims are written into out's metadata as
xarray reads them, and when out lies in a Zarr group (``"ds.zarr/c"``) its
coordinates beside it, so that ``xr.open_zarr("ds.zarr")["c"]`` is the
product, dims and coordinates (:func:`prepare_out`, :func:`write_out_metadata`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


def is_zarr_array(x) -> bool:
    """Whether ``x`` is a zarr.Array (without importing zarr when it is not loaded)."""
    zarr = sys.modules.get("zarr")
    return zarr is not None and isinstance(x, zarr.Array)


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

    if is_zarr_array(result):
        import dask.array as da
        result = da.from_zarr(result)
    dims = result_dims(a, b, trans_a=trans_a, trans_b=trans_b)
    # only coordinates that lie along the kept dims: those along the contracted one do not
    coords = _coords(a, b, dims)
    out = xr.DataArray(result, dims=dims, coords=coords)
    # set, not passed: given name=None, xarray takes the data's ``.name``, a dask array's graph key
    out.name = result_name(a, b) if name is None else name
    return out


# -- out=: the dims and coordinates, written where xarray reads them ----------------------------------------------
# xarray reads a Zarr *group* (xr.open_zarr, xr.open_dataarray): each variable an array in it, with its dims in the
# array's metadata (Zarr v3 ``dimension_names``; v2: the ``_ARRAY_DIMENSIONS`` attribute), each coordinate an array
# beside it, non-index ones listed in the variable's ``coordinates`` attribute.  dgemm's out stays an array (its
# completion marker, resume and lease are the array's), so the group is the one that holds out, if any.

@dataclass
class Stored:
    """Where the product's xarray metadata goes: out's group (None: out lies in none) and out's name in it."""

    group_store: Any
    group_path: str
    name: str
    dims: tuple
    coords: dict            # name -> xarray.Variable: the result's coordinates
    missing: tuple          # those the group lacks, to write beside out
    zarr_format: int | None
    consolidated: bool      # the group has consolidated metadata (xarray reads that first)


def _coords(a, b, dims: tuple) -> dict:
    """The coordinates of ``a`` and ``b`` that lie along the result's ``dims`` (not the contracted one)."""
    coords = {}
    for x in (a, b):
        if not is_dataarray(x):
            continue
        for cname, coord in x.coords.items():
            if coord.dims and set(coord.dims) <= set(dims) and cname not in coords:
                coords[cname] = coord.variable
    return coords


def prepare_out(out, a, b, *, trans_a: bool = False, trans_b: bool = False, storage_options=None) -> Stored | None:
    """Check, before any work, where ``out``'s dims and coordinates will go; refuse a clash.

    When ``out`` lies in a Zarr group (``"ds.zarr/c"``, an array of a
    group), the coordinates go beside it, as :meth:`xarray.Dataset.to_zarr`
    lays them out, so that ``xr.open_zarr(group)[name]`` (or
    ``xr.open_dataarray(group, engine="zarr")`` when it is the group's only
    variable) is the product with its dims and coordinates.  A coordinate
    the group already holds is shared when equal (labels and dims), and
    refused here, with a ValueError naming it, when not: xarray could not
    read both.  An ``out`` in no group (a path in a plain folder) gets its
    dims only; None when ``out`` is None or nothing dgemm can locate.
    """
    if out is None:
        return None
    from dgemm.storage.groups import enclosing_group, open_group, out_store

    where = out_store(out, storage_options)
    dims = result_dims(a, b, trans_a=trans_a, trans_b=trans_b)
    around = enclosing_group(*where) if where is not None else None
    group = open_group(around[0], around[1]) if around is not None else None
    if group is None:
        return Stored(None, "", "", dims, {}, (), None, False)
    gstore, gpath, name = around
    coords = _coords(a, b, dims)
    if name in coords:
        raise ValueError(f"out is named {name!r} in its group, as a coordinate of the result; xarray could not read "
                         "both: give out another name")
    clashes = [c for c in coords if c in group]
    if clashes:
        _check_shared(group, gstore, gpath, name, {c: coords[c] for c in clashes})
    missing = tuple(c for c in coords if c not in clashes)
    return Stored(gstore, gpath, name, dims, coords, missing, group.metadata.zarr_format,
                  group.metadata.consolidated_metadata is not None)


def _check_shared(group, gstore, gpath: str, name: str, coords: dict) -> None:
    """Refuse coordinates the group already holds with other labels or dims (read as xarray reads them)."""
    import xarray as xr

    others = [k for k in group.array_keys() if k not in coords]
    try:
        ds = xr.open_zarr(gstore, group=gpath or None, consolidated=False, drop_variables=others + [name])
    except Exception as e:
        raise ValueError(f"out's group already holds {sorted(coords)}, which xarray cannot read to compare with the "
                         f"result's coordinates ({type(e).__name__}: {e}); write out in another group") from None
    for cname, var in coords.items():
        have = ds.variables.get(cname)
        if have is None or have.dims != var.dims or not have.equals(var.to_base_variable()):
            raise ValueError(f"out's group already holds a coordinate {cname!r} other than the result's (other labels "
                             f"or dims); xarray could not read the product beside it: write out in another group, or "
                             f"drop or rename the operands' {cname!r}")


def write_out_metadata(array, stored: Stored | None) -> str | None:
    """Write the dims into ``array`` (dgemm's finished out) and the coordinates beside it; the name xarray reads it by.

    The dims go into the array's metadata as xarray reads them (Zarr v3
    ``dimension_names``, v2 the ``_ARRAY_DIMENSIONS`` attribute); in a
    group, the coordinates it lacks are written beside it (by xarray), the
    non-index ones named in the array's ``coordinates`` attribute, and the
    group's consolidated metadata, if it has any, is made again (xarray
    reads that first, and would not see the new arrays).
    """
    import zarr

    if stored is None or not is_zarr_array(array):
        return None
    # opened again: the completion marker was written through another handle, and saving this one's
    # metadata as it was would drop it
    arr = zarr.open_array(store=array.store, path=array.path, mode="r+")
    in_group = stored.group_store is not None
    if in_group and arr.metadata.zarr_format != stored.zarr_format:
        # a group lists its members of its own format only: xarray would not find out there, nor need coordinates
        import warnings
        warnings.warn(f"dgemm: out ({stored.name!r}) is a Zarr v{arr.metadata.zarr_format} array in a Zarr "
                      f"v{stored.zarr_format} group, where xarray does not look for it; its dims are written, its "
                      f"coordinates are not.  To read it with xr.open_zarr, pass an array created in the group "
                      f"(group.create_array(...)) as out, or use a v{arr.metadata.zarr_format} group",
                      RuntimeWarning, stacklevel=3)
        in_group = False
    attrs = {}
    if arr.metadata.zarr_format == 2:
        attrs["_ARRAY_DIMENSIONS"] = list(stored.dims)
    non_index = sorted(c for c, v in stored.coords.items() if (c,) != v.dims)   # as xarray lists them
    if in_group and non_index:
        attrs["coordinates"] = " ".join(non_index)
    if attrs:
        arr.update_attributes(attrs)
    if arr.metadata.zarr_format == 3:   # last, from the metadata just saved
        from dgemm.storage.groups import save_dimension_names
        save_dimension_names(arr, stored.dims)
    if not in_group:
        return None
    if stored.missing:
        import xarray as xr

        coords = {}
        for cname in stored.missing:
            var = stored.coords[cname].to_base_variable().copy(deep=False)
            var.encoding = {}      # the source's chunks and codecs need not suit the new array
            coords[cname] = var
        xr.Dataset(coords=coords).to_zarr(stored.group_store, group=stored.group_path or None, mode="a",
                                          consolidated=False, zarr_format=stored.zarr_format)
    # known from before the run: writing the coordinates (consolidated=False) drops the group's consolidated metadata
    if stored.consolidated:
        zarr.consolidate_metadata(stored.group_store, path=stored.group_path, zarr_format=stored.zarr_format)
    return stored.name

"""How a new output is laid out, as :func:`zarr.create_array` takes it: chunks, shards, format, dims, attributes.

:func:`check_layout` checks what the user gave before any work (the
errors name the argument) and lets zarr itself resolve it, on a
metadata-only array in memory, so that the output records exactly what
``zarr.create_array`` would.  :func:`default_chunks` is the rule for C's
chunks when none are given.
"""
from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from dgemm.storage.markers import COMPLETE_ATTR


@dataclass(frozen=True)
class Layout:
    """The checked layout options of a new output; None where the user gave none.

    ``chunks`` and ``shards`` are as zarr resolved them, in the output's
    dimensions; ``zarr_format`` None means zarr's default (3).
    """

    chunks: tuple[int, ...] | None = None
    shards: tuple[int, ...] | None = None
    zarr_format: int | None = None
    dimension_names: tuple | None = None
    attributes: dict | None = None

    @property
    def unit(self) -> tuple[int, ...] | None:
        """What a store task must write whole: the shards where there are, else the chunks (None: not given)."""
        return self.shards or self.chunks

    def given(self) -> dict:
        """The options the user gave, by their argument names."""
        return {k: v for k, v in (("chunks", self.chunks), ("shards", self.shards),
                                  ("zarr_format", self.zarr_format), ("dimension_names", self.dimension_names),
                                  ("attributes", self.attributes)) if v is not None}

    def create_kwargs(self) -> dict:
        """Keyword arguments of :func:`zarr.create_array` (chunks aside: the caller's)."""
        out = {}
        if self.shards is not None:
            out["shards"] = self.shards
        if self.zarr_format is not None:
            out["zarr_format"] = self.zarr_format
        if self.dimension_names is not None:
            out["dimension_names"] = self.dimension_names
        return out


def _sizes(value, name: str, ndim: int) -> tuple[int, ...]:
    """A chunk or shard shape: an int (every dimension) or one positive int per dimension of the output."""
    def ok(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and v > 0

    if ok(value):
        return (int(value),) * ndim
    try:
        vals = tuple(value) if not isinstance(value, (str, bytes)) else None
    except TypeError:
        vals = None
    if vals is None or not all(ok(v) for v in vals):
        raise ValueError(f"{name}={value!r}: give a positive int or one positive int per dimension of the "
                         f"output ({ndim})")
    if len(vals) != ndim:
        raise ValueError(f"{name}={value!r} has {len(vals)} sizes, but the output has {ndim} dimension(s)")
    return tuple(int(v) for v in vals)


def check_layout(shape: tuple[int, ...], dtype, *, chunks=None, shards=None, zarr_format=None,
                 dimension_names=None, attributes=None) -> Layout | None:
    """Check a new output's layout options, before any work; None when none is given.

    Parameters are those of :func:`zarr.create_array`, for an output of
    ``shape`` and ``dtype``: ``chunks`` and ``shards`` an int (every
    dimension) or one positive int per dimension, ``shards`` multiples of
    ``chunks`` (given with them), ``zarr_format`` 2 or 3 (2 has no shards
    and no dimension names), ``dimension_names`` one str or None
    per dimension, ``attributes`` a JSON-serialisable mapping without
    dgemm's own key.

    Raises
    ------
    ValueError
        A value zarr would refuse, or one it would take but that cannot be
        right (a chunk of size 0), naming the argument.
    TypeError
        ``attributes`` that is no mapping, or holds what JSON cannot store.
    """
    if all(x is None for x in (chunks, shards, zarr_format, dimension_names, attributes)):
        return None
    ndim = len(shape)
    if zarr_format is not None and (isinstance(zarr_format, bool) or zarr_format not in (2, 3)):
        raise ValueError(f"zarr_format={zarr_format!r}: give 2 or 3 (None: zarr's default, 3)")
    zarr_format = None if zarr_format is None else int(zarr_format)
    if chunks is not None:
        chunks = _sizes(chunks, "chunks", ndim)
    if shards is not None:
        if zarr_format == 2:
            raise ValueError(f"shards={shards!r} needs zarr_format=3: Zarr v2 arrays have no shards")
        shards = _sizes(shards, "shards", ndim)
        if chunks is None:
            raise ValueError(f"shards={shards!r} needs chunks= too (the chunks inside each shard), as "
                             "zarr.create_array takes them")
        bad = [ax for ax, (s, c) in enumerate(zip(shards, chunks)) if s % c]
        if bad:
            raise ValueError(f"shards={shards} are not multiples of chunks={chunks} (dimension {bad[0]}): "
                             "each shard holds whole chunks")
    if dimension_names is not None:
        if isinstance(dimension_names, (str, bytes)) or not _is_sequence(dimension_names):
            raise ValueError(f"dimension_names={dimension_names!r}: give one name (str or None) per dimension")
        dimension_names = tuple(dimension_names)
        if len(dimension_names) != ndim or not all(d is None or isinstance(d, str) for d in dimension_names):
            raise ValueError(f"dimension_names={dimension_names!r}: give one name (str or None) for each of the "
                             f"output's {ndim} dimension(s)")
        if zarr_format == 2:
            raise ValueError(f"dimension_names={dimension_names!r} needs zarr_format=3: Zarr v2 arrays have no "
                             "dimension names (xarray keeps them in the _ARRAY_DIMENSIONS attribute)")
    if attributes is not None:
        if not isinstance(attributes, Mapping) or not all(isinstance(k, str) for k in attributes):
            raise TypeError(f"attributes must be a mapping with str keys (a dict), not {attributes!r}")
        if COMPLETE_ATTR in attributes:
            raise ValueError(f"attributes: the key {COMPLETE_ATTR!r} is dgemm's own record of the run; "
                             "use another name")
        try:
            attributes = json.loads(json.dumps(dict(attributes), allow_nan=True))
        except (TypeError, ValueError) as e:
            raise TypeError(f"attributes cannot be stored as Zarr attributes (JSON): {e}") from None
    return _resolved(shape, dtype, Layout(chunks, shards, zarr_format, dimension_names, attributes))


def _is_sequence(x) -> bool:
    try:
        iter(x)
    except TypeError:
        return False
    return not isinstance(x, Mapping)


def _resolved(shape, dtype, layout: Layout) -> Layout:
    """The layout as zarr resolves it: an array's metadata made in memory (no chunk written)."""
    import zarr
    from zarr.storage import MemoryStore

    # chunks are dgemm's when not given: any shape does for the metadata here
    chunks = layout.chunks or tuple(max(s, 1) for s in shape)
    try:   # compressors aside: dgemm.storage.outputs.output_codecs checks them, for this zarr_format
        probe = zarr.create_array(store=MemoryStore(), shape=shape, chunks=chunks, dtype=dtype, fill_value=0,
                                  attributes=layout.attributes, **layout.create_kwargs())
    except Exception as e:
        given = ", ".join(f"{k}={v!r}" for k, v in layout.given().items())
        raise ValueError(f"zarr refuses the output's options ({given}): {type(e).__name__}: {e}") from None
    shards = getattr(probe, "shards", None)
    return Layout(tuple(probe.chunks) if layout.chunks is not None else None,
                  tuple(shards) if layout.shards is not None and shards else None,
                  layout.zarr_format, layout.dimension_names, layout.attributes)


def differences(array, layout: Layout) -> list[str]:
    """The options of ``layout`` that an existing ``array`` does not have (each as ``"name=... (out has ...)"``)."""
    have = {"chunks": tuple(array.chunks), "shards": tuple(getattr(array, "shards", None) or ()) or None,
            "zarr_format": array.metadata.zarr_format,
            "dimension_names": getattr(array.metadata, "dimension_names", None),
            "attributes": {k: v for k, v in array.attrs.asdict().items() if k != COMPLETE_ATTR}}
    out = []
    for name, value in layout.given().items():
        old = have[name]
        if name == "attributes":
            same = all(k in old and _plain(old[k]) == _plain(v) for k, v in value.items())
        else:
            same = _plain(old) == _plain(value)
        if not same:
            out.append(f"{name}={value!r} (out has {old!r})")
    return out


def _plain(x):
    return json.loads(json.dumps(x, default=list))


def default_chunks(shape: tuple[int, ...], block: tuple[int, int], inputs: tuple, drop: tuple = ()) -> tuple:
    """C's chunks when none are given: the inputs' (rows of A's chunks, columns of B's), as dask's matmul.

    ``block`` is the plan's C block (rows, columns) and ``inputs`` the
    chunk sizes of op(A) along M and of op(B) along N (None where an input
    has none: numpy).  Along each axis C takes the input's chunk when every
    block holds whole ones (the block is a multiple of it, or the whole
    axis), else the block itself: a store task writes whole chunks.

    >>> default_chunks((6144, 6144), (1024, 1024), (512, 512))
    (512, 512)
    >>> default_chunks((6144, 6144), (1024, 1024), (8192, None))   # chunks larger than a block; numpy B
    (1024, 1024)
    >>> default_chunks((1000, 300), (1000, 300), (300, 128))       # one block along each axis
    (300, 128)
    """
    full = [0, 0]
    it = iter(shape)
    extents = [1 if ax in drop else next(it) for ax in range(2)]
    for ax in range(2):
        b, c = block[ax], inputs[ax]
        full[ax] = c if c and (b % c == 0 or b >= extents[ax]) else b
    return tuple(max(1, min(s, e) if e else s) for ax, (s, e) in enumerate(zip(full, extents)) if ax not in drop)

"""The element types and arithmetic paths dgemm supports: one list, one check each.

>>> DTYPES
('float32', 'float64')
>>> check_dtype("f4", "a")
dtype('float32')
"""
from __future__ import annotations

import numpy as np

DTYPES = ("float32", "float64")
SUPPORTED = tuple(np.dtype(d) for d in DTYPES)
# precision= values per result dtype: the FMA kernel and the tensor-core paths (see dgemm.opencl.params)
PRECISIONS = {"float32": ("fma", "3xtf32", "tf32"), "float64": ("fma", "dmma")}
ALL_PRECISIONS = tuple(dict.fromkeys(p for ps in PRECISIONS.values() for p in ps))


def check_dtype(dtype, what: str) -> np.dtype:
    """Accept float32 and float64 in either byte order; say clearly why anything else is refused.

    Returns the dtype in this machine's byte order: what the devices compute
    in and the result holds.  A big-endian operand (``>f4``, ``>f8``: Zarr v2
    arrays, a big-endian ``bytes`` codec, FITS or network data) is converted
    on the host as each block is read, before it is uploaded.

    >>> check_dtype(">f8", "a"), check_dtype("<f4", "b")
    (dtype('float64'), dtype('float32'))
    >>> check_dtype("i8", "a")
    Traceback (most recent call last):
    ...
    TypeError: a has dtype int64; dgemm multiplies float32 and float64 only (cast it first, e.g. a.astype('float64'))
    """
    dt = np.dtype(dtype)
    native = dt.newbyteorder("=") if dt.byteorder in "<>" else dt
    if native not in SUPPORTED:
        raise TypeError(f"{what} has dtype {dt}; dgemm multiplies float32 and float64 only "
                        f"(cast it first, e.g. {what}.astype('float64'))")
    return native


def check_precision(dtype: str, precision: str | None) -> str | None:
    """Validate a ``precision=`` option for a result dtype.

    >>> check_precision("float32", "3xtf32")
    '3xtf32'
    >>> check_precision("float64", "tf32")
    Traceback (most recent call last):
    ...
    ValueError: precision='tf32' is not available for float64; choose one of None, 'fma', 'dmma'
    """
    if precision is None:
        return None
    allowed = PRECISIONS[dtype]
    if precision not in allowed:
        raise ValueError(f"precision={precision!r} is not available for {dtype}; choose one of None, "
                         + ", ".join(repr(p) for p in allowed))
    return precision

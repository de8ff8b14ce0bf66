"""Size rules every layer shares: the kernels' 32-bit indexing and rounding up to tiles."""
from __future__ import annotations

INT32_MAX = 2**31 - 1   # the kernels index buffers with 32-bit integers


def roundup(x: int, m: int) -> int:
    """Smallest multiple of ``m`` that is >= ``x``.

    >>> roundup(100, 32), roundup(96, 32), roundup(0, 32)
    (128, 96, 0)
    """
    return -(-x // m) * m

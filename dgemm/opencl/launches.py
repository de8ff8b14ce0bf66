"""A k step's GEMM cut into a few launches, each over some of C's tiles (the ``gemm-launches`` setting).

On NVIDIA's driver a kernel of another queue (a device decoder's) that
becomes ready while a GEMM launch fills the device gets its multiprocessors
as that launch's last work-groups drain: the decoders' kernels, which run
one after another, each ended with the 5.6 ms GEMM launch beside which it
started (two H200s, 49152² zstd under ``device-codecs: on``; bench/NOTES.md,
issue 28, thirtieth session).  A launch over a part of C's tiles ends
sooner.  The kernels read where their part starts from the launch's global
offset (``kernels/common.cl``'s ``TILE_ORIGIN``, ``gemm_wgmma.cl``), so
the parts run the one kernel unchanged.
"""
from __future__ import annotations

from dgemm import config


def default() -> int:
    """Launches a k step's GEMM is cut into: the ``gemm-launches`` setting, read when a product starts."""
    return config.get("gemm-launches") or 1


def cuts(params, mp: int, np_: int, parts: int = 1) -> list:
    """``(global size, local size, global offset)`` of each launch that covers a padded ``mp x np_`` C.

    ``parts`` launches, or as many as C's tiles allow: the wgmma kernel's
    tiles in runs of the order it walks them, the other kernels' tile rows
    in runs of whole bands of ``GROUPM`` rows (the order they walk within a
    band).  One part: the whole launch, without an offset.

    >>> from dgemm.opencl.params import KernelParams
    >>> cuts(KernelParams(), 192, 64, 2)    # 3 tile rows of 64, local size (16, 16)
    [((16, 16), (16, 16), (0, 0)), ((16, 32), (16, 16), (0, 16))]
    >>> [c[2] for c in cuts(KernelParams(GROUPM=2), 320, 64, 4)]    # 5 rows: bands of 2, 2 and 1
    [(0, 0), (0, 32), (0, 64)]
    >>> cuts(KernelParams(), 192, 64, 1)
    [((16, 48), (16, 16), None)]
    """
    (gx, gy), (lx, ly) = params.launch(mp, np_)
    if params.k_major:      # (one row of work-groups, a tile each)
        units, unit, total = gx // lx, 1, gx // lx
    else:
        unit = max(params.GROUPM, 1)
        total = gy // ly
        units = -(-total // unit)
    parts = min(parts, units)
    if parts <= 1:
        return [((gx, gy), (lx, ly), None)]
    out = []
    for i in range(parts):
        first, last = i * units // parts * unit, min((i + 1) * units // parts * unit, total)
        if params.k_major:
            out.append((((last - first) * lx, 1), (lx, 1), (first * lx, 0)))
        else:
            out.append(((gx, (last - first) * ly), (lx, ly), (0, first * ly)))
    return out

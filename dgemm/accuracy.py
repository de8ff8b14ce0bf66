"""Is a product right?  One error measure and one tolerance rule, for every check dgemm makes.

The tuner, ``dgemm bench kernel``, ``dgemm bench e2e``, ``dgemm demo`` and the
cuBLAS peer all check a computed ``C = A @ B`` against float64 products of
the same inputs, on sampled rows and columns, and they all use:

**The measure** (:func:`entry_errors`): for each checked entry,

    ``|c_ij - ref_ij| / (|A| |B|)_ij``

with ``ref = A @ B`` and ``|A| |B|`` the product of the absolute values,
both in float64.  It is the relative error of the classical bound for a dot
product of length k, ``|c - ref| <= gamma_k |A| |B|``: unlike ``|ref_ij|``,
the denominator cannot be near zero by cancellation, and unlike a norm over
the whole sample, a single wrong entry shows.  A check reports the worst
entry; a non-finite entry makes it ``inf``.

**The tolerance** (:func:`tolerance`), per precision path:

* ``fma``, ``dmma``, ``3xtf32``: ``16 sqrt(k) eps`` (``eps`` of the dtype).
  Rounding errors of a blocked or pairwise sum of k terms grow like
  ``sqrt(k) eps`` on average; 16 leaves room for unlucky rounding.
  3xTF32 keeps float32 accuracy (its dropped low-by-low products are below
  ``2^-22`` of each term).
* ``tf32``: the same plus ``2^-10``: every input is rounded to TF32's 10
  mantissa bits (``2^-11`` each), so every product may be off by ``2^-10``
  of itself.

A lost k-tile (t terms of k) gives entry errors near ``sqrt(t) / k``
(``|A||B|`` grows like k, the missing part like ``sqrt(t)``), and the
worst of a few thousand sampled entries several times that: with random
normal data, k = 4096 and t = 8, about 7e-3, which is 50 times float32's
tolerance (1.2e-4) and 6 times TF32's (1.1e-3).  A correct float32 product
stays near 4e-8 there.

>>> rng = np.random.default_rng(0)
>>> a, b = rng.standard_normal((64, 256)), rng.standard_normal((256, 48))
>>> rows, cols = np.arange(64), np.arange(48)
>>> sampled_error(a, b, a @ b, rows, cols) <= tolerance("float64", 256)
True
>>> lost = a[:, 8:] @ b[8:]                                # one k-tile of 8 missing
>>> sampled_error(a, b, lost, rows, cols) > tolerance("float32", 256, "tf32")
True
"""
from __future__ import annotations

import math

import numpy as np

SAFETY = 16                # the room over sqrt(k) eps (see the module's text)
TF32_INPUT_ERROR = 2.0 ** -10   # two inputs, each rounded to 10 mantissa bits (2^-11)


def tolerance(dtype, k: int, precision: str | None = "fma") -> float:
    """The largest :func:`entry_errors` value a correct product of depth ``k`` shows.

    ``precision`` is the kernel path (:data:`dgemm.dtypes.PRECISIONS`); None
    is read as ``"fma"`` (float64's exact DMMA has the same rule).

    >>> tolerance("float32", 4096) == 16 * 64 * float(np.finfo(np.float32).eps)
    True
    >>> tolerance("float32", 4096, "tf32") > 2 ** -10
    True
    """
    tol = SAFETY * math.sqrt(max(int(k), 1)) * float(np.finfo(np.dtype(dtype)).eps)
    return tol + TF32_INPUT_ERROR if precision == "tf32" else tol


def entry_errors(got, ref, scale):
    """``|got - ref| / scale`` entry by entry (``scale``: ``|A| |B|``; see the module's text).

    Works on numpy, cupy and torch arrays alike (the cuBLAS peer checks on the
    GPU).  A zero ``scale`` means an exact zero reference: any other value
    there is an infinite error.
    """
    tiny = float(np.finfo(np.float64).tiny)
    return abs(got - ref) / (scale + tiny)


def worst(errors) -> float:
    """The largest of ``errors``; ``inf`` when one is NaN (a non-finite result) or there are none to blame.

    >>> worst(np.array([1e-9, np.nan])), worst(np.array([])), worst(np.array([0.5, 0.25]))
    (inf, 0.0, 0.5)
    """
    size = errors.numel() if hasattr(errors, "numel") else errors.size   # torch's size is a method
    if size == 0:
        return 0.0
    w = float(errors.max())
    return w if w == w else float("inf")


def tf32(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to TF32 (10 mantissa bits, to nearest, ties away from zero: PTX's ``cvt.rna.tf32``), as
    the engine stages the ``tf32`` and ``3xtf32`` paths' operands.  A float32 array."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def sampled_error(a: np.ndarray, b: np.ndarray, c: np.ndarray, rows, cols) -> float:
    """Worst entry error over whole rows ``rows`` and whole columns ``cols`` of an in-memory ``c``.

    What the tuner and the kernel benchmark check: every timed run's C,
    with the rows and columns chosen at random.
    """
    a64, b64 = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    out = 0.0
    for ar, bc, got in ((a64[rows], b64, c[rows]), (a64, b64[:, cols], c[:, cols])):
        got = got.astype(np.float64)
        out = max(out, worst(entry_errors(got, ar @ bc, np.abs(ar) @ np.abs(bc))))
    return out


def sample_indices(n: int, count: int, rng) -> np.ndarray:
    """``count`` distinct sorted indices of ``range(n)``, always including the first and last.

    The ends are where padding and edge blocks go wrong, so they are always checked.

    >>> sample_indices(100, 8, np.random.default_rng(0))[[0, -1]].tolist()
    [0, 99]
    >>> sample_indices(3, 8, np.random.default_rng(0)).tolist()
    [0, 1, 2]
    """
    if n <= count:
        return np.arange(n)
    inner = rng.choice(np.arange(1, n - 1), size=count - 2, replace=False)
    return np.sort(np.concatenate([[0, n - 1], inner]))


def check_sample(a, b, c, n_rows: int = 8, n_cols: int = 8, seed: int = 0, precision: str | None = None) -> dict:
    """Check the entries of ``c = a @ b`` where sampled rows and columns cross.

    Only the sampled rows of ``a``, columns of ``b`` and entries of ``c``
    are read: what a check of Zarr arrays too large for memory can afford
    (``dgemm demo``, ``dgemm bench e2e``).

    Parameters
    ----------
    a, b, c : zarr.Array or numpy.ndarray
        2-D operands and result.
    n_rows, n_cols : int
        Rows and columns sampled (all when there are fewer; the first and
        last always); ``n_rows x n_cols`` entries are checked.
    seed : int
        Seed for choosing the sample.
    precision : str, optional
        The kernel path that computed ``c``, for :func:`tolerance`.

    Returns
    -------
    dict
        ``entries`` (number checked), ``max_rel_err`` (:func:`worst` of
        :func:`entry_errors`), ``tolerance`` and ``passed``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> a, b = rng.standard_normal((20, 30)), rng.standard_normal((30, 10))
    >>> r = check_sample(a, b, a @ b)
    >>> r["entries"], r["passed"]
    (64, True)
    >>> check_sample(a, b, a @ b + 1)["passed"]
    False
    """
    rng = np.random.default_rng(seed)
    m, k = a.shape
    n = b.shape[1]
    rows, cols = sample_indices(m, n_rows, rng), sample_indices(n, n_cols, rng)
    a_rows = np.asarray(_take(a, (rows, slice(None))), dtype=np.float64)
    b_cols = np.asarray(_take(b, (slice(None), cols)), dtype=np.float64)
    got = np.asarray(_take(c, (rows, cols)), dtype=np.float64)
    err = worst(entry_errors(got, a_rows @ b_cols, np.abs(a_rows) @ np.abs(b_cols)))
    tol = tolerance(np.result_type(a.dtype, b.dtype, c.dtype), k, precision)
    return {"entries": int(got.size), "max_rel_err": err, "tolerance": tol, "passed": bool(err <= tol)}


def _take(x, sel):
    if hasattr(x, "get_orthogonal_selection"):  # zarr: read only these rows / columns
        return x.get_orthogonal_selection(sel)
    return np.asarray(x)[np.ix_(*(np.arange(n)[s] if isinstance(s, slice) else s
                                   for s, n in zip(sel, x.shape)))]

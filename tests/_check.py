"""Numerical checks shared by the tests: results against numpy in float64."""
from __future__ import annotations

import time

import numpy as np

# Relative (Frobenius) error allowed for products with K <= a few thousand.
REL_TOL = {np.dtype("float32"): 1e-4, np.dtype("float64"): 1e-12}


def randn(rng, shape, dtype="float64"):
    """Fresh standard-normal data (never zeros), in ``dtype``."""
    return rng.standard_normal(shape).astype(dtype)


def reference(a, b, *, alpha=1.0, beta=0.0, c=None, trans_a=False, trans_b=False):
    """``alpha * op(a) @ op(b) + beta * c`` in float64, and the matching ``|.|`` bound term."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a = a.T if trans_a else a
    b = b.T if trans_b else b
    with np.errstate(invalid="ignore"):      # Inf - Inf in inputs that test NaN propagation
        ref = alpha * np.matmul(a, b)
        absref = abs(alpha) * np.matmul(np.abs(a), np.abs(b))
    if c is not None and beta != 0:
        c = np.asarray(c, dtype=np.float64)
        ref = ref + beta * c
        absref = absref + abs(beta) * np.abs(c)
    return ref, absref


def assert_close(got, ref, absref, dtype, k, what="result"):
    """``got`` matches ``ref``: in norm (REL_TOL) and element by element.

    The element-wise bound is the classical one for a dot product of length
    ``k`` in ``dtype``: ``|got - ref| <= (k + 2) * eps * (|alpha| |A| |B| + |beta| |C|)``;
    it catches a single wrong or missing element that a norm would hide.
    """
    dtype = np.dtype(dtype)
    got = np.asarray(got)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
    bad = ~np.isfinite(got)
    assert not bad.any(), f"{what}: {bad.sum()} non-finite elements, first at {tuple(np.argwhere(bad)[0])}"
    diff = np.abs(got.astype(np.float64) - ref)
    rel = np.linalg.norm(diff) / max(np.linalg.norm(ref), np.finfo(np.float64).tiny)
    assert rel < REL_TOL[dtype], f"{what}: relative error {rel:.3g} >= {REL_TOL[dtype]:g} ({dtype}, K={k})"
    bound = (k + 2) * np.finfo(dtype).eps * absref
    over = diff > bound
    if over.any():
        i = tuple(np.argwhere(over)[0])
        raise AssertionError(f"{what}: {over.sum()} elements exceed the error bound; first at {i}: "
                             f"got {got[i]!r}, expected {ref[i]!r} (bound {bound[i]:.3g})")


def check_product(got, a, b, *, dtype, alpha=1.0, beta=0.0, c=None, trans_a=False, trans_b=False,
                  what="result"):
    """Compare ``got`` with the float64 numpy product of the same inputs."""
    ref, absref = reference(a, b, alpha=alpha, beta=beta, c=c, trans_a=trans_a, trans_b=trans_b)
    ka = np.shape(a)[0 if trans_a else -1] if np.ndim(a) else 0
    assert_close(got, ref, absref, dtype, ka, what)


def assert_nonfinite_like(got, ref, what="result"):
    """NaN and +/-Inf exactly where numpy has them; finite elements close."""
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"{what}: NaN positions differ")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref), err_msg=f"{what}: +Inf positions differ")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref), err_msg=f"{what}: -Inf positions differ")
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-4, atol=1e-3, err_msg=f"{what}: finite part")


def wait_for(cond, timeout: float = 30, what: str = "condition", every: float = 0.1):
    """Poll ``cond()`` until it is true and return its value; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)

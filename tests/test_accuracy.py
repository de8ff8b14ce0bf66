"""dgemm.accuracy: the result check passes correct products and refuses subtly wrong ones.

The wrong products here are wrong the way a kernel or a block plan goes
wrong: one k-tile left out, the result shifted by one row or column, one
element a few times the tolerance off, TF32 inputs where FMA accuracy was
asked for.  Each is made to be between 100 and a few thousand times the
tolerance (the tests measure that, with the rule written out here), so a
check even 10,000 times too loose would pass them and fail these tests; a
gross error (a NaN, half of k missing) would not tell.
"""
from __future__ import annotations

import numpy as np
import pytest
import zarr

from _check import randn
from dgemm.accuracy import (check_sample, entry_errors, sample_indices, sampled_error, tf32, tolerance,
                            worst)

M, N, K = 24, 20, 512
DTYPES = ["float32", "float64"]


def rule(dtype, k: int) -> float:
    """The documented tolerance, written out independently of the module: 16 sqrt(k) eps."""
    return 16 * np.sqrt(k) * float(np.finfo(np.dtype(dtype)).eps)


def exact(a, b) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def measured(a, b, c) -> float:
    """The worst entry error over all of ``c``: ``|c - A B| / (|A| |B|)``, in float64."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.max(np.abs(c.astype(np.float64) - a64 @ b64) / (np.abs(a64) @ np.abs(b64))))


# -- the checks, as dgemm's callers use them ------------------------------------------
def by_check_sample(a, b, c, precision=None) -> bool:
    """``dgemm demo``, ``dgemm bench e2e``: sampled rows x sampled columns."""
    return check_sample(a, b, c, precision=precision)["passed"]


def by_sampled_error(a, b, c, precision=None) -> bool:
    """The tuner and ``dgemm bench kernel``: whole sampled rows and columns."""
    rng = np.random.default_rng(1)
    rows, cols = sample_indices(a.shape[0], 6, rng), sample_indices(b.shape[1], 6, rng)
    return sampled_error(a, b, c, rows, cols) <= tolerance(c.dtype, a.shape[1], precision)


def by_entry_errors(a, b, c, precision=None) -> bool:
    """The cuBLAS peer: every entry."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    err = worst(entry_errors(c.astype(np.float64), a64 @ b64, np.abs(a64) @ np.abs(b64)))
    return err <= tolerance(c.dtype, a.shape[1], precision)


CHECKS = {"check_sample": by_check_sample, "sampled_error": by_sampled_error, "entry_errors": by_entry_errors}


# -- subtly wrong products --------------------------------------------------------------
def k_tile_missing(rng, dtype):
    """One 16-wide slice of k (a kernel's k-tile) left out of every entry.

    float64's tolerance is 2^29 times float32's: a lost tile is subtle there
    only when its terms are small against the rest (wide-range data), so
    its slice of A is scaled down by 1e-9 in float64.
    """
    a, b = randn(rng, (M, K), dtype), randn(rng, (K, N), dtype)
    a[:, 128:144] *= 1.0 if dtype == "float32" else 1e-9
    keep = np.r_[0:128, 144:K]
    return a, b, exact(a[:, keep], b[keep]).astype(dtype)


def smooth(rng, count: int, dtype) -> np.ndarray:
    """``count`` vectors of length K that change slowly from one to the next (neighbours close)."""
    base, step = rng.standard_normal(K), rng.standard_normal(K)
    return base + (1e6 * float(np.finfo(np.dtype(dtype)).eps) * np.arange(count))[:, None] * step


def row_shift(rng, dtype):
    """Every row of C holds the next row's product (the last repeated): an off-by-one over smooth data."""
    a, b = smooth(rng, M, dtype).astype(dtype), randn(rng, (K, N), dtype)
    c = exact(a, b)
    return a, b, np.vstack([c[1:], c[-1:]]).astype(dtype)


def column_shift(rng, dtype):
    """Every column of C holds the next column's product: the same along N."""
    a, b = randn(rng, (M, K), dtype), smooth(rng, N, dtype).T.astype(dtype)
    c = exact(a, b)
    return a, b, np.hstack([c[:, 1:], c[:, -1:]]).astype(dtype)


def one_element_off(rng, dtype, times=3.0):
    """C exact but for its last element (always sampled), ``times`` the tolerance off."""
    a, b = randn(rng, (M, K), dtype), randn(rng, (K, N), dtype)
    c = exact(a, b)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    c[-1, -1] += times * rule(dtype, K) * scale[-1, -1]
    return a, b, c.astype(dtype)


DEFECTS = {"k-tile-missing": k_tile_missing, "row-shift": row_shift, "column-shift": column_shift,
           "one-element-3x-off": one_element_off}


# -- the tests -----------------------------------------------------------------------------
@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 7, K, 4096])
def test_correct_products_pass(rng, check, dtype, k):
    """numpy's own product in ``dtype`` (float32 sums in float32) and the exact product rounded once."""
    a, b = randn(rng, (M, k), dtype), randn(rng, (k, N), dtype)
    assert CHECKS[check](a, b, a @ b)
    assert CHECKS[check](a, b, exact(a, b).astype(dtype))


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("defect", list(DEFECTS))
def test_subtly_wrong_products_are_refused(rng, check, dtype, defect):
    a, b, c = DEFECTS[defect](rng, dtype)
    assert c.dtype == np.dtype(dtype)
    assert 2 < measured(a, b, c) / rule(dtype, K) < 1e4, "the defect is not the subtle kind this test is about"
    assert not CHECKS[check](a, b, c), f"{check} passed a {dtype} product with {defect}"


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_an_element_within_the_tolerance_passes(rng, check, dtype):
    """Half the tolerance off is a correct product's worst case: a check tighter than the rule refuses it."""
    a, b, c = one_element_off(rng, dtype, times=0.5)
    assert CHECKS[check](a, b, c)


@pytest.mark.parametrize("check", list(CHECKS))
def test_tf32_products_need_the_tf32_tolerance(rng, check):
    """TF32-rounded inputs (k = 32): refused as an FMA product (over 10 times its tolerance), accepted as TF32."""
    k = 32
    a, b = randn(rng, (M, k), "float32"), randn(rng, (k, N), "float32")
    c = exact(tf32(a), tf32(b)).astype(np.float32)
    assert 2 < measured(a, b, c) / rule("float32", k) < 1e4
    assert not CHECKS[check](a, b, c)
    assert not CHECKS[check](a, b, c, precision="fma")
    assert CHECKS[check](a, b, c, precision="tf32")
    assert CHECKS[check](a, b, exact(a, b).astype(np.float32), precision="tf32")


@pytest.mark.parametrize("check", list(CHECKS))
def test_a_non_finite_element_is_refused(rng, check):
    a, b = randn(rng, (M, K), "float32"), randn(rng, (K, N), "float32")
    c = exact(a, b).astype(np.float32)
    c[0, 0] = np.nan
    assert not CHECKS[check](a, b, c)


@pytest.mark.parametrize("dtype", DTYPES)
def test_check_sample_reads_zarr_arrays(tmp_path, rng, dtype):
    """On Zarr operands (what the demo and bench e2e check): a corner 3x the tolerance off is refused."""
    a, b, wrong = one_element_off(rng, dtype)
    stored = {}
    for name, x in {"a": a, "b": b, "c": exact(a, b).astype(dtype), "wrong": wrong}.items():
        stored[name] = zarr.create_array(store=str(tmp_path / f"{name}.zarr"), shape=x.shape, chunks=(7, 9),
                                         dtype=dtype)
        stored[name][...] = x
    good = check_sample(stored["a"], stored["b"], stored["c"])
    bad = check_sample(stored["a"], stored["b"], stored["wrong"])
    assert good["passed"] and good["entries"] == 64 and good["max_rel_err"] <= good["tolerance"]
    assert not bad["passed"] and 2 < bad["max_rel_err"] / bad["tolerance"] < 4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 100, 4096])
def test_the_tolerance_is_the_documented_rule(dtype, k):
    assert tolerance(dtype, k) == pytest.approx(rule(dtype, k), rel=1e-12)
    assert tolerance(dtype, k, None) == tolerance(dtype, k, "fma") == tolerance(dtype, k, "dmma")
    assert tolerance(dtype, k, "tf32") == pytest.approx(rule(dtype, k) + 2.0 ** -10, rel=1e-12)

"""The precision= option: validated before any work; tensor-core requests fall back to FMA where absent."""
from __future__ import annotations

import numpy as np
import pytest

import dgemm
from _check import check_product, randn
from dgemm.worker import DeviceState


class _Untouchable:
    """A client that fails the test if validation lets any work start."""

    def __getattr__(self, name):
        raise AssertionError(f"the client was used ({name}) before the options were checked")


@pytest.mark.parametrize("dtype, precision", [("float32", "dmma"), ("float64", "tf32"), ("float64", "3xtf32"),
                                              ("float32", "TF32"), ("float32", "fast")])
def test_bad_precision_is_refused_before_work(dtype, precision, tmp_path, rng):
    a, b = randn(rng, (8, 5), dtype), randn(rng, (5, 3), dtype)
    with pytest.raises(ValueError, match=f"precision={precision!r} is not available for {dtype}"):
        dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=_Untouchable(), precision=precision)
    assert not (tmp_path / "c.zarr").exists()


@pytest.mark.parametrize("dtype, precision", [("float32", None), ("float32", "fma"), ("float32", "3xtf32"),
                                              ("float32", "tf32"), ("float64", None), ("float64", "dmma"),
                                              ("float64", "fma")])
def test_every_precision_runs_and_is_right(client, rng, dtype, precision):
    """On devices without tensor cores (PoCL) every precision runs the FMA kernel: float accuracy."""
    a, b = randn(rng, (130, 70), dtype), randn(rng, (70, 90), dtype)
    out = dgemm.matmul(a, b, client=client, block=64, precision=precision)       # numpy in, numpy out
    descs = client.run(lambda dask_worker: DeviceState.describe(dask_worker.plugins["dgemm"].state))
    has_tc = any(d["device"].dmma for d in descs.values())
    if precision == "tf32" and has_tc:
        assert np.linalg.norm(out - a.astype(np.float64) @ b) / np.linalg.norm(a.astype(np.float64) @ b) < 1e-2
    else:
        check_product(out, a, b, dtype=dtype)


def test_workers_describe_every_precision(client):
    for d in client.run(lambda dask_worker: DeviceState.describe(dask_worker.plugins["dgemm"].state)).values():
        keys = set(d["params"])
        assert {"float32", "float32:fma", "float32:3xtf32", "float32:tf32"} <= keys
        if not d["device"].dmma:
            assert d["params"]["float32:3xtf32"]["params"]["MMA"] == 0
            assert "compute capability" in d["params"]["float32:3xtf32"]["note"]

"""numpy in, numpy out (dgemm.client.inmemory, dgemm.client.steps._in_memory): at once, without the data in the graph."""
from __future__ import annotations

import warnings

import dask
import numpy as np
import pytest

import dgemm
import dgemm.client.steps
from _check import check_product, randn
from dgemm.client.inmemory import host_product


def no_cluster(*args, **kwargs):
    raise AssertionError("a small in-memory product reached for a cluster")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_small_products_are_numpy_here_without_a_cluster(monkeypatch, rng, dtype):
    monkeypatch.setattr(dgemm.client.steps, "get_client", no_cluster)
    A, B, C = randn(rng, (30, 20), dtype), randn(rng, (20, 25), dtype), randn(rng, (30, 25), dtype)
    with dask.config.set({"dgemm.small-flops": 1e12}):
        got = dgemm.matmul(A, B)
        assert type(got) is np.ndarray and got.dtype == dtype
        check_product(got, A, B, dtype=dtype)
        got = dgemm.gemm(A.T, B, c=C, alpha=-0.5, beta=2.0, trans_a=True)
        check_product(got, A, B, alpha=-0.5, beta=2.0, c=C, dtype=dtype)
        v = dgemm.matmul(A[:, 0], A)      # 1-D operands squeeze as in numpy
        assert v.shape == (20,)
        check_product(v, A[:, 0], A, dtype=dtype)
        s = dgemm.matmul(A[0], A[0])
        assert np.shape(s) == () and np.isclose(s, A[0].astype("f8") @ A[0], rtol=1e-5)


def test_host_product_scales_and_adds_in_the_result_dtype(rng):
    A, B, C = randn(rng, (5, 4), "f4"), randn(rng, (4, 3), "f8"), randn(rng, (5, 3), "f4")
    got = host_product(A, B, C, alpha=3.0, beta=-1.0, dtype=np.dtype("f8"))
    np.testing.assert_allclose(got, 3.0 * A.astype("f8") @ B - C, rtol=1e-12)
    assert got.dtype == np.float64


def test_device_products_send_the_blocks_as_data_not_inside_the_graph(client, rng):
    """Above small-flops the blocks are scattered once; the task graph names them (no large-graph warning)."""
    A, B = randn(rng, (512, 384), "float64"), randn(rng, (384, 448), "float64")   # 1.5 and 1.3 MiB
    with dask.config.set({"dgemm.small-flops": 0, "distributed.admin.large-graph-warning-threshold": "256kB"}):
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            got = dgemm.matmul(A, B, client=client, block=128)
    assert type(got) is np.ndarray
    check_product(got, A, B, dtype="float64")
    # nothing of this product stays on the cluster
    assert not [k for k in client.who_has() if "dgemm-scattered" in str(k)]

"""The steps of a call (dgemm.client.steps): a lazy call builds a graph and starts nothing; no default client left."""
from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

import dgemm
import dgemm.client.steps
from _check import check_product, randn


def current_client():
    from distributed import default_client
    try:
        return default_client()
    except ValueError:
        return None


def test_a_lazy_call_without_a_client_starts_nothing_and_computes_where_dask_does(monkeypatch, client, rng):
    if current_client() is not None:
        pytest.skip("another test left a default client; this test needs none")

    def no_cluster(*args, **kwargs):
        raise AssertionError("a lazy call reached for a cluster")

    monkeypatch.setattr(dgemm.client.steps, "get_client", no_cluster)
    A, B = randn(rng, (90, 70), "float32"), randn(rng, (70, 50), "float32")
    lazy = dgemm.matmul(da.from_array(A, chunks=40), da.from_array(B, chunks=30), block=32)
    assert isinstance(lazy, da.Array) and current_client() is None
    assert lazy.numblocks == (3, 2)
    with dask.config.set(scheduler="threads"):            # this process's device, blocks in parallel threads
        check_product(lazy.compute(), A, B, dtype="float32")
    check_product(client.compute(lazy).result(), A, B, dtype="float32")   # or a cluster's workers


def test_a_call_that_starts_its_local_cluster_leaves_no_default_client(tmp_path, rng):
    import zarr

    from dgemm.cluster.local import closing_new_local_clusters

    if current_client() is not None:
        pytest.skip("another test left a default client; this test needs none")
    A, B = randn(rng, (40, 30), "float64"), randn(rng, (30, 20), "float64")
    za = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=A.shape, chunks=(20, 30), dtype=A.dtype)
    za[...] = A
    with closing_new_local_clusters():
        out = dgemm.matmul(za, B, out=str(tmp_path / "c.zarr"), devices="cpu")
        assert current_client() is None        # the user's own dask work stays where it was
    check_product(out[...], A, B, dtype="float64")


def _first_of_the_last_run(dask_worker=None):
    """On a worker: the priorities of the last run's GEMM tasks as they reached it (dask's tuple: lower first),
    in that order."""
    seen = [ev for ev in dask_worker.state.stimulus_log if type(ev).__name__ == "ComputeTaskEvent"
            and isinstance(ev.key, tuple) and str(ev.key[0]).startswith("dgemm-gemm-")]
    if not seen:
        return []
    run = seen[-1].key[0]
    return [tuple(ev.priority) for ev in seen if ev.key[0] == run]


@pytest.mark.parametrize("gemm_tasks", [1, 2])
def test_each_worker_gets_its_first_gemm_tasks_first(client, tmp_path, rng, gemm_tasks):
    """The scheduler sends each worker its first GEMM tasks (in the order the worker runs its blocks) before the
    others: a worker starts the first task to reach it, and one of its last read its blocks and their
    read-ahead before the run's first product could (bench/NOTES.md, issue 28, fourteenth session).  With
    ``gemm-tasks`` 2, its first two."""
    import dask

    A = rng.standard_normal((256, 96)).astype("float32")
    B = rng.standard_normal((96, 256)).astype("float32")
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=A.shape, chunks=(32, 32), dtype="f4")
    b = zarr.create_array(str(tmp_path / "b.zarr"), shape=B.shape, chunks=(32, 32), dtype="f4")
    a[...], b[...] = A, B
    with dask.config.set({"dgemm.gemm-tasks": gemm_tasks}):
        c = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=32)
    check_product(np.asarray(c[...]), A, B, dtype="float32")
    for worker, got in client.run(_first_of_the_last_run).items():
        assert len(got) >= 2 * gemm_tasks, (worker, got)
        assert sorted(got[:gemm_tasks]) == sorted(got)[:gemm_tasks], (worker, got[:6], sorted(got)[:3])

""":mod:`dgemm.benchmarks.floor`: the run's own rates in ``dgemm plan``'s terms, from the local store (warm
or cold) or from the object store, and where each came from.

The floor itself (:func:`~dgemm.benchmarks.floor.plan_floor` on a real cluster's workers) is checked in
tests/test_e2e.py, beside runs on a local folder, with ``--cold`` and on S3.
"""
from __future__ import annotations

import pytest

from dgemm.benchmarks.floor import _operands, measured_rates

HOST = {"read_gbps": {"1": 1.0, "4": 3.0}, "reader_gbps": {"1": 2.0, "4": 6.0},
        "read_cold_gbps": {"1": 0.5}, "reader_cold_gbps": {"1": 0.7, "4": 0.9},
        "write_gbps": {"1": 1.5, "4": None}, "copy_gbps": {"upload_pageable": 10.0, "upload_pinned": 25.0}}


def test_a_local_store_reads_at_dgemms_readers_best():
    r = measured_rates({"host_rates": HOST, "kernel": {"tflops": 40.0}})
    assert r["rates"] == {"read": 6e9, "write": 1.5e9, "pcie": 25e9, "flops": 40e12}
    assert r["source"]["read"] == "dgemm's chunk reader (best over threads)"
    assert r["source"]["pcie"] == "upload, page-locked"


def test_cold_reads_take_the_cold_rates_and_zarrs_when_the_reader_has_none():
    cold = measured_rates({"host_rates": HOST, "cold": True})
    assert cold["rates"]["read"] == pytest.approx(0.9e9) and "cold" in cold["source"]["read"]
    zarr_only = measured_rates({"host_rates": {**HOST, "reader_gbps": {}}})
    assert zarr_only["rates"]["read"] == 3e9 and zarr_only["source"]["read"].startswith("zarr")


def test_s3_takes_the_servers_raw_rates_and_leaves_out_what_was_not_measured():
    r = measured_rates({"store_kind": "s3", "host_rates": {"copy_gbps": {"upload_pageable": 12.0}},
                        "object_store": {"get": {"best_gbps": 4.5}, "put": {"best_gbps": None}}})
    assert r["rates"] == {"read": 4.5e9, "pcie": 12e9}       # no PUT rate, no kernel: the plan's defaults stand
    assert set(r["source"]) == {"read", "pcie"} and r["source"]["pcie"] == "upload, pageable"


def test_a_gram_floor_reads_x_transposed_as_a_and_x_as_b(tmp_path, rng):
    """The floor of X^T X plans with A = X transposed and B = X, as dgemm.matmul reads them: the plan's M and K, and
    the codecs' count (a Gram product, whose mirrored C blocks are never encoded), need both."""
    import numcodecs
    import zarr

    from dgemm.client.request import is_gram

    x = zarr.create_array(str(tmp_path / "x.zarr"), shape=(200, 70), chunks=(48, 16), dtype="float32",
                          zarr_format=2, compressors=numcodecs.Zstd(level=3))
    x[...] = rng.standard_normal((200, 70)).astype("float32")
    a, b = _operands(tmp_path / "x.zarr", tmp_path / "x.zarr", gram=True)
    assert (a.shape, a.chunks, b.shape, b.chunks) == ((70, 200), (16, 48), (200, 70), (48, 16))
    assert is_gram(a, b, 0.0)
    a, b = _operands(tmp_path / "x.zarr", tmp_path / "x.zarr")
    assert a.shape == b.shape == (200, 70) and not is_gram(a, b, 0.0)

""":mod:`dgemm.benchmarks.floor`: the run's own rates in ``dgemm plan``'s terms, from the local store (warm
or cold) or from the object store, and where each came from.

The floor itself (:func:`~dgemm.benchmarks.floor.plan_floor` on a real cluster's workers) is checked in
tests/test_e2e.py, beside runs on a local folder, with ``--cold`` and on S3.
"""
from __future__ import annotations

import pytest

from dgemm.benchmarks.floor import measured_rates

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

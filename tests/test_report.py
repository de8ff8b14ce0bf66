""":mod:`dgemm.benchmarks.report`: a record prints whatever it holds, a failure says so, and the record's name
tells runs apart."""
from __future__ import annotations

from dgemm.benchmarks.report import format_table, input_detail, ratios, result_detail

HEAD = {"commit": "abc1234", "date": "2026-11-26T00:00:00+00:00", "m": 64, "n": 64, "k": 64, "dtype": "float32",
        "chunks": 16, "reps": 1, "store": "/tmp/x", "device": "cpu", "workers": 2, "failures": 0, "errors": []}
RUN = {"m": 64, "n": 64, "k": 64, "seconds": 0.5, "tflops": 1e-6, "ok": True, "status": "ok",
       "check": {"max_rel_err": 1e-7}}


def test_an_unfinished_record_prints_what_it_has():
    table = format_table({**HEAD, "failures": 1, "errors": [{"stage": "dgemm", "error": "RuntimeError: lost"}],
                          "dgemm": {"m": 64, "n": 64, "k": 64, "status": "ERROR", "ok": False,
                                    "error": "RuntimeError: lost", "seconds": None, "tflops": None}})
    assert "dgemm e2e (2 worker(s))" in table and "ERROR RuntimeError: lost" in table
    assert "dask.array + numpy         not timed: None" in table
    assert table.endswith("result: 1 FAILURE(S)")


def test_a_finished_record_prints_each_run_its_scaling_and_its_first_call():
    row = {"gpus": 1, "seconds": 0.5, "tflops": 1e-6, "speedup": 1.0, "efficiency": 1.0,
           "workers": {"tcp://a:1": {"blocks": 4, "kernel_seconds": 0.2, "bytes_read": 2**20}}}
    first = {**RUN, "seconds": 3.0, "process_start_seconds": 0.05, "import_seconds": 0.5, "matmul_seconds": 2.4,
             "exit_seconds": 0.3, "minus_warm_seconds": 2.5}
    record = {**HEAD, "dgemm": RUN, "kernel": {**RUN, "rel_err": 1e-7}, "first_call": first, "scaling": [row],
              "peers": {"dask_cupy": None, "dask_cupy_skipped": "cupy is not installed", "dask_numpy": RUN}}
    record["ratios"] = ratios(record)
    table = format_table(record)
    assert "dgemm first call (script)" in table and "not timed: cupy is not installed" in table
    assert "ratios: dgemm/dask+cupy -; dgemm/kernel 1" in table
    assert "tcp://a:1: 4 blocks; kernel 0.2 s; read 1.00 MiB" in table
    assert "first call from a fresh script: 3 s from process start" in table
    assert table.endswith("result: OK")


def test_the_name_tells_runs_apart():
    assert "-".join(x for x in (result_detail(96, 96, 96, "float32"), input_detail("blosc-lz4", 2, None)) if x) \
        == "96-float32-blosc-lz4-v2"
    assert input_detail("raw", 3, None) == ""

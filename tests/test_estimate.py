""":mod:`dgemm.client.estimate`: the time floor counts codec work, bytes read more than once, and the kernel.

Issue 27: `dgemm plan` predicted 117 s for a 24 s run and 0.03 s for a 0.6 s one: its floor counted
neither the host's decoding and encoding nor, without a database figure, the kernel, and took every
B block as read again on every task once the device cache was short.  The figures here are checked
against sums done by hand from the plan's sizes (no timing is measured).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from dask.utils import format_bytes

from dgemm.benchmarks.floor import floor_of, measured_rates
from dgemm.cli import cli
from dgemm.client.estimate import CODECS, Rates, codec_of
from dgemm.client.plan import make_plan

ZSTD, RAW = CODECS["zstd"], CODECS["raw"]


def square(n=4096, block=1024, workers=1, dtype="float32"):
    return make_plan(n, n, n, dtype, (32, 32, 16), a_chunks=(block, block), b_chunks=(block, block),
                     target=block, n_workers=workers)


def test_a_compressed_input_costs_its_decode_on_the_hosts_cores():
    """Same bytes, same plan: zstd inputs take longer to decode than raw ones; the cpu time is bytes / (rate x cores)."""
    p = square()
    rates = Rates(cores=4, flops=1e15)
    z = p.estimate(1, rates, codecs=(ZSTD, ZSTD, RAW))
    r = p.estimate(1, rates, codecs=(RAW, RAW, RAW))
    assert z["bytes_decoded"] == r["bytes_decoded"] == 2 * 4096 * 4096 * 4
    assert z["floor_seconds"] > r["floor_seconds"] and z["bound"] == "cpu"
    inputs, out = 2 * 4096**2 * 4, 4096**2 * 4
    assert z["hosts"][0]["cpu"]["decode"] == pytest.approx(inputs / ZSTD.decode / 4)
    assert z["hosts"][0]["cpu"]["encode"] == pytest.approx(out / RAW.encode / 4)
    # encoding C in zstd costs more than writing it raw, and more cores share the work
    zc = p.estimate(1, rates, codecs=(RAW, RAW, ZSTD))
    assert zc["hosts"][0]["cpu"]["encode"] == pytest.approx(out / ZSTD.encode / 4)
    assert zc["hosts"][0]["cpu"]["encode"] > r["hosts"][0]["cpu"]["encode"]
    more = p.estimate(1, Rates(cores=16, flops=1e15), codecs=(ZSTD, ZSTD, RAW))
    assert more["hosts"][0]["cpu"]["decode"] == pytest.approx(z["hosts"][0]["cpu"]["decode"] / 4)
    # a measured per-core rate takes the codec's place
    measured = p.estimate(1, Rates(cores=4, decode=0.1e9, flops=1e15), codecs=(ZSTD, ZSTD, RAW))
    assert measured["hosts"][0]["cpu"]["decode"] == pytest.approx(inputs / 0.1e9 / 4)


def test_workers_of_one_host_read_their_overlapping_panels_each():
    """2 workers on one host each read all of A and half of B (a 1 x 2 split): 1.5x the inputs, decoded on the same cores."""
    p = square()
    inputs = 2 * 4096**2 * 4
    one = p.estimate(1, Rates(cores=8), codecs=(ZSTD, ZSTD, RAW))
    two = p.estimate(2, Rates(cores=8), codecs=(ZSTD, ZSTD, RAW))
    assert one["bytes_decoded"] == inputs
    assert two["bytes_decoded"] == pytest.approx(1.5 * inputs)
    assert two["hosts"][0]["cpu"]["decode"] > one["hosts"][0]["cpu"]["decode"]
    # a host cache decodes each block once for both; on two hosts each has its own cores
    shared = p.estimate(2, Rates(cores=8), codecs=(ZSTD, ZSTD, RAW), shared_decode=True)
    assert shared["bytes_decoded"] == pytest.approx(inputs)
    apart = p.estimate(2, Rates(cores=8), codecs=(ZSTD, ZSTD, RAW), hosts=2)
    assert len(apart["hosts"]) == 2 and apart["bytes_decoded"] == two["bytes_decoded"]


def test_a_short_device_cache_reads_b_again_on_later_rows_and_no_more():
    """4 x 4 blocks of 1024: a cache holding all of B beside an A panel reads nothing twice; a smaller one re-reads B per row."""
    p = square()
    item, b = 4, 4096 * 4096 * 4
    full = p.estimate(1, Rates(), cache_bytes=None)["bytes_read"]
    assert full == 2 * b
    roomy = p.estimate(1, Rates(), cache_bytes=b + 1024 * 4096 * item)["bytes_read"]
    assert roomy == 2 * b
    # room for the A panel and half of B: each of the 3 later rows reads the other half again
    half = p.estimate(1, Rates(), cache_bytes=b / 2 + 1024 * 4096 * item)["bytes_read"]
    assert half == pytest.approx(2 * b + 3 * b / 2)
    # no room: B once per task (16 tasks, each its whole B panel), never more
    none = p.estimate(1, Rates(), cache_bytes=0)["bytes_read"]
    assert none == pytest.approx(b + 16 * 4096 * 1024 * item)


def test_blocks_that_cut_chunks_decode_them_whole():
    """k-blocks of 1024 in chunks of 4096: each chunk is decoded once per block that touches it (4 times)."""
    p = make_plan(1024, 1024, 8192, "float32", (32, 32, 16), a_chunks=(1024, 4096), b_chunks=(4096, 1024),
                  target=1024, exact=True)
    assert p.block_shape == (1024, 1024, 1024)
    inputs = 2 * 1024 * 8192 * 4
    cut = p.estimate(1, Rates(cores=2), codecs=(ZSTD, ZSTD, RAW), chunks=((1024, 4096), (4096, 1024)))
    assert cut["bytes_decoded"] == pytest.approx(4 * inputs)
    assert cut["workers"][0]["seconds"]["upload"] == pytest.approx(inputs / Rates().pcie)   # blocks go up once


def test_the_kernel_counts_when_its_rate_is_known():
    p = square(dtype="float64")
    flops = 2.0 * 4096**3
    unknown = p.estimate(1, Rates(cores=64))
    assert "kernel" not in unknown["workers"][0]["seconds"]
    known = p.estimate(1, Rates(cores=64, flops=1e12))
    assert known["workers"][0]["seconds"]["kernel"] == pytest.approx(flops / 1e12)
    assert known["bound"] == "kernel" and known["floor_seconds"] > flops / 1e12
    # two devices share the flops; on a CPU device (PoCL) the kernel takes the host's cores, after the codecs
    assert p.estimate(2, Rates(cores=64, flops=1e12))["workers"][0]["seconds"]["kernel"] == pytest.approx(
        flops / 2e12)
    cpu = p.estimate(1, Rates(cores=2, flops=1e12), codecs=(ZSTD, ZSTD, ZSTD), device_is_host=True)
    c = cpu["hosts"][0]["cpu"]
    assert c["kernel"] == pytest.approx(flops / 1e12) and cpu["workers"][0]["seconds"]["cpu"] == pytest.approx(
        c["kernel"] + c["decode"] + c["encode"])


@pytest.mark.parametrize("compressors, name", [
    ([{"name": "zstd", "configuration": {"level": 0}}], "zstd level 3"),
    ([{"name": "zstd", "configuration": {"level": -1}}], "zstd level < 0"),
    ([{"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5}}], "blosc-lz4"),
    ({"id": "zstd", "level": 3}, "zstd level 3"),
    ([], "raw (copied)"),
])
def test_codecs_are_read_from_zarrs_description(compressors, name):
    assert codec_of(compressors).name == name


def test_the_runs_measured_rates_take_the_codecs_place():
    """The e2e record's reader rate per thread is the inputs' decode rate per core; zarr's own reads bind nothing."""
    rec = {"host_rates": {"reader_gbps": {"1": 0.7, "16": 6.4}, "write_gbps": {"4": 10.0},
                          "encode_gbps": {"1": 0.6, "16": 4.8}, "copy_gbps": {"upload_pinned": 50.0}},
           "kernel": {"tflops": 40.0}, "cpus": 16}
    m = measured_rates(rec)
    assert m["cpu"] == {"decode": pytest.approx(0.4e9), "encode": pytest.approx(0.3e9), "cores": 16}
    p = square()
    f = floor_of(p, 1, None, {"codecs": (ZSTD, ZSTD, ZSTD)}, None, m)
    r = f["measured"]["rates"]
    assert (r["decode_a"], r["encode_c"], r["cores"], r["flops"]) == (pytest.approx(0.4e9), pytest.approx(0.3e9),
                                                                      16, 40e12)
    assert f["defaults"]["rates"]["decode_a"] == ZSTD.decode and f["defaults"]["rates"]["flops"] is None
    zarr_only = measured_rates({"host_rates": {"read_gbps": {"4": 1.0}}})
    assert floor_of(p, 1, None, {}, None, zarr_only)["measured"]["rates"]["read"] is None


@pytest.fixture
def arrays(tmp_path):
    rng = np.random.default_rng(7)
    a = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(3000, 2000), chunks=(500, 500), dtype="float32")
    a[...] = rng.standard_normal((3000, 2000), dtype=np.float32)
    b = zarr.create_array(store=str(tmp_path / "b.zarr"), shape=(2000, 1000), chunks=(500, 500), dtype="float32",
                          compressors=None)
    b[...] = rng.standard_normal((2000, 1000), dtype=np.float32)
    return str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")


def test_dgemm_plan_prints_sizes_as_dask_does_and_what_binds(arrays, monkeypatch):
    monkeypatch.setenv("DGEMM_DEVICES", "none-such")      # no device: the default tiles, no kernel rate
    a, b = arrays
    r = CliRunner().invoke(cli, ["plan", a, b, "--workers", "2", "--cores", "4", "--block", "1000"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert f"output bytes written {format_bytes(3000 * 1000 * 4)}" in out
    assert f"inputs' {format_bytes((3000 * 2000 + 2000 * 1000) * 4)}" in out
    assert not re.search(r"\d MB\b", out)
    assert "A 0.448 GB/s (zstd level 3), B 1.12 GB/s (raw (copied))" in out     # Zarr's default codec for A
    assert "4 cores" in out and re.search(r"time floor [\d.]+ s \(cpu-bound\)", out)
    assert "kernel rate unknown (not counted)" in out
    r = CliRunner().invoke(cli, ["plan", a, b, "--workers", "2", "--cores", "4", "--block", "1000",
                                 "--tflops", "0.001"])
    assert re.search(r"time floor [\d.]+ s \(kernel-bound\)", r.output) and "kernel 0.001 TFLOPS" in r.output


def test_the_host_rates_time_cs_codec_encoding(arrays, tmp_path):
    """`dgemm bench e2e`'s host rates hold C's encode rate by threads (zarr into memory), the floor's per-core encode."""
    from dgemm.benchmarks.rates import encode_rate, host_rates

    assert encode_rate("auto", (64, 64), "float32", 1) > 0
    a, _ = arrays
    r = host_rates(a, tmp_path, (500, 500), "float32")
    assert "1" in r["encode_gbps"] and all(v > 0 for v in r["encode_gbps"].values())
    assert "encode_gbps" not in host_rates(a, tmp_path, (500, 500), "float32", compressors="<a codec object>")
    m = measured_rates({"host_rates": r, "cpus": 2})
    best, threads = max((v, int(t)) for t, v in r["encode_gbps"].items())
    assert m["cpu"]["encode"] == pytest.approx(best * 1e9 / min(threads, 2))


def gram(block_k=4096, n=256, rows=65536, chunk=4096):
    """X^T X of X (rows x n) in (chunk x n) chunks: op(A) = X^T in (n x chunk) chunks, op(B) = X."""
    p = make_plan(n, n, rows, "float32", (32, 32, 16), a_chunks=(n, chunk), b_chunks=(chunk, n),
                  target=(n, n, block_k), exact=True)
    return p, ((n, chunk), (chunk, n))


def test_a_gram_decodes_each_chunk_of_x_once_for_both_operands():
    """Issue 27: X^T X reads X once (its A blocks and B blocks are the same chunks); the floor counted X twice."""
    p, chunks = gram()
    x = 65536 * 256 * 4
    rates = Rates(cores=4, flops=1e15)
    g = p.estimate(1, rates, codecs=(ZSTD, ZSTD, RAW), chunks=chunks, gram=True)
    assert g["bytes_decoded"] == pytest.approx(x) and g["bytes_read"] == pytest.approx(x)
    assert g["hosts"][0]["cpu"]["decode"] == pytest.approx(x / ZSTD.decode / 4)
    assert g["workers"][0]["seconds"]["upload"] == pytest.approx(x / Rates().pcie)     # X goes up once too
    # the same shapes as two different arrays read both
    assert p.estimate(1, rates, codecs=(ZSTD, ZSTD, RAW), chunks=chunks)["bytes_decoded"] == pytest.approx(2 * x)


def test_a_gram_whose_k_blocks_cut_its_chunks_decodes_each_chunk_once_per_block():
    """K blocks of 1024 rows in 4096-row chunks (as before e29a553): each chunk of X decoded 4 times, not 8."""
    p, chunks = gram(block_k=1024)
    x = 65536 * 256 * 4
    assert p.block_shape == (256, 256, 1024)
    g = p.estimate(1, Rates(cores=4), codecs=(ZSTD, ZSTD, RAW), chunks=chunks, gram=True)
    assert g["bytes_decoded"] == pytest.approx(4 * x)


def test_a_gram_computes_one_triangle_of_c_and_writes_all_of_it():
    """C of 4 x 4 blocks: the kernel runs the 10 blocks i <= j (10/16 of the flops), every block is encoded."""
    n, k = 4096, 8192
    p = make_plan(n, n, k, "float32", (32, 32, 16), a_chunks=(1024, 1024), b_chunks=(1024, 1024), target=1024,
                  exact=True)
    assert p.rows.count == 4
    g = p.estimate(1, Rates(cores=4, flops=1e12), codecs=(ZSTD, ZSTD, ZSTD), gram=True)
    assert g["workers"][0]["seconds"]["kernel"] == pytest.approx(10 / 16 * 2.0 * n * n * k / 1e12)
    assert g["workers"][0]["seconds"]["download"] == pytest.approx(10 / 16 * n * n * 4 / Rates().pcie)
    assert g["hosts"][0]["cpu"]["encode"] == pytest.approx(n * n * 4 / ZSTD.encode / 4)


def test_the_fill_delays_the_device_not_the_hosts_cores():
    """The first panels' decode is part of the cores' total: a cpu-bound floor is cpu + drain, a kernel-bound one
    kernel + fill + drain (the floor used to add the fill to the cores' time as well)."""
    p = square()
    cpu_bound = p.estimate(1, Rates(cores=4, flops=1e15), codecs=(ZSTD, ZSTD, RAW))
    w = cpu_bound["workers"][0]
    inputs, out = 2 * 4096**2 * 4, 4096**2 * 4
    cpu = inputs / ZSTD.decode / 4 + out / RAW.encode / 4
    assert cpu_bound["bound"] == "cpu" and w["fill"] > 0
    assert cpu_bound["floor_seconds"] == pytest.approx(cpu + w["drain"])
    kernel_bound = p.estimate(1, Rates(cores=64, flops=1e12), codecs=(ZSTD, ZSTD, RAW))
    w = kernel_bound["workers"][0]
    assert kernel_bound["bound"] == "kernel"
    assert kernel_bound["floor_seconds"] == pytest.approx(2.0 * 4096**3 / 1e12 + w["fill"] + w["drain"])


def test_two_workers_of_one_host_each_decode_the_panels_of_their_share():
    """49152^2 in 4096^2 blocks on 2 GPUs of one host (issue 27's case): each worker reads all of one operand and
    half of the other (a 1 x 2 or 2 x 1 split), so the host decodes 1.5x the inputs: 29.0 GB for 19.3 GB, as the
    workers' counters of 95a8705 showed."""
    n = 49152
    p = make_plan(n, n, n, "float32", (128, 128, 32), a_chunks=(4096, 4096), b_chunks=(4096, 4096), target=4096,
                  n_workers=2)
    two = p.estimate(2, Rates(cores=32), codecs=(ZSTD, ZSTD, ZSTD))
    inputs = 2 * n * n * 4
    assert [sorted((w["bytes_a"], w["bytes_b"])) for w in two["workers"]] == [[n * n * 2, n * n * 4]] * 2
    assert two["bytes_decoded"] == pytest.approx(1.5 * inputs)
    assert two["hosts"][0]["cpu"]["decode"] == pytest.approx(1.5 * inputs / ZSTD.decode / 32)

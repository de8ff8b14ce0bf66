"""``dgemm bench e2e --op gram|projection`` (issue 27's shapes): the record names the op, dgemm and its peers
compute the same product on the same files (checked against numpy float64, a Gram matrix's symmetry too), the
read-and-decode floor beside each figure adds up from the rates the run measured, and a wrong C fails the command.

Runs on the session's two-worker PoCL cluster (lent to ``--scheduler``), at tiny sizes; cupy and torch are
hidden, so the GPU peers say why they were skipped.  References come from numpy float64 and from the files
themselves, never from dgemm.  No test asserts on speed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import zarr

import dgemm
from dgemm.accuracy import sample_indices
from dgemm.benchmarks.e2e import E2EOptions
from dgemm.benchmarks.shapes import check_gram
from dgemm.cli import cli
from test_e2e import lend, needs_device, no_cuda, no_work, runner  # noqa: F401  (fixtures)

META = {"zarr.json", ".zarray", ".zattrs", ".zgroup"}


def _only_json(folder: Path):
    files = sorted(folder.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text()), files[0]


def _files_bytes(path) -> int:
    """Bytes of every file under a Zarr array's folder (metadata included), as ``du -b`` counts them."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _floor_adds_up(rec: dict, size: str, stored: int, decoded: int, c_bytes: int) -> dict:
    """The record's read-and-decode floor is the sum of its parts, each from the rates this run measured."""
    f = rec["io_floor"][size]
    rates = rec["io_rates"]
    assert rates["threads"] == os.cpu_count() and rates["read_gbps"] > 0 and rates["decode_gbps"] > 0
    assert "zstd" in rates["decode_codec"]
    encode = max(v for v in rec["host_rates"]["encode_gbps"].values() if v)
    run = rec["dgemm"] if size == "full" else rec["dgemm_small"]
    flops = run["counters"]["total"]["flops"] / run["reps"]    # the counters cover every timed repetition
    want = {"read": stored / (rates["read_gbps"] * 1e9), "decode": decoded / (rates["decode_gbps"] * 1e9),
            "kernel": flops / (rec["kernel"]["tflops"] * 1e12) / rec["workers"], "encode": c_bytes / (encode * 1e9)}
    assert f["parts"] == pytest.approx(want)
    assert f["seconds"] == pytest.approx(sum(want.values()))
    for name, run in f["runs"].items():
        assert run["over_floor"] == pytest.approx(run["seconds"] / f["seconds"])
        assert run["floor_fraction"] == pytest.approx(f["seconds"] / run["seconds"])
    return f


# -- a Gram matrix -----------------------------------------------------------------------------
@needs_device
def test_gram_record_names_the_op_and_every_product_is_x_transpose_x(runner, tmp_path, lend, no_cuda):
    out, store = tmp_path / "results", tmp_path / "store"
    r = runner.invoke(cli, ["bench", "e2e", "--op", "gram", "--shape", "512,96", "--chunks", "32", "--codec",
                            "default", "--numpy-size", "64", "--keep", "--out", str(out), "--store", str(store), *lend])
    assert r.exit_code == 0, r.output
    rec, path = _only_json(out)
    assert path.name.endswith("-e2e-gram-512x96-float32-default.json")
    assert (rec["op"], rec["expression"], rec["operands"], rec["c_shape"]) == ("gram", "C = X^T X", {"x": [512, 96]},
                                                                              [96, 96])
    assert (rec["m"], rec["n"], rec["k"]) == (96, 96, 512) and rec["ok"] and rec["failures"] == 0, rec["errors"]
    folder = Path(rec["store"])
    ins = rec["inputs"]
    assert ins["a"]["path"] == ins["b"]["path"] == str(folder / "x.zarr")     # X written once, both operands
    assert not (folder / "a.zarr").exists() and not (folder / "b.zarr").exists()
    x = zarr.open_array(str(folder / "x.zarr"), mode="r")
    assert x.shape == (512, 96) and x.chunks == (32, 32)
    x64 = x[...].astype(np.float64)

    d = rec["dgemm"]
    assert d["op"] == "gram" and d["ok"] and d["check"]["passed"]
    assert d["check"]["symmetry_err"] <= d["check"]["tolerance"] and d["check"]["exactly_symmetric"]
    assert d["bytes"]["inputs"] == 512 * 96 * 4                               # X counted once
    c = zarr.open_array(str(folder / "c_dgemm.zarr"), mode="r")[...]
    np.testing.assert_allclose(c, x64.T @ x64, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(c, c.T)                                     # one triangle, mirrored
    # dgemm plan's floor beside the time, planned as the Gram it is: X decoded once for both operands
    fl = d["floor"]
    assert fl["how"]["gram"] and fl["measured"]["floor_seconds"] > 0 and fl["same_blocks_as_run"] is True
    assert fl["measured"]["bytes_decoded"] == pytest.approx(512 * 96 * 4, rel=0.25), fl["measured"]

    p = rec["peers"]
    assert p["dask_cupy"] is None and p["dask_cupy_skipped"] == "cupy is not installed"
    assert p["cublas"] is None and "torch is not installed" in p["cublas_skipped"]
    dn = p["dask_numpy"]
    assert (dn["op"], dn["m"], dn["n"], dn["k"]) == ("gram", 64, 64, 64) and dn["check"]["passed"]
    assert dn["check"]["symmetry_err"] <= dn["check"]["tolerance"]
    xs = zarr.open_array(str(folder / "x_small.zarr"), mode="r")[...].astype(np.float64)
    np.testing.assert_allclose(zarr.open_array(str(folder / "c_numpy.zarr"), mode="r")[...], xs.T @ xs,
                               rtol=1e-4, atol=1e-3)
    assert rec["dgemm_small"]["check"]["passed"] and rec["dgemm_small"]["k"] == 64

    f = _floor_adds_up(rec, "full", _files_bytes(folder / "x.zarr"), 512 * 96 * 4, 96 * 96 * 4)
    assert set(f["runs"]) == {"dgemm"} and f["runs"]["dgemm"]["seconds"] == d["seconds"]
    small = _floor_adds_up(rec, "small", _files_bytes(folder / "x_small.zarr"), 64 * 64 * 4, 64 * 64 * 4)
    assert set(small["runs"]) == {"dgemm_small", "dask_numpy"}
    assert "C = X^T X, 96 x 96 x 512" in r.output and "inputs: X 192.00 kiB" in r.output
    assert "read-and-decode floor (96x96x512, inputs read once)" in r.output and "x the floor" in r.output


@pytest.fixture
def mirrored_without_transpose(monkeypatch):
    """dgemm.gemm whose mirror is wrong: C's block (1, 0) is a copy of block (0, 1), not its transpose."""
    real = dgemm.gemm

    def bug(*args, **kwargs):
        out = real(*args, **kwargs)
        c = zarr.open_array(kwargs["out"], mode="r+")
        c[32:64, 0:32] = c[0:32, 32:64]
        return out

    monkeypatch.setattr(dgemm, "gemm", bug)


@needs_device
def test_a_wrong_gram_fails_the_command(runner, tmp_path, lend, mirrored_without_transpose):
    r = runner.invoke(cli, ["bench", "e2e", "--op", "gram", "--shape", "256,96", "--chunks", "32", "--codec",
                            "default", "--no-peers", "--out", str(tmp_path), *lend])
    assert r.exit_code == 1, r.output
    assert "FAILED" in r.output
    rec, _ = _only_json(tmp_path)
    check = rec["dgemm"]["check"]
    assert rec["failures"] >= 1 and not check["passed"] and not check["exactly_symmetric"]
    assert check["symmetry_err"] > check["tolerance"]
    assert any(e["stage"] == "dgemm" and "wrong result" in e["error"] for e in rec["errors"])


def test_the_symmetry_check_catches_a_mirror_the_sampled_entries_miss(rng):
    """Only the mirrors C[j, i] of the sampled entries C[i, j] wrong: the entries pass, the symmetry fails."""
    x = rng.standard_normal((200, 40))
    c = x.T @ x
    pick = np.random.default_rng(0)                                           # check_gram's sample, seed 0
    rows, cols = sample_indices(40, 8, pick), sample_indices(40, 8, pick)
    for i in rows:
        for j in cols:
            if not (j in rows and i in cols):                                 # C[j, i] is not itself sampled
                c[j, i] += 1.0
    r = check_gram(x, c, 8, 8)
    assert r["max_rel_err"] <= r["tolerance"] and r["symmetry_err"] > r["tolerance"]
    assert not r["passed"] and not r["exactly_symmetric"]
    assert check_gram(x, x.T @ x, 8, 8)["passed"]


def test_a_c_of_the_wrong_shape_fails_the_check(rng):
    """A C with extra rows and columns beyond the product fails, though every sampled entry inside it is right."""
    from dgemm.benchmarks.shapes import check_op

    x, w = rng.standard_normal((60, 20)), rng.standard_normal((20, 4))
    gram = np.zeros((24, 24))
    gram[:20, :20] = x.T @ x
    proj = np.zeros((60, 6))
    proj[:, :4] = x @ w
    for op, c, right in (("gram", gram, x.T @ x), ("projection", proj, x @ w)):
        bad = check_op(op, x, w, c)
        assert not bad["passed"] and bad["shape"] == list(c.shape) and bad["expected_shape"] == list(right.shape)
        assert check_op(op, x, w, right)["passed"]


# -- a projection ------------------------------------------------------------------------------
@needs_device
def test_projection_record_and_its_peers(runner, tmp_path, lend, no_cuda):
    out, store = tmp_path / "results", tmp_path / "store"
    r = runner.invoke(cli, ["bench", "e2e", "--op", "projection", "--shape", "384,8,160", "--chunks", "32", "--codec",
                            "default", "--keep", "--out", str(out), "--store", str(store), *lend])
    assert r.exit_code == 0, r.output
    rec, path = _only_json(out)
    assert path.name.endswith("-e2e-projection-384x8x160-float32-default.json")
    assert (rec["op"], rec["expression"], rec["operands"]) == ("projection", "C = X @ W",
                                                               {"x": [384, 160], "w": [160, 8]})
    assert rec["ok"] and rec["failures"] == 0, rec["errors"]
    folder = Path(rec["store"])
    x, w = (zarr.open_array(str(folder / f"{s}.zarr"), mode="r")[...].astype(np.float64) for s in "xw")
    assert x.shape == (384, 160) and w.shape == (160, 8)
    np.testing.assert_allclose(zarr.open_array(str(folder / "c_dgemm.zarr"), mode="r")[...], x @ w,
                               rtol=1e-4, atol=1e-3)
    d = rec["dgemm"]
    assert d["op"] == "projection" and d["check"]["passed"] and d["bytes"]["inputs"] == (384 * 160 + 160 * 8) * 4
    assert d["floor"]["measured"]["floor_seconds"] > 0                        # dgemm plan's floor: A @ B
    dn = rec["peers"]["dask_numpy"]                                           # at the full size: 384 <= 4096
    assert (dn["op"], dn["m"], dn["n"], dn["k"]) == ("projection", 384, 8, 160) and dn["check"]["passed"]
    assert rec["small_is_full"] and "small" not in rec["io_floor"]
    stored = _files_bytes(folder / "x.zarr") + _files_bytes(folder / "w.zarr")
    f = _floor_adds_up(rec, "full", stored, (384 * 160 + 160 * 8) * 4, 384 * 8 * 4)
    assert set(f["runs"]) == {"dgemm", "dask_numpy"}
    assert "C = X @ W, 384 x 8 x 160" in r.output and "inputs: X 240.00 kiB, W 5.00 kiB" in r.output


@pytest.fixture
def rows_misplaced(monkeypatch):
    """dgemm.matmul that stores C's first two row blocks in each other's place."""
    real = dgemm.matmul

    def bug(*args, **kwargs):
        out = real(*args, **kwargs)
        c = zarr.open_array(kwargs["out"], mode="r+")
        top, next_ = c[0:32], c[32:64]
        c[0:32], c[32:64] = next_, top
        return out

    monkeypatch.setattr(dgemm, "matmul", bug)


@needs_device
def test_a_wrong_projection_fails_the_command(runner, tmp_path, lend, rows_misplaced):
    r = runner.invoke(cli, ["bench", "e2e", "--op", "projection", "--shape", "128,8,64", "--chunks", "32",
                            "--no-peers", "--out", str(tmp_path), *lend])
    assert r.exit_code == 1, r.output
    rec, _ = _only_json(tmp_path)
    assert rec["op"] == "projection" and rec["failures"] >= 1 and not rec["dgemm"]["check"]["passed"]


# -- the options ---------------------------------------------------------------------------------
def test_op_options_and_their_shapes():
    assert E2EOptions(shape=[1000, 64], op="gram").mnk() == (64, 64, 1000)
    assert E2EOptions(size=512, op="projection").mnk() == (512, 256, 512)
    assert E2EOptions(size=100, op="projection").mnk() == (100, 100, 100)
    for kwargs, message in (({"shape": (8, 4, 2), "op": "gram"}, "X's two sizes M, N"),
                            ({"shape": (8, 4), "op": "projection"}, "three positive integers"),
                            ({"size": 8, "op": "syrk"}, "op must be one of matmul, gram, projection"),
                            ({"size": 8, "op": "gram", "first_call": True}, "not with op='gram'")):
        with pytest.raises(ValueError, match=message):
            E2EOptions(**kwargs)


@pytest.mark.parametrize("args, message", [
    (["--op", "gram", "--shape", "64,64,64"], "with --op gram give X's two sizes M,N"),
    (["--op", "projection", "--shape", "64,64"], "give three sizes M,N,K"),
    (["--op", "gram", "--size", "64", "--first-call"], "not with --op gram"),
    (["--op", "syrk", "--size", "64"], "'syrk' is not one of 'matmul', 'gram', 'projection'"),
])
def test_op_argument_errors_start_nothing(runner, tmp_path, no_work, args, message):
    r = runner.invoke(cli, ["bench", "e2e", "--out", str(tmp_path / "out"), "--store", str(tmp_path / "s"), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "s").exists()


@pytest.mark.gpu
def test_cublas_times_a_checked_gram_product():
    """cuBLAS's X^T X of one X (the GEMM's first operand transposed, no copy), checked against float64."""
    from dgemm.benchmarks.peers import cublas, cublas_backend

    if cublas_backend()[0] is None:
        pytest.skip(cublas_backend()[1])
    r = cublas("float32", 512, 512, 8192, reps=3, gram=True)
    assert r["ok"] and r["gram"] and r["rel_err"] <= r["tolerance"] and r["seconds"] > 0


def test_the_floors_kernel_part_is_one_products_whatever_the_repetitions():
    """The workers' counters cover every timed repetition: the floor's kernel part is one product's."""
    from dgemm.benchmarks.shapes import add_io_floor

    def record(reps):
        flops = 2.0 * 1024 ** 3
        return {"dtype": "float32", "compressors": None, "workers": 1, "m": 1024, "n": 1024, "k": 1024,
                "kernel": {"tflops": 10.0}, "io_rates": {"read_gbps": 4.0, "decode_gbps": 2.0},
                "inputs": {"a": {"path": "a", "bytes": 4 << 20, "bytes_on_disk": 4 << 20},
                           "b": {"path": "b", "bytes": 4 << 20, "bytes_on_disk": 4 << 20}},
                "dgemm": {"m": 1024, "n": 1024, "k": 1024, "reps": reps, "seconds": 1.0,
                          "counters": {"total": {"flops": flops * reps}}}}

    one, three = (add_io_floor(record(r))["full"] for r in (1, 3))
    assert one["parts"]["kernel"] == pytest.approx(2.0 * 1024 ** 3 / 10e12)
    assert three["parts"] == one["parts"] and three["seconds"] == one["seconds"]

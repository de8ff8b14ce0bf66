"""Paths as users spell them, on workers that run in a folder of their own.

The ``elsewhere`` cluster is a ``dgemm cluster`` process started in its own
working folder (``elsewhere.home``); each test ``chdir``s to its own
``tmp_path`` and names its arrays relatively, as a user in a terminal does.
``elsewhere.home`` holds decoys: arrays of the same names and shapes with
other data, so that a path resolved in the workers' folder instead of the
client's gives a wrong product (caught by the comparison with numpy), not
just an error.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import dask.array as da
import pytest
import zarr
from click.testing import CliRunner

import dgemm
import dgemm.cluster
import dgemm.cluster.local
from _check import check_product, randn
from dgemm.cli import cli
from dgemm.storage import COMPLETE_ATTR


def zarr_in(path, data, chunks):
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, overwrite=True)
    arr[...] = data
    return arr


@pytest.fixture
def here(elsewhere, tmp_path, monkeypatch):
    """The client's working folder (``tmp_path``), different from the workers' (``elsewhere.home``)."""
    monkeypatch.chdir(tmp_path)
    assert os.path.realpath(tmp_path) != os.path.realpath(elsewhere.home)
    return tmp_path


@pytest.fixture
def decoys(elsewhere, rng):
    """``decoy(name, shape, chunks)``: an array of that name, with other data, in the workers' folder."""
    made = []

    def decoy(name, shape, chunks):
        zarr_in(elsewhere.home / name, randn(rng, shape), chunks)
        made.append(elsewhere.home / name)

    yield decoy
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def ab(here, decoys, rng):
    """``a.zarr`` (96 x 64) and ``b.zarr`` (64 x 80) in the client's folder, decoys of both in the workers'."""
    A, B = randn(rng, (96, 64)), randn(rng, (64, 80))
    zarr_in(here / "a.zarr", A, (32, 32))
    zarr_in(here / "b.zarr", B, (32, 40))
    decoys("a.zarr", A.shape, (32, 32))
    decoys("b.zarr", B.shape, (32, 40))
    return A, B


def test_relative_inputs_and_out_are_the_clients(ab, here, elsewhere):
    """Case 1: relative a, b and out all resolve in the client's folder; metadata and chunks land there."""
    A, B = ab
    out = dgemm.matmul("a.zarr", "b.zarr", out="c.zarr", client=elsewhere.client, block=32)
    stored = zarr.open_array(str(here / "c.zarr"), mode="r")
    check_product(stored[...], A, B, dtype="float64", what="c.zarr in the client's folder")
    assert stored.attrs[COMPLETE_ATTR]["complete"]
    assert stored.nchunks_initialized == stored.nchunks          # every chunk is here, none elsewhere
    assert not (elsewhere.home / "c.zarr").exists()
    assert os.path.isabs(str(out.store.root))


def test_relative_zarr_arrays_and_a_lazy_result(ab, here, elsewhere, decoys, rng):
    """zarr.open_array with relative paths, a relative c, and the lazy result computed on the workers."""
    A, B = ab
    C = randn(rng, (96, 80))
    zarr_in(here / "c0.zarr", C, (32, 40))
    decoys("c0.zarr", C.shape, (32, 40))
    za, zb = zarr.open_array("a.zarr", mode="r"), zarr.open_array("b.zarr", mode="r")
    lazy = dgemm.gemm(za, zb, c="c0.zarr", alpha=0.5, beta=-1.0, client=elsewhere.client, block=32)
    got = elsewhere.client.compute(lazy).result()
    check_product(got, A, B, alpha=0.5, beta=-1.0, c=C, dtype="float64")


def test_dask_arrays_over_relative_zarr_arrays(ab, here, elsewhere):
    """da.from_zarr over a relatively opened array: read whole (as Zarr), or computed from (a cast)."""
    A, B = ab
    plain = da.from_zarr(zarr.open_array("a.zarr", mode="r"))
    cast = da.from_zarr(zarr.open_array("b.zarr", mode="r")).astype("float32")
    lazy = dgemm.matmul(plain, cast, client=elsewhere.client, block=32)
    check_product(elsewhere.client.compute(lazy).result(), A, B.astype("float32"), dtype="float64")


@pytest.mark.parametrize("spelling", ["relative", "file-url", "symlink", "fsspec-store"])
def test_out_is_c_in_place_however_spelt(here, elsewhere, decoys, rng, spelling):
    """Case 6: out naming c by another spelling updates c in place (nothing erased before it is read)."""
    from zarr.storage import FsspecStore

    A, B, C = randn(rng, (64, 48)), randn(rng, (48, 40)), randn(rng, (64, 40))
    zarr_in(here / "c.zarr", C, (32, 40))
    decoys("c.zarr", C.shape, (32, 40))
    os.symlink(here / "c.zarr", here / "link.zarr")
    out = {"relative": "c.zarr", "file-url": f"file://{here}/c.zarr", "symlink": str(here / "link.zarr"),
           "fsspec-store": FsspecStore.from_url(f"file://{here}/c.zarr")}[spelling]
    c = "c.zarr" if spelling != "relative" else str(here / "c.zarr")
    got = dgemm.gemm(A, B, c=c, beta=2.0, out=out, client=elsewhere.client, block=32)
    assert got.chunks == (32, 40)                       # c itself, not a re-created array
    after = zarr.open_array(str(here / "c.zarr"), mode="r")
    check_product(after[...], A, B, beta=2.0, c=C, dtype="float64")
    assert after.attrs[COMPLETE_ATTR]["complete"]


def test_cli_with_relative_paths(ab, here, elsewhere):
    """Case 1: ``dgemm matmul a.zarr b.zarr c.zarr --scheduler ...`` run in the client's folder."""
    A, B = ab
    r = subprocess.run([sys.executable, "-m", "dgemm", "matmul", "a.zarr", "b.zarr", "c.zarr", "--scheduler",
                        elsewhere.client.scheduler.address, "--no-progress", "--block", "32"],
                       cwd=here, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    stored = zarr.open_array(str(here / "c.zarr"), mode="r")
    check_product(stored[...], A, B, dtype="float64", what="the CLI's relative c.zarr")
    assert stored.nchunks_initialized == stored.nchunks
    assert not (elsewhere.home / "c.zarr").exists()


# -- overwrite never deletes what is not Zarr, nor a folder holding the inputs --------------------
@pytest.fixture
def data_folder(here, rng):
    """``data/`` with the two inputs and a file of the user's."""
    (here / "data").mkdir()
    zarr_in(here / "data" / "a.zarr", randn(rng, (40, 30)), (20, 30))
    zarr_in(here / "data" / "b.zarr", randn(rng, (30, 20)), (30, 20))
    (here / "data" / "notes.txt").write_text("mine")
    return here / "data"


def _intact(data):
    assert (data / "notes.txt").read_text() == "mine"
    assert zarr.open_array(str(data / "a.zarr"), mode="r").shape == (40, 30)
    assert zarr.open_array(str(data / "b.zarr"), mode="r").shape == (30, 20)


def test_cli_overwrite_never_deletes_the_inputs_folder(data_folder, monkeypatch):
    """Case 5: ``dgemm matmul data/a.zarr data/b.zarr data --overwrite`` is refused before any work."""
    def refuse(*args, **kwargs):
        raise AssertionError("a local cluster was started before the arguments were checked")
    monkeypatch.setattr(dgemm.cluster, "local_client", refuse)
    monkeypatch.setattr(dgemm.cluster.local, "local_client", refuse)
    r = CliRunner().invoke(cli, ["matmul", "data/a.zarr", "data/b.zarr", "data", "--overwrite", "--no-progress"])
    assert r.exit_code == 2, r.output
    assert "holds the input a" in r.output and "Traceback" not in r.output
    _intact(data_folder)


@pytest.mark.parametrize("out", ["data", "data/", "./data/../data", "file://{here}/data"])
def test_api_overwrite_never_deletes_the_inputs_folder(data_folder, here, no_client, out):
    """Case 5, the API: the folder holding both inputs is never out, however it is spelt."""
    with pytest.raises(ValueError, match="holds the input a"):
        dgemm.matmul("data/a.zarr", "data/b.zarr", out=out.format(here=here), overwrite=True, client=no_client)
    _intact(data_folder)

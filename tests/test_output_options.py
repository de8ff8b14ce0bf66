"""Outputs as Zarr and dask users write them: layout options, C's default chunks, lazy slices, a clean finish.

``chunks=``, ``shards=``, ``zarr_format=``, ``dimension_names=`` and
``attributes=`` are taken as :func:`zarr.create_array` takes them, checked
before any work, and recorded as zarr records them (the reference is an
array zarr itself creates with the same options).  Without ``chunks=``, C is
chunked as :func:`dask.array.matmul` chunks it wherever the blocks hold
whole such chunks.  A slice of a lazy result computes only the blocks it
touches (counted on the real workers).  A finished output keeps nothing
under ``.dgemm/``; an unfinished one keeps what ``resume`` needs.  The
products run on the session's worker processes (PoCL on a CPU host).
"""
from __future__ import annotations

import json

import dask.array as da
import numpy as np
import pytest
import zarr

import dgemm
from _check import check_product, randn
from dgemm.storage import COMPLETE_ATTR, BlockMarkers


def zarr_in(path, x, chunks, **kw):
    arr = zarr.create_array(str(path), shape=x.shape, chunks=chunks, dtype=x.dtype, **kw)
    arr[...] = x
    return arr


def metadata(path, name="zarr.json") -> dict:
    """An array's metadata document as stored, without dgemm's own attribute."""
    doc = json.loads((path / name).read_text())
    doc.get("attributes", {}).pop(COMPLETE_ATTR, None)
    return doc


def dgemm_files(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if ".dgemm" in p.parts)


# -- recorded as zarr records them ------------------------------------------------
def test_layout_options_are_recorded_as_zarr_records_them(client, tmp_path, rng):
    """chunks, shards, dimension_names and attributes: the output's zarr.json is zarr's own for them."""
    A, B = randn(rng, (200, 96)), randn(rng, (96, 150))
    a, b = zarr_in(tmp_path / "a.zarr", A, (64, 32)), zarr_in(tmp_path / "b.zarr", B, (32, 64))
    options = dict(chunks=(25, 30), shards=(50, 60), dimension_names=("row", "col"),
                   attributes={"units": "m", "history": ["made by a test", 1]})
    out = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=64, **options)
    check_product(out[...], A, B, dtype="float64")
    got = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")
    assert got.chunks == (25, 30) and got.shards == (50, 60)
    assert got.metadata.dimension_names == ("row", "col")
    assert {k: v for k, v in got.attrs.items() if k != COMPLETE_ATTR} == options["attributes"]
    zarr.create_array(str(tmp_path / "ref.zarr"), shape=(200, 150), dtype="float64", fill_value=0, **options)
    assert metadata(tmp_path / "c.zarr") == metadata(tmp_path / "ref.zarr")
    # the blocks are whole shards, as large as the block asked for allows
    block = got.attrs[COMPLETE_ATTR]["run"]["block"]
    assert block == [50, 60], block


def test_zarr_format_2(client, tmp_path, rng):
    """zarr_format=2 with chunks and attributes: a v2 array (.zarray, .zattrs) as zarr writes one."""
    A, B = randn(rng, (120, 80)), randn(rng, (80, 70), "float32")
    a, b = zarr_in(tmp_path / "a.zarr", A, (40, 40)), zarr_in(tmp_path / "b.zarr", B, (40, 40))
    out = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, chunks=(60, 35), zarr_format=2,
                       attributes={"source": "test"})
    check_product(out[...], A, B, dtype="float64")
    got = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")
    assert got.metadata.zarr_format == 2 and got.chunks == (60, 35)
    assert got.attrs["source"] == "test" and got.attrs[COMPLETE_ATTR]["complete"] is True
    zarr.create_array(str(tmp_path / "ref.zarr"), shape=(120, 70), chunks=(60, 35), dtype="float64",
                      fill_value=0, zarr_format=2)
    assert metadata(tmp_path / "c.zarr", ".zarray") == metadata(tmp_path / "ref.zarr", ".zarray")


def test_gemm_takes_them_too_and_a_vector_product_has_its_own_dimensions(client, tmp_path, rng):
    A, B, x = randn(rng, (90, 70)), randn(rng, (60, 70)), randn(rng, (70,))
    a = zarr_in(tmp_path / "a.zarr", A, (30, 35))
    out = dgemm.gemm(a, B, trans_b=True, out=str(tmp_path / "c.zarr"), client=client, chunks=(45, 20),
                     dimension_names=("i", None))
    check_product(out[...], A, B, trans_b=True, dtype="float64")
    assert out.chunks == (45, 20) and out.metadata.dimension_names == ("i", None)
    v = dgemm.matmul(a, x, out=str(tmp_path / "v.zarr"), client=client, chunks=30, dimension_names=("i",))
    np.testing.assert_allclose(v[...], A @ x, rtol=1e-12, atol=1e-12)
    assert v.chunks == (30,) and v.metadata.dimension_names == ("i",)


@pytest.mark.parametrize("options, error, match", [
    (dict(chunks=(0, 10)), ValueError, r"chunks=\(0, 10\).*positive int"),
    (dict(chunks=(10, 10, 10)), ValueError, r"chunks=.*has 3 sizes, but the output has 2"),
    (dict(chunks=(10.0, 10)), ValueError, r"chunks="),
    (dict(chunks="auto"), ValueError, r"chunks='auto'"),
    (dict(shards=(20, 20)), ValueError, r"shards=.*needs chunks="),
    (dict(chunks=(10, 10), shards=(25, 20)), ValueError, r"shards=\(25, 20\) are not multiples of chunks=\(10, 10\)"),
    (dict(chunks=(10, 10), shards=(20, 20), zarr_format=2), ValueError, r"shards=.*needs zarr_format=3"),
    (dict(zarr_format=4), ValueError, r"zarr_format=4: give 2 or 3"),
    (dict(zarr_format=True), ValueError, r"zarr_format=True"),
    (dict(dimension_names=("x",)), ValueError, r"dimension_names=.*each of the output's 2 dimension"),
    (dict(dimension_names="xy"), ValueError, r"dimension_names='xy'"),
    (dict(dimension_names=("x", 1)), ValueError, r"dimension_names="),
    (dict(dimension_names=("x", "y"), zarr_format=2), ValueError, r"dimension_names=.*needs zarr_format=3"),
    (dict(attributes={COMPLETE_ATTR: 1}), ValueError, r"attributes: the key 'dgemm' is dgemm's own"),
    (dict(attributes={"s": {1, 2}}), TypeError, r"attributes cannot be stored"),
    (dict(attributes=[("a", 1)]), TypeError, r"attributes must be a mapping"),
    (dict(zarr_format=2, compressors=zarr.codecs.ZstdCodec()), ValueError,
     r"compressors=.*Zarr v2 array"),
])
def test_bad_options_are_refused_before_any_work(tmp_path, rng, no_client, options, error, match):
    a, b = zarr_in(tmp_path / "a.zarr", randn(rng, (40, 30)), (10, 10)), randn(rng, (30, 20))
    with pytest.raises(error, match=match):
        dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=no_client, **options)
    assert not (tmp_path / "c.zarr").exists()


def test_options_apply_to_a_new_out_only(tmp_path, rng, no_client):
    a, b = zarr_in(tmp_path / "a.zarr", randn(rng, (40, 30)), (10, 10)), randn(rng, (30, 20))
    with pytest.raises(ValueError, match=r"chunks= applies to a Zarr out; a lazy result"):
        dgemm.matmul(a, b, chunks=(10, 10), client=no_client)
    existing = zarr.create_array(str(tmp_path / "c.zarr"), shape=(40, 20), chunks=(20, 20), dtype="float64")
    with pytest.raises(ValueError, match=r"zarr_format=, attributes= applies to a new out; the existing array"):
        dgemm.matmul(a, b, out=existing, client=no_client, zarr_format=3, attributes={"x": 1})


def test_dimension_names_with_dataarrays_must_be_their_dims(tmp_path, rng, no_client):
    xr = pytest.importorskip("xarray")
    a = xr.DataArray(randn(rng, (4, 3)), dims=("i", "k"))
    b = xr.DataArray(randn(rng, (3, 5)), dims=("k", "j"))
    with pytest.raises(ValueError, match=r"dimension_names=\('x', 'y'\), but the DataArray operands give .*'i', 'j'"):
        dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=no_client, dimension_names=("x", "y"))


# -- C's chunks when none are given -------------------------------------------------
def test_default_chunks_follow_the_inputs_as_dask_matmul(client, tmp_path, rng):
    """Rows as a's chunks, columns as b's (op(a), op(b)), as dask.array.matmul chunks its result."""
    A, B = randn(rng, (200, 96)), randn(rng, (96, 150))
    a, b = zarr_in(tmp_path / "a.zarr", A, (40, 32)), zarr_in(tmp_path / "b.zarr", B, (32, 50))
    out = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client)
    check_product(out[...], A, B, dtype="float64")
    expected = da.matmul(da.from_zarr(a), da.from_zarr(b)).chunksize
    assert out.chunks == expected == (40, 50)
    # blocks larger than the chunks (block=128): still the inputs' chunks, each block writing whole ones
    a2, b2 = zarr_in(tmp_path / "a2.zarr", A, (32, 32)), zarr_in(tmp_path / "b2.zarr", B, (32, 64))
    out = dgemm.matmul(a2, b2, out=str(tmp_path / "c2.zarr"), client=client, block=128)
    check_product(out[...], A, B, dtype="float64")
    assert out.chunks == (32, 64) and out.attrs[COMPLETE_ATTR]["run"]["block"] == [128, 128]
    # transposed: op(a)'s rows are a's columns
    At = randn(rng, (96, 200))
    at = zarr_in(tmp_path / "at.zarr", At, (48, 25))
    out = dgemm.gemm(at, b, trans_a=True, out=str(tmp_path / "c3.zarr"), client=client)
    check_product(out[...], At, B, trans_a=True, dtype="float64")
    assert out.chunks == (25, 50)


def test_default_chunks_where_the_blocks_need_otherwise(client, tmp_path, rng):
    """Chunks larger than the blocks, and numpy operands (no chunks): C's chunks are the blocks."""
    A, B = randn(rng, (200, 96)), randn(rng, (96, 150))
    a = zarr_in(tmp_path / "a.zarr", A, (128, 32))
    out = dgemm.matmul(a, B, out=str(tmp_path / "c.zarr"), client=client, block=64)
    check_product(out[...], A, B, dtype="float64")
    assert out.chunks == (64, 64)


# -- lazy slices compute only what they touch ---------------------------------------------
def _flops(client) -> float:
    return sum(client.run(lambda dask_worker: dask_worker.plugins["dgemm"].state.totals()["flops"]).values())


def test_a_slice_of_a_lazy_result_computes_only_the_blocks_it_touches(client, tmp_path, rng):
    """At 1536² (the CPU plan's blocks are 1024²), lazy[:10, :10] runs one 256² block: its flops, no more."""
    A, B = randn(rng, (1536, 64)), randn(rng, (64, 1536))
    a, b = zarr_in(tmp_path / "a.zarr", A, (256, 64)), zarr_in(tmp_path / "b.zarr", B, (64, 256))
    lazy = dgemm.matmul(a, b, client=client)
    before = _flops(client)
    got = client.compute(lazy[:10, 300:310], sync=True)
    np.testing.assert_allclose(got, A[:10] @ B[:, 300:310], rtol=1e-12, atol=1e-12)
    assert _flops(client) - before == 2 * 256 * 256 * 64      # the one block (0, 1)
    before = _flops(client)
    got = client.compute(lazy[250:260, :10], sync=True)       # rows of two blocks
    np.testing.assert_allclose(got, A[250:260] @ B[:, :10], rtol=1e-12, atol=1e-12)
    assert _flops(client) - before == 2 * 2 * 256 * 256 * 64
    assert lazy.chunks == ((256,) * 6, (256,) * 6)     # as dask.array.matmul chunks it


def test_a_lazy_slice_under_dask_local_scheduler_culls_to_its_blocks(tmp_path, rng):
    """No cluster: the collection's graph keeps one GEMM task for a slice inside one chunk."""
    A, B = randn(rng, (1536, 64)), randn(rng, (64, 1536))
    a, b = zarr_in(tmp_path / "a.zarr", A, (256, 64)), zarr_in(tmp_path / "b.zarr", B, (64, 256))
    lazy = dgemm.matmul(str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"))
    part = lazy[:10, :10]
    graph = part.__dask_optimize__(part.__dask_graph__(), part.__dask_keys__())
    gemm = [k for k in dict(graph) if str(k[0] if isinstance(k, tuple) else k).startswith("dgemm-gemm")]
    assert len(gemm) == 1, gemm
    assert lazy.chunks == ((256,) * 6, (256,) * 6)
    np.testing.assert_allclose(part.compute(scheduler="sync"), A[:10] @ B[:, :10], rtol=1e-12, atol=1e-12)


# -- a finished output is as clean as to_zarr leaves one ------------------------------------------
def test_a_finished_output_keeps_no_records_and_resume_keeps_them_until_done(client, tmp_path, rng):
    """Interrupted: its markers stay for resume; resumed to the end: nothing under .dgemm, only the attribute.

    Its blocks (64) hold two of its chunks (32, the inputs'): resume plans with the blocks the run recorded.
    """
    A, B = randn(rng, (128, 64)), randn(rng, (64, 96))
    a = zarr_in(tmp_path / "a.zarr", A, (32, 64), compressors=None)
    b = zarr_in(tmp_path / "b.zarr", B, (64, 32))
    out = tmp_path / "c.zarr"
    chunk = tmp_path / "a.zarr" / "c" / "3" / "0"
    good = chunk.read_bytes()
    chunk.write_bytes(b"broken")
    with pytest.raises(OSError, match=r"chunk \(3, 0\)"):
        dgemm.matmul(a, b, out=str(out), client=client, block=64, attributes={"kept": True})
    chunk.write_bytes(good)
    c = zarr.open_array(str(out), mode="r")
    owner = c.attrs[COMPLETE_ATTR]["owner"]
    assert c.chunks == (32, 32) and c.attrs[COMPLETE_ATTR]["run"]["block"] == [64, 64]
    done = BlockMarkers(c, owner).done()
    # (the blocks stored before the broken chunk failed the run depend on the order the workers took them:
    # none may have been; each that was has its marker, and nothing else of dgemm's is left)
    assert all(f.startswith(f".dgemm/done/{owner}/") or f in (".dgemm", ".dgemm/done", f".dgemm/done/{owner}")
               for f in dgemm_files(out)), dgemm_files(out)
    assert len(done) == len([f for f in dgemm_files(out) if f.startswith(f".dgemm/done/{owner}/")])
    foreign = out / ".dgemm" / "done" / owner / "notes.txt"   # not dgemm's: stays
    foreign.parent.mkdir(parents=True, exist_ok=True)
    foreign.write_text("mine")
    with pytest.raises(ValueError, match=r"cannot resume: .*attributes=\{'kept': False\} \(out has"):
        dgemm.matmul(a, b, out=str(out), client=client, resume=True, attributes={"kept": False})
    result = dgemm.matmul(a, b, out=str(out), client=client, resume=True, attributes={"kept": True})
    meta = result.attrs[COMPLETE_ATTR]
    assert meta["complete"] and meta["resumed"] and meta["blocks_run"] == 4 - len(done)
    check_product(dgemm.open_result(str(out))[...], A, B, dtype="float64")
    assert result.attrs["kept"] is True
    assert dgemm_files(out) == [".dgemm", ".dgemm/done", f".dgemm/done/{owner}", f".dgemm/done/{owner}/notes.txt"]
    foreign.unlink()
    # a fresh run over it (overwrite) finishes with nothing under .dgemm at all, as to_zarr leaves an array
    result = dgemm.matmul(a, b, out=str(out), client=client, overwrite=True)
    assert dgemm_files(out) == [] and dgemm.open_result(str(out)).attrs[COMPLETE_ATTR]["complete"] is True
    again = dgemm.matmul(a, b, out=str(out), client=client, resume=True)   # complete: nothing to do
    assert again.attrs[COMPLETE_ATTR]["blocks_run"] == result.attrs[COMPLETE_ATTR]["blocks_run"]

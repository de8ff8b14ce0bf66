"""dgemm.storage.locations: where an array lives, however the user spelt it.

Equality ("the same array"), containment ("this folder holds that input"),
absolutising (nothing relative reaches a worker, which has a working folder
of its own) and the refusals of what no worker can reach.  No cluster: what
workers see is imitated by pickling in one folder and unpickling in another.
"""
from __future__ import annotations

import os
import pickle
import sys

import dask.array as da
import numpy as np
import pytest
import zarr
from zarr.storage import FsspecStore, LocalStore, MemoryStore, ZipStore

from dgemm.storage.locations import (Location, absolute, check_protocol, check_readable, local_path, locate,
                                     plain_zarr, same, sources, zarr_arrays)


def zarr_in(path, data, chunks=None, **kw):
    arr = zarr.create_array(store=path, shape=data.shape, chunks=chunks or data.shape, dtype=data.dtype, **kw)
    arr[...] = data
    return arr


@pytest.fixture
def here(tmp_path, monkeypatch):
    """The working folder is ``tmp_path/here``; ``tmp_path/there`` is another (a worker's)."""
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    return tmp_path / "here"


def in_another_folder(x, folder, monkeypatch):
    """``x`` as a worker in ``folder`` gets it: pickled here, unpickled there."""
    blob = pickle.dumps(x)
    monkeypatch.chdir(folder)
    return pickle.loads(blob)


# -- the same array, however spelt ----------------------------------------------------
def test_every_spelling_of_a_local_array_is_one_location(here, rng):
    z = zarr_in("a.zarr", rng.standard_normal((4, 3)))
    os.symlink(here / "a.zarr", here / "link.zarr")
    real = Location("file", os.path.realpath(here / "a.zarr"))
    spellings = {
        "relative": "a.zarr", "dot": "./sub/../a.zarr/", "absolute": str(here / "a.zarr"),
        "pathlike": here / "a.zarr", "file-url": f"file://{here}/a.zarr", "local-url": f"local://{here}/a.zarr",
        "symlink": str(here / "link.zarr"), "array": z, "array-read-relative": zarr.open_array("a.zarr", mode="r"),
        "array-by-url": zarr.open_array(f"file://{here}/a.zarr", mode="r"),
        "local-store-relative": LocalStore("a.zarr"), "fsspec-store": FsspecStore.from_url(f"file://{here}/a.zarr"),
        "dask": da.from_zarr(zarr.open_array("a.zarr", mode="r")),
    }
    for name, x in spellings.items():
        got = sources(x) if name == "dask" else [locate(x)]
        assert got == [real], name
    assert same("a.zarr", f"file://{here}/link.zarr")
    assert not same("a.zarr", "b.zarr") and not same("a.zarr", np.zeros(2)) and locate(3) is None


def test_arrays_inside_groups_and_zips(here, rng):
    g = zarr.open_group("g.zarr", mode="w")
    x = g.create_array("sub/x", shape=(2, 2), dtype="f4")
    assert locate(x) == locate("g.zarr/sub/x") == Location("file", os.path.realpath(here / "g.zarr/sub/x"))
    assert locate("g.zarr").contains(locate(x)) and not locate(x).contains(locate("g.zarr"))
    with ZipStore("z.zip", mode="w") as zs:
        zarr_in(zs, np.ones((2, 2)))
    zipped = zarr.open_array(ZipStore("z.zip", mode="r"), mode="r")
    assert locate(zipped) == Location("file", os.path.realpath(here / "z.zip"))
    assert locate(".").contains(locate(zipped))


def test_remote_urls_are_protocol_bucket_and_path():
    assert locate("s3://bucket/x.zarr/") == locate("s3a://bucket/x.zarr") == Location("s3", "bucket/x.zarr")
    assert locate("s3://bucket/x.zarr").url == "s3://bucket/x.zarr"
    assert locate("simplecache::s3://bucket/x.zarr") == Location("s3", "bucket/x.zarr")
    assert not same("s3://bucket/x.zarr", "s3://other/x.zarr")
    assert Location("s3", "bucket/d").contains(locate("s3://bucket/d/a.zarr"))
    assert not Location("s3", "bucket/d").contains(locate("s3://bucket/d2/a.zarr"))
    assert not Location("s3", "bucket/d").contains(Location("gs", "bucket/d/a.zarr"))
    assert locate("https://host/data/x.zarr/") == Location("https", "host/data/x.zarr")


def test_process_local_stores():
    mem = MemoryStore()
    z = zarr_in(mem, np.ones((2, 2)))
    assert locate(z).process_local and locate(mem) == locate(z)
    assert locate(zarr_in(MemoryStore(), np.ones((2, 2)))) != locate(z)      # another store, another place
    url = zarr.open_array("memory://h1/loc", mode="w", shape=(2,), dtype="f4")
    assert locate(url) == locate("memory://h1/loc") == Location("memory", "/h1/loc")
    assert locate(url).process_local and locate(FsspecStore.from_url("memory://h1/loc")).process_local
    assert not locate("s3://b/k").process_local and not locate("/tmp/x").process_local


# -- nothing relative reaches a worker ----------------------------------------------------
def test_absolute_paths_and_urls(here):
    assert absolute("a.zarr") == str(here / "a.zarr")
    assert absolute(here / "a.zarr") == str(here / "a.zarr")
    assert absolute(f"file://{here}/a.zarr") == str(here / "a.zarr")
    assert absolute("s3://bucket/a.zarr") == "s3://bucket/a.zarr"
    assert local_path("a.zarr") == str(here / "a.zarr") and local_path("gs://b/a.zarr") is None
    x = np.ones(2)
    assert absolute(x) is x


def test_absolute_stores_keep_their_mode(here, monkeypatch):
    for read_only in (True, False):
        s = absolute(LocalStore("a.zarr", read_only=read_only))
        assert isinstance(s, LocalStore) and str(s.root) == str(here / "a.zarr") and s.read_only == read_only
    already = LocalStore(str(here / "a.zarr"))
    assert absolute(already) is already
    z = absolute(ZipStore("z.zip", mode="w"))
    assert str(z.path) == str(here / "z.zip") and z._zmode == "w" and not z.read_only
    local = absolute(FsspecStore.from_url(f"file://{here}/a.zarr", read_only=True))
    assert isinstance(local, LocalStore) and local.read_only and str(local.root) == str(here / "a.zarr")
    remote = FsspecStore.from_url("memory://h1/abs")
    assert absolute(remote) is remote


def test_a_relative_array_reads_the_same_data_in_another_folder(here, rng, monkeypatch):
    data = rng.standard_normal((6, 4))
    zarr_in("a.zarr", data, (3, 4))
    zarr_in(here.parent / "there" / "a.zarr", rng.standard_normal((6, 4)), (3, 4))     # a decoy
    for mode in ("r", "r+"):
        monkeypatch.chdir(here)
        z = absolute(zarr.open_array("a.zarr", mode=mode))
        assert z.read_only == (mode == "r") and os.path.isabs(str(z.store.root))
        np.testing.assert_array_equal(in_another_folder(z, here.parent / "there", monkeypatch)[...], data)
    monkeypatch.chdir(here)
    new = absolute(zarr.create_array("b.zarr", shape=(2,), dtype="f4", config={"write_empty_chunks": True}))
    assert new._async_array.config.write_empty_chunks        # the array's settings are kept


@pytest.mark.parametrize("inline", [False, True])
def test_dask_graphs_over_relative_arrays(here, rng, monkeypatch, inline):
    data = rng.standard_normal((6, 4))
    zarr_in("a.zarr", data, (3, 4))
    zarr_in(here.parent / "there" / "a.zarr", rng.standard_normal((6, 4)), (3, 4))     # a decoy
    z = zarr.open_array("a.zarr", mode="r")
    plain = da.from_zarr(z, inline_array=inline)
    assert plain_zarr(plain) is z and zarr_arrays(plain) == [z]
    cast = plain.astype("f4") * 2
    assert plain_zarr(cast) is None and plain_zarr(plain[:3]) is None and zarr_arrays(cast) == [z]
    fixed = absolute(cast)
    assert fixed.name == cast.name and all(os.path.isabs(str(a.store.root)) for a in zarr_arrays(fixed))
    got = in_another_folder(fixed, here.parent / "there", monkeypatch).compute(scheduler="sync")
    np.testing.assert_array_equal(got, (data.astype("f4") * 2))
    other = da.ones((2, 2))
    assert absolute(other) is other and plain_zarr(other) is None and sources(other) == []


# -- what the workers cannot reach ------------------------------------------------------
def test_unknown_protocols_and_missing_packages(monkeypatch):
    registry = sys.modules["fsspec.registry"]   # (fsspec.registry is also the name of a mapping)
    with pytest.raises(ValueError, match=r"a \('nosuch://b/a.zarr'\): fsspec knows no protocol 'nosuch'"):
        check_protocol("nosuch://b/a.zarr", "a")
    monkeypatch.delitem(registry._registry, "s3", raising=False)
    monkeypatch.setitem(sys.modules, "s3fs", None)                    # as if s3fs were not installed
    with pytest.raises(ImportError, match=r"out \('s3://b/c.zarr'\): the s3:// protocol needs a package .*s3fs"):
        check_protocol("s3://b/c.zarr", "out")
    with pytest.raises(ImportError, match="s3fs"):
        check_protocol("simplecache::s3://b/c.zarr", "a")
    check_protocol("a.zarr", "a")
    check_protocol(f"file://{os.getcwd()}/a.zarr", "a")
    check_protocol("memory://x", "a")


def test_process_local_inputs_are_refused_naming_the_fix():
    mem = zarr_in(MemoryStore(), np.ones((2, 2)))
    url = zarr.open_array("memory://h1/in", mode="w", shape=(2, 2), dtype="f8")
    cases = {"a": mem, "b": "memory://h1/in", "c": url, "x": FsspecStore.from_url("memory://h1/in"),
             "y": da.from_zarr(url) + 1}
    for what, x in cases.items():
        with pytest.raises(ValueError, match=rf"{what} is stored in .*in-memory.* exists only in this process.*"
                                             rf"np\.asarray"):
            check_readable(x, what)
    check_readable(da.from_zarr(mem) + 1, "a")     # dask ships a MemoryStore with its data: dask's business
    check_readable("s3://bucket/a.zarr", "a")

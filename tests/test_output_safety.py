"""Issue 26: what ``overwrite=True``, ``resume=True`` and the request checks may touch, on real files.

* An output folder that also holds the user's files is never replaced with them.
* An output that is a symbolic link keeps its link, and nothing of the user's behind it goes.
* An unfinished dgemm output is refused as an input however it is spelt.
* A run that failed on a full disk gives its lease up: ``resume=True`` goes on at once.
* Paths that cannot be created are refused before any cluster is started.
"""
from __future__ import annotations

import errno
import json
import os

import dask.array as da
import numpy as np
import pytest
import zarr

import dgemm
import dgemm.client.steps
from _check import check_product, randn, wait_for
from dgemm.storage import COMPLETE_ATTR, keys, lease


def zarr_in(path, data, chunks):
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, overwrite=True)
    arr[...] = data
    return arr


def finished_output(client, path, rng, shape=(64, 64)):
    """A complete dgemm output at ``path`` (2 x 2 chunks of 32)."""
    A, B = randn(rng, (shape[0], 32)), randn(rng, (32, shape[1]))
    return dgemm.matmul(A, B, out=str(path), client=client, block=32)


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail the test if the call reaches for a cluster (dgemm starts its local one there)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the call reached for a cluster before refusing")

    monkeypatch.setattr(dgemm.client.steps, "get_client", refuse)


def tree(path) -> list[str]:
    """Every file, link and folder under ``path``, relative, sorted (links not followed)."""
    out = []
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            out.append(os.path.relpath(os.path.join(top, name), path))
    return sorted(out)


# -- 1. overwrite never deletes the user's files -------------------------------------------------
@pytest.mark.parametrize("kind", ["array", "group"])
def test_overwrite_refuses_a_zarr_folder_that_also_holds_the_users_files(tmp_path, no_cluster, kind):
    """A Zarr array (or group) folder with a notes file and a folder of pictures: refused, all of it kept."""
    out = tmp_path / "c.zarr"
    if kind == "array":
        zarr_in(out, np.ones((4, 5), "f4"), (2, 5))
    else:
        g = zarr.open_group(str(out), mode="w")
        g.create_array("x", shape=(3,), dtype="f4")[...] = 1
    (out / "notes.txt").write_text("my notes")
    (out / "pictures").mkdir()
    for i in range(7):
        (out / "pictures" / f"p{i}.png").write_bytes(b"png")
    before = tree(out)
    with pytest.raises(FileExistsError, match=r"holds 8 file\(s\) or folder\(s\) that neither Zarr nor dgemm "
                                              r"wrote \('notes.txt', 'pictures/p0.png'.* and 3 more\)"):
        dgemm.matmul(np.ones((4, 3), "f4"), np.ones((3, 5), "f4"), out=str(out), overwrite=True)
    assert tree(out) == before
    assert (out / "notes.txt").read_text() == "my notes"


def test_overwrite_refuses_a_file_saved_there_while_the_cluster_started(client, tmp_path, rng, monkeypatch):
    """Checked again just before anything is deleted: a notes file saved after the call's checks is kept."""
    out = tmp_path / "c.zarr"
    finished_output(client, out, rng)
    real_plan = dgemm.client.steps._plan

    def plan_while_the_user_saves_a_file(*args, **kwargs):
        (out / "notes.txt").write_text("saved meanwhile")
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(dgemm.client.steps, "_plan", plan_while_the_user_saves_a_file)
    before = tree(out)
    with pytest.raises(FileExistsError, match=r"holds 1 file.*'notes.txt'"):
        dgemm.matmul(randn(rng, (64, 8)), randn(rng, (8, 64)), out=str(out), client=client, overwrite=True,
                     block=32)
    assert tree(out) == sorted(before + ["notes.txt"])
    assert dgemm.open_result(str(out)).shape == (64, 64)   # the old output, untouched and complete


def test_overwrite_refuses_a_file_among_the_chunks(tmp_path, no_cluster):
    """A file in the chunk folder that is no chunk key of the array is the user's too; a link is never Zarr's."""
    out = tmp_path / "c.zarr"
    zarr_in(out, np.ones((4, 5), "f4"), (2, 5))
    (out / "c" / "README").write_text("mine")
    os.symlink(tmp_path, out / "elsewhere")
    with pytest.raises(FileExistsError, match=r"holds 2 file.*'c/README', 'elsewhere'"):
        dgemm.matmul(np.ones((4, 3), "f4"), np.ones((3, 5), "f4"), out=str(out), overwrite=True)
    assert (out / "c" / "README").exists() and (out / "elsewhere").is_symlink()


def test_overwrite_replaces_what_zarr_and_dgemm_wrote(client, tmp_path, rng):
    """An earlier dgemm output (chunks, metadata, markers) and an empty chunk folder are replaced, as before."""
    out = tmp_path / "c.zarr"
    finished_output(client, out, rng)
    (out / "c" / "9").mkdir()            # a chunk folder left empty
    A, B = randn(rng, (64, 16)), randn(rng, (16, 64))
    c = dgemm.matmul(A, B, out=str(out), client=client, overwrite=True, block=32)
    check_product(c[...], A, B, dtype="float64")


def test_overwrite_refuses_an_object_store_output_holding_the_users_files(s3, no_cluster):
    """The same refusal for a URL: every key under it is listed, and a notes key is the user's."""
    url = s3.url("safety/c.zarr")
    z = zarr.create_array(store=url, shape=(4, 5), chunks=(2, 5), dtype="f4", storage_options=s3.storage_options)
    z[...] = 1
    fs = s3.fs()
    fs.pipe(url.replace("s3://", "") + "/notes.txt", b"mine")
    with pytest.raises(FileExistsError, match=r"holds 1 file.*'notes.txt'"):
        dgemm.matmul(np.ones((4, 3), "f4"), np.ones((3, 5), "f4"), out=url, overwrite=True,
                     storage_options=s3.storage_options)
    assert fs.cat(url.replace("s3://", "") + "/notes.txt") == b"mine"
    assert fs.exists(url.replace("s3://", "") + "/c/0/0")


# -- 2. a symbolic link as the output ---------------------------------------------------------
@pytest.mark.parametrize("spelling", ["path", "store"])
def test_overwrite_through_a_symbolic_link_keeps_the_link_and_replaces_inside(client, tmp_path, rng, spelling):
    """``out`` a link to an output elsewhere: its Zarr data is replaced there, the link stays, and works."""
    from zarr.storage import LocalStore

    real = tmp_path / "disk" / "c.zarr"
    real.parent.mkdir()
    finished_output(client, real, rng)
    (real.parent / "other.txt").write_text("beside it")
    link = tmp_path / "c.zarr"
    os.symlink(real, link)
    A, B = randn(rng, (64, 16)), randn(rng, (16, 64))
    dgemm.matmul(A, B, out=str(link) if spelling == "path" else LocalStore(str(link)), client=client,
                 overwrite=True, block=32)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert (real.parent / "other.txt").read_text() == "beside it"
    check_product(dgemm.open_result(str(link))[...], A, B, dtype="float64")


def test_overwrite_through_a_symbolic_link_refuses_the_users_files_behind_it(tmp_path, no_cluster):
    real = tmp_path / "disk" / "c.zarr"
    real.parent.mkdir()
    zarr_in(real, np.ones((4, 5), "f4"), (2, 5))
    (real / "notes.txt").write_text("mine")
    link = tmp_path / "c.zarr"
    os.symlink(real, link)
    before = tree(real)
    with pytest.raises(FileExistsError, match=r"c\.zarr' holds 1 file.*'notes.txt'"):
        dgemm.matmul(np.ones((4, 3), "f4"), np.ones((3, 5), "f4"), out=str(link), overwrite=True)
    assert tree(real) == before and link.is_symlink()


# -- 3. an unfinished output is no input, however it is spelt -------------------------------------
@pytest.mark.parametrize("spelling", ["from_zarr-path", "from_zarr-array", "derived", "sliced", "from_array"])
def test_an_unfinished_output_is_refused_as_an_input_however_it_is_spelt(tmp_path, no_cluster, spelling):
    half = tmp_path / "half.zarr"
    z = zarr_in(half, np.ones((4, 3), "f4"), (2, 3))
    z.attrs[COMPLETE_ATTR] = {"complete": False}
    a = {"from_zarr-path": lambda: da.from_zarr(str(half)),
         "from_zarr-array": lambda: da.from_zarr(z),
         "derived": lambda: da.from_zarr(str(half)) * 2,
         "sliced": lambda: da.from_zarr(z)[:, :3].astype("f8"),
         "from_array": lambda: da.from_array(z, chunks=1) + 0}[spelling]()
    with pytest.raises(ValueError, match=r"half\.zarr\) is an incomplete dgemm output"):
        dgemm.matmul(a, np.ones((3, 5), "f4"), out=str(tmp_path / "c.zarr"))
    with pytest.raises(ValueError, match=r"half\.zarr\) is an incomplete dgemm output"):
        dgemm.matmul(a, np.ones((3, 5), "f4"))      # a lazy product of it too
    assert not (tmp_path / "c.zarr").exists()


# -- 4. a run that failed on a full disk gives its lease up -----------------------------------
def _disk_full_for_leases(monkeypatch):
    """Make every write of a lease in this process fail as on a full disk (deleting still works, as there)."""
    real = keys.put

    def put(store, key, data):
        if key.endswith("/lease") or key == "lease":
            raise OSError(errno.ENOSPC, "No space left on device", key)
        return real(store, key, data)

    monkeypatch.setattr(keys, "put", put)
    return real


@pytest.mark.parametrize("drained", [True, False], ids=["drained", "tasks-left"])
def test_a_run_failed_on_a_full_disk_is_resumed_at_once(client, tmp_path, rng, monkeypatch, drained):
    """A chunk write fails on a worker, and so does stopping the lease (the disk is full): resume works at once.

    The chunk (1, 1) is a folder when the run starts, so its block fails on
    the worker; the client then finds no room to write its stopped lease.
    The failed run must still give the output up, so ``resume=True`` right
    after is not refused as "being written by another dgemm run" (the run
    that just died, in this very process).  With tasks said to be left
    running, the lease stays (it cannot be stopped): this process takes it
    over at once, while another process is still refused.
    """
    A, B = randn(rng, (96, 64)), randn(rng, (64, 96))
    path = tmp_path / "c.zarr"
    zarr.create_array(store=str(path), shape=(96, 96), chunks=(32, 32), dtype="f8", fill_value=np.nan)
    obstacle = path / "c" / "1" / "1"
    obstacle.mkdir(parents=True)
    (obstacle / "keep").write_text("a folder where the chunk goes")
    out = zarr.open_array(str(path), mode="r+")
    real_stop = lease.Lease.stop

    def stop_on_a_full_disk(self):
        _disk_full_for_leases(monkeypatch)
        real_stop(self)

    monkeypatch.setattr(lease.Lease, "stop", stop_on_a_full_disk)
    if not drained:
        monkeypatch.setattr(dgemm.client.steps, "_drain", lambda *args, **kwargs: False)
    with pytest.raises(OSError):
        dgemm.matmul(A, B, out=out, client=client, block=32)
    monkeypatch.undo()
    wait_for(lambda: not any(client.run(lambda dask_worker: len(dask_worker.state.executing)).values()), 60,
             "the failed run's tasks to drain")
    key = path / ".dgemm" / "lease"
    assert key.exists() != drained
    if not drained:   # the same lease seen from another process: a live writer, refused
        held = key.read_text()
        key.write_text(json.dumps({**json.loads(held), "pid": os.getpid() + 1}))
        with pytest.raises(dgemm.OutputBusyError, match="being written by another dgemm run"):
            dgemm.matmul(A, B, out=zarr.open_array(str(path), mode="r+"), client=client, block=32, resume=True)
        key.write_text(held)
    (obstacle / "keep").unlink()
    obstacle.rmdir()
    result = dgemm.matmul(A, B, out=zarr.open_array(str(path), mode="r+"), client=client, block=32, resume=True)
    check_product(result[...], A, B, dtype="float64")


def test_a_run_that_cannot_write_its_lease_gives_it_up(client, tmp_path, rng, monkeypatch):
    """The disk fills between opening the output and computing: the lease it holds goes, resume goes on."""
    A, B = randn(rng, (64, 32)), randn(rng, (32, 64))
    path = tmp_path / "c.zarr"
    real_kept = lease.Lease.kept

    def kept_on_a_full_disk(self, *args, **kwargs):
        _disk_full_for_leases(monkeypatch)
        return real_kept(self, *args, **kwargs)

    monkeypatch.setattr(lease.Lease, "kept", kept_on_a_full_disk)
    with pytest.raises(OSError, match="No space left"):
        dgemm.matmul(A, B, out=str(path), client=client, block=32)
    monkeypatch.undo()
    result = dgemm.matmul(A, B, out=str(path), client=client, block=32, resume=True)
    check_product(result[...], A, B, dtype="float64")


def test_a_live_writer_of_another_process_is_still_refused(tmp_path, no_cluster, rng):
    """The same refusal as before for a fresh lease of another run (here another process's)."""
    path = tmp_path / "c.zarr"
    z = zarr.create_array(store=str(path), shape=(4, 5), chunks=(2, 5), dtype="f4")
    z.attrs[COMPLETE_ATTR] = {"complete": False}
    other = lease.Lease(z, "someone", str(path))
    other.acquire()
    held = json.loads((path / ".dgemm" / "lease").read_text())
    held["pid"] = os.getpid() + 1
    (path / ".dgemm" / "lease").write_text(json.dumps(held))
    with pytest.raises(dgemm.OutputBusyError, match="being written by another dgemm run"):
        dgemm.matmul(np.ones((4, 3), "f4"), np.ones((3, 5), "f4"), out=str(path), resume=True)


# -- 5. paths that cannot be created: refused before any cluster ----------------------------------
def test_an_output_under_a_file_is_refused_before_any_cluster(tmp_path, no_cluster):
    (tmp_path / "notes.txt").write_text("a file")
    with pytest.raises(NotADirectoryError, match=r"notes\.txt/c\.zarr' cannot be created: .*notes\.txt is a file"):
        dgemm.matmul(np.ones((4, 3), "f4"), np.ones((3, 5), "f4"), out=str(tmp_path / "notes.txt" / "c.zarr"))


def test_an_output_name_too_long_is_refused_before_any_cluster(tmp_path, no_cluster):
    name = "c" * 300 + ".zarr"
    with pytest.raises(ValueError, match=r"305 bytes long, more than the \d+ that the file system"):
        dgemm.matmul(np.ones((4, 3), "f4"), np.ones((3, 5), "f4"), out=str(tmp_path / name))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("spelling", ["path", "store"])
def test_a_dangling_link_as_the_output_is_refused_before_any_cluster(tmp_path, no_cluster, overwrite, spelling):
    from zarr.storage import LocalStore

    link = tmp_path / "c.zarr"
    os.symlink(tmp_path / "gone" / "c.zarr", link)
    with pytest.raises(FileExistsError, match=r"c\.zarr' is a symbolic link to '.*gone/c\.zarr', which does not "
                                              "exist"):
        dgemm.matmul(np.ones((4, 3), "f4"), np.ones((3, 5), "f4"), overwrite=overwrite,
                     out=str(link) if spelling == "path" else LocalStore(str(link)))
    assert link.is_symlink() and not (tmp_path / "gone").exists()


def test_a_zero_chunk_size_in_an_input_is_refused_before_any_cluster(tmp_path, no_cluster):
    a = tmp_path / "a.zarr"
    zarr_in(a, np.ones((4, 3), "f4"), (2, 3))
    meta = json.loads((a / "zarr.json").read_text())
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [0, 3]
    (a / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"a\.zarr.* has a chunk size of 0 .*\(0, 3\)"):
        dgemm.matmul(str(a), np.ones((3, 5), "f4"), out=str(tmp_path / "c.zarr"))
    assert not (tmp_path / "c.zarr").exists()

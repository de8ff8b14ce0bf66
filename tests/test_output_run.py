"""One call's run on its output (dgemm.storage.output_run), on real Zarr folders, without a cluster.

Each test plays what a call does with its output: the checks before any
work, opening it (fresh, replaced, resumed, in place), holding its lease,
and completing or abandoning it; the store tasks' part is played by
writing blocks and their markers here.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
import zarr

from dgemm.errors import OutputBusyError, OutputTakenOverError
from dgemm.storage import COMPLETE_ATTR, ZarrBlock, check_output, keys, run_id, store_block
from dgemm.storage import output_run
from dgemm.storage.lease import Holder, Lease, current, lease_key, refuse_if_held
from dgemm.storage.output_run import OutputRun, already_complete, write_empty

F8 = np.dtype("f8")
SHAPE, BLOCK, GRID = (4, 6), (2, 3), (2, 2)
FINGERPRINT = {"operation": "matmul", "shape": list(SHAPE), "dtype": F8.str, "a": "a", "b": "b", "c": None,
               "alpha": 1.0, "beta": 0.0, "precision": None}
ALL = [(0, 0), (0, 1), (1, 0), (1, 1)]
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def open_run(spec, fingerprint=FINGERPRINT, block=BLOCK, grid=GRID, **kwargs) -> OutputRun:
    return OutputRun.open(spec, fingerprint, block=block, grid=grid, about={"operation": "matmul"}, **kwargs)


def store(run: OutputRun, blocks, value: float = 1.0) -> None:
    """What the run's store tasks do: each block written, then its marker."""
    for i, j in blocks:
        rows, cols = (i * BLOCK[0], (i + 1) * BLOCK[0]), (j * BLOCK[1], (j + 1) * BLOCK[1])
        store_block(run.array, rows, cols, np.full(BLOCK, value))
        run.markers.mark(i, j)


def stale_holder(*, fresh: bool) -> Holder:
    now = time.time()
    expires = now + 3600 if fresh else now - 15
    return Holder("x", "o", "elsewhere", 4242, now - 60, now - 30, expires, "tcp://10.0.0.1:8786", "tok")


def test_a_fresh_run_creates_its_output_incomplete_and_holds_it(tmp_path):
    path = str(tmp_path / "c.zarr")
    spec = check_output(path, SHAPE, F8, False)
    assert already_complete(spec, FINGERPRINT) is None
    run = open_run(spec)
    meta = run.array.attrs[COMPLETE_ATTR]
    assert meta["complete"] is False and meta["operation"] == "matmul" and meta["owner"]
    assert meta["run"]["id"] == run_id({**FINGERPRINT, "block": list(BLOCK), "grid": list(GRID)})
    assert run.array.chunks == BLOCK and run.pending == ALL and not run.resumed
    assert run.originals is None and run.took_over is None
    assert current(run.array).id == run.lease.id
    # a second writer is refused, before any work and again just before writing
    again = check_output(path, SHAPE, F8, True)
    with pytest.raises(OutputBusyError, match=r"out file://.*c\.zarr is being written by another dgemm run"):
        already_complete(again, FINGERPRINT)
    with pytest.raises(OutputBusyError, match="is being written by another dgemm run"):
        open_run(again)
    assert current(run.array).id == run.lease.id


def test_vector_axes_are_dropped_from_a_new_outputs_chunks(tmp_path):
    spec = check_output(str(tmp_path / "v.zarr"), (6,), F8, False)
    run = open_run(spec, {**FINGERPRINT, "shape": [6]}, block=(1, 3), grid=(1, 2), drop=(0,))
    assert run.array.shape == (6,) and run.array.chunks == (3,) and run.pending == [(0, 0), (0, 1)]


def test_completion_needs_every_marker_then_gives_up_the_lease(tmp_path):
    path = str(tmp_path / "c.zarr")
    run = open_run(check_output(path, SHAPE, F8, False))
    store(run, ALL[:3])
    with pytest.raises(RuntimeError, match=r"dgemm: 1 of 4 blocks of file://.*c\.zarr have no completion marker "
                                           r"after the run \(first: \(1, 1\)\); out is left incomplete, "
                                           r"resume=True finishes it"):
        run.complete(1.0, 1e12)
    assert run.array.attrs[COMPLETE_ATTR]["complete"] is False and current(run.array) is None

    run = open_run(check_output(path, SHAPE, F8, True))
    store(run, ALL)
    run.complete(2.0, 1e12)
    meta = zarr.open_array(path, mode="r").attrs[COMPLETE_ATTR]
    assert meta["complete"] is True and meta["tflops"] == 0.5 and meta["seconds"] == 2.0
    assert (meta["blocks"], meta["blocks_run"], meta["resumed"]) == (4, 4, False)
    assert current(run.array) is None


def test_a_run_taken_over_is_not_marked_complete(tmp_path):
    run = open_run(check_output(str(tmp_path / "c.zarr"), SHAPE, F8, False))
    store(run, ALL)
    thief = Lease(run.array, "someone", "c.zarr", interval=60)
    thief.acquire()
    with pytest.raises(OutputTakenOverError, match="before this run could mark it complete"):
        run.complete(1.0, 1e12)
    assert run.array.attrs[COMPLETE_ATTR]["complete"] is False and current(run.array).id == thief.id


def test_a_resumed_run_computes_only_the_unmarked_blocks_under_the_same_owner(tmp_path):
    path = str(tmp_path / "c.zarr")
    first = open_run(check_output(path, SHAPE, F8, False))
    store(first, [(0, 0), (1, 1)])
    first.abandon(lambda: True)                       # interrupted: the lease is given up
    spec = check_output(path, SHAPE, F8, False, resume=True)
    assert spec.resume and already_complete(spec, FINGERPRINT) is None
    run = open_run(spec)
    assert run.resumed and run.pending == [(0, 1), (1, 0)]
    assert run.markers.prefix == first.markers.prefix and run.lease.id != first.lease.id
    store(run, run.pending, 2.0)
    run.complete(1.0, 1e12)
    meta = run.array.attrs[COMPLETE_ATTR]
    assert (meta["blocks_run"], meta["resumed"], meta["tflops"]) == (2, True, None)   # no rate for a part
    np.testing.assert_array_equal(run.array[0:2, 0:3], 1.0)
    np.testing.assert_array_equal(run.array[0:2, 3:6], 2.0)
    done = already_complete(check_output(path, SHAPE, F8, False, resume=True), FINGERPRINT)
    assert done is not None and done.attrs[COMPLETE_ATTR]["complete"] is True


def test_resume_refuses_another_product_other_blocks_and_no_run(tmp_path):
    path = str(tmp_path / "c.zarr")
    open_run(check_output(path, SHAPE, F8, False)).abandon(lambda: True)
    spec = check_output(path, SHAPE, F8, False, resume=True)
    with pytest.raises(ValueError, match=r"cannot resume: out \(file://.*c\.zarr\) was written by a different "
                                         r"product: beta was 0\.0, now 1\.0; pass overwrite=True to start again"):
        already_complete(spec, {**FINGERPRINT, "beta": 1.0})
    with pytest.raises(ValueError, match=r"^cannot resume: block was \[2, 3\], now \[1, 3\]; grid was \[2, 2\], "
                                         r"now \[4, 2\]; pass overwrite=True to start again$"):
        open_run(spec, block=(1, 3), grid=(4, 2))
    spec.array.attrs[COMPLETE_ATTR] = {**spec.array.attrs[COMPLETE_ATTR], "run": {"id": "edited", **FINGERPRINT,
                                                                                "block": [2, 3], "grid": [2, 2]}}
    with pytest.raises(ValueError, match="^cannot resume: out was cut into different blocks; pass overwrite=True"):
        open_run(spec)
    spec.array.attrs[COMPLETE_ATTR] = {"complete": False}
    with pytest.raises(ValueError, match=r"records no dgemm run to resume \(written by an older dgemm, or an "
                                         r"empty product\); pass overwrite=True to start again"):
        already_complete(spec, FINGERPRINT)


def test_a_replaced_output_is_held_before_it_is_emptied(tmp_path, monkeypatch):
    """The lease is claimed and the old metadata (marked incomplete) kept while the old chunks go."""
    path = tmp_path / "c.zarr"
    old = zarr.create_array(store=str(path), shape=SHAPE, chunks=(1, 6), dtype=F8, fill_value=0)
    old[...] = 7.0
    old.attrs[COMPLETE_ATTR] = {"complete": True}
    seen = {}
    real = output_run.create_output

    def look_then_create(*args, **kwargs):
        now = zarr.open_array(str(path), mode="r")
        seen.update(held=current(now), meta=now.attrs[COMPLETE_ATTR], chunks=(path / "c").exists())
        return real(*args, **kwargs)

    monkeypatch.setattr(output_run, "create_output", look_then_create)
    run = open_run(check_output(str(path), SHAPE, F8, True))
    assert seen["held"] is not None and seen["held"].id == run.lease.id
    assert seen["meta"] == {"complete": False, "replacing": True} and not seen["chunks"]
    with pytest.raises(OutputBusyError):   # meanwhile, and now: another call is refused
        refuse_if_held(run.array, "c.zarr")
    assert run.array.chunks == BLOCK and np.all(run.array[...] == 0) and run.pending == ALL
    assert current(run.array).id == run.lease.id


def test_a_fresh_lease_is_refused_and_a_stale_one_taken_over(tmp_path):
    path = tmp_path / "c.zarr"
    old = zarr.create_array(store=str(path), shape=SHAPE, chunks=BLOCK, dtype=F8, fill_value=0)
    old[...] = 7.0
    keys.put(old.store, lease_key(old), stale_holder(fresh=True).dumps())
    with pytest.raises(OutputBusyError, match=rf"\(process 4242 on elsewhere, started {STAMP}, tasks on "
                                              r"tcp://10\.0\.0\.1:8786; its lease was renewed"):
        open_run(check_output(str(path), SHAPE, F8, True))
    np.testing.assert_array_equal(zarr.open_array(str(path), mode="r")[...], 7.0)     # nothing deleted
    keys.put(old.store, lease_key(old), stale_holder(fresh=False).dumps())
    spec = check_output(str(path), SHAPE, F8, True)
    assert already_complete(spec, FINGERPRINT) is None
    run = open_run(spec)
    assert run.took_over is not None and run.took_over.pid == 4242
    assert run.took_over_tasks("tcp://10.0.0.1:8786") == "tok" and run.took_over_tasks("tcp://other:8786") is None
    assert current(run.array).id == run.lease.id


def test_in_place_the_originals_are_kept_until_completion(tmp_path, rng):
    path = str(tmp_path / "c.zarr")
    c = zarr.create_array(store=path, shape=SHAPE, chunks=BLOCK, dtype=F8)
    C0 = rng.standard_normal(SHAPE)
    c[...] = C0
    spec = check_output(c, SHAPE, F8, False)
    other = zarr.create_array(store=str(tmp_path / "other.zarr"), shape=SHAPE, dtype=F8)
    for reads_c in (other, None):                        # another C, or none read (beta = 0): not in place
        run = open_run(spec, reads_c=reads_c)
        assert run.originals is None
        run.abandon(lambda: True)
    run = open_run(spec, reads_c=zarr.open_array(f"file://{path}", mode="r"))   # C however spelt
    assert run.originals is not None
    run.originals.keep(0, 0, ZarrBlock(c, (0, 2), (0, 3)))
    store(run, ALL)
    assert (tmp_path / "c.zarr" / ".dgemm" / "original").exists()
    run.complete(1.0, 1e12)
    assert not (tmp_path / "c.zarr" / ".dgemm" / "original").exists() and current(c) is None


def test_abandoning_fences_the_tasks_off_at_once_and_frees_the_output_once_drained(tmp_path):
    path = str(tmp_path / "c.zarr")
    run = open_run(check_output(path, SHAPE, F8, False))
    fence = run.fence()
    fence.check(0, 0)                                    # its tasks write while it holds the output

    waited = []

    def still_running() -> bool:                         # the run's tasks are waited for after the fence
        with pytest.raises(OutputTakenOverError, match="its run was stopped"):
            fence.check(0, 0)
        waited.append(True)
        return False
    run.abandon(still_running)
    assert waited
    with pytest.raises(OutputBusyError, match=r"held by a dgemm run that was stopped .* while the last of its "
                                              r"tasks finish writing"):
        already_complete(check_output(path, SHAPE, F8, True), FINGERPRINT)
    run.lease.release()                                  # the stopped lease expires, or is released

    run = open_run(check_output(path, SHAPE, F8, True))
    fence = run.fence()
    run.abandon(lambda: True)
    assert current(run.array) is None
    with pytest.raises(OutputTakenOverError, match="its lease was released: the run was cancelled"):
        fence.check(1, 1)


def test_held_renews_the_lease_naming_the_cluster_unless_taken_over(tmp_path):
    run = open_run(check_output(str(tmp_path / "c.zarr"), SHAPE, F8, False))
    with run.held("tcp://10.0.0.2:8786", "token1"):
        held = current(run.array)
        assert (held.id, held.scheduler, held.token) == (run.lease.id, "tcp://10.0.0.2:8786", "token1")
    Lease(run.array, "someone", "c.zarr", interval=60).acquire()
    with pytest.raises(OutputTakenOverError, match="before this run started computing"):
        with run.held("tcp://10.0.0.2:8786", "token2"):
            pass


def test_an_empty_product_is_complete_at_once(tmp_path):
    fingerprint = {**FINGERPRINT, "shape": [0, 6]}
    spec = check_output(str(tmp_path / "c.zarr"), (0, 6), F8, False)
    out = write_empty(spec, fingerprint)
    meta = out.attrs[COMPLETE_ATTR]
    assert out.shape == (0, 6) and out.chunks == (1, 6)
    assert meta["complete"] is True and meta["seconds"] == 0.0 and meta["run"]["id"] == run_id(fingerprint)
    done = already_complete(check_output(str(tmp_path / "c.zarr"), (0, 6), F8, False, resume=True), fingerprint)
    assert done is not None and done.attrs[COMPLETE_ATTR]["complete"] is True   # resume: nothing to do


def test_replacing_an_output_never_lets_go_of_its_lease(tmp_path, monkeypatch):
    """The old run's records (markers, originals) go when the output is replaced, the lease just claimed
    stays: in between, another call must find the output held, not free."""
    from dgemm.storage.markers import BlockMarkers

    path = tmp_path / "c.zarr"
    first = open_run(check_output(str(path), SHAPE, F8, False))
    store(first, ALL[:2])                                  # an interrupted run: markers of its own
    first.lease.release()
    seen = []
    real = BlockMarkers.reset

    def reset_then_look(self, *args, **kwargs):
        real(self, *args, **kwargs)
        now = zarr.open_array(str(path), mode="r")
        seen.append((current(now), sorted(first.markers.done(GRID))))

    monkeypatch.setattr(BlockMarkers, "reset", reset_then_look)
    run = open_run(check_output(str(path), SHAPE, F8, True))
    [(held, done)] = seen
    assert held is not None and held.id == run.lease.id, "the output was free between reset and acquire"
    assert done == []                                       # the old run's markers are gone


def _watch_the_lease(monkeypatch) -> list:
    """Record the id of the lease at ``.dgemm/lease`` after every delete and write of a local or fsspec store,
    and after every local folder set aside."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import FsspecStore, LocalStore

    seen = []

    def watched(cls, name):
        real = getattr(cls, name)

        async def op(self, *args, **kwargs):
            out = await real(self, *args, **kwargs)
            if seen and seen[-1] is None:   # no longer watched
                return out
            raw = await self.get(".dgemm/lease", prototype=default_buffer_prototype())
            seen.append((name, args[0] if args else None, None if raw is None else Holder.loads(raw.to_bytes()).id))
            return out
        monkeypatch.setattr(cls, name, op)

    for cls in (LocalStore, FsspecStore):
        for name in ("delete", "delete_dir", "set", "set_if_not_exists"):
            watched(cls, name)
    real_aside = keys.set_aside

    def set_aside(store, prefix, node=""):   # a local folder moved out of the way, to delete in the background
        out = real_aside(store, prefix, node)
        if not (seen and seen[-1] is None):
            raw = keys.get(store, ".dgemm/lease")
            seen.append(("set_aside", prefix, None if raw is None else Holder.loads(raw).id))
        return out
    monkeypatch.setattr(keys, "set_aside", set_aside)
    return seen


@pytest.mark.parametrize("formats", [(3, 3), (2, 3), (3, 2)], ids=lambda f: f"v{f[0]}-to-v{f[1]}")
@pytest.mark.parametrize("where", ["relative-path", "s3"])
def test_replacing_an_output_keeps_its_lease_through_every_delete_and_write(tmp_path, monkeypatch, request, where,
                                                                            formats):
    """From the moment the replacing run claims the lease to the end, every delete and write of the store
    (dgemm's emptying, the new metadata, the old records' removal) leaves that lease in place; the old run's
    markers and originals go, the old format's metadata too, and the finished output keeps no ``.dgemm``."""
    from dgemm.storage.layout import Layout
    from dgemm.storage.originals import Originals

    old_format, new_format = formats
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        target, options = s3.url(f"replace-{old_format}{new_format}-{time.time_ns()}/c.zarr"), s3.storage_options
    else:   # a relative path, from a working folder other than the output's
        (tmp_path / "work").mkdir()
        monkeypatch.chdir(tmp_path / "work")
        target, options = "../out/c.zarr", None

    def spec(overwrite, zarr_format):
        s = check_output(target, SHAPE, F8, overwrite, storage_options=options)
        s.layout = Layout(zarr_format=zarr_format)
        return s

    first = open_run(spec(False, old_format))
    store(first, ALL[:2], 5.0)                                          # interrupted: markers and a kept original
    first_owner = first.array.attrs[COMPLETE_ATTR]["owner"]
    kept = Originals(first.array, first_owner)
    kept.keep(0, 0, ZarrBlock(first.array, (0, 2), (0, 3)))
    first.lease.release()
    seen = _watch_the_lease(monkeypatch)
    run = open_run(spec(True, new_format))
    seen.append(None)
    ids = [lease_id for _, _, lease_id in seen[:-1]]
    claimed = next(n for n, lease_id in enumerate(ids) if lease_id is not None)
    assert ids[claimed:] == [run.lease.id] * (len(ids) - claimed), [s for s in seen[claimed:-1] if s[2] is None]
    # the old output was emptied meanwhile: its chunks, the old run's markers and originals
    chunks = {"c"} if old_format == 3 else {f"{i}.{j}" for i, j in ALL[:2]}   # the blocks the old run stored
    assert chunks | {".dgemm/done", ".dgemm/original"} <= {path for op, path, _ in seen[claimed:-1]
                                                           if op in ("delete", "delete_dir", "set_aside")}
    store_ = run.lease.store
    left = sorted(keys.listed(store_, ".dgemm"))
    assert left == [".dgemm/lease"]                                       # old markers and originals gone
    names = {"zarr.json"} if new_format == 3 else {".zarray", ".zattrs"}
    assert {n for n in ("zarr.json", ".zarray", ".zattrs") if keys.exists(store_, n)} == names
    assert run.array.metadata.zarr_format == new_format and np.all(run.array[...] == 0)
    assert run.array.attrs[COMPLETE_ATTR]["owner"] != first_owner and run.pending == ALL
    store(run, ALL, 2.0)
    run.complete(1.0, 1.0)
    reopened = zarr.open_array(target, mode="r", storage_options=options)
    assert reopened.metadata.zarr_format == new_format and np.all(reopened[...] == 2.0)
    assert reopened.attrs[COMPLETE_ATTR]["complete"] is True and current(reopened) is None
    assert keys.listed(store_, ".dgemm") == []
    if where != "s3":
        assert not (tmp_path / "out" / "c.zarr" / ".dgemm").exists()


# -- stragglers: store tasks whose marker lands late -----------------------------------------------------------
def test_a_marker_that_lands_after_the_run_completed_is_taken_back(tmp_path, monkeypatch):
    """A store task still running when the run completes (dask re-ran it: its worker died) writes its marker
    after the markers were removed: it finds the lease given up, takes its marker back and fails, and the
    finished output keeps no ``.dgemm`` at all."""
    from dgemm.storage.markers import BlockMarkers

    path = tmp_path / "c.zarr"
    run = open_run(check_output(str(path), SHAPE, F8, False))
    store(run, ALL)
    late = []
    real = BlockMarkers.remove

    def remove_then_a_straggler_marks(self):
        real(self)
        try:   # the re-run of block (1, 1)'s store task: it passed its check before, its marker lands now
            run.markers.mark(1, 1)
        except OutputTakenOverError as e:
            late.append(str(e))

    monkeypatch.setattr(BlockMarkers, "remove", remove_then_a_straggler_marks)
    run.complete(1.0, 1.0)
    assert len(late) == 1 and "its lease was released" in late[0] and "block (1, 1) stored but did not mark" in late[0]
    assert zarr.open_array(str(path), mode="r").attrs[COMPLETE_ATTR]["complete"] is True
    assert not (path / ".dgemm").exists(), sorted(str(p.relative_to(path)) for p in (path / ".dgemm").rglob("*"))


@pytest.mark.parametrize("later", ["overwrite", "resume"])
def test_a_straggler_of_an_earlier_run_leaves_no_marker_in_the_output_a_later_run_holds(tmp_path, later):
    """A store task of a run that died passed its check before a later run took the output over; its marker,
    landing after, is taken back: none in the later run's output, under the earlier owner's name
    (``overwrite``) or under the one both share (``resume``: the block is not counted as done)."""
    path = tmp_path / "c.zarr"
    first = open_run(check_output(str(path), SHAPE, F8, False))
    store(first, ALL[:2])
    first.lease.release()                      # the first run is gone: its lease expired, or was released
    if later == "overwrite":
        second = open_run(check_output(str(path), SHAPE, F8, True))
    else:
        second = open_run(check_output(str(path), SHAPE, F8, False, resume=True))
    assert second.lease.id != first.lease.id
    with pytest.raises(OutputTakenOverError, match=r"block \(1, 0\) stored but did not mark it"):
        first.markers.mark(1, 0)               # the straggler's late marker
    done = {"overwrite": [], "resume": ["0.0", "0.1"]}[later]   # resume: the first run's blocks, same owner
    owner = second.array.attrs[COMPLETE_ATTR]["owner"]
    assert sorted(keys.listed(second.lease.store, ".dgemm/done")) == [f".dgemm/done/{owner}/{b}" for b in done]
    assert (1, 0) in second.pending and (1, 0) not in second.markers.done(GRID)
    store(second, second.pending, 3.0)
    second.complete(1.0, 1.0)
    assert not (path / ".dgemm").exists(), sorted(str(p.relative_to(path)) for p in (path / ".dgemm").rglob("*"))


def test_a_marker_whose_writer_was_killed_mid_write_goes_with_the_markers(tmp_path):
    """A worker SIGKILLed while it writes a marker leaves zarr's temporary file (``<i>.<hex>.partial``, renamed
    into place once written): it goes with the run's markers once the run completes."""
    import signal
    import subprocess
    import sys

    path = tmp_path / "c.zarr"
    run = open_run(check_output(str(path), SHAPE, F8, False))
    store(run, ALL)
    owner = run.array.attrs[COMPLETE_ATTR]["owner"]
    code = ("import os, pathlib, signal, zarr\n"
            "from dgemm.storage import BlockMarkers\n"
            f"arr = zarr.open_array({str(path)!r}, mode='r+')\n"
            "# killed once the marker's file is written, before it is renamed into place\n"
            "pathlib.Path.replace = lambda self, target: os.kill(os.getpid(), signal.SIGKILL)\n"
            f"BlockMarkers(arr, {owner!r}).mark(1, 1)\n")
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(list((path / ".dgemm" / "done" / owner).glob("1.*.partial"))) == 1
    run.complete(1.0, 1.0)
    assert not (path / ".dgemm").exists(), sorted(str(p.relative_to(path)) for p in (path / ".dgemm").rglob("*"))


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("writer", ["store_block", "zarr"])
def test_a_chunk_whose_writer_was_killed_mid_write_does_not_stop_a_replacement(tmp_path, writer, zarr_format):
    """A worker SIGKILLed while it writes a chunk leaves the chunk's temporary file (dgemm's store, or zarr's):
    ``overwrite=True`` replaces the output with it, as Zarr data, not as a file of the user's."""
    import signal
    import subprocess
    import sys

    from dgemm.storage.layout import Layout

    path = tmp_path / "c.zarr"
    spec = check_output(str(path), SHAPE, F8, False)
    spec.layout = Layout(zarr_format=zarr_format)
    run = open_run(spec)
    store(run, ALL[:2])
    write = ("store_block(arr, (2, 4), (3, 6), np.full((2, 3), 4.0))" if writer == "store_block"
             else "arr[2:4, 3:6] = 4.0")
    code = ("import os, signal, numpy as np, zarr\n"
            "from dgemm.storage import store_block\n"
            f"arr = zarr.open_array({str(path)!r}, mode='r+')\n"
            "# killed once the chunk's file is written, before it is renamed into place\n"
            "os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
            f"{write}\n")
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(list(path.rglob("*.partial"))) == 1
    run.lease.release()                                   # the run died with its worker
    again = open_run(check_output(str(path), SHAPE, F8, True))
    assert not list(path.rglob("*.partial")) and np.all(again.array[...] == 0)

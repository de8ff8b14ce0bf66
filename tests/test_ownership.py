"""A run owns its output: a second writer is refused, a superseded run writes nothing more, Ctrl-C stops a run.

(:mod:`dgemm.storage.lease`.)  The cluster tests run writers as separate
client processes of the session cluster, as two users (or a Ctrl-C in
IPython) would; every result is checked against numpy in float64.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr

import dgemm
from _check import check_product, randn
from dgemm.storage import COMPLETE_ATTR, BlockMarkers, ZarrBlock, keys
from dgemm.storage.lease import (Holder, Lease, OutputBusyError, OutputTakenOverError, current, lease_key,
                                 refuse_if_held)
from dgemm.storage.originals import OriginalBlock, Originals
from dgemm.worker.tasks import store
from test_faults import cluster_idle, n_done, wait_for, zarr_in

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


# -- the store task, without a cluster ------------------------------------------
def test_store_task_writes_only_while_its_run_holds_the_lease(tmp_path, rng):
    """A task of a superseded (or cancelled) run writes nothing and says why; a marked block is not rewritten."""
    arr = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(4, 6), chunks=(2, 3), dtype="f8",
                            fill_value=np.nan)
    markers = BlockMarkers(arr, "own")
    first = Lease(arr, "own", "c.zarr", interval=5)
    first.acquire()
    blk = rng.standard_normal((2, 3))
    assert store(arr, (0, 2), (0, 3), blk, (), (markers, 0, 0), first.fence()) == (2, 3)
    np.testing.assert_array_equal(arr[0:2, 0:3], blk)
    # stored again (dask re-runs the store of a block whose result a dead worker held): nothing is written
    store(arr, (0, 2), (0, 3), blk + 1, (), (markers, 0, 0), first.fence())
    np.testing.assert_array_equal(arr[0:2, 0:3], blk)

    second = Lease(arr, "own", "c.zarr", interval=5)     # another call takes the output over
    second.acquire()
    with pytest.raises(OutputTakenOverError, match=rf"out c\.zarr was taken over by another run \(now process "
                                                   rf"{os.getpid()} on .*, started {STAMP}\); this run's task for "
                                                   r"block \(1, 1\) wrote nothing"):
        store(arr, (2, 4), (3, 6), blk, (), (markers, 1, 1), first.fence())
    assert np.isnan(arr[2:4, 3:6]).all() and markers.done() == {(0, 0)}
    assert not first.renew() and first.lost.id == second.id
    first.release()                                      # not its lease any more: left alone
    assert current(arr).id == second.id
    second.release()
    assert current(arr) is None
    with pytest.raises(OutputTakenOverError, match="its lease was released: the run was cancelled"):
        store(arr, (2, 4), (3, 6), blk, (), (markers, 1, 1), second.fence())
    assert np.isnan(arr[2:4, 3:6]).all()


def test_in_place_store_keeps_the_original_first(tmp_path, rng):
    """In place, the store task keeps C's original block before overwriting it; a re-read gets the original."""
    C0 = rng.standard_normal((4, 4))
    c = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(4, 4), chunks=(2, 2), dtype=">f8")
    c[...] = C0
    originals, markers = Originals(c, "own"), BlockMarkers(c, "own")
    ref = OriginalBlock(ZarrBlock(c, (0, 2), (2, 4)), originals, 0, 1)
    # a copy half written (no marker after it) is not trusted: C is still the original
    keys.put(c.store, originals.key(0, 1), b"half")
    np.testing.assert_array_equal(ref.load(), C0[0:2, 2:4])
    new = rng.standard_normal((2, 2))
    store(c, (0, 2), (2, 4), new, (), (markers, 0, 1), None, originals)
    np.testing.assert_array_equal(c[0:2, 2:4], new)
    got = ref.load()                                     # the original, although C holds the result now
    np.testing.assert_array_equal(got, C0[0:2, 2:4])
    assert got.dtype == c.dtype and got.flags.writeable
    # a second store of the same block (the marker lost) must not keep the updated block as "original"
    markers.reset()
    keys.put(c.store, originals.key(0, 1), b"x" * 32)    # as the first copy was
    keys.put(c.store, originals.key(0, 1) + ".ok", b"1")
    store(c, (0, 2), (2, 4), new, (), (markers, 0, 1), None, originals)
    assert keys.get(c.store, originals.key(0, 1)) == b"x" * 32
    originals.remove()
    assert not (tmp_path / "c.zarr" / ".dgemm" / "original").exists()


# -- two writers, on the cluster ------------------------------------------------
WRITER = """
import json, sys
import dgemm
from distributed import Client

if __name__ == "__main__":
    address, a, b, out = sys.argv[1:5]
    with Client(address, set_as_default=False) as client:
        try:
            dgemm.matmul(a, b, out=out, client=client, block=(32, 32, 512))
            print("FINISHED", flush=True)
        except KeyboardInterrupt as e:
            kept = e     # as IPython keeps the last traceback, and with it the interrupted call's futures

            def running(dask_worker):
                state = dask_worker.state
                return [str(ts.key) for ts in (*state.executing, *state.long_running)]
            print("INTERRUPTED " + json.dumps(sum(client.run(running).values(), [])), flush=True)
            sys.stdin.read()     # stay connected, as an IPython session does, until the test is done
"""


class WriterProcess:
    """A client process writing ``a @ b`` to ``out`` on the session cluster; its output lines as they come."""

    def __init__(self, tmp_path, client, a, b, out, env=None):
        script = tmp_path / "writer.py"
        script.write_text(WRITER)
        self.proc = subprocess.Popen([sys.executable, str(script), client.scheduler.address, a, b, out],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=str(tmp_path), env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def line(self, start: str, timeout: float) -> str:
        wait_for(lambda: any(x.startswith(start) for x in self.lines) or self.proc.poll() is not None,
                 timeout, f"the writer to print {start}")
        time.sleep(0.2)   # the reader thread may still be taking the last lines
        found = [x for x in self.lines if x.startswith(start)]
        assert found, f"the writer ended without {start}: {''.join(self.lines)[-3000:]}"
        return found[0]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(30)
            except Exception:
                self.proc.kill()
        self.proc.wait()


def _inputs(tmp_path, rng, m=512, k=512, n=512):
    A, B, B2 = randn(rng, (m, k)), randn(rng, (k, n)), randn(rng, (k, n))
    for name, x, chunks in (("a", A, (32, k)), ("b", B, (k, 32)), ("b2", B2, (k, 32))):
        zarr_in(tmp_path / f"{name}.zarr", x, chunks)
    return A, B, B2, *(str(tmp_path / f"{x}.zarr") for x in ("a", "b", "b2", "c"))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_second_writer_is_refused_while_the_first_finishes(client, tmp_path, rng):
    """A second call writing the same ``out`` (overwrite, resume, another process or this one) is refused
    before any work, naming the running writer; the first run finishes, right."""
    A, B, B2, a, b, b2, out = _inputs(tmp_path, rng)
    writer = WriterProcess(tmp_path, client, a, b, out)
    try:
        wait_for(lambda: n_done(out) >= 8 or writer.proc.poll() is not None, 120, "the writer's first blocks")
        assert writer.proc.poll() is None, f"the writer finished first: {''.join(writer.lines)[-2000:]}"
        who = rf"process {writer.proc.pid} on {socket.gethostname()}, started {STAMP}, tasks on tcp://"
        with pytest.raises(OutputBusyError, match=rf"out file://.*c\.zarr is being written by another dgemm run "
                                                  rf"\({who}.*Wait for it to finish.*expires at {STAMP}"):
            dgemm.matmul(a, b2, out=out, overwrite=True, client=client, block=(32, 32, 512))
        with pytest.raises(OutputBusyError, match=who):
            dgemm.matmul(a, b, out=out, resume=True, client=client, block=(32, 32, 512))
        assert writer.proc.poll() is None, "the refusals disturbed the writer"
        writer.line("FINISHED", 180)
    finally:
        writer.close()
    assert writer.proc.returncode == 0, "".join(writer.lines)[-3000:]
    check_product(dgemm.open_result(out)[...], A, B, dtype="float64")
    assert current(dgemm.open_result(out)) is None


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ctrl_c_stops_the_run_and_a_restart_is_right(client, tmp_path, rng):
    """Ctrl-C (SIGINT) in a writer that stays connected, as IPython does: when the KeyboardInterrupt comes
    out of the call, none of its tasks runs any more; an ``overwrite=True`` run started right after gives
    exactly its own product, and nothing of the first run lands later."""
    A, B, B2, a, b, b2, out = _inputs(tmp_path, rng)
    writer = WriterProcess(tmp_path, client, a, b, out)
    try:
        wait_for(lambda: n_done(out) >= 16 or writer.proc.poll() is not None, 120, "the writer's first blocks")
        assert writer.proc.poll() is None, f"the writer finished first: {''.join(writer.lines)[-2000:]}"
        writer.proc.send_signal(signal.SIGINT)
        running = json.loads(writer.line("INTERRUPTED", 120).split(" ", 1)[1])
        assert running == [], f"tasks still running after the KeyboardInterrupt: {running}"
        assert current(zarr.open_array(out, mode="r")) is None        # the lease is given up
        with pytest.raises(dgemm.IncompleteResultError):
            dgemm.open_result(out)
        result = dgemm.matmul(a, b2, out=out, overwrite=True, client=client, block=(32, 32, 512))
        check_product(result[...], A, B2, dtype="float64")
        wait_for(lambda: cluster_idle(client), 60, "the cluster to be idle")
        check_product(dgemm.open_result(out)[...], A, B2, dtype="float64", what="after the cluster is idle")
    finally:
        writer.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_run_whose_output_is_taken_over_stops_writing(client, tmp_path, rng):
    """Another call takes the lease mid-run: the run's store tasks stop writing, it fails saying so, and
    nothing is marked complete."""
    A, B, B2, a, b, b2, out = _inputs(tmp_path, rng)
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(dgemm.matmul, a, b, out=out, client=client, block=(32, 32, 512))
        wait_for(lambda: n_done(out) >= 8 or run.done(), 120, "the first blocks")
        assert not run.done(), "the run finished before it was taken over"
        arr = zarr.open_array(out, mode="r+")
        thief = Lease(arr, "someone", out, interval=60)
        thief.acquire()
        with pytest.raises(OutputTakenOverError, match=rf"was taken over by another run \(now process "
                                                       rf"{os.getpid()} on .*\); this run's task for block"):
            run.result(timeout=180)
    stored = n_done(out)
    wait_for(lambda: cluster_idle(client), 60, "the cluster to be idle")
    assert n_done(out) == stored < (512 // 32) ** 2                 # nothing marked after it failed
    assert zarr.open_array(out, mode="r").attrs[COMPLETE_ATTR]["complete"] is False
    assert current(arr).id == thief.id                              # the run left the new holder's lease alone


def test_a_fresh_lease_is_refused_and_a_stale_one_taken_over(client, tmp_path, rng):
    """A lease left by a writer on another host: refused while fresh (naming it, before any work), taken
    over once stale, in place too."""
    A, B, B2, C0 = (randn(rng, s) for s in ((96, 64), (64, 80), (64, 80), (96, 80)))
    out = str(tmp_path / "c.zarr")
    dgemm.matmul(A, B, out=out, client=client, block=32)
    c = zarr_in(tmp_path / "cin.zarr", C0, (32, 32))
    now = time.time()
    for arr in (zarr.open_array(out, mode="r+"), c):
        held = Holder("x", "o", "elsewhere", 4242, now - 60, now, now + 3600, "tcp://10.0.0.1:8786", "t")
        keys.put(arr.store, lease_key(arr), held.dumps())
    who = rf"\(process 4242 on elsewhere, started {STAMP}, tasks on tcp://10\.0\.0\.1:8786; its lease was renewed"
    with pytest.raises(OutputBusyError, match=who):
        dgemm.matmul(A, B2, out=out, overwrite=True, client=client, block=32)
    with pytest.raises(OutputBusyError, match=who):
        dgemm.gemm(A, B, c, beta=1.0, out=c, client=client, block=32)
    check_product(dgemm.open_result(out)[...], A, B, dtype="float64")   # untouched
    np.testing.assert_array_equal(c[...], C0)
    for arr in (zarr.open_array(out, mode="r+"), c):
        held = Holder("x", "o", "elsewhere", 4242, now - 60, now - 30, now - 15, "tcp://10.0.0.1:8786", "t")
        keys.put(arr.store, lease_key(arr), held.dumps())
    result = dgemm.matmul(A, B2, out=out, overwrite=True, client=client, block=32)
    check_product(result[...], A, B2, dtype="float64")
    assert current(result) is None
    result = dgemm.gemm(A, B, c, beta=1.0, out=c, client=client, block=32)
    check_product(result[...], A, B, beta=1.0, c=C0, dtype="float64")
    assert current(c) is None


def test_a_stopped_run_keeps_other_writers_out_until_it_releases(tmp_path, rng):
    """Stopping fences the run's tasks off at once, but a second writer waits until the stopped run releases.

    (So a block a stopped run's task is still writing cannot land on the next run's block.)
    """
    arr = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(4, 6), chunks=(2, 3), dtype="f8",
                            fill_value=np.nan)
    markers = BlockMarkers(arr, "own")
    lease = Lease(arr, "own", "c.zarr", interval=5)
    lease.acquire()
    fence = lease.fence()
    lease.stop()
    with pytest.raises(OutputTakenOverError, match="its run was stopped"):
        store(arr, (0, 2), (0, 3), rng.standard_normal((2, 3)), (), (markers, 0, 0), fence)
    assert np.isnan(arr[0:2, 0:3]).all() and not markers.done()
    with pytest.raises(OutputBusyError, match="stopped .* while the last of its tasks finish"):
        refuse_if_held(arr, "c.zarr")
    lease.release()
    assert current(arr) is None and refuse_if_held(arr, "c.zarr") is None


def test_a_second_writer_is_refused_while_the_first_replaces_the_output(client, tmp_path, rng, monkeypatch):
    """``overwrite=True`` on an existing output: replacing it takes a while, and a second call meanwhile is refused.

    The first call is held inside creating its new output (as deleting a
    large old one holds it); the second must find the output held, not free,
    and the first's product must be right.
    """
    import dgemm.storage.output_run as output_run

    A, B = randn(rng, (64, 48)), randn(rng, (48, 64))
    path = str(tmp_path / "c.zarr")
    dgemm.matmul(A, B, out=path, client=client, block=32)           # the output to replace
    real, entered, go = output_run.create_output, threading.Event(), threading.Event()

    def slow_create(*args, **kwargs):
        if threading.current_thread().name == "first":
            entered.set()
            go.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(output_run, "create_output", slow_create)
    done = {}
    first = threading.Thread(name="first", target=lambda: done.setdefault(
        "c", dgemm.matmul(2 * A, B, out=path, overwrite=True, client=client, block=32)))
    first.start()
    try:
        assert entered.wait(60)
        with pytest.raises(OutputBusyError):
            dgemm.matmul(A, 3 * B, out=path, overwrite=True, client=client, block=32)
        with pytest.raises(dgemm.IncompleteResultError):     # meanwhile a reader finds it unfinished
            dgemm.open_result(path)
    finally:
        go.set()
        first.join(120)
    check_product(dgemm.open_result(path)[...], 2 * A, B, dtype="float64")

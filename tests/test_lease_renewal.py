"""The lease of a run that lasts longer than its stale window: renewed, so a second writer is refused.

A lease not renewed for ``EXPIRY`` intervals is stale and may be taken over
(:mod:`dgemm.storage.lease`).  Here a real client process computes on the
session's cluster with a short ``lease-interval`` (``DGEMM_LEASE_INTERVAL``
in its environment), and its run is held open by one of A's chunk files being
a named pipe: the worker tasks that read that chunk wait in ``open`` until the
test lets them go, so the run lasts as long as the test needs, whatever the
machine's speed.  While it lasts, its lease must keep being renewed well past
its first expiry, and ``overwrite=True`` and ``resume=True`` calls of this
process must be refused; once its client is killed and the window has passed,
``resume=True`` takes the output over and finishes it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import zarr

import dgemm
from _check import check_product, randn, wait_for
from dgemm.storage import COMPLETE_ATTR, lease

INTERVAL = 1.0          # the client's lease-interval, seconds: stale after EXPIRY of them
BLOCK = (32, 32, 64)    # 4 x 4 C blocks of a 128 x 64 @ 64 x 128 product, one k-block
GATED = "c/3/0"         # A's chunk held back: the tasks of C's last block row wait for it

CLIENT_SCRIPT = f"""
import sys
import dgemm
from distributed import Client

if __name__ == "__main__":
    address, a, b, out = sys.argv[1:5]
    with Client(address, set_as_default=False) as client:
        dgemm.matmul(a, b, out=out, client=client, block={BLOCK})
    print("FINISHED")
"""


def zarr_in(path, data, chunks):
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype)
    arr[...] = data
    return arr


class Gate:
    """One chunk file of an array replaced by a named pipe: a reader's ``open`` waits until :meth:`release`.

    The chunk's real file is kept aside; :meth:`release` puts it back (new
    readers get the data) and opens the pipe for writing and closes it, so
    the readers already waiting go on and find it empty (their tasks fail).
    """

    def __init__(self, array_path, key, aside):
        self.path = os.path.join(array_path, *key.split("/"))
        self.aside, self.pipe = str(aside / "chunk"), str(aside / "pipe")
        os.replace(self.path, self.aside)
        os.mkfifo(self.pipe)
        os.link(self.pipe, self.path)   # a second name for the pipe: reachable after the chunk is back
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        os.replace(self.aside, self.path)
        try:
            fd = os.open(self.pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:   # ENXIO: no reader waits on the pipe
            return
        os.close(fd)


def lease_of(path) -> lease.Holder | None:
    try:
        return lease.current(zarr.open_array(path, mode="r"))
    except FileNotFoundError:
        return None


def assert_refused(call, out, first: lease.Holder) -> None:
    """A second writer's call (a future) is refused; it fails the test as soon as it takes the lease instead.

    A call that took over would wait for the first run's tasks, which wait
    for the gate: it is run aside and watched, not waited for.
    """
    wait_for(lambda: call.done() or getattr(lease_of(out), "id", None) != first.id, 60,
             "the second writer's call to end")
    assert call.done(), f"a second writer took over the output of a run renewing its lease: now {lease_of(out)}"
    with pytest.raises(dgemm.OutputBusyError, match="is being written by another dgemm run"):
        call.result()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_long_run_renews_its_lease_and_a_second_writer_is_refused_until_it_dies(client, tmp_path, rng):
    m, k, n = 128, 64, 128
    A, B = randn(rng, (m, k)), randn(rng, (k, n))
    zarr_in(tmp_path / "a.zarr", A, (32, 64))
    zarr_in(tmp_path / "b.zarr", B, (64, 32))
    zarr_in(tmp_path / "a2.zarr", A + 1, (32, 64))
    a, b, out = (str(tmp_path / x) for x in ("a.zarr", "b.zarr", "c.zarr"))
    aside = tmp_path / "aside"
    aside.mkdir()
    gate = Gate(a, GATED, aside)
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), client.scheduler.address, a, b, out],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(tmp_path),
                            env={**os.environ, "DGEMM_LEASE_INTERVAL": str(INTERVAL)})
    pool = ThreadPoolExecutor(1)
    try:
        # computing: the lease names the cluster its tasks run on
        first = wait_for(lambda: proc.poll() is not None or ((h := lease_of(out)) is not None and h.scheduler and h),
                         120, "the client's run to start computing")
        assert proc.poll() is None, f"the client ended before its gated chunk was released: {proc.communicate()[0]}"
        assert first.pid == proc.pid and first.expires == pytest.approx(first.renewed + lease.EXPIRY * INTERVAL)

        # (a) renewed: the lease lives on past the expiry of the record first seen, still the same call's
        seen = {first.renewed}

        def renewed_past_first_expiry():
            held = lease_of(out)
            assert proc.poll() is None, f"the client ended while its run was held: {proc.communicate()[0]}"
            assert held is not None and held.id == first.id, f"the lease changed hands: {held}"
            seen.add(held.renewed)
            return held.renewed > first.expires and held.fresh()

        try:
            wait_for(renewed_past_first_expiry, 10 * lease.EXPIRY * INTERVAL, "the lease renewed past its first expiry")
        except AssertionError as e:
            raise AssertionError(f"{e}: renewed {[round(t - first.renewed, 1) for t in sorted(seen)]} s after the "
                                 f"record first seen, which expired after {lease.EXPIRY * INTERVAL:g} s") from None
        print(f"{len(seen)} renewals seen in {max(seen) - first.renewed:.1f} s (stale after "
              f"{lease.EXPIRY * INTERVAL:g} s without one)")

        # (b) a second writer, now that the first lease record would be stale without renewals, is refused
        assert_refused(pool.submit(dgemm.matmul, str(tmp_path / "a2.zarr"), b, out=out, overwrite=True,
                                   client=client), out, first)
        assert_refused(pool.submit(dgemm.matmul, a, b, out=out, resume=True, client=client), out, first)
        held = lease_of(out)
        assert held is not None and held.id == first.id and held.fresh()    # the refusals changed nothing

        # the writer dies: its lease is no longer renewed, goes stale, and resume=True takes the output over
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
        proc.wait()
        gate.release()      # the dead client's tasks waiting on the pipe go on (and fail): the workers are free
        pool.shutdown()     # a second writer that took over waited for them
    dead = wait_for(lambda: (h := lease_of(out)) is not None and not h.fresh() and h, 10 * lease.EXPIRY * INTERVAL,
                    "the dead client's lease to go stale")
    assert dead.id == first.id and dead.pid == proc.pid
    result = dgemm.matmul(a, b, out=out, resume=True, client=client, block=BLOCK)
    meta = result.attrs[COMPLETE_ATTR]
    print(f"resume ran {meta['blocks_run']} of {meta['blocks']} blocks")
    assert meta["complete"] is True and meta["resumed"] is True and meta["blocks"] == 16
    check_product(dgemm.open_result(out)[...], A, B, dtype="float64")
    assert lease.current(result) is None                                 # taken over, then released

"""The ``device-codecs`` setting on a cluster's workers, and the codec counters a call grows there.

Shared by tests/test_decoding.py and tests/test_encoding.py.
"""
from __future__ import annotations

import dask

from dgemm.names import CODEC_COUNTERS, WORKER_PLUGIN


def configure(value, dask_worker=None):
    """On a worker: set ``dgemm.device-codecs`` (None: unset)."""
    dask.config.set({"dgemm.device-codecs": value})


def setting(client):
    """A fixture's body: ``setting(value)`` for the test, the setting unset again after it."""
    yield lambda value: client.run(configure, value)
    client.run(configure, None)


def _counters(keys, dask_worker=None):
    """On a worker: its dgemm metric's ``keys`` (what its heartbeats carry to the scheduler)."""
    snap = dask_worker.plugins[WORKER_PLUGIN].metric(dask_worker)
    return {k: snap[k] for k in keys}


def run_counted(client, fn, keys=CODEC_COUNTERS):
    """``(fn(), what each of keys grew by, summed over the workers)``."""
    before = client.run(_counters, keys)
    result = fn()
    after = client.run(_counters, keys)
    return result, {k: sum(after[w][k] - before[w][k] for w in after) for k in keys}


_HELD: list = []    # (release event, threads) of the slots held on this worker


def hold_slots(dask_worker=None, device=None) -> int:
    """On a worker (or for ``device`` in this process): threads holding every decode slot of its device (until :func:`free_slots`, or 2 minutes: far
    longer than the tests' small products take, and a test that fails before it frees them, or a reader that waits
    for them, is not left without slots); how many slots stay free."""
    import threading

    from dgemm.worker import device_state

    scratch = (device or device_state().device).scratch
    release, ready = threading.Event(), threading.Barrier(scratch._slots + 1)

    def hold():
        with scratch.slot():
            ready.wait(60)
            release.wait(120)

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(scratch._slots)]
    for t in threads:
        t.start()
    _HELD.append((release, threads))
    ready.wait(60)      # (raises where a slot was not taken in time)
    return scratch.free_now()


def free_slots(dask_worker=None) -> None:
    """On a worker: let go of the slots :func:`hold_slots` took."""
    while _HELD:
        release, threads = _HELD.pop()
        release.set()
        for t in threads:
            t.join(30)


def behind_a_gate(dev, buf, before, value, fn, what: str):
    """``fn(written)`` run in a thread of its own, ``written`` a fill of ``buf`` (first holding the array ``before``)
    with ``value`` on the device's GEMM queue, held back by a user event: ``fn`` must not return before the gate
    opens (checked half a second on), then must return (its value is returned; its error is raised)."""
    import threading

    import pyopencl as cl

    gate, opened = cl.UserEvent(dev.context), False
    got, errors = [], []

    def run(written):
        try:
            got.append(fn(written))
        except Exception as e:   # noqa: BLE001  (shown by the assertion below)
            errors.append(e)
    try:
        cl.enqueue_copy(dev.queue, buf, before).wait()
        written = cl.enqueue_fill_buffer(dev.queue, buf, value, 0, before.nbytes, wait_for=[gate])
        dev.queue.flush()
        t = threading.Thread(target=run, args=(written,), daemon=True)
        t.start()
        t.join(0.5)
        assert t.is_alive() and not got, f"{what} returned before what writes its buffer had run"
        opened = gate.set_status(cl.command_execution_status.COMPLETE) or True
        t.join(120)
        assert not t.is_alive() and not errors, errors
    finally:
        if not opened:      # (a failed check above: the thread must not wait for ever)
            gate.set_status(cl.command_execution_status.COMPLETE)
        dev.queue.finish()
    return got[0]

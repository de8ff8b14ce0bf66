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

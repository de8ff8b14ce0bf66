"""The threads that help a store task encode and write its C block's chunks (:func:`dgemm.storage.chunks.write_region`,
and the frames the device encoded: :func:`dgemm.storage.encoded.write`).

A store task encodes and writes its block's chunks on its own thread.  Where a
worker's cores would otherwise idle (a run's last blocks, :func:`dgemm.worker.tasks.store`),
it deals them to helper threads too: :func:`shared`.  The helpers are one
pool per process, at most one thread a core, made when first asked for.
Idle, they hold no memory of their own: their encoders' buffers are freed
with every thread's (:func:`dgemm.storage.zstd.release`), and they keep no
scratch chunk.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """This process's helper threads."""
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="dgemm-encode")
        return _POOL


def shared(fn, items: list, threads: int) -> list:
    """``[fn(x, helper) for x in items]``, the items dealt in turn to this thread (``helper`` False) and to
    ``threads - 1`` helpers (True).

    Returns once every item is done; raises the first error (this
    thread's first), after the helpers' items all finished or failed, so
    that nothing is still being written when the caller learns of it.
    """
    threads = max(1, min(int(threads), len(items)))
    if threads == 1:
        return [fn(x, False) for x in items]
    futures = [pool().submit(lambda part: [fn(x, True) for x in part], items[t::threads]) for t in range(1, threads)]
    mine, error = None, None
    try:
        mine = [fn(x, False) for x in items[0::threads]]
    except BaseException as e:
        error = e
    theirs = []
    for f in futures:
        try:
            theirs.append(f.result())
        except BaseException as e:
            error = error or e
    if error is not None:
        raise error
    out = [None] * len(items)
    out[0::threads] = mine
    for t, part in enumerate(theirs, start=1):
        out[t::threads] = part
    return out

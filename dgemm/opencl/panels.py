"""The panel cache: input blocks kept on the device, in the kernel's layout, for reuse.

A C block ``(i, j)`` needs the A row panel ``i`` and the B column panel
``j``.  A worker that runs the blocks of a row one after the other (the
graph orders them so, see :mod:`dgemm.client.graph`) needs A's panel again for each
of them, and B's panels again on every row.  Keeping the staged (padded,
transposed) device buffers means each input block is read from the store
and sent over PCIe once per worker while it fits, instead of once per use.

Entries are futures: the first task that asks for a block starts its read
and upload in the background, and later askers (a prefetch, the next task)
wait on the same future instead of reading it twice.  An entry in use is
pinned and never evicted; the least recently used unpinned entries go when
the cache would exceed its budget.  Freeing an entry only drops the Python
reference: OpenCL keeps a buffer alive until the commands using it finish.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field


@dataclass
class Entry:
    """One cached block: a future of ``(buffer, event)``, its size and its users."""

    future: Future
    nbytes: int
    pins: int = 0
    hits: int = 0
    meta: dict = field(default_factory=dict)


class PanelCache:
    """Device buffers keyed by what they hold, evicted least recently used first.

    Parameters
    ----------
    budget : int
        Bytes the cached buffers may hold together.  Pinned entries may push
        it over (a task's own inputs are never dropped under it).

    Examples
    --------
    >>> from concurrent.futures import Future
    >>> def ready(x):
    ...     f = Future(); f.set_result(x); return f
    >>> cache = PanelCache(budget=100)
    >>> e, hit = cache.acquire("a", 60, lambda: ready("A"))
    >>> hit, e.future.result()
    (False, 'A')
    >>> cache.release(e)
    >>> e, hit = cache.acquire("a", 60, lambda: ready("A again"))
    >>> hit, e.future.result()                 # served from the cache
    (True, 'A')
    >>> cache.release(e)
    >>> e2, _ = cache.acquire("b", 60, lambda: ready("B"))   # "a" is evicted to make room
    >>> sorted(cache.keys()), cache.bytes
    (['b'], 60)
    """

    def __init__(self, budget: int = 0):
        self.budget = int(budget)
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.peak = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def keys(self) -> list:
        with self._lock:
            return list(self._entries)

    def acquire(self, key, nbytes: int, make) -> tuple[Entry, bool]:
        """The pinned entry for ``key``, made by ``make()`` (which returns a Future) on a miss.

        Returns the entry and whether it was already there.  Every acquire
        must be paired with a :meth:`release`.  A ``key`` of None is never
        stored: the entry is made, pinned and dropped on release.
        """
        with self._lock:
            entry = self._entries.get(key) if key is not None else None
            if entry is not None:
                self._entries.move_to_end(key)
                entry.pins += 1
                entry.hits += 1
                self.hits += 1
                return entry, True
            self.misses += 1
            if key is not None:
                self._evict(nbytes)
            entry = Entry(None, int(nbytes), pins=1)
            if key is not None:
                self._entries[key] = entry
                self.bytes += entry.nbytes
                self.peak = max(self.peak, self.bytes)
        try:
            entry.future = make()
        except BaseException:
            self._forget(key, entry)
            raise
        if key is not None:
            # A failed read must not stay cached: the next asker tries again.
            entry.future.add_done_callback(lambda f: f.exception() is not None and self._forget(key, entry))
        return entry, False

    def release(self, entry: Entry) -> None:
        with self._lock:
            entry.pins -= 1
            if self.bytes > self.budget:
                self._evict(0)

    def _evict(self, incoming: int) -> None:
        # Oldest first; in-use (pinned) entries stay.
        for key in list(self._entries):
            if self.bytes + incoming <= self.budget:
                return
            e = self._entries[key]
            if e.pins == 0:
                del self._entries[key]
                self.bytes -= e.nbytes
                self.evictions += 1

    def _forget(self, key, entry: Entry) -> None:
        with self._lock:
            if key is not None and self._entries.get(key) is entry:
                del self._entries[key]
                self.bytes -= entry.nbytes

    def clear(self) -> None:
        """Drop every unpinned entry."""
        with self._lock:
            saved, self.budget = self.budget, 0
            self._evict(0)
            self.budget = saved

    def stats(self) -> dict:
        with self._lock:
            return {"cache_bytes": self.bytes, "cache_peak_bytes": self.peak, "cache_hits": self.hits,
                    "cache_misses": self.misses, "cache_evictions": self.evictions,
                    "cache_entries": len(self._entries)}

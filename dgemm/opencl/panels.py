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
the cache would exceed its budget.  The cache is per run: a run's entries go
when the next run (another ``scope``, the first item of a tuple key) starts
(:meth:`PanelCache.enter`), or when the worker sees its run end
(:meth:`PanelCache.drop`).  A dropped entry is handed to ``on_drop``, which
releases its buffer at once (OpenCL keeps a released buffer alive until the
commands using it finish); only dropping the reference is not enough, as
anything in a reference cycle with the buffer would hold the device memory
until Python's collector happens to run.
"""
from __future__ import annotations

import functools
import threading
import weakref
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
    stored: bool = False   # in the cache now (dropped entries are handed to on_drop once unpinned)


class PanelCache:
    """Device buffers keyed by what they hold, evicted least recently used first.

    Parameters
    ----------
    budget : int
        Bytes the cached buffers may hold together.  Pinned entries may push
        it over (a task's own inputs are never dropped under it).
    on_drop : callable, optional
        Called with each entry evicted or dropped (unpinned, no longer in
        the cache), outside the cache's lock: the device releases its buffer.

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

    def __init__(self, budget: int = 0, on_drop=None):
        self.budget = int(budget)
        self.on_drop = on_drop
        self.scope = None
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
            dropped = self._evict(nbytes) if key is not None else []
            entry = Entry(None, int(nbytes), pins=1)
            if key is not None:
                self._entries[key] = entry
                entry.stored = True
                self.bytes += entry.nbytes
                self.peak = max(self.peak, self.bytes)
        self._dropped(dropped)
        try:
            entry.future = make()
        except BaseException:
            self._forget(key, entry)
            raise
        if key is not None:
            # A failed read must not stay cached: the next asker tries again.  The callback holds the
            # entry weakly: entry -> future -> callback -> entry would be a reference cycle, keeping
            # every evicted entry's device buffer alive until the collector ran (issue 26).
            entry.future.add_done_callback(functools.partial(_forget_failed, weakref.ref(self), key,
                                                             weakref.ref(entry)))
        return entry, False

    def release(self, entry: Entry) -> None:
        """Unpin ``entry``; an entry made for a key of None (never stored) is dropped now."""
        dropped = []
        with self._lock:
            entry.pins -= 1
            if entry.pins == 0 and not entry.stored:
                dropped.append(entry)   # not (or no longer) in the cache: nobody else will drop it
            if self.bytes > self.budget:
                dropped += self._evict(0)
        self._dropped(dropped)

    def _evict(self, incoming: int) -> list:
        """Drop the oldest unpinned entries until ``incoming`` more bytes fit; returns them (in the lock)."""
        out = []
        for key in list(self._entries):
            if self.bytes + incoming <= self.budget:
                break
            e = self._entries[key]
            if e.pins == 0:
                del self._entries[key]
                e.stored = False
                self.bytes -= e.nbytes
                self.evictions += 1
                out.append(e)
        return out

    def _dropped(self, entries: list) -> None:
        if self.on_drop is not None:
            for e in entries:
                self.on_drop(e)

    def enter(self, scope) -> None:
        """A product of run ``scope`` starts: drop the entries of other runs that no product uses now.

        A run whose entries are all unpinned has no product running; if it
        goes on after all, its next blocks are read again.
        """
        with self._lock:
            if scope == self.scope:
                return
            self.scope = scope
            busy = {_scope(k) for k, e in self._entries.items() if e.pins}
        self.drop(lambda s: s != scope and s not in busy)

    def drop(self, which=None) -> int:
        """Drop the unpinned entries whose scope ``which(scope)`` accepts (all without it); returns how many."""
        with self._lock:
            gone = [k for k, e in self._entries.items() if e.pins == 0 and (which is None or which(_scope(k)))]
            out = [self._entries.pop(k) for k in gone]
            for e in out:
                e.stored = False
            self.bytes -= sum(e.nbytes for e in out)
            if which is None:
                self.scope = None
        self._dropped(out)
        return len(out)

    def _forget(self, key, entry: Entry) -> None:
        with self._lock:
            if key is not None and self._entries.get(key) is entry:
                del self._entries[key]
                entry.stored = False
                self.bytes -= entry.nbytes

    def clear(self) -> None:
        """Drop every unpinned entry (handing each to ``on_drop``)."""
        self.drop()

    def stats(self) -> dict:
        with self._lock:
            return {"cache_bytes": self.bytes, "cache_peak_bytes": self.peak, "cache_hits": self.hits,
                    "cache_misses": self.misses, "cache_evictions": self.evictions,
                    "cache_entries": len(self._entries)}


def _scope(key):
    """The run a key belongs to: the first item of a tuple key (the engine's keys), else None."""
    return key[0] if isinstance(key, tuple) and key else None


def _forget_failed(cache_ref, key, entry_ref, future) -> None:
    """A future's callback: forget a failed entry (held weakly, so that no reference cycle forms)."""
    cache, entry = cache_ref(), entry_ref()
    if cache is not None and entry is not None and future.exception() is not None:
        cache._forget(key, entry)

"""Decoded input blocks shared by the device workers of one process.

Where one process drives several devices (the ``worker-process: host``
setting: a Dask worker per device, all in one process; or an in-process
cluster), a block that several of them read is read and decoded once: the
first reader decodes it into its own buffer and leaves a copy on the
process's :class:`Board`; the others wait for it (on an event, no polling)
and copy it from there; the last one frees it.  No file, no lock between
processes, no checksum: unlike the host cache (:mod:`~dgemm.storage.hostcache`,
one process per device), what is shared never leaves the process.

The client's placement says which blocks several workers of a host read and
how many (``ZarrBlock.host_shared``, ``host_readers``); only those go
through the board (:func:`through`).  The board is bounded
(:data:`LIMIT_FRACTION` of the host's memory): a block that does not fit is
decoded by each of its readers, as without it.  A run's blocks go when the
run ends here (:func:`drop`), so nothing of a run outlives it.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from dgemm.sizes import host_memory
from dgemm.storage.blocks import Through, ZarrBlock, unreadable

# Of the host's memory, what the blocks waiting for their other readers may hold.  The devices of a
# process read the shared panels in the same order (each one's rectangle of C, row by row), so a
# block waits for as long as one device runs behind the other: a few blocks, not a panel.
LIMIT_FRACTION = 1 / 16
# Seconds a reader waits for another's decode before it decodes the block itself: a decode takes
# well under a second; this only bounds a reader whose decoding thread hangs in a store.
WAIT = 300.0


class _Entry:
    __slots__ = ("ready", "data", "left")

    def __init__(self, left: int):
        self.ready = threading.Event()
        self.data: np.ndarray | None = None   # the block, once decoded and kept; None: not kept (or failed)
        self.left = left                      # readers still to take it


class Board:
    """The decoded blocks of this process's runs that other readers in it still need.

    Parameters
    ----------
    limit : int
        Bytes the kept blocks may hold together (their buffers are reused
        for the next blocks of the same size, up to the same bound).
    """

    def __init__(self, limit: int):
        self.limit = int(limit)
        self._lock = threading.Lock()
        self._entries: dict = {}      # (scope, key) -> _Entry
        self._held = 0                # bytes of the kept blocks and of the spare buffers
        self._spare: dict = {}        # nbytes -> buffers to reuse (no page faults for the next block)

    def fetch(self, scope: Hashable, key: Hashable, readers: int, out: np.ndarray,
              decode: Callable[[np.ndarray], None]) -> bool:
        """Fill ``out`` with block ``key`` of run ``scope``, which ``readers`` readers of this process take.

        Returns True when another reader's decode was copied, False when
        this one decoded (and kept a copy for the others, if it fits).  A
        decode that fails raises here, and a reader waiting for it decodes
        the block itself (and fails with its own error, if it fails again).
        """
        with self._lock:
            entry = self._entries.get((scope, key))
            mine = entry is None
            if mine:
                entry = self._entries[(scope, key)] = _Entry(readers - 1)
        if mine:
            return self._decode(scope, key, entry, out, decode)
        if not entry.ready.wait(WAIT):
            decode(out)
            return False
        with self._lock:
            data = entry.data
        if data is None:              # not kept (no room) or its decode failed: decode it here
            decode(out)
            return False
        np.copyto(out, data)
        with self._lock:
            entry.left -= 1
            if entry.left <= 0 and self._entries.get((scope, key)) is entry:
                del self._entries[(scope, key)]
                self._give_back(entry)
        return True

    def _decode(self, scope, key, entry: _Entry, out: np.ndarray, decode) -> bool:
        try:
            decode(out)
            if entry.left > 0:
                kept = self._take(out)
                if kept is not None:
                    np.copyto(kept, out)
                    entry.data = kept
        except BaseException:
            with self._lock:
                if self._entries.get((scope, key)) is entry:
                    del self._entries[(scope, key)]
                self._give_back(entry)
            raise
        finally:
            entry.ready.set()
        if entry.data is None:
            with self._lock:
                if self._entries.get((scope, key)) is entry:
                    del self._entries[(scope, key)]
        return False

    def _take(self, like: np.ndarray) -> np.ndarray | None:
        """A buffer of ``like``'s shape and dtype counted against the limit, or None where it does not fit."""
        n = like.nbytes
        with self._lock:
            spare = self._spare.get(n)
            if spare:
                raw = spare.pop()
            elif self._held + n <= self.limit:
                self._held += n
                raw = None
            else:
                return None
        if raw is None:
            raw = np.empty(n, np.uint8)
        return raw.view(like.dtype).reshape(like.shape)

    def _give_back(self, entry: _Entry) -> None:
        """(Under the lock.)  The entry's buffer goes to the spares of its size."""
        data, entry.data = entry.data, None
        if data is not None:
            raw = data.reshape(-1).view(np.uint8)
            self._spare.setdefault(raw.nbytes, []).append(raw)

    def drop(self, scope: Hashable | None = None) -> int:
        """Forget run ``scope``'s blocks (every run's with None); bytes freed.

        The spare buffers go too once no run's block is left.  A reader
        copying a block meanwhile keeps its buffer alive until it is done.
        """
        with self._lock:
            before = self._held
            for k in [k for k in self._entries if scope is None or k[0] == scope]:
                self._entries.pop(k).data = None
            if not self._entries:
                self._spare.clear()
            self._held = (sum(e.data.nbytes for e in self._entries.values() if e.data is not None)
                          + sum(b.nbytes for bufs in self._spare.values() for b in bufs))
            return before - self._held

    def held(self) -> int:
        """Bytes held now: the blocks kept for their other readers and the spare buffers."""
        with self._lock:
            return self._held

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


_BOARD: Board | None = None
_BOARD_LOCK = threading.Lock()


def board() -> Board:
    """This process's board, made on first use."""
    global _BOARD
    with _BOARD_LOCK:
        if _BOARD is None:
            _BOARD = Board(int(host_memory() * LIMIT_FRACTION))
        return _BOARD


def drop(scope: Hashable | None = None) -> int:
    """Forget run ``scope``'s shared blocks in this process (see :meth:`Board.drop`); bytes freed."""
    return _BOARD.drop(scope) if _BOARD is not None else 0


@dataclass(frozen=True)
class Sibling(Through):
    """A :class:`~dgemm.storage.blocks.ZarrBlock` of run ``scope`` read through this process's board.

    Read like the block itself (``shape``, ``dtype``, ``key()``,
    ``copies``); :meth:`fill_into` also says whether it was copied from
    another reader's decode, which the engine counts as the host cache's
    (``host_cache_*``: what was shared on this host).
    """

    block: ZarrBlock
    board: Board
    scope: Hashable

    def fill_into(self, out: np.ndarray) -> bool:
        """Fill all of ``out`` as :meth:`ZarrBlock.fill_into <dgemm.storage.blocks.ZarrBlock.fill_into>` does;
        True when another reader's decode was copied, False when decoded here; raises the same one read error."""
        try:
            return self.board.fetch(self.scope, self.block.key(), self.block.host_readers, out,
                                    self.block.decode_into)
        except Exception as e:
            raise unreadable(self.block, e) from e


def through(shared: Board | None, scope: Hashable, ref):
    """``ref`` to be read through ``shared`` for run ``scope``: a :class:`Sibling` for a Zarr block that
    other workers of the host read too (``host_readers`` > 1), else ``ref``.

    Blocks only copied from their files (raw chunks, :attr:`ZarrBlock.copies`)
    are read by each reader: a copy from the board would save nothing.
    """
    if (shared is None or scope is None or not isinstance(ref, ZarrBlock) or ref.host_readers < 2
            or ref.copies):
        return ref
    return Sibling(ref, shared, scope)

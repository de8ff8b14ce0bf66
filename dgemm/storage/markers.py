"""Completion records of an output: the ``dgemm`` attribute of a finished run and per-block markers.

The attribute (:data:`COMPLETE_ATTR`) says whether the run that writes an
output finished; the markers (:class:`BlockMarkers`) say which of its blocks
are stored, so an interrupted run can be resumed.  Once the run completes
the markers go (:meth:`BlockMarkers.remove`): the attribute alone says a
finished output is complete.
"""
from __future__ import annotations

import hashlib
import json
import re

from dgemm.storage import keys

COMPLETE_ATTR = "dgemm"
# A marker's name under its run's prefix, "<i>.<j>", or that of one whose writer was killed mid-write: zarr's
# local store writes "<i>.<32 hex digits>.partial", then renames it.
_MARKER = re.compile(r"\d+\.(\d+|[0-9a-f]{32}\.partial)")
_PASSES = 3   # removals tried while stragglers add or take back markers at the same time


def run_id(fingerprint: dict) -> str:
    """A short stable hash of a run's fingerprint (a resumed run must have the same).

    >>> run_id({"a": 1}) == run_id({"a": 1}) != run_id({"a": 2})
    True
    """
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


class BlockMarkers:
    """Which C blocks of one run are safely stored: one tiny store object per block.

    A store task writes its block, then its marker ``<array>/.dgemm/done/<owner>/<i>.<j>``.
    ``owner`` names the run that writes the output (a token drawn when the
    output is created, kept by ``resume``; :mod:`dgemm.storage.lease`), so two
    runs of the same product never share markers.  Each block has its own
    key, so concurrent writers never touch the same object (unlike a Zarr
    attribute, which is one JSON document); the keys live in the output's own
    store (:mod:`dgemm.storage.keys`).

    With a ``fence`` (:class:`~dgemm.storage.lease.Fence`, the run's: the
    markers a run's store tasks get) a marker holds the id of the call that
    wrote it, and is taken back when, once written, the call's lease is
    gone or another's: a task that passed its check before the run completed,
    or before a later run took the output over, leaves nothing behind.
    """

    def __init__(self, array, owner: str, fence=None):
        self.store = array.store
        self.root = keys.root(array)
        self.prefix = f"{self.root}/done/{owner}/"
        self.fence = fence

    def key(self, i: int, j: int) -> str:
        return f"{self.prefix}{i}.{j}"

    def mark(self, i: int, j: int) -> None:
        """Write block ``(i, j)``'s marker (its block is stored whole).

        Raises
        ------
        OutputTakenOverError
            The run no longer holds the output (completed, stopped or taken
            over) once the marker is written: it is taken back.
        """
        if self.fence is None:
            keys.put(self.store, self.key(i, j), b"1")
            return
        mine = self.fence.id.encode()
        keys.put(self.store, self.key(i, j), mine)
        try:
            # checked after the write: a run that completes gives its lease up before it removes its markers,
            # and a later run holds the lease before it writes; so a marker written too late is found here
            self.fence.check(i, j, stored=True)
        except Exception:
            if keys.get(self.store, self.key(i, j)) == mine:   # another call's marker of the same key stays
                keys.delete(self.store, self.key(i, j))
            keys.prune(self.store, self.prefix.rstrip("/"))
            raise

    def is_done(self, i: int, j: int) -> bool:
        """Whether block ``(i, j)`` has its marker (one small existence check)."""
        return keys.exists(self.store, self.key(i, j))

    def done(self, grid: tuple[int, int] | None = None) -> set[tuple[int, int]]:
        """The ``(i, j)`` of every marked block (``grid`` is needed by stores that cannot list keys)."""
        if getattr(self.store, "supports_listing", True):
            out = set()
            for k in keys.listed(self.store, self.prefix):
                name = k[len(self.prefix):] if k.startswith(self.prefix) else k.rsplit("/", 1)[-1]
                i, _, j = name.partition(".")
                if i.isdigit() and j.isdigit():
                    out.add((int(i), int(j)))
            return out
        if grid is None:
            raise ValueError(f"{self.store} cannot list keys; pass the block grid")
        return {(i, j) for i in range(grid[0]) for j in range(grid[1]) if self.is_done(i, j)}

    def remove(self) -> None:
        """Remove this run's markers (a completed run's: ``resume`` has nothing left to do), nothing else.

        Only keys named as markers are deleted (and the temporary file of
        one whose writer was killed mid-write), all at once where every key
        under the run's prefix is one (a single request on an object
        store), one by one otherwise: a file that dgemm did not write stays.
        Where the store cannot list or delete, they stay, unused.
        """
        if not getattr(self.store, "supports_listing", True) or not getattr(self.store, "supports_deletes", True):
            return
        for attempt in range(_PASSES):
            found = keys.listed(self.store, self.prefix)
            ours = [k for k in found if _MARKER.fullmatch(k[len(self.prefix):] if k.startswith(self.prefix) else "")]
            if not ours:
                break
            try:
                if len(ours) == len(found):
                    keys.delete_dir(self.store, self.prefix.rstrip("/"))
                else:
                    for k in ours:
                        keys.delete(self.store, k)
            except OSError:
                # a straggler's marker written or taken back meanwhile (a local folder's removal then fails
                # part way): what is left goes in the next pass
                if attempt == _PASSES - 1:
                    raise
        keys.prune(self.store, self.prefix.rstrip("/"))

    def reset(self, keep=frozenset()) -> None:
        """Remove every dgemm record of this array (markers of any run, originals) but the keys ``keep``.

        A fresh start; the run's lease, named in ``keep``, stays held.
        Where the store cannot list or delete, the records stay, unused.
        """
        if getattr(self.store, "supports_listing", True) and getattr(self.store, "supports_deletes", True):
            keys.clear_except(self.store, self.root, set(keep), aside=False)
            keys.prune(self.store, self.root)   # a local .dgemm folder left empty


def mark_complete(array, meta: dict) -> None:
    """Written last: a reader can tell a finished result from an interrupted one."""
    attrs = dict(array.attrs.get(COMPLETE_ATTR, {}))
    attrs.update(meta)
    attrs["complete"] = True
    array.attrs[COMPLETE_ATTR] = attrs

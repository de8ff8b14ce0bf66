"""Completion records of an output: the ``dgemm`` attribute of a finished run and per-block markers.

The attribute (:data:`COMPLETE_ATTR`) says whether the run that writes an
output finished; the markers (:class:`BlockMarkers`) say which of its blocks
are stored, so an interrupted run can be resumed.
"""
from __future__ import annotations

import hashlib
import json


COMPLETE_ATTR = "dgemm"
MARKERS = ".dgemm"   # key prefix, inside the output's own prefix, of the per-block completion markers


def run_id(fingerprint: dict) -> str:
    """A short stable hash of a run's fingerprint (names its block markers).

    >>> run_id({"a": 1}) == run_id({"a": 1}) != run_id({"a": 2})
    True
    """
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


class BlockMarkers:
    """Which C blocks of one run are safely stored: one tiny store object per block.

    A store task writes its block, then its marker ``<array>/.dgemm/done/<run>/<i>.<j>``.
    Each block has its own key, so concurrent writers never touch the same
    object (unlike a Zarr attribute, which is one JSON document), and the
    markers live in the output's own store, so they work for any Zarr store
    (local, fsspec/object stores) and go when the array is overwritten.  Zarr
    ignores keys it does not know, so readers of the array never see them.
    """

    def __init__(self, array, run: str):
        self.store = array.store
        node = array.path.strip("/")
        self.root = f"{node}/{MARKERS}" if node else MARKERS
        self.prefix = f"{self.root}/done/{run}/"

    def key(self, i: int, j: int) -> str:
        return f"{self.prefix}{i}.{j}"

    def mark(self, i: int, j: int) -> None:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync
        sync(self.store.set(self.key(i, j), default_buffer_prototype().buffer.from_bytes(b"1")))

    def done(self, grid: tuple[int, int] | None = None) -> set[tuple[int, int]]:
        """The ``(i, j)`` of every marked block (``grid`` is needed by stores that cannot list keys)."""
        from zarr.core.sync import sync

        async def listed():
            return [k async for k in self.store.list_prefix(self.prefix)]

        if getattr(self.store, "supports_listing", True):
            keys = sync(listed())
            out = set()
            for k in keys:
                name = k[len(self.prefix):] if k.startswith(self.prefix) else k.rsplit("/", 1)[-1]
                i, _, j = name.partition(".")
                if i.isdigit() and j.isdigit():
                    out.add((int(i), int(j)))
            return out
        if grid is None:
            raise ValueError(f"{self.store} cannot list keys; pass the block grid")
        return {(i, j) for i in range(grid[0]) for j in range(grid[1]) if sync(self.store.exists(self.key(i, j)))}

    def reset(self) -> None:
        """Remove every marker (of any run) of this array: a fresh run starts from none."""
        from zarr.core.sync import sync
        if getattr(self.store, "supports_deletes", True):
            sync(self.store.delete_dir(self.root))


def mark_complete(array, meta: dict) -> None:
    """Written last: a reader can tell a finished result from an interrupted one."""
    attrs = dict(array.attrs.get(COMPLETE_ATTR, {}))
    attrs.update(meta)
    attrs["complete"] = True
    array.attrs[COMPLETE_ATTR] = attrs

"""Where an output lies among Zarr groups, and the dimension names in its metadata.

What the xarray layer (:mod:`dgemm.client.dataarrays`) needs of the store
to write a product's dims and coordinates the way xarray reads them: the
store and path an ``out`` names, the group that would hold it, and saving
Zarr v3 ``dimension_names`` into an existing array (zarr has no public call
for that once an array is created: one of this package's uses of zarr's
private API).
"""
from __future__ import annotations

from pathlib import Path

from dgemm.storage.locations import local_path
from dgemm.storage.options import is_url


def out_store(out, storage_options=None):
    """``(store, path)`` of the array ``out`` names (it need not exist yet); None for anything else."""
    import zarr
    from zarr.abc.store import Store
    from zarr.storage import FsspecStore, LocalStore

    if isinstance(out, zarr.Array):
        return out.store, out.path
    if isinstance(out, Store):
        return out, ""
    local = local_path(out)
    if local is not None:
        return LocalStore(local), ""
    if is_url(out):
        return FsspecStore.from_url(str(out), storage_options=storage_options or None, read_only=False), ""
    return None


def enclosing_group(store, path: str):
    """``(group store, group path, name)`` of the group that would hold the array at ``(store, path)``, or None."""
    from zarr.storage import FsspecStore, LocalStore

    path = path.strip("/")
    if path:
        parent, _, name = path.rpartition("/")
        return store, parent, name
    if isinstance(store, LocalStore):
        root = Path(store.root)
        return LocalStore(root.parent, read_only=store.read_only), "", root.name
    if isinstance(store, FsspecStore):
        parent, _, name = store.path.rstrip("/").rpartition("/")
        if not parent or not name:
            return None
        return FsspecStore(store.fs, read_only=store.read_only, path=parent), "", name
    return None   # a store of its own (memory, zip...): no group around it


def open_group(store, path: str):
    """The Zarr group at ``(store, path)``, read-only; None where there is none (a plain folder, nothing)."""
    import zarr
    try:
        return zarr.open_group(store=store, path=path, mode="r")
    except Exception:
        return None


def save_dimension_names(array, dims) -> None:
    """Save ``dims`` as a Zarr v3 ``array``'s ``dimension_names``, its other metadata as it is now."""
    import dataclasses

    from zarr.core.sync import sync

    metadata = dataclasses.replace(array.metadata, dimension_names=tuple(dims))
    sync(array._async_array._save_metadata(metadata, ensure_parents=False))

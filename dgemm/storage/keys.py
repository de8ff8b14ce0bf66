"""The small objects dgemm keeps next to an output's chunks, under ``<array>/.dgemm/``.

Block markers (:mod:`dgemm.storage.markers`), the originals of an in-place
C (:mod:`dgemm.storage.originals`) and the lease of the run writing the
output (:mod:`dgemm.storage.lease`) are plain keys of the output's own
store, so they work for any Zarr store (local, fsspec/object stores) and
go when the array is overwritten; Zarr ignores keys it does not know.
These helpers are the only place they touch zarr's store API.
"""
from __future__ import annotations

PREFIX = ".dgemm"   # inside the output's own prefix


def root(array) -> str:
    """The key prefix of ``array``'s dgemm records (``<array path>/.dgemm``)."""
    node = array.path.strip("/")
    return f"{node}/{PREFIX}" if node else PREFIX


def put(store, key: str, data: bytes) -> None:
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync
    sync(store.set(key, default_buffer_prototype().buffer.from_bytes(data)))


def get(store, key: str) -> bytes | None:
    """The bytes at ``key``, None when there is no such key."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync
    buf = sync(store.get(key, prototype=default_buffer_prototype()))
    return None if buf is None else buf.to_bytes()


def exists(store, key: str) -> bool:
    from zarr.core.sync import sync
    return sync(store.exists(key))


def delete(store, key: str) -> None:
    from zarr.core.sync import sync
    if getattr(store, "supports_deletes", True):
        sync(store.delete(key))


def delete_dir(store, prefix: str) -> None:
    """Remove every key under ``prefix`` (where the store can; elsewhere they stay, unused)."""
    from zarr.core.sync import sync
    if getattr(store, "supports_deletes", True) and getattr(store, "supports_listing", True):
        sync(store.delete_dir(prefix))


def listed(store, prefix: str) -> list[str]:
    """Every key under ``prefix`` (the store must support listing)."""
    from zarr.core.sync import sync

    async def keys():
        return [k async for k in store.list_prefix(prefix)]
    return sync(keys())


def put_new(store, key: str, data: bytes) -> bool:
    """Write ``key`` unless it exists; whether this call's ``data`` is what it holds now.

    Exclusive where the store can be (a local file created exclusively);
    elsewhere (object stores) a check and a write, with a window of a
    round trip.  ``data`` must be unique to the caller (a lease is).
    """
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync
    sync(store.set_if_not_exists(key, default_buffer_prototype().buffer.from_bytes(data)))
    return get(store, key) == data


def clear_except(store, prefix: str, keep) -> None:
    """Remove every key under ``prefix`` except those in ``keep``, whole folders at a time where the store can."""
    from zarr.core.sync import sync

    async def children():
        return [c async for c in store.list_dir(prefix)]

    for child in sync(children()):
        path = f"{prefix}/{child}" if prefix else child
        if path in keep:
            continue
        if any(k.startswith(path + "/") for k in keep):
            clear_except(store, path, keep)
        elif exists(store, path):    # a key
            delete(store, path)
        else:                        # a folder of keys
            delete_dir(store, path)

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


def prune(store, prefix: str) -> None:
    """Remove the empty folders of a local store from ``prefix`` up to the array's ``.dgemm`` folder itself.

    Object stores have no folders; a local one keeps a folder after its
    last key goes.  Only empty folders are removed (``rmdir`` refuses any
    other), so nothing of anyone else's goes, and a folder a new run has
    just written into stays.
    """
    import os

    from dgemm.storage.locations import local_folder

    folder = local_folder(store)
    if folder is None or PREFIX not in prefix.split("/"):
        return
    parts = prefix.split("/")
    top = parts.index(PREFIX)
    for depth in range(len(parts), top, -1):
        try:
            os.rmdir(os.path.join(folder, *parts[:depth]))
        except OSError:   # not empty (or gone already): what is left above it stays too
            if os.path.isdir(os.path.join(folder, *parts[:depth])):
                return


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


def clear_except(store, prefix: str, keep, node: str | None = None, aside: bool = True) -> None:
    """Remove every key under ``prefix`` except those in ``keep``, whole folders at a time where the store can.

    With ``aside``, folders of a local store are set aside (:func:`set_aside`)
    beside the folder of ``node`` (default ``prefix``), and deleted in the
    background; without, deleted at once (a few small records).
    """
    from zarr.core.sync import sync

    node = prefix if node is None else node

    async def children():
        return [c async for c in store.list_dir(prefix)]

    for child in sync(children()):
        path = f"{prefix}/{child}" if prefix else child
        if path in keep:
            continue
        if any(k.startswith(path + "/") for k in keep):
            clear_except(store, path, keep, node, aside)
            continue
        # An object store's exists() is true of a folder of keys too (s3fs), and a delete of one deletes none
        # of them: a key is deleted, then a folder of that name, if any (a local one set aside where it can).
        if exists(store, path):
            delete(store, path)
        if not (aside and set_aside(store, path, node)):
            delete_dir(store, path)


# Folders set aside and being deleted in the background; the process waits for them at exit.
_DISCARDING: list = []


def set_aside(store, prefix: str, node: str = "") -> bool:
    """Move the folder of keys ``prefix`` of a local store out of the way and delete it in the background.

    Deleting gigabytes of chunk files takes a second or more (ext4: up to
    1.1 s for a 4 GiB output), which an ``overwrite=True`` run would
    otherwise spend before its first block.  The folder is renamed (one
    system call) to a hidden ``.<name>.dgemm-discarded-...`` beside the
    folder of the array ``node`` it belongs to — outside that array, so
    that zarr's own overwrite of the array does not delete it again — and
    removed by a background thread; the process waits for those threads
    when it exits.  False (nothing moved) for other stores, or where the
    rename fails: the caller deletes the keys itself.
    """
    import atexit
    import os
    import shutil
    import threading
    import uuid

    from dgemm.storage.locations import local_folder

    root = local_folder(store)
    if root is None or not prefix:
        return False
    path = os.path.join(root, *prefix.split("/"))
    owner = os.path.normpath(os.path.join(root, *[p for p in node.split("/") if p]))
    aside = os.path.join(os.path.dirname(owner), f".{os.path.basename(owner)}.dgemm-discarded-{uuid.uuid4().hex}")
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            return False
        os.rename(path, aside)
    except OSError:
        return False
    thread = threading.Thread(target=shutil.rmtree, args=(aside,), kwargs={"ignore_errors": True},
                              name="dgemm-discard", daemon=True)
    thread.start()
    if not _DISCARDING:
        atexit.register(_wait_for_discards)
    _DISCARDING.append(thread)
    return True


def _wait_for_discards() -> None:
    for thread in _DISCARDING:
        thread.join()

"""Where a Zarr array's chunk bytes come from: files for local stores, the store's ``get`` for the others.

Local files are read with ``preadv`` (outside the GIL) into a buffer the
caller names: this thread's reusable scratch, a page-locked staging buffer,
or a chunk's place in the block.  Other stores' requests go out all at once
(:mod:`dgemm.storage.remote`, else zarr's event loop).
"""
from __future__ import annotations

import os
import re
import stat
import threading

import numpy as np


class Source:
    """The bytes under an array's keys: files for local stores, the store's ``get`` for the others."""

    def __init__(self, array):
        from dgemm.storage.locations import local_folder

        self.array = array
        self.store = array.store
        self.prefix = array.path.strip("/")
        self.root = local_folder(self.store)     # None: the store's own get

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def file(self, key: str) -> str | None:
        return os.path.join(self.root, *self._key(key).split("/")) if self.root is not None else None

    def fetch(self, requests: list):
        """``[(key, (start, stop) or ("suffix", n) or None)]`` -> an iterator of bytes-like or None (missing).

        Local files are read one at a time, as the iterator is advanced,
        into this thread's scratch buffer: each item is valid until the
        next.  Other stores get every request at once, concurrently, on
        zarr's event loop.
        """
        if self.root is not None:
            return (self._read_file(key, rng) for key, rng in requests)
        if not requests:
            return iter(())
        from dgemm.storage import remote

        got = remote.get_many(self.store, [(self._key(k), r) for k, r in requests])
        if got is not None:      # S3 through s3fs settings: obstore from this thread and a pool, not zarr's one loop
            return iter(got)
        import asyncio

        from zarr.abc.store import RangeByteRequest, SuffixByteRequest
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        proto = default_buffer_prototype()

        def request(rng):
            if rng is None:
                return None
            if rng[0] == "suffix":
                return SuffixByteRequest(rng[1])
            return RangeByteRequest(rng[0], rng[1])

        async def gather():
            return await asyncio.gather(*(self.store.get(self._key(k), proto, byte_range=request(r))
                                          for k, r in requests))
        return iter([None if g is None else g.as_numpy_array() for g in sync(gather())])

    def fetch_packed(self, keys: list, host: np.ndarray, align: int = 16):
        """Each key's stored bytes packed into ``host`` (uint8), one after another, each start ``align``-aligned:
        an iterator of ``(bytes-like, start in host)``; ``(None, None)`` for a key with nothing stored, and a
        start of None for bytes past the room left (a copy of their own).

        Local files are read straight into ``host`` (page-locked staging, say), with no copy between; other
        stores' bytes, which arrive in buffers of their own, are copied in.
        """
        pos = 0

        def place(n: int):
            nonlocal pos
            if pos + n > host.nbytes:
                return None
            start, pos = pos, (pos + n + align - 1) // align * align
            return start

        if self.root is None:
            for data in self.fetch([(k, None) for k in keys]):
                if data is None:
                    yield None, None
                    continue
                view = np.frombuffer(memoryview(data).cast("B"), np.uint8)
                start = place(view.nbytes)
                if start is None:
                    yield bytes(view), None
                    continue
                host[start:start + view.nbytes] = view
                yield host[start:start + view.nbytes], start
            return
        for key in keys:
            opened = self._open(key)
            if opened is None:
                yield None, None
                continue
            fd, size = opened
            try:
                start = place(size)
                out = np.empty(size, np.uint8) if start is None else host[start:start + size]
                pread_into(fd, out, 0, key)
            finally:
                os.close(fd)
            yield out, start

    def _open(self, key: str) -> tuple[int, int] | None:
        """``(descriptor, size)`` of ``key``'s file, or None when it is missing."""
        try:
            fd = os.open(self.file(key), os.O_RDONLY)
        except FileNotFoundError:
            return None
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            # os.open opens a folder too, whose read then fails with a bare "[Errno 21] Is a directory"
            # (and zarr reads one as a missing chunk): say which chunk, as other unreadable chunks do.
            os.close(fd)
            index = tuple(int(p) for p in re.split(r"[./]", key.removeprefix("c")) if p.isdigit())
            raise IsADirectoryError(f"chunk {index} (store key {self._key(key)!r}) is a folder, not a file")
        return fd, st.st_size

    def _read_file(self, key: str, rng) -> np.ndarray | None:
        opened = self._open(key)
        if opened is None:
            return None
        fd, size = opened
        try:
            if rng is None:
                start, stop = 0, size
            elif rng[0] == "suffix":
                start, stop = max(0, size - rng[1]), size
            else:
                start, stop = rng[0], min(rng[1], size)
            buf = scratch("bytes", stop - start)
            pread_into(fd, buf, start, key)
            return buf
        finally:
            os.close(fd)

    def read_raw_into(self, key: str, out: np.ndarray) -> bool:
        """Read a raw chunk's file straight into ``out``; False when it is missing. Local stores only."""
        opened = self._open(key)
        if opened is None:
            return False
        fd, size = opened
        try:
            if size != out.nbytes:
                raise ValueError(f"chunk {key!r} has {size} bytes; a raw chunk of this array has {out.nbytes}")
            pread_into(fd, out.reshape(-1).view(np.uint8), 0, key)
            return True
        finally:
            os.close(fd)


def pread_into(fd: int, buf: np.ndarray, offset: int, key: str) -> None:
    view = memoryview(buf.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if not got:
            raise OSError(f"chunk {key!r} ended after {done} of {len(view)} bytes")
        done += got


_LOCAL = threading.local()


def scratch(name: str, nbytes: int) -> np.ndarray:
    """This thread's reusable buffer ``name`` of ``nbytes`` bytes (grown, never shrunk)."""
    held = getattr(_LOCAL, name, None)
    if held is None or held.nbytes < nbytes:
        held = np.empty(max(nbytes, 1), np.uint8)
        setattr(_LOCAL, name, held)
    return held[:nbytes]

"""Local files out of the page cache, for ``dgemm bench e2e --cold``; and how much of them is cached.

:func:`drop` writes each file's dirty pages back (``fsync``: pages just
written cannot be dropped before) and asks the kernel to drop its cached
pages (``posix_fadvise(POSIX_FADV_DONTNEED)``, which needs no privileges and
touches no other file).  :func:`cached_bytes` counts a file's pages in the
page cache (``mincore`` on a read-only mapping), so the record says what
was dropped rather than what was asked: pages of a tmpfs such as /dev/shm
are the file itself and stay, and a page another process has mapped or
locked may stay too.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import time

import numpy as np

_PROT_READ, _MAP_SHARED = 1, 1


def supported() -> str | None:
    """None where :func:`drop` works here; else why not."""
    if not hasattr(os, "posix_fadvise") or not hasattr(os, "POSIX_FADV_DONTNEED"):
        return "this system has no posix_fadvise (Linux has)"
    return None


def files_under(paths) -> list[str]:
    """Every regular file under ``paths`` (folders walked; files as they are), sorted."""
    out = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isfile(p):
            out.append(p)
            continue
        for root, _, files in os.walk(p):
            out.extend(os.path.join(root, f) for f in files)
    return sorted(out)


def _load_libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()


def cached_bytes(path) -> int | None:
    """Bytes of the file ``path`` in the page cache now (whole pages, capped to its size); None if unknown."""
    if _LIBC is None:
        return None
    size = os.path.getsize(path)
    if size == 0:
        return 0
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _LIBC.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            pages = -(-size // page)
            vec = (ctypes.c_ubyte * pages)()
            if _LIBC.mincore(addr, size, vec) != 0:
                return None
            resident = np.frombuffer(vec, np.uint8) & 1
            n = int(resident.sum()) * page
            if resident[-1]:
                n -= pages * page - size   # the last page holds only the file's tail
            return n
        finally:
            _LIBC.munmap(addr, size)
    finally:
        os.close(fd)


def _total_cached(files) -> int | None:
    total = 0
    for f in files:
        n = cached_bytes(f)
        if n is None:
            return None
        total += n
    return total


def drop(paths) -> dict:
    """Drop every file under ``paths`` from the page cache; what was cached before and after.

    Returns
    -------
    dict
        ``files``, ``bytes`` (their sizes), ``cached_before`` and
        ``cached_after`` (:func:`cached_bytes` summed; None where unknown),
        ``dropped_bytes`` (before minus after), ``seconds`` (the whole call,
        the write-back of dirty pages included) and ``method``.

    Raises
    ------
    OSError
        The system cannot drop pages (:func:`supported`).
    """
    why = supported()
    if why:
        raise OSError(why)
    files = files_under(paths)
    t0 = time.perf_counter()
    before = _total_cached(files)
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)            # dirty pages are not dropped: write them back first
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    after = _total_cached(files)
    return {"files": len(files), "bytes": sum(os.path.getsize(f) for f in files), "cached_before": before,
            "cached_after": after, "dropped_bytes": before - after if before is not None and after is not None
            else None, "seconds": time.perf_counter() - t0,
            "method": "fsync + posix_fadvise(POSIX_FADV_DONTNEED) on every file; cached bytes by mincore"}

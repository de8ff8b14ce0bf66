"""A disk cache of the program binaries dgemm finishes itself (the wgmma kernel's PTX route).

pyopencl caches the programs it builds from source, per source, options and
device.  A program dgemm builds from a binary it edited
(:mod:`dgemm.opencl.ptx`: built once for ``sm_90``, its PTX edited and
retargeted to ``sm_90a``, built again) escapes that cache, so every new
worker process redid the whole route.  Here such binaries are kept on disk,
under a key made of everything that determines them (:func:`key`: the
sources and options, the editing code, the device and its driver, dgemm's
version), in the ``program-cache`` setting's folder (by default
``programs`` in the user cache folder, beside pyopencl's).

Each entry is one file, written whole under a temporary name and renamed
into place (:func:`store`), so several worker processes may write the same
entry at once and a reader sees an old entry, a new one or none, never a
half.  An entry carries its length and SHA-256: one that is truncated or
damaged is ignored (and removed), and the caller builds again
(:func:`load`).  Nothing here knows OpenCL: entries are plain bytes.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable

from dgemm import config

__all__ = ["cache_dir", "cached", "key", "load", "store"]

logger = logging.getLogger("dgemm")

# The first line of every entry: format name and version, then the payload's SHA-256 and length.
MAGIC = b"dgemm-program-binary 1"
_SUFFIX = ".bin"


def cache_dir() -> Path | None:
    """The folder of the cache (the ``program-cache`` setting), None when it is off."""
    setting = config.get("program-cache")
    if setting == "off":
        return None
    if setting in (None, "on"):
        import platformdirs

        return Path(platformdirs.user_cache_dir("dgemm")) / "programs"
    return Path(setting)


def key(**parts) -> str:
    """A hex key for ``parts`` (JSON-able values): what an entry was built from, each part named.

    >>> key(source="x", device="d") == key(device="d", source="x") != key(source="y", device="d")
    True
    """
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _path(folder: Path, entry: str) -> Path:
    if not entry or any(c not in "0123456789abcdef" for c in entry):
        raise ValueError(f"a cache key is lower-case hex (binaries.key), not {entry!r}")
    return Path(folder) / (entry + _SUFFIX)


def _header(data: bytes) -> bytes:
    return MAGIC + b" " + hashlib.sha256(data).hexdigest().encode() + b" " + str(len(data)).encode() + b"\n"


def load(entry: str, folder: Path | None = None) -> bytes | None:
    """The bytes stored under ``entry``, or None: no entry, the cache off, or an entry not whole.

    An entry whose header, length or checksum is wrong (a truncated file, a
    disk error, a file of another program) is removed, and None returned:
    the caller builds again and stores a good one.
    """
    folder = cache_dir() if folder is None else Path(folder)
    if folder is None:
        return None
    path = _path(folder, entry)
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    head, sep, data = raw.partition(b"\n")
    fields = head.split(b" ")
    if sep and len(fields) == 4 and b" ".join(fields[:2]) == MAGIC and _header(data) == head + b"\n":
        return data
    logger.warning("dgemm: the cached program %s is damaged (%d bytes); building it again", path, len(raw))
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def store(entry: str, data: bytes, folder: Path | None = None) -> Path | None:
    """Keep ``data`` under ``entry``, atomically; the file's path, or None (cache off, or not writable).

    Written to a temporary file in the same folder, flushed to disk, then
    renamed over the entry (:func:`os.replace`): concurrent writers of one
    entry each rename a whole file, the last one stays.  A failure (a
    read-only or full disk) is logged and leaves no temporary file: the
    program still works, it is just not kept.
    """
    folder = cache_dir() if folder is None else Path(folder)
    if folder is None:
        return None
    path = _path(folder, entry)
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.stem[:16] + ".", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(_header(data))
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path
    except OSError as e:
        logger.info("dgemm: could not keep a built program in %s: %s", folder, e)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return None


def cached(entry: str, build: Callable[[], tuple], use: Callable[[bytes], object] | None = None,
           folder: Path | None = None):
    """``use(bytes)`` of the entry if it is whole and ``use`` accepts it, else what ``build()`` makes, stored.

    Parameters
    ----------
    entry : str
        The entry's :func:`key`.
    build : callable
        Makes it anew (a miss): ``(what the caller wants, its bytes to keep)``.
    use : callable, optional
        Turns the bytes into what the caller wants (a loaded program); an
        exception from it on cached bytes counts as a damaged entry: it is
        removed and built again.  Default: the bytes themselves.
    folder : path, optional
        The cache's folder (default :func:`cache_dir`).

    Returns
    -------
    (object, bool)
        What ``use`` gave, and whether it came from the cache.
    """
    use = use or (lambda data: data)
    folder = cache_dir() if folder is None else Path(folder)
    data = load(entry, folder) if folder is not None else None
    if data is not None:
        try:
            return use(data), True
        except Exception as e:   # whole but not loadable here (a driver that changed without saying): rebuild
            logger.warning("dgemm: the cached program %s did not load (%s: %s); building it again",
                           _path(folder, entry), type(e).__name__, e)
            with contextlib.suppress(OSError):
                _path(folder, entry).unlink()
    result, data = build()
    if folder is not None:
        store(entry, data, folder)
    return result, False

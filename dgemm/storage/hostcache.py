"""Decoded input blocks shared by the device workers of one host, in shared memory.

A host with several device workers (one process per GPU) would otherwise
read and decode every input block each of them needs, once per worker: on
two H200s, each worker read 27 of the inputs' 36 GiB.  With the host cache
on, a block of a run is decoded by one worker of the host, written to a
file in shared memory (``/dev/shm``), and copied from there by the others.

Files, under ``<folder>/dgemm-hostcache-<uid>/<run>/``:

``<h>.blk``
    A decoded block: a header naming exactly what it holds (the run, the
    block's key, dtype and shape), its crc32c, then its bytes.  Written
    under a temporary name and renamed, so a reader sees a whole block or
    none; checked in full before use, and removed (the block decoded again)
    when anything in it is wrong.
``<h>.<pid>.<thread>.<random>.tmp``
    A block being written: counted against the size limit, never evicted.
``<h>.lock``
    The claim of the worker decoding ``<h>``: an ``flock`` on it, which the
    kernel releases when that process dies, so a waiter takes over from a
    killed claimer at once, with no timeout to guess.

The cache is bounded (the ``host-cache-bytes`` setting): the least recently
used blocks (by modification time, which a hit renews) go first.  Room is
made under ``<folder>/dgemm-hostcache-<uid>/.space.lock``, whose file also
holds a tally of the bytes held, so that a block that fits is written
without a look at every file (:meth:`HostCache._reserve`).  A run's
folder goes when the run ends (:func:`forget`, from the client), and files
older than :data:`MAX_AGE` go when a worker first uses the cache (a crashed
run's leftovers).  Caching is best effort: a block that does not fit, or a
write that fails, is still decoded and used, only not shared.

A worker hands its device engine each Zarr block of a run wrapped by
:func:`through` (a :class:`Shared`): the engine reads it with the same one
call as a bare block, :meth:`Shared.fill_into`, and learns from it whether
the cache served the block.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import logging
import os
import re
import shutil
import stat
import struct
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from dgemm.storage.blocks import Through, ZarrBlock, unreadable

logger = logging.getLogger(__name__)

MAGIC = b"dgemm-hostcache1"           # 16 bytes; a new layout of the file gets a new one
_PREFIX = struct.Struct("<16sIIQ")   # magic, crc32c of the payload, length of the identity, payload bytes
ALIGN = 64                           # the payload starts at a multiple of this
PIECE = 8 << 20                      # bytes copied (and checksummed) at a time, while in the CPU's cache
MAX_AGE = 6 * 3600.0                 # seconds: older files are a finished or crashed run's, removed at start
STALE_TMP = 600.0                    # seconds: a temporary file this old has no live writer (writes take ms)
WAIT = 300.0                         # seconds a worker waits for another's decode before decoding itself
RESCAN = 30.0                        # seconds a tally of the bytes held stands before the folder is counted again
_TALLY = struct.Struct("<Qd")        # in the space lock's file: bytes held as last counted and reserved since, when counted


class Corrupt(Exception):
    """A cache file that does not hold exactly the block asked for."""


def _crc(data, value: int = 0) -> int:
    import google_crc32c   # zarr's own dependency; releases the GIL

    return google_crc32c.extend(value, data)


def _digest(text: str, size: int = 20) -> str:
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


def scope_name(scope: Hashable) -> str:
    """The folder name of run ``scope``: the token itself when it is a short plain name, else a hash.

    >>> scope_name("0123abcd"), scope_name(("x", 1)) == scope_name(("x", 1)), scope_name("../x")[:6]
    ('run-0123abcd', True, 'run-h.')
    """
    if isinstance(scope, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", scope):
        return f"run-{scope}"
    return "run-h." + _digest(repr(scope), 16)


def root(base: str) -> str:
    """This user's cache folder under ``base`` (private: another user's files are never read as blocks)."""
    return os.path.join(os.fspath(base), f"dgemm-hostcache-{os.getuid()}")


def default_folder() -> str:
    """Where the cache's folder goes by default: ``/dev/shm`` (memory) where there is one, else the temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


@functools.lru_cache(maxsize=None)
def default_limit(folder: str) -> int:
    """The size limit where ``host-cache-bytes`` is unset: a quarter of the host's memory, at most half of
    what ``folder``'s filesystem holds (a ``/dev/shm`` is often half the memory, in containers far less)."""
    from dgemm.sizes import host_memory

    ram = host_memory()
    try:
        st = os.statvfs(folder)
        fs = st.f_blocks * st.f_frsize
    except OSError:
        fs = ram
    return int(min(ram // 4, fs // 2))


def settings() -> tuple[str, int] | None:
    """``(base folder, size limit)`` from this process's settings, or None where the cache is off.

    ``host-cache`` is ``auto`` unless set: the launchers that start several
    device workers on a host set ``on`` in each one's environment
    (:func:`dgemm.cluster.spec.device_worker`), so ``auto`` in a worker no
    launcher told is off.
    """
    from dgemm import config

    mode = config.get("host-cache")
    if mode in (None, "off", "auto"):
        return None
    base = default_folder() if mode == "on" else mode
    limit = config.get("host-cache-bytes")
    return base, (default_limit(base) if limit is None else limit)


_current: dict = {}
_current_lock = threading.Lock()


def current() -> HostCache | None:
    """This process's host cache as the settings say now (one per folder and limit), or None when off."""
    where = settings()
    if where is None:
        return None
    with _current_lock:
        cache = _current.get(where)
        if cache is None:
            cache = _current[where] = HostCache(*where)
        return cache


def shareable(array) -> bool:
    """Whether every process of the host reads ``array`` by the same name: not an in-process store
    (a MemoryStore's name is an id in each process, so two arrays could share one)."""
    from dgemm.storage.locations import locate

    try:
        where = locate(array)
    except Exception:
        return False
    return where is not None and not where.process_local and not where.protocol.startswith("store-")


class HostCache:
    """Decoded blocks in ``<base>/dgemm-hostcache-<uid>``, shared by this host's processes, at most ``limit`` bytes.

    Parameters
    ----------
    base : str
        The folder to keep it in (``/dev/shm`` by default: memory).
    limit : int
        Bytes the cache may hold, blocks being written included.
    sweep : bool
        Remove files older than :data:`MAX_AGE` first (leftovers of runs
        that crashed); once per process and folder.
    """

    _swept: set = set()

    def __init__(self, base: str, limit: int, *, sweep: bool = True):
        self.root = root(base)
        self.limit = int(limit)
        self.counts: Counter = Counter()   # hits, misses, and bytes of each: what this process saw
        self._lock = threading.Lock()
        self._warned = False
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        st = os.lstat(self.root)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            # another user's folder (or a link to one) could hand us their bytes as our inputs
            raise PermissionError(f"dgemm's host cache folder {self.root} is not a folder of this user "
                                  f"(uid {os.getuid()}); remove it, or set host-cache to another folder")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(self.root, 0o700)   # ours, but others could write into it
        if sweep and self.root not in HostCache._swept:
            HostCache._swept.add(self.root)
            self.sweep()

    # -- names ----------------------------------------------------------
    def folder(self, scope: Hashable) -> str:
        """Run ``scope``'s folder."""
        return os.path.join(self.root, scope_name(scope))

    @staticmethod
    def identity(scope: Hashable, key: Hashable, out: np.ndarray) -> str:
        """What a cache file must say it holds to be used for ``out``: run, key, dtype and shape."""
        return repr((scope, key, out.dtype.str, tuple(out.shape)))

    # -- the one call ---------------------------------------------------
    def fetch(self, scope: Hashable, key: Hashable, out: np.ndarray, decode: Callable[[np.ndarray], None]) -> bool:
        """Fill ``out`` with block ``key`` of run ``scope``; whether it came from the cache (else ``decode`` ran here).

        On a miss, one caller of the host claims the block and runs
        ``decode(out)`` (which must fill all of ``out``), then shares it;
        the others wait for it and copy it.  A claimer that dies is taken
        over at once; one still decoding after :data:`WAIT` seconds is no
        longer waited for.  ``decode``'s errors reach its caller.
        """
        if not out.flags.c_contiguous:
            raise ValueError("internal: the host cache fills C-contiguous arrays only")
        ident = self.identity(scope, key, out)
        if _PREFIX.size + len(ident.encode()) + ALIGN + out.nbytes > self.limit:
            decode(out)   # never fits: not worth a claim that would make the others wait in turn
            return self._count(False, out.nbytes)
        folder = self.folder(scope)
        h = _digest(ident)
        data, lock = os.path.join(folder, h + ".blk"), os.path.join(folder, h + ".lock")
        if self._read(data, ident, out):
            return self._count(True, out.nbytes)
        deadline = time.monotonic() + WAIT
        while True:
            fd = self._claim(folder, lock)
            if fd is not None:
                try:
                    if self._read(data, ident, out):   # shared while we waited for the lock
                        return self._count(True, out.nbytes)
                    decode(out)
                    self._write(folder, h, data, ident, out)
                    return self._count(False, out.nbytes)
                finally:
                    _unlock(fd, lock)
            # Another process decodes it: woken when its claim goes (shared, or the claimer died), not by
            # looking again and again (each look a sleep's worth late; bench/NOTES.md).
            _wait_released(lock, deadline - time.monotonic())
            if self._read(data, ident, out):
                return self._count(True, out.nbytes)
            if time.monotonic() > deadline:
                logger.warning("dgemm host cache: waited %.0f s for another worker to decode a block; "
                               "decoding it here", WAIT)
                decode(out)
                return self._count(False, out.nbytes)

    def _count(self, hit: bool, nbytes: int) -> bool:
        with self._lock:
            self.counts["hits" if hit else "misses"] += 1
            self.counts["bytes_served" if hit else "bytes_decoded"] += nbytes
        return hit

    # -- claims ---------------------------------------------------------
    def _claim(self, folder: str, lock: str) -> int | None:
        """A descriptor holding the block's lock, or None while another holds it."""
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
            except FileNotFoundError:   # the run's folder is new (or was cleared)
                os.makedirs(folder, mode=0o700, exist_ok=True)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            except BaseException:
                os.close(fd)
                raise
            # The previous holder removes the lock's name before letting it go: a lock held on a
            # name no longer there (or there again as another file) is no claim; try again.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock))
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    # -- reading --------------------------------------------------------
    def _read(self, path: str, ident: str, out: np.ndarray) -> bool:
        """Copy the cached block at ``path`` into ``out``; False when there is none (or it was bad: removed)."""
        try:
            f = open(path, "rb", buffering=0)
        except FileNotFoundError:
            return False
        with f:
            try:
                _check_and_copy(f, ident, out)
            except Corrupt as e:
                logger.warning("dgemm host cache: %s: %s; decoding the block again", path, e)
                _remove_if_same(path, os.fstat(f.fileno()))
                return False
            try:
                os.utime(f.fileno())   # recently used: evicted last
            except OSError:
                pass
        return True

    # -- writing --------------------------------------------------------
    def _write(self, folder: str, h: str, path: str, ident: str, out: np.ndarray) -> None:
        """Share ``out`` as ``path`` (best effort: a block that does not fit or fails to write is only not shared)."""
        head = ident.encode()
        offset = -(-(_PREFIX.size + len(head)) // ALIGN) * ALIGN
        total = offset + out.nbytes
        tmp = os.path.join(folder, f"{h}.{os.getpid()}.{threading.get_ident()}.{os.urandom(4).hex()}.tmp")
        try:
            fd = self._reserve(tmp, total)
        except OSError as e:
            self._warn(f"could not reserve {total} bytes in {folder}: {e}")
            return
        if fd is None:
            return
        try:
            try:
                view = out.reshape(-1).view(np.uint8)   # google_crc32c takes arrays, not memoryviews
                _write_all(fd, bytes(offset), 0)
                crc = 0
                for lo in range(0, out.nbytes, PIECE):
                    piece = view[lo:lo + PIECE]
                    crc = _crc(piece, crc)
                    _write_all(fd, piece, offset + lo)
                os.pwrite(fd, _PREFIX.pack(MAGIC, crc, len(head), out.nbytes) + head, 0)
            finally:
                os.close(fd)
            os.rename(tmp, path)
        except OSError as e:   # /dev/shm full (other users), the run's folder cleared meanwhile
            _unlink(tmp)
            self._warn(f"could not write a block to {folder}: {e}")

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("dgemm host cache: %s; the block is used but not shared (warned once)", what)

    def _reserve(self, tmp: str, nbytes: int) -> int | None:
        """Make room for ``nbytes`` (evicting the least recently used blocks) and create ``tmp`` that size,
        all under the folder's space lock; None when it cannot fit.

        The bytes the cache holds are kept as a tally in the lock's file,
        added to by each reservation: a reservation that fits takes no look
        at the folder (a scan of every file, 10 µs each, had been every
        block's, one at a time across the host's workers).  The folder is
        scanned, its usage counted again and blocks evicted, only where the
        tally says a block would not fit, or where it is :data:`RESCAN`
        seconds old (files removed behind its back: a finished run's, a
        swept one's, a damaged block's, which leave it too high, never too
        low).
        """
        if nbytes > self.limit:
            return None
        fd = os.open(os.path.join(self.root, ".space.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            used, counted = _read_tally(fd)
            now = time.time()
            if used is None or used + nbytes > self.limit or not 0 <= now - counted <= RESCAN:
                used, counted = self._make_room(nbytes, now), now
                if used + nbytes > self.limit:   # the rest is being written: counted, for the next asker
                    os.pwrite(fd, _TALLY.pack(used, counted), 0)
                    return None
            out = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(out, nbytes)   # counted by the next scan at its full size
            os.pwrite(fd, _TALLY.pack(used + nbytes, counted), 0)
            return out
        finally:
            os.close(fd)

    def _make_room(self, nbytes: int, now: float) -> int:
        """Scan the folder (in the space lock): stale temporary files removed, the least recently used blocks
        evicted until ``nbytes`` more fit (or none is left to evict); the bytes held then."""
        used, blocks = 0, []
        for path, st in self._files():
            if path.endswith(".tmp") and now - st.st_mtime > STALE_TMP:   # its writer died
                _unlink(path)
                continue
            used += st.st_size
            if path.endswith(".blk"):
                blocks.append((st.st_mtime, st.st_size, path))
        blocks.sort()
        for _, size, path in blocks:
            if used + nbytes <= self.limit:
                break
            _unlink(path)   # a reader that has it open keeps its bytes until it closes it
            used -= size
            with self._lock:
                self.counts["evictions"] += 1
        return used

    # -- housekeeping ---------------------------------------------------
    def _files(self):
        """``(path, stat)`` of every block, temporary and lock file, all runs."""
        try:
            runs = list(os.scandir(self.root))
        except FileNotFoundError:
            return
        for run in runs:
            if not run.is_dir(follow_symlinks=False):
                continue
            try:
                entries = list(os.scandir(run.path))
            except FileNotFoundError:
                continue
            for e in entries:
                try:
                    yield e.path, e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue

    def usage(self) -> int:
        """Bytes the cache's files take now (blocks and blocks being written)."""
        return sum(st.st_size for path, st in self._files() if not path.endswith(".lock"))

    def clear(self, scope: Hashable) -> bool:
        """Remove run ``scope``'s blocks (its end); whether there were any."""
        return _rmtree(self.folder(scope))

    def sweep(self, max_age: float = MAX_AGE) -> int:
        """Remove files unused for ``max_age`` seconds and the runs' folders left empty; how many files went."""
        now, gone = time.time(), 0
        for path, st in list(self._files()):
            if now - st.st_mtime <= max_age:
                continue
            if path.endswith(".lock"):   # only a lock nobody holds
                try:
                    fd = os.open(path, os.O_RDWR)
                except FileNotFoundError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                _remove_if_same(path, os.fstat(fd))
                os.close(fd)
            else:
                _unlink(path)
            gone += 1
        for run in list(os.scandir(self.root)):
            if run.is_dir(follow_symlinks=False):
                try:
                    os.rmdir(run.path)   # only an empty one
                except OSError:
                    pass
        return gone


def _check_and_copy(f, ident: str, out: np.ndarray) -> None:
    """Check the header of the cache file ``f``, copy its payload into ``out`` and check its crc32c."""
    prefix = f.read(_PREFIX.size)
    if len(prefix) != _PREFIX.size:
        raise Corrupt("shorter than its header")
    magic, crc, n_ident, nbytes = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise Corrupt("not a dgemm host cache file of this version")
    if f.read(n_ident) != ident.encode():
        raise Corrupt("holds another block (its name's hash collided, or its header is damaged)")
    offset = -(-(_PREFIX.size + n_ident) // ALIGN) * ALIGN
    if nbytes != out.nbytes or os.fstat(f.fileno()).st_size != offset + nbytes:
        raise Corrupt(f"holds {os.fstat(f.fileno()).st_size - offset} bytes of a {nbytes}-byte block, "
                      f"{out.nbytes} expected")
    view = out.reshape(-1).view(np.uint8)   # google_crc32c takes arrays, not memoryviews
    f.seek(offset)
    value = 0
    for lo in range(0, nbytes, PIECE):
        piece = view[lo:lo + PIECE]
        got = 0
        while got < len(piece):
            n = f.readinto(memoryview(piece[got:]))
            if not n:
                raise Corrupt("ended early")
            got += n
        value = _crc(piece, value)
    if value != crc:
        raise Corrupt("its bytes fail their crc32c")


def _read_tally(fd: int) -> tuple[int | None, float]:
    """The space lock file's tally: ``(bytes held, when they were last counted)``, ``(None, 0)`` where there is none."""
    raw = os.pread(fd, _TALLY.size, 0)
    if len(raw) != _TALLY.size:
        return None, 0.0
    used, counted = _TALLY.unpack(raw)
    return int(used), float(counted)


def _write_all(fd: int, data, offset: int) -> None:
    data = memoryview(data).cast("B")
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _wait_released(lock: str, timeout: float) -> bool:
    """Wait until no process holds the claim ``lock`` (or ``timeout`` seconds); whether it was let go.

    A shared ``flock`` on the claim waits in the kernel for the claimer's
    exclusive one to go, which happens when it has shared the block (or when
    its process dies); the wait runs on a helper thread so that it can end
    at ``timeout`` (a claimer stopped, or decoding from a store that hangs).
    A claim already gone (its name removed) is no wait at all.
    """
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return True
    released = threading.Event()

    def wait():
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)   # releases the GIL while it waits
        except OSError:
            pass
        finally:
            os.close(fd)   # lets the shared lock go at once: a later claimer is not held up
            released.set()

    threading.Thread(target=wait, name="dgemm-hostcache-wait", daemon=True).start()
    return released.wait(max(timeout, 0.0))


def _unlock(fd: int, lock: str) -> None:
    """Let a claim go: its name first (so no one locks a finished claim), then the lock itself."""
    try:
        _remove_if_same(lock, os.fstat(fd))
    finally:
        os.close(fd)


def _remove_if_same(path: str, st) -> None:
    try:
        if os.path.samestat(os.stat(path), st):
            os.unlink(path)
    except FileNotFoundError:
        pass


def _rmtree(folder: str) -> bool:
    if not os.path.isdir(folder):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno != errno.ENOENT:
            logger.debug("dgemm host cache: could not remove %s: %s", path, e)


# -- blocks read through the cache ---------------------------------------------------
@dataclass(frozen=True)
class Shared(Through):
    """A :class:`~dgemm.storage.blocks.ZarrBlock` of run ``scope`` read through ``cache``.

    Read like the block itself (the same ``shape``, ``dtype``, ``key()``
    and ``copies``), so the device engine needs to know nothing of the
    cache; :meth:`fill_into` also says whether the cache served it, for the
    engine's ``host_cache_*`` counters.
    """

    block: ZarrBlock
    cache: HostCache
    scope: Hashable

    def fill_into(self, out: np.ndarray) -> bool | None:
        """Fill all of ``out`` as :meth:`ZarrBlock.fill_into <dgemm.storage.blocks.ZarrBlock.fill_into>` does.

        Returns True when the cache served the block, False when this
        worker decoded it (and shared it), None when the array cannot be
        shared (:func:`shareable`: the cache was not asked).  Raises the
        same one read error (:func:`~dgemm.storage.blocks.unreadable`).
        """
        if not shareable(self.block.array):
            return self.block.fill_into(out)
        try:
            return self.cache.fetch(self.scope, self.block.key(), out, self.block.decode_into)
        except Exception as e:
            raise unreadable(self.block, e) from e


def through(cache: HostCache | None, scope: Hashable, ref):
    """``ref`` to be read through ``cache`` for run ``scope``: a :class:`Shared` for a Zarr block that
    another worker of the host reads too, else ``ref``.

    The client's placement marks those blocks (``ZarrBlock.host_shared``,
    :func:`dgemm.client.graph.build`): a block only this worker reads gains
    nothing from the cache and would pay for a copy into it and a checksum
    (on two workers whose C rows are split, each one's A panels).  Blocks
    held in memory, and every block where there is no cache (``cache``
    None) or no run to share them in (``scope`` None), are returned as
    they are.
    """
    if cache is None or scope is None or not isinstance(ref, ZarrBlock) or not ref.host_shared:
        return ref
    return Shared(ref, cache, scope)


# -- the end of a run ---------------------------------------------------------------
def clear_here(scope: Hashable) -> bool:
    """Remove run ``scope``'s blocks from this host's cache (run on a worker); whether there were any."""
    where = settings()
    return _rmtree(os.path.join(root(where[0] if where is not None else default_folder()), scope_name(scope)))


def forget(client, scope: Hashable) -> None:
    """At the end of run ``scope`` (finished, failed or stopped): remove its blocks from every host's cache.

    Called by the client; asks each worker (any of a host's workers may
    remove its host's copy, the others find it gone).  Never raises: a lost
    cluster has nothing left to remove, and what a worker could not remove
    goes with the sweep of old files.
    """
    if client is None or scope is None:
        return
    try:
        client.run(clear_here, scope, on_error="ignore")
    except Exception as e:
        logger.debug("dgemm host cache: could not clear run %s: %s", scope, e)

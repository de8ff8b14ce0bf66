"""Zarr's default codec, zstd, through the system's libzstd with one context and one output buffer per thread.

numcodecs' ``Zstd`` makes a new compression context and a new output
buffer for every chunk.  For a 64 MiB chunk that is tens of megabytes of
fresh memory, faulted in page by page, and on many threads at once the
page faults serialise: on a 32-core host (bench/NOTES.md, "Issue 27")
numcodecs encoded zstd level 3 at 8.4 GB/s, libzstd with reused contexts
and buffers at 13.8; level -1 at 14.0 against 54.5; decoding into a
reused buffer ran at 21.3 GB/s against 10.9 (18.6 decoding into the
caller's buffer).  Encoding C is the largest share of a product's host
work, so this is where the host's cores go.

The frames are zstd's standard frames, as numcodecs and zarr write and
read them: the content size in the header, a checksum where the codec asks
for one.  Decoding checks that the frame declares exactly the bytes of the
buffer it fills and that it filled all of them; libzstd, the reference
decoder, checks every length and offset inside.  Where no libzstd of 1.4
or later can be loaded, :func:`codec` returns None and the caller keeps
numcodecs.
"""
from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

# zstd.h's stable API (1.4.0 and later): the parameters of ZSTD_CCtx_setParameter.
_C_LEVEL, _C_CHECKSUM, _C_WORKERS = 100, 201, 400
_MIN_VERSION = 10400
_NAMES = ("libzstd.so.1", "libzstd.so", "libzstd.1.dylib", "libzstd.dylib")

_lib = None
_lib_lock = threading.Lock()
_tried = False


def library():
    """The loaded libzstd (ctypes), or None where there is none of version 1.4 or later."""
    global _lib, _tried
    if _tried:
        return _lib
    with _lib_lock:
        if not _tried:
            _lib = _load()
            _tried = True
    return _lib


def _load():
    for name in _NAMES:
        try:
            z = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            z.ZSTD_versionNumber.restype = ctypes.c_uint
            if z.ZSTD_versionNumber() < _MIN_VERSION:
                continue
            size_t, ptr = ctypes.c_size_t, ctypes.c_void_p
            for fn, res, args in (
                    ("ZSTD_createCCtx", ptr, []), ("ZSTD_createDCtx", ptr, []),
                    ("ZSTD_freeCCtx", size_t, [ptr]), ("ZSTD_freeDCtx", size_t, [ptr]),
                    ("ZSTD_CCtx_setParameter", size_t, [ptr, ctypes.c_int, ctypes.c_int]),
                    ("ZSTD_compress2", size_t, [ptr, ptr, size_t, ptr, size_t]),
                    ("ZSTD_decompressDCtx", size_t, [ptr, ptr, size_t, ptr, size_t]),
                    ("ZSTD_compressBound", size_t, [size_t]),
                    ("ZSTD_isError", ctypes.c_uint, [size_t]),
                    ("ZSTD_getErrorName", ctypes.c_char_p, [size_t])):
                f = getattr(z, fn)
                f.restype, f.argtypes = res, args
        except AttributeError:
            continue
        return z
    return None


class _Contexts:
    """One thread's compression and decompression contexts and output buffer.

    Freed with the thread, or by :func:`release` (a worker's run is over):
    the thread makes them again for its next chunk.  ``lock`` is held while
    the thread uses them, so that :func:`release` never frees them under it.
    """

    def __init__(self, z):
        self.z = z
        self.cctx = self.dctx = None
        self.level = self.checksum = None
        self.workers = 0
        self.out = np.empty(0, np.uint8)
        self.lock = threading.Lock()
        with _ALL_LOCK:
            _ALL.add(self)

    def free(self) -> None:
        z = self.z
        if self.cctx:
            z.ZSTD_freeCCtx(self.cctx)
        if self.dctx:
            z.ZSTD_freeDCtx(self.dctx)
        self.cctx = self.dctx = None
        self.level = self.checksum = None
        self.workers = 0
        self.out = np.empty(0, np.uint8)

    def compressor(self, level: int, checksum: bool, workers: int = 0):
        z = self.z
        if self.cctx is None:
            self.cctx = z.ZSTD_createCCtx()
            if not self.cctx:
                raise MemoryError("libzstd could not create a compression context")
        if (level, checksum) != (self.level, self.checksum):
            for param, value in ((_C_LEVEL, level), (_C_CHECKSUM, int(checksum))):
                _check(z, z.ZSTD_CCtx_setParameter(self.cctx, param, value), "setting a compression parameter")
            self.level, self.checksum = level, checksum
        if workers != self.workers:
            # libzstd's own threads compress the frame's jobs (a libzstd built without them refuses: one thread)
            if z.ZSTD_isError(z.ZSTD_CCtx_setParameter(self.cctx, _C_WORKERS, workers)):
                workers = self.workers
            self.workers = workers
        return self.cctx

    def decompressor(self):
        if self.dctx is None:
            self.dctx = self.z.ZSTD_createDCtx()
            if not self.dctx:
                raise MemoryError("libzstd could not create a decompression context")
        return self.dctx

    def __del__(self):
        self.free()


_LOCAL = threading.local()
_ALL: weakref.WeakSet = weakref.WeakSet()   # every thread's contexts, for release()
_ALL_LOCK = threading.Lock()


def release() -> int:
    """Free every thread's contexts and output buffers not in use now; how many threads' were freed.

    What a worker gives back when a run ends: the next run's threads make
    them again (a few milliseconds each), its chunks still reuse them.
    """
    with _ALL_LOCK:
        held = list(_ALL)
    freed = 0
    for c in held:
        if c.lock.acquire(blocking=False):
            try:
                freed += bool(c.cctx or c.dctx or c.out.nbytes)
                c.free()
            finally:
                c.lock.release()
    return freed


def _contexts(z) -> _Contexts:
    held = getattr(_LOCAL, "contexts", None)
    if held is None:
        held = _LOCAL.contexts = _Contexts(z)
    return held


def _check(z, code: int, what: str) -> int:
    if z.ZSTD_isError(code):
        raise ValueError(f"zstd: {what}: {z.ZSTD_getErrorName(code).decode(errors='replace')}")
    return code


def _bytes_of(buf) -> np.ndarray:
    if isinstance(buf, np.ndarray):
        return np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(buf).cast("B"), np.uint8)


class Zstd:
    """A zstd step of :mod:`dgemm.storage.chunks` (``level``, ``checksum`` as zarr's ``ZstdCodec``).

    ``encode`` returns a view of this thread's output buffer, valid until
    the thread's next ``encode`` (``transient``): a caller that keeps it
    longer copies it.

    Examples
    --------
    >>> z = codec(3, False)
    >>> x = np.arange(1000, dtype="float32")
    >>> out = np.empty_like(x)
    >>> z is None or np.array_equal(z.decode(bytes(z.encode(x)), out.view(np.uint8), "chunk").view("float32"), x)
    True
    """

    name = "zstd"
    encodes = True
    transient = True
    parallel = True      # encode(workers=): one chunk on several threads (libzstd's multithreaded frames)

    def __init__(self, z, level: int, checksum: bool):
        self.z, self.level, self.checksum = z, int(level), bool(checksum)

    def encode(self, buf, workers: int = 0) -> np.ndarray:
        """``buf`` as one frame; ``workers``: libzstd threads that compress it in jobs (0: this thread alone).

        A frame of several jobs is one standard frame, content size and all,
        that every decoder reads; its bytes differ from a one-thread frame's
        by a few (the jobs' block boundaries), its ratio hardly.
        """
        z = self.z
        src = _bytes_of(buf)
        ctx = _contexts(z)
        bound = z.ZSTD_compressBound(src.nbytes)
        with ctx.lock:
            if ctx.out.nbytes < bound:
                ctx.out = np.empty(bound, np.uint8)
            cctx = ctx.compressor(self.level, self.checksum, max(0, int(workers)))
            n = _check(z, z.ZSTD_compress2(cctx, ctx.out.ctypes.data, bound, src.ctypes.data, src.nbytes),
                       "compressing a chunk")
            return ctx.out[:n]   # (a view: release() drops the thread's reference, not the caller's)

    def decode(self, buf, out, what: str):
        """Decode the frame(s) in ``buf`` into all of ``out``, or raise :class:`ValueError`; returns ``out``."""
        z = self.z
        src = _bytes_of(buf)
        target = out.reshape(-1).view(np.uint8)
        ctx = _contexts(z)
        with ctx.lock:
            n = z.ZSTD_decompressDCtx(ctx.decompressor(), target.ctypes.data, target.nbytes,
                                      src.ctypes.data, src.nbytes)
        _check(z, n, f"{what}: decoding")
        if n != target.nbytes:
            raise ValueError(f"{what}: zstd frame decodes to {n} bytes, the chunk has {target.nbytes}")
        return out

    def __repr__(self):
        return f"zstd codec (libzstd, level {self.level})"


def codec(level: int, checksum: bool) -> Zstd | None:
    """A :class:`Zstd` step, or None where libzstd cannot be loaded."""
    z = library()
    return None if z is None else Zstd(z, level, checksum)

"""The block product on a device: C_ij = alpha * sum_k op(A_ik) op(B_kj) + beta * C_ij.

Host blocks arrive at their true sizes.  On the device they are zero-padded
to tile multiples (transposed to the kernel's k-major A layout on the way
where needed), multiplied and accumulated over k in one device buffer, and
the padding is cut off before the single download.

Two command queues share the device: uploads (and the padding and transpose kernels that follow them) go on the
transfer queue, GEMM kernels on the compute queue, each kernel waiting only for the events of its own inputs.
:meth:`BlockEngine.stream` reads and uploads the next blocks in a pool of threads while the device multiplies the
current ones, and keeps staged blocks in the device's :class:`~dgemm.opencl.panels.PanelCache` for the next block
product that needs them.

The engine knows no storage: a block it is handed is either an array or a block that reads itself, which it knows
by ``fill_into``.  Such a block has ``shape`` and ``dtype`` (what it reads as), ``key()`` (hashable: the same region
of the same array gives the same key), ``copies`` (whether reading it only copies file bytes) and
``fill_into(out)``, which fills all of ``out`` or raises its one read error; it returns True or False where a host
cache served or decoded the block, None where none was asked.  A block may also have ``fill_device``
(:meth:`BlockEngine._decoded`): its chunks then go to the device compressed and are decoded there, where it does
not decline.  The workers hand it :class:`dgemm.storage.ZarrBlock` and :class:`dgemm.storage.hostcache.Shared`
blocks.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future

import numpy as np

from dgemm import config
from dgemm.opencl import nogil
from dgemm.opencl.device import Device, Kernels, device_error, is_opencl_error, raise_plain, read_threads
from dgemm.opencl.panels import PanelCache
from dgemm.opencl.stats import Stats
from dgemm.opencl.stats import seconds as _seconds
from dgemm.opencl.turn import Turn
from dgemm.sizes import INT32_MAX, roundup

# The padding kernels check bounds, so they run on a fixed work-group shape
# over a rounded-up grid: a fixed shape lets drivers that specialise kernels
# per launch shape (PoCL) compile them once, not once per edge-block size.
LOCAL_2D = (16, 16)


def _grid(x: int, y: int) -> tuple[int, int]:
    return (roundup(max(x, 1), LOCAL_2D[0]), roundup(max(y, 1), LOCAL_2D[1]))


# A block decoded on the device is handed to the product once its decode is enqueued (the padding and the
# GEMM wait for it by events; its error rows are checked before the product gives its result), not once
# the host has seen it finish: 2-4 % faster on one H100 with zstd in and out, the device freed of none of
# its idle time, which the host's per-call work holds (bench/NOTES.md, issue 28, eighth session).
DEFERRED_DECODES = True


def default_prefetch() -> int:
    """k steps (A and B block pairs) a product reads ahead: the ``prefetch`` setting (``DGEMM_PREFETCH``).

    Unset, one per reader thread (at least 4), so all of them stay busy when
    A's panel is cached and each step reads one block of B (on 4 H200s
    sharing a host, 4 steps ahead left half the readers idle and the
    products waited on them).  Read when a product starts, so a setting
    changed later counts.
    """
    return config.get("prefetch") or max(4, read_threads())


class BlockEngine:
    """Runs block products of one dtype on one :class:`Device`.

    The engine keeps its accumulator buffers between calls (grown as needed)
    and serialises calls with a lock: a device runs one block product at a
    time, while the next product's inputs may already be uploading.
    """

    def __init__(self, device: Device, dtype, params=None):
        self.device = device
        self.k: Kernels = device.kernels(dtype, params)
        self.dtype = self.k.dtype
        self.params = self.k.params
        self.stats = Stats()
        self._buffers: dict = {}
        self._lock = threading.Lock()
        # pyopencl sets a kernel's arguments and enqueues it in two calls: threads must not interleave them
        self._launch = threading.Lock()
        self._count = threading.Lock()
        self._busy_end = 0.0   # where the last product's busy time ended (time.perf_counter)
        self._mine = threading.local()   # what this thread's product added to the stats (see _add)
        # The unpadded result buffers, used in turn: the download of one overlaps the next product, and each
        # buffer's last download, which the unpadding into it must wait for.
        self._slot = 0
        self._downloads: list = [None, None]

    @property
    def cache(self) -> PanelCache:
        return self.device.cache

    def count(self, **amounts) -> None:
        """Add ``amounts`` to :attr:`stats` (from any thread: what a product's ``finish`` did after it returned)."""
        self._add(**amounts)

    def _add(self, **amounts) -> None:
        with self._count:
            for name, value in amounts.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)
        tally = getattr(self._mine, "tally", None)
        if tally is not None:   # a product of this thread is being measured (MeteredEngine._measured)
            for name, value in amounts.items():
                tally[name] = tally.get(name, 0) + value

    # -- buffers --------------------------------------------------------
    def _buf(self, name: str, elements: int, what: str):
        nbytes = elements * self.dtype.itemsize
        held = self._buffers.get(name)
        if held is None or held[1] < nbytes:
            if held is not None:
                self._buffers.pop(name)[0].release()
            # kept with its size: a released buffer must never be asked anything (pyopencl crashes)
            self._buffers[name] = (self.device.buffer(nbytes, what=what), nbytes)
        return self._buffers[name][0]

    def release(self, wait: bool = True) -> bool:
        """Release the accumulator buffers kept between products; whether it was done.

        ``wait=False``: only if no product is running now (else nothing is
        released, False), for callers that must not block (the worker's
        event loop, at the end of a run).
        """
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            # a product that handed over before its finish (the device encode) may still read a result buffer
            pending = [d for d in self._downloads if isinstance(d, Future)]
            if not wait and not all(d.done() for d in pending):
                return False
            for d in pending:
                d.result()
            for buf, _ in self._buffers.values():
                buf.release()
            self._buffers.clear()
            self._downloads = [None, None]   # their buffers are gone; a new one has nothing to wait for
            return True
        finally:
            self._lock.release()

    # -- staging --------------------------------------------------------
    def _stage_into(self, q, host: np.ndarray, transpose: bool, drows: int, dcols: int, out):
        """Upload ``host`` into ``out`` as a zero-padded ``drows x dcols`` block; returns the last event.

        ``transpose`` stores ``host.T``.  An aligned block in the right layout
        is copied straight into place (None: the copy is finished); others go
        through a staging buffer and the padding or transposing kernel.
        """
        if host.dtype != self.dtype or not host.flags.c_contiguous:
            # the copy below sends raw bytes: a big-endian (or other) block would reach the kernels as garbage
            raise TypeError(f"internal: a {host.dtype} block (C-contiguous: {host.flags.c_contiguous}) reached "
                            f"the device of a {self.dtype} engine; convert it on the host first")
        rows, cols = host.shape
        for n in (rows * cols, drows * dcols):
            if n > INT32_MAX:
                raise ValueError(f"a block of {n} elements is too large for 32-bit indexing; use smaller blocks")
        t0 = time.perf_counter()
        ev = None
        size = f"{rows}x{cols} {self.dtype.name} block ({host.nbytes} bytes)"
        if not transpose and (rows, cols) == (drows, dcols):
            if host.size:
                with self.device.failing(f"uploading a {size}"):
                    self._transferred(nogil.copied(q, out, host))
            self._add(bytes_up=host.nbytes, upload_seconds=time.perf_counter() - t0)
            return ev
        # Its own staging buffer, so concurrent uploads never share one, free again once the kernel reading it
        # has run (dgemm.opencl.spares; released here, NVIDIA's driver would wait for the GEMMs beside).
        raw = self.device.spares.take(host.nbytes, f"the upload buffer of a {rows}x{cols} {self.dtype.name} block")
        ev = None
        try:
            with self.device.failing(f"uploading a {size}"):
                if host.size:
                    self._transferred(nogil.copied(q, raw, host))
            ev = self._pad(q, raw, rows, cols, transpose, drows, dcols, out)
        finally:
            self.device.spares.give(raw, ev)    # (a failed upload's is released)
        self._add(bytes_up=host.nbytes, upload_seconds=time.perf_counter() - t0)
        return ev

    def _pad(self, q, raw, rows: int, cols: int, transpose: bool, drows: int, dcols: int, out, wait=None):
        """Enqueue the padding (or transposing) kernel from ``raw``, a ``rows x cols`` block in C order on
        the device, into ``out`` as ``drows x dcols``; returns its event (flushed).  ``q`` is where ``raw``
        was filled (``wait``: events of other queues that fill it); the kernel goes to
        :meth:`Device.kernel_queue <dgemm.opencl.device.Device.kernel_queue>`."""
        q = self.device.kernel_queue(q)
        size = f"{rows}x{cols} {self.dtype.name} block ({rows * cols * self.dtype.itemsize} bytes)"
        with self._launch, self.device.failing(f"{'transposing' if transpose else 'padding'} a {size} "
                                               f"to {drows}x{dcols}"):
            if transpose:
                tt = self.k.transpose_tile
                ev = self.k.transpose_pad(q, (roundup(drows, tt), roundup(dcols, tt)), (tt, tt),
                                          np.int32(rows), np.int32(cols), raw, np.int32(drows),
                                          np.int32(dcols), out, wait_for=wait)
            else:
                ev = self.k.pad_zeros(q, _grid(dcols, drows), LOCAL_2D, np.int32(rows), np.int32(cols),
                                      np.int32(cols), raw, np.int32(drows), np.int32(dcols), out, wait_for=wait)
            q.flush()  # another queue will wait on ``ev``: it must be submitted
        self._transferred(ev)
        return ev

    def _prepared(self, q, out, ev, drows: int, dcols: int):
        """The wgmma kernels' operands rounded (or split) once, after ``ev``; returns the last event."""
        if self.k.prepare is None:
            return ev
        q = self.device.kernel_queue(q)
        with self._launch, self.device.failing(f"preparing a staged {drows}x{dcols} block for wgmma"):
            ev = self.k.prepare(q, (roundup(drows * dcols // 4, 256),), (256,), out,
                                np.int32(drows * dcols // 4), wait_for=[ev] if ev is not None else None)
            q.flush()
        self._transferred(ev)
        return ev

    def upload(self, host: np.ndarray, transpose: bool, drows: int, dcols: int):
        """A new device buffer holding ``host`` staged as ``drows x dcols``; returns ``(buffer, event)``."""
        # once, on the host: any byte order (a big-endian Zarr or numpy block) and layout to the engine's
        host = np.ascontiguousarray(host, dtype=self.dtype)
        nbytes = self._nbytes(drows, dcols)
        out = self.device.buffer(nbytes, what=f"a staged {drows}x{dcols} {self.dtype.name} block")
        q = self.device.transfer_queue
        try:
            ev = self._prepared(q, out, self._stage_into(q, host, transpose, drows, dcols, out), drows, dcols)
        except BaseException:
            out.release()   # nobody else holds it
            raise
        return out, ev

    def _fetch(self, ref, transpose: bool, drows: int, dcols: int):
        """Read a block (in a pool thread) and upload it.

        A block that reads itself fills page-locked staging memory where its
        dtype is the engine's (sent over the bus from there), else an array
        converted on upload; its read errors reach the product as they are.
        ``bytes_read`` counts the bytes this worker read from the store; the
        ``host_cache_*`` figures of ``Stats.extra`` what a host cache served
        and decoded.
        """
        # this thread's staging buffer is in use until the upload has copied it (Device.trim waits)
        with self.device.reading():
            if hasattr(ref, "fill_device") and np.dtype(ref.dtype) == self.dtype:
                staged = self._decoded(ref, transpose, drows, dcols)
                if staged is not None:
                    return staged
            t0 = time.perf_counter()
            served = None
            if _reads_itself(ref):
                rows, cols = ref.shape
                dtype = np.dtype(ref.dtype)
                if dtype == self.dtype:
                    host = self.device.staging(rows * cols * dtype.itemsize).view(dtype).reshape(rows, cols)
                else:
                    host = np.empty((rows, cols), dtype)
                served = ref.fill_into(host)
            else:
                host = np.asarray(ref)
            self._add(read_seconds=time.perf_counter() - t0, bytes_read=0 if served else host.nbytes,
                      reads=0 if served else 1)
            if served is not None:   # a host cache was asked (blocks that read themselves only)
                with self._count:
                    extra = self.stats.extra
                    for name, value in (("host_cache_hits", int(served)), ("host_cache_misses", int(not served)),
                                        ("host_cache_bytes_served", host.nbytes if served else 0),
                                        ("host_cache_bytes_decoded", 0 if served else host.nbytes)):
                        extra[name] = extra.get(name, 0) + value
            return self.upload(host, transpose, drows, dcols)

    def _decoded(self, ref, transpose: bool, drows: int, dcols: int):
        """Stage a block whose chunks the device decodes; ``(buffer, event)``, or None where it declines.

        ``ref.fill_device(device, buffer, queue, events)`` (a block may have
        it: :class:`dgemm.worker.decoding.DeviceDecoded`) reads the block's
        chunks compressed, uploads and decodes them into ``buffer`` (the
        block's ``rows x cols`` in C order) and returns the bytes it sent over
        the bus once they are there, or, under :data:`DEFERRED_DECODES`, once
        the decode is enqueued: then the padding (or the GEMM) waits for its
        last command, and the entry carries the decode's checks as a third
        item, which :meth:`_accumulate` calls before the product gives its
        result; None: nothing done, the block is read on the host.  An
        aligned block is decoded straight into its staged buffer; others into a buffer the padding or transposing
        kernel reads, as an upload is.  ``bytes_read`` counts the decoded
        bytes, as for a block read on the host; ``bytes_up`` what was sent.
        """
        rows, cols = ref.shape
        if not rows or not cols or max(rows * cols, drows * dcols) > INT32_MAX:
            return None   # the host path (and its error for blocks beyond 32-bit indexing)
        if getattr(ref, "declines", None) is not None and ref.declines(self.device):
            return None   # (device-codecs: share) every decode slot busy: the host decodes it, no buffer spent
        q = self.device.transfer_queue
        direct = not transpose and (rows, cols) == (drows, dcols)
        out = self.device.buffer(self._nbytes(drows, dcols), what=f"a staged {drows}x{dcols} {self.dtype.name} block")
        raw, staged, padded = out, None, None
        try:
            if not direct:
                raw = self.device.spares.take(rows * cols * self.dtype.itemsize,
                                              f"the decode buffer of a {rows}x{cols} {self.dtype.name} block")
            t0 = time.perf_counter()
            events: list = []
            pending: list | None = [] if DEFERRED_DECODES else None
            sent = ref.fill_device(self.device, raw, q, events, **({} if pending is None else {"pending": pending}))
            for _, event in events:
                self._transferred(event)
            if sent is None:
                padded = self.device.spares.UNREAD     # declined: nothing enqueued on it
                return None
            t1 = time.perf_counter()
            done = [event for event, _ in pending or ()]    # a deferred decode's last commands
            ev = done[-1] if direct and done else None
            if not direct:
                ev = padded = self._pad(q, raw, rows, cols, transpose, drows, dcols, out, wait=done or None)
            staged = out, self._prepared(q, out, ev, drows, dcols)
            if pending:     # its checks, which a product calls before it gives its result (_accumulate)
                staged += (tuple(check for _, check in pending),)
            self._add(read_seconds=t1 - t0, bytes_read=rows * cols * self.dtype.itemsize, reads=1, bytes_up=sent,
                      upload_seconds=time.perf_counter() - t1)
            return staged
        finally:
            if raw is not out:
                self.device.spares.give(raw, padded)    # free once its padding ran (a failed block's: released)
            if staged is None:
                out.release()   # declined, or failed: nobody else holds it

    def _staged(self, ref, transpose: bool, drows: int, dcols: int, scope):
        """The cache entry (pinned) of ``ref`` staged as ``drows x dcols``, read in the background on a miss."""
        key = None
        if _reads_itself(ref):   # blocks held by dask arrive as arrays and are not kept
            # (prepared: the wgmma engines' blocks are TF32 values or [big; small] halves, not plain float32)
            key = (scope, ref.key(), transpose, drows, dcols, self.dtype.str, self.k.parts, self.k.prepare is not None)
        nbytes = self._nbytes(drows, dcols)
        entry, _ = self.cache.acquire(key, nbytes, lambda: self.device.pool(copy=_copies(ref)).submit(
            self._fetch, ref, transpose, drows, dcols))
        return entry

    # -- the product ----------------------------------------------------
    def product(self, pairs: Iterable[tuple[np.ndarray, np.ndarray]], m: int, n: int, *,
                alpha: float = 1.0, beta: float = 0.0, c: np.ndarray | None = None,
                trans_a: bool = False, trans_b: bool = False) -> np.ndarray:
        """Compute ``alpha * sum(op(a) @ op(b) for a, b in pairs) + beta * c``.

        Parameters
        ----------
        pairs : iterable of (ndarray, ndarray)
            The k-blocks ``(A_ik, B_kj)`` as stored: ``A_ik`` is ``m x k``
            (``k x m`` when ``trans_a``), ``B_kj`` is ``k x n`` (``n x k``
            when ``trans_b``).  May be a generator that reads them lazily.
        m, n : int
            Shape of the C block.
        c : ndarray, optional
            The ``m x n`` block of C; read only when ``beta != 0``.
        """
        mp, np_ = self._padded(m, n)

        def steps():
            for a, b in pairs:
                k = self._check(a.shape, b.shape, m, n, trans_a, trans_b)
                if k and m and n:
                    ua = self.upload(a, *self._layout("a", trans_a, k, mp))
                    try:
                        ub = self.upload(b, *self._layout("b", trans_b, k, np_))
                    except BaseException:
                        ua[0].release()
                        raise
                    try:
                        yield k, ua, ub
                    finally:   # the GEMM reading them is enqueued (or the product failed): OpenCL keeps them
                        ua[0].release()
                        ub[0].release()
        return self._run(steps, m, n, alpha, beta, c)

    def stream(self, a_refs: Sequence, b_refs: Sequence, m: int, n: int, *, alpha: float = 1.0,
               beta: float = 0.0, c: np.ndarray | None = None, trans_a: bool = False, trans_b: bool = False,
               scope=None, ahead=None, prefetch: int | None = None, twin: bool = False, finish=None):
        """Like :meth:`product`, from block references that are read and uploaded ahead of the device.

        Parameters
        ----------
        a_refs, b_refs : sequences
            The k-blocks of A and B: blocks that read themselves (see the
            module's notes; read in the device's pool of threads, and kept in
            its panel cache) or arrays.
        scope : hashable, optional
            Names the run: cached blocks are shared only within one scope, so
            an input rewritten between two runs is never served stale.  The
            first product of a new scope drops the other runs' cached blocks
            that no product uses (:meth:`PanelCache.enter`): the cache is per
            run, and its device memory is the next run's.
        ahead : sequence of (ref, side, extent), optional
            Blocks the products expected next on this device will read first,
            in the order they will need them: ``side`` is ``"a"`` or ``"b"``,
            ``extent`` the m (for A) or n (for B) of their product.  They are
            read once this product's own reads are all under way, as many as
            a quarter of the panel cache holds, so that the readers never
            wait for the next task to ask (:func:`dgemm.client.graph.build` lists
            them: the blocks not read before, in this worker's order).
        prefetch : int, optional
            How many k steps to read ahead (default :func:`default_prefetch`).
        twin : bool
            A and B are blocks of one array, which ``op`` stages in the same
            layout on both sides (a Gram product, X^T X or X X^T): m and n are
            padded to one tile (the least common multiple of TSM and TSN), so
            that a block staged as A for one product is the very cache entry
            another product needs as B: each block is read, decoded and
            uploaded once, and held once on the device.  Every product of
            the run must pass the same value (the cache keys depend on it).
        finish : callable, optional
            ``finish(buffer, events, after) -> (result, bytes downloaded[, freed])``,
            called in place of the download with the ``m x n`` result (C
            order) in a device buffer of the engine's, once the product is
            enqueued on the device's queue: ``after`` lists the events that
            ``buffer`` holds the result after (a command on another queue
            waits for them).  Its ``result`` is the product's (the worker
            encodes C's chunks there: :mod:`dgemm.worker.encoding`).  It
            must not keep ``buffer`` past its return, or, where it returns
            ``freed``, past that event (the next product to write ``buffer``
            waits for it); ``events`` takes its ``(what, event)`` (downloads
            named ``"download"`` count as the product's).  A product with no
            GEMM (K == 0) returns its array as without it.
        """
        if prefetch is None:
            prefetch = default_prefetch()
        if scope is not None:   # a new run: the last run's cached blocks go (the cache is per run)
            self.cache.enter(scope)
        mp, np_ = self._padded(m, n, twin)
        plan = []
        for a, b in zip(a_refs, b_refs, strict=True):
            k = self._check(_shape(a), _shape(b), m, n, trans_a, trans_b)
            if k and m and n:
                plan.append((k, a, b))
        nxt = self._ahead(ahead or (), trans_a, trans_b, twin)

        def request(k, a, b):
            ea = self._staged(a, *self._layout("a", trans_a, k, mp), scope)
            try:
                eb = self._staged(b, *self._layout("b", trans_b, k, np_), scope)
            except BaseException:
                self.cache.release(ea)
                raise
            return k, ea, eb

        def steps():
            pending = deque()
            ahead = iter(plan)
            try:
                for item in ahead:
                    pending.append(request(*item))
                    if len(pending) >= prefetch:
                        break
                while pending:
                    k, ea, eb = pending.popleft()
                    item = next(ahead, None)
                    if item is not None:
                        pending.append(request(*item))
                    else:   # all of ours are under way: warm the cache for the next product
                        while nxt:
                            self.cache.release(self._staged(*nxt.pop(0), scope))
                    try:
                        yield k, ea.future.result(), eb.future.result()
                    finally:
                        self.cache.release(ea)
                        self.cache.release(eb)
            finally:
                for _, ea, eb in pending:
                    self.cache.release(ea)
                    self.cache.release(eb)
        return self._run(steps, m, n, alpha, beta, c, planned=(len(plan), sum(2.0 * m * n * k for k, _, _ in plan)),
                         twin=twin, finish=finish)

    def _ahead(self, ahead, trans_a: bool, trans_b: bool, twin: bool = False) -> list:
        """``(ref, transpose, drows, dcols)`` of each read-ahead block, up to a quarter of the cache's budget."""
        out, spent, seen = [], 0, set()
        for ref, side, extent in ahead:
            rows, cols = _shape(ref)
            if side == "a":
                k, trans = (rows if trans_a else cols), trans_a
            else:
                k, trans = (cols if trans_b else rows), trans_b
            if not k or not extent:
                continue
            mp, np_ = self._padded(extent, extent, twin)
            transpose, drows, dcols = self._layout(side, trans, k, mp if side == "a" else np_)
            if _reads_itself(ref):   # a twin's block is listed once per side, for one cache entry (see stream)
                if (ident := (ref.key(), transpose, drows, dcols)) in seen:
                    continue
                seen.add(ident)
            nbytes = self._nbytes(drows, dcols)
            if out and spent + nbytes > self.cache.budget // 4:
                break
            out.append((ref, transpose, drows, dcols))
            spent += nbytes
        return out

    def _layout(self, side: str, trans: bool, k: int, extent: int) -> tuple[bool, int, int]:
        """``(transpose, rows, cols)`` of a block of A (``side="a"``) or B on the device.

        The kernels take A^T (k x m) and B (k x n), K padded to TSK; the wgmma kernel
        (``params.k_major``) takes A (m x k) and B^T (n x k).  ``trans``: the block is
        stored transposed (``trans_a``/``trans_b``); ``extent``: the padded m or n.
        """
        kp = roundup(k, self.params.TSK)
        if self.params.k_major:
            return (trans, extent, kp) if side == "a" else (not trans, extent, kp)
        return (not trans, kp, extent) if side == "a" else (trans, kp, extent)

    def _nbytes(self, drows: int, dcols: int) -> int:
        """Device bytes of a staged ``drows x dcols`` block (3xTF32's blocks hold two halves)."""
        return drows * dcols * self.dtype.itemsize * self.k.parts

    def _padded(self, m: int, n: int, twin: bool = False) -> tuple[int, int]:
        """The C block's padded ``(m, n)``; ``twin`` (see :meth:`stream`): both to one common tile."""
        tm, tn = self.params.TSM, self.params.TSN
        if twin:
            tm = tn = math.lcm(tm, tn)
        return roundup(max(m, 1), tm), roundup(max(n, 1), tn)

    @staticmethod
    def _check(a_shape, b_shape, m, n, trans_a, trans_b) -> int:
        k = a_shape[0] if trans_a else a_shape[1]
        kb = b_shape[1] if trans_b else b_shape[0]
        ma = a_shape[1] if trans_a else a_shape[0]
        nb = b_shape[0] if trans_b else b_shape[1]
        if k != kb or ma != m or nb != n:
            raise ValueError(f"block shapes do not fit: A {tuple(a_shape)}, B {tuple(b_shape)} for C {(m, n)}")
        return k

    def _run(self, steps, m, n, alpha, beta, c, planned=None, twin: bool = False, finish=None):
        with Turn(self._lock) as turn:
            self.device.idle = False
            t0 = time.perf_counter()

            handed = []

            def handoff():   # the rest of this product is its download, on a queue of its own
                handed.append(self._handoff())
                turn.release()
            try:
                return self._measured(lambda: self._accumulate(steps(), m, n, alpha, beta, c, twin, finish, handoff),
                                      planned)
            except Exception as e:
                if is_opencl_error(e):   # one the steps did not name (their own are DeviceErrors already)
                    raise_plain(device_error(self.device.info.name, f"a {m}x{n} {self.dtype.name} block product", e))
                raise
            finally:
                self._busy(t0, time.perf_counter(), *handed)

    # Hooks for a subclass that meters products (dgemm.worker.state.MeteredEngine); times are
    # time.perf_counter's, and the hooks are cheap: they only note what the product has at hand.
    def _measured(self, fn, planned=None):
        """Run one product; ``planned`` is ``(k steps, flops)`` when known ahead."""
        return fn()

    def _handoff(self):
        """The product gives up the engine's lock before its download is done; what :meth:`_busy` gets then."""
        return None

    def _busy(self, start: float, end: float, handed=None) -> float:
        """Count one product's wall time, from its start to its result's arrival; returns the start counted.

        Called after the product, in the engine's lock unless it was handed
        over (``handed``: what :meth:`_handoff` returned).  The next product
        may then have started before this one's download ended: the time
        both cover counts once, for the one that ended first.
        """
        with self._count:
            start = min(max(start, self._busy_end), end)
            self._busy_end = max(self._busy_end, end)
            self.stats.busy_seconds += end - start
        return start

    def _waited(self, start: float, end: float) -> None:
        """The product waited for its next inputs from ``start`` to ``end``."""

    def _launched(self, event, flops: float) -> None:
        """A GEMM kernel of ``flops`` was enqueued (``event``)."""

    def _transferred(self, event) -> None:
        """An upload, padding, unpadding or download command (None: nothing was enqueued)."""

    def _accumulate(self, steps, m, n, alpha, beta, c, twin: bool = False, finish=None, handoff=None):
        """Enqueue one GEMM per step into the C accumulator, then unpad and download it once (or ``finish`` it).

        ``handoff()``, once the download is enqueued (or, with ``finish``, once the
        unpadding is), lets the next product in (:class:`~dgemm.opencl.turn.Turn`)."""
        import pyopencl as cl

        p, q = self.params, self.device.queue
        mp, np_ = self._padded(m, n, twin)
        real = self.dtype.type
        use_c = c is not None and beta != 0
        if use_c:
            if c.shape != (m, n):
                raise ValueError(f"C block has shape {c.shape}, expected {(m, n)}")
        acc = f"the {mp}x{np_} {self.dtype.name} accumulator"
        c_dev = self._buf("c", mp * np_, acc)
        if use_c:
            self._stage_into(q, np.ascontiguousarray(c, dtype=self.dtype), False, mp, np_, c_dev)
        beta_k = beta if use_c else 0.0
        events, flops = [], 0.0
        checks: dict = {}   # the deferred decodes' checks of this product's blocks (each once)
        gsize, lsize = p.launch(mp, np_)
        try:
            while True:
                t0 = time.perf_counter()
                step = next(steps, None)
                t1 = time.perf_counter()
                self._add(wait_seconds=t1 - t0)
                self._waited(t0, t1)
                if step is None:
                    break
                k, a, b = step
                (at, a_ev), (bt, b_ev) = a[:2], b[:2]
                checks.update((id(c), c) for staged in (a, b) for c in (staged[2] if len(staged) > 2 else ()))
                wait = [e for e in (a_ev, b_ev) if e is not None] or None
                with self.device.failing(f"launching the GEMM kernel on {mp}x{np_}x{roundup(k, p.TSK)} "
                                         f"{self.dtype.name} blocks"):
                    events.append(self.k.gemm(q, gsize, lsize, np.int32(mp), np.int32(np_),
                                              np.int32(roundup(k, p.TSK)), real(alpha), real(beta_k), at, bt,
                                              c_dev, wait_for=wait))
                    nogil.flush(q)
                self._launched(events[-1], 2.0 * m * n * k)
                flops += 2.0 * m * n * k
                beta_k = 1.0
        finally:
            steps.close()   # releases the cache pins of steps not taken (after an error)
        if m == 0 or n == 0 or not events:
            out = np.empty((m, n), dtype=self.dtype)
            if m and n:  # K == 0: the product is empty, only beta * C remains
                out[...] = real(beta) * c if use_c else 0
            return out
        for check in checks.values():   # every block decoded cleanly, or the product fails here
            check()
        slot, self._slot = self._slot, 1 - self._slot
        last = self._downloads[slot]
        if isinstance(last, Future):    # a product before the last one still finishing from this buffer
            last = last.result()
        dense = self._buf(f"dense{slot}", m * n, f"the {m}x{n} {self.dtype.name} result")
        free = [last] if last is not None else None   # the buffer's last download has read it
        if finish is not None:
            with self.device.failing(f"unpadding the {m}x{n} {self.dtype.name} result"):
                unpad = self.k.unpad(q, _grid(n, m), LOCAL_2D, np.int32(m), np.int32(n), np.int32(np_), c_dev,
                                     dense, wait_for=free)
                self._transferred(unpad)
                q.flush()
            # The next product may start once the unpadding has read the accumulator (its GEMMs queue behind it
            # on q). Until finish() returns (and its "freed" has run), this result buffer is ours: the product
            # after next waits for the future.
            read, freed = Future(), None
            self._downloads[slot] = read
            try:
                if handoff is not None:
                    handoff()
                done: list = []
                result, down, *freed = finish(dense, done, [unpad])
            finally:   # finish's commands have run (it waits for them), or will have once its "freed" has
                read.set_result(freed[0] if freed else None)
            nogil.wait(events[-1])   # (a finish that returns early: the GEMMs' profiling is there once they have run)
            self._add(kernel_seconds=sum(_seconds(e) for e in events), flops=flops, bytes_down=down, blocks=1,
                      download_seconds=sum(_seconds(e) for what, e in done if what == "download"))
            return result
        out = self.device.host_array((m, n), self.dtype)   # page-locked: the download runs at bus speed
        what = f"downloading the {m}x{n} {self.dtype.name} result ({out.nbytes} bytes)"
        with self.device.failing(what):
            unpad = self.k.unpad(q, _grid(n, m), LOCAL_2D, np.int32(m), np.int32(n), np.int32(np_), c_dev, dense,
                                 wait_for=free)
            self._transferred(unpad)
            q.flush()
            # on a queue of its own: the next product's GEMMs (behind the unpadding on q) run meanwhile
            down = self._downloads[slot] = cl.enqueue_copy(self.device.download_queue, out, dense,
                                                           is_blocking=False, wait_for=[unpad])
            self.device.download_queue.flush()
        if handoff is not None:
            handoff()
        with self.device.failing(what):
            nogil.wait(down)
        self._transferred(down)
        self._add(kernel_seconds=sum(_seconds(e) for e in events), flops=flops, bytes_down=out.nbytes, blocks=1,
                  download_seconds=_seconds(down))
        return out


def _reads_itself(ref) -> bool:
    """Whether ``ref`` is a block that reads itself (see the module's notes) rather than an array."""
    return hasattr(ref, "fill_into")


def _copies(ref) -> bool:
    """Whether reading ``ref`` only copies file bytes (see :meth:`~dgemm.opencl.device.Device.pool`)."""
    return _reads_itself(ref) and ref.copies


def _shape(ref) -> tuple[int, int]:
    return ref.shape if _reads_itself(ref) else np.shape(ref)

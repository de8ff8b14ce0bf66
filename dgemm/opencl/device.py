"""One OpenCL device as a worker uses it: context, queue, built programs.

Objects here are created inside worker processes (see :mod:`dgemm.worker`),
never in the client.  Programs are built once per (dtype, parameters) and
cached on the :class:`Device`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dgemm import config
from dgemm.dtypes import SUPPORTED
from dgemm.errors import DeviceError, DeviceMemoryError
from dgemm.opencl import nogil, sources
from dgemm.opencl.database import Choice, lookup
from dgemm.opencl.discovery import DeviceInfo, cl_device, worker_device
from dgemm.opencl.panels import PanelCache
from dgemm.opencl import poison
from dgemm.opencl.params import KernelParams
from dgemm.opencl.poison import POISON_BYTE, poisoned  # noqa: F401 (the tests' hook, where it always was)
from dgemm.opencl.scratch import ENCODE_SLOTS, Scratch
from dgemm.opencl.spares import Spares

logger = logging.getLogger("dgemm")
# cl_khr_priority_hints (cl_ext.h): a queue property and its high value
QUEUE_PROPERTIES, QUEUE_PRIORITY_KHR, QUEUE_PRIORITY_HIGH_KHR = 0x1093, 0x1096, 1 << 0


def high_priority_queues(extensions: str) -> bool:
    """Whether a device with these OpenCL ``extensions`` gets high-priority feeding queues
    (:meth:`Device.feeding_queue`): it offers ``cl_khr_priority_hints`` and the ``queue-priority`` setting is on.

    >>> high_priority_queues("cl_khr_fp64 cl_khr_priority_hints"), high_priority_queues("cl_khr_fp64")
    (True, False)
    """
    return "cl_khr_priority_hints" in extensions.split() and config.get("queue-priority") == "on"

# the kernels' PRECISION macro: bits of the element type
PRECISION_BITS = {dt: dt.itemsize * 8 for dt in SUPPORTED}

class Kernels:
    """The built kernels of one program, with the parameters they were built for.

    ``gemm_program``: where the GEMM kernel comes from when it is not
    ``program`` (the wgmma kernel, built on its own through the PTX route).
    """

    def __init__(self, program, params: KernelParams, dtype: np.dtype, gemm_program=None):
        import pyopencl as cl

        self.program = program
        self.params = params
        self.dtype = dtype
        # The wgmma kernels' operands are prepared where they are staged: rounded to TF32
        # (round_tf32), or split into [big; small] TF32 halves for 3xTF32 (split_tf32, ``parts`` 2).
        self.prepare = None
        self.parts = params.parts
        self.gemm_program = gemm_program or program
        # Kernels made by name, not as the program's attributes: the wgmma kernels share the padding program
        # of the regular ones, and pyopencl warns (RepeatedKernelRetrieval) at each attribute read after the first.
        if gemm_program is None:
            self.gemm = cl.Kernel(program, "gemm")
        else:
            self.prepare = cl.Kernel(gemm_program, "split_tf32" if self.parts == 2 else "round_tf32")

            kernel = cl.Kernel(gemm_program, "gemm_wgmma")

            def gemm(queue, gsize, lsize, *args, **kw):
                return kernel(queue, gsize, lsize, *args, None, **kw)   # no probe buffer
            self.gemm = gemm
        self.pad_zeros, self.unpad, self.transpose_pad = (cl.Kernel(program, n) for n in
                                                          ("pad_zeros", "unpad", "transpose_pad"))
        self.transpose_tile = 16


class Device:
    """An OpenCL context and in-order profiling queue on one device.

    Parameters
    ----------
    info : DeviceInfo, optional
        The device; by default the one :func:`dgemm.opencl.discovery.worker_device`
        picks from the environment.
    """

    def __init__(self, info: DeviceInfo | None = None):
        import pyopencl as cl

        self.info = info or worker_device()
        self.cl_device = cl_device(self.info)
        self.context = cl.Context([self.cl_device])
        self.priority = high_priority_queues(getattr(self.cl_device, "extensions", "") or "")
        # queue-priority inline: the feeding kernels go into the GEMM kernels' queue (kernel_queue)
        self.inline_feeding = config.get("queue-priority") == "inline"
        profiling = cl.command_queue_properties.PROFILING_ENABLE
        self.queue = cl.CommandQueue(self.context, properties=profiling)            # GEMM kernels
        self.transfer_queue = self.feeding_queue()                                  # uploads, staging
        # results coming down: a download here overlaps the next product's GEMMs (opencl.engine)
        self.download_queue = cl.CommandQueue(self.context, properties=profiling)
        # the worker sets its budget (dgemm.worker.DeviceState); a dropped entry's buffer is released at once
        self.cache = PanelCache(0, on_drop=_release_entry)
        self._pools: dict[bool, ThreadPoolExecutor] = {}
        # Each reader thread's page-locked staging buffer, by thread id (not thread-local: trim() must
        # reach them from another thread), and the threads filling theirs now, which trim() leaves alone.
        self._staging: dict[int, tuple] = {}
        self._reading: dict[int, int] = {}
        # What trim() keeps of a thread's staging buffer: one of the default block's size (the worker
        # sets it, see DgemmPlugin), so that back-to-back runs do not pin their staging again.
        self.staging_keep = 0
        self._free: list = []          # page-locked download buffers no array uses now
        self._pinned_bytes = 0
        # Set by trim(), cleared when a product starts: while idle, download buffers given back by
        # the arrays that held them are released at once instead of waiting in the free list.
        self.idle = True
        # Buffers allocated less buffers released (explicitly or collected), and their bytes:
        # what live_buffers() reports.  Counted by DeviceBuffer, so no gc internals are needed.
        self._live = {"device": 0, "page-locked": 0}
        self._live_bytes = {"device": 0, "page-locked": 0}
        self._kernels: dict = {}
        self._lock = threading.Lock()
        # reader threads' decode buffers and queues (device codecs), given back by trim()
        self.scratch = Scratch(self)
        # the device encoder's buffers and queues (a set per C block encoded at once),
        # kept from one C block to the next and given back by trim(): a release waits for the device to idle
        self.encode_scratch = Scratch(self, slots=ENCODE_SLOTS)
        self.spares = Spares(self)  # blocks' source buffers (uploads', decodes') kept for the next block, as scratch
        # Kernels that could not be built here, and why (the wgmma kernel's PTX route can fail
        # with a driver it was not tried on); choice() says so, and the worker's description with it.
        self.failed: dict[KernelParams, str] = {}

    def kernel_queue(self, queue):
        """Where a kernel that feeds the GEMM kernels goes, its uploads having been made on ``queue``: the GEMM
        kernels' own in-order queue under ``queue-priority: inline`` (it then runs between two GEMMs, all
        of it, and the GEMMs after it find its output there without an event), else ``queue``."""
        return self.queue if self.inline_feeding else queue

    def feeding_queue(self):
        """A new in-order profiling queue for commands that feed the GEMM kernels (uploads and the padding
        and transposing kernels after them, device decodes): of high priority where the driver offers
        ``cl_khr_priority_hints`` and the ``queue-priority`` setting is on.

        A GEMM kernel fills the device with work-groups; a kernel on
        another queue of the same priority waits for free room, which a
        GEMM leaves only at its end, so a decode of ten short kernels took
        ten GEMMs (bench/NOTES.md, issue 28).  A higher-priority kernel's
        work-groups go before the GEMM's waiting ones as its running ones
        end.  Where the driver has no such hint (PoCL) or refuses it, the
        queue is an ordinary one.
        """
        import pyopencl as cl

        profiling = cl.command_queue_properties.PROFILING_ENABLE
        if self.priority:
            try:
                return cl.CommandQueue(self.context, properties=[
                    QUEUE_PROPERTIES, profiling, QUEUE_PRIORITY_KHR, QUEUE_PRIORITY_HIGH_KHR])
            except cl.Error as e:      # advertised but refused: an ordinary queue, and no further tries
                logger.info("dgemm: %s refused a high-priority queue (%s): ordinary queues", self.info.name, e)
                self.priority = False
        return cl.CommandQueue(self.context, properties=profiling)

    def staging(self, nbytes: int) -> np.ndarray:
        """This thread's page-locked host buffer of at least ``nbytes`` (uint8), kept for the thread's next block.

        Copies from page-locked memory run at the bus's speed, several times
        faster than from ordinary memory (bench/NOTES.md has the figures);
        the driver allocates it for ``ALLOC_HOST_PTR`` buffers.  Call it
        within :meth:`reading` (the engine does), so that :meth:`trim` leaves
        the buffer alone while the thread fills it.
        """
        me = threading.get_ident()
        with self._lock:
            held = self._staging.get(me)
        if held is None or held[1].nbytes < nbytes:
            if held is not None:   # grown: the smaller one is not kept beside it
                held[0].release()
            fresh = self._page_locked(nbytes)
            with self._lock:
                held = self._staging[me] = fresh
        if poison.POISON:
            held[1][:nbytes] = POISON_BYTE
        return held[1][:nbytes]

    def warm_staging(self, nbytes: int, wait: bool = True, timeout: float = 60.0, first: bool = False,
                     copy: bool = False):
        """Give each reader thread (:meth:`pool`, the ``copy`` one or not) its :meth:`staging` buffer of ``nbytes`` now.

        So that the first block products do not wait for the driver to pin
        memory.  One task per thread, each held at a barrier until all have
        started, so that no thread takes two; if a thread stays busy (a
        read) longer than ``timeout`` seconds, the others go on without it.
        ``first``: only if the readers have not started yet (threads held at
        the barrier would keep a run's reads waiting); else nothing, ``[]``.

        Returns
        -------
        list of concurrent.futures.Future
            One per thread, each giving the bytes that thread's buffer holds
            (at least ``nbytes``; a larger one is kept); already finished
            when ``wait``.
        """
        with self._lock:
            if first and self._pools:
                return []
        # by default the decoding readers: compressed inputs are the common case, and raw copies
        # (the copy pool) pin their buffers as they start unless asked for here
        pool = self.pool(copy=copy)
        n = pool._max_workers
        barrier = threading.Barrier(n, timeout=timeout)

        def one():
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()   # n tasks on n threads: each thread's buffer is its own (thread-local)
            with self.reading():
                self.staging(nbytes)
            with self._lock:
                return self._staging[threading.get_ident()][1].nbytes

        futures = [pool.submit(one) for _ in range(n)]
        if wait:
            for f in futures:
                f.result()
        return futures

    def _page_locked(self, nbytes: int):
        """``(buffer, host view)``: driver-allocated host memory (``ALLOC_HOST_PTR``), mapped for the host."""
        import pyopencl as cl

        nbytes = max(int(nbytes), 1)
        buf = self._allocate(cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes, "page-locked",
                             "page-locked host memory")
        with self.failing(f"mapping {_size(nbytes)} of page-locked host memory"):
            host, _ = cl.enqueue_map_buffer(self.transfer_queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                            (nbytes,), np.uint8, is_blocking=True)
        return buf, host

    def _allocate(self, flags, nbytes: int, kind: str, what: str):
        """A counted :class:`DeviceBuffer` (see :meth:`live_buffers`); a failure is a :class:`DeviceError`."""
        cls = _buffer_class()
        with self.failing(f"allocating {what} of {_size(nbytes)}"):
            buf = cls(self.context, flags, nbytes)
        with self._lock:
            self._live[kind] += 1
            self._live_bytes[kind] += nbytes
        # counted down once: by release() or, for a buffer only dropped, when it is collected
        buf._dgemm_gone = weakref.finalize(buf, self._gone, kind, nbytes)
        return buf

    def _gone(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self._live[kind] -= 1
            self._live_bytes[kind] -= nbytes

    def live_buffers(self) -> dict:
        """OpenCL buffers this device allocated and has not released or dropped yet, and their bytes.

        Returns
        -------
        dict
            ``buffers`` and ``buffer_bytes`` (device buffers: staged blocks,
            the panel cache, accumulators), ``pinned_buffers`` and
            ``pinned_bytes`` (page-locked host memory: staging and download
            buffers).  A buffer kept alive by a reference cycle counts until
            the collector frees it, so after each run these come back to the
            idle worker's figures (:meth:`trim`), without any ``gc.collect()``.
        """
        with self._lock:
            return {"buffers": self._live["device"], "buffer_bytes": self._live_bytes["device"],
                    "pinned_buffers": self._live["page-locked"], "pinned_bytes": self._live_bytes["page-locked"]}

    @contextlib.contextmanager
    def failing(self, what: str):
        """Within this block, an OpenCL error becomes a :class:`DeviceError` naming the device and ``what``.

        pyopencl's errors carry a record that does not pickle, so a worker's
        error would reach the client as an empty ``Exception``; this one is
        plain text: the device, what was being allocated or launched (and its
        size), and OpenCL's code.
        """
        try:
            yield
        except DeviceError:
            raise
        except Exception as e:
            if not is_opencl_error(e):
                raise
            raise_plain(device_error(self.info.name, what, e))

    @contextlib.contextmanager
    def reading(self):
        """Marks this thread as filling its staging buffer: :meth:`trim` leaves the buffer alone meanwhile."""
        me = threading.get_ident()
        with self._lock:
            self._reading[me] = self._reading.get(me, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                if self._reading[me] == 1:
                    del self._reading[me]
                else:
                    self._reading[me] -= 1

    def trim(self, keep_pinned: bool = False) -> dict:
        """Give back what a finished run held: the panel cache, and page-locked memory beyond a bounded pool.

        Drops every panel cache entry no product uses (releasing its device buffer), the reader threads'
        decode buffers (:mod:`.scratch`) but those of a thread reading now, the encoder's unless it is
        encoding, and the blocks' free source buffers (:mod:`.spares`).  ``keep_pinned`` (a run's end):
        page-locked memory stays for the next run, so that it does not pin its staging again (16 readers'
        256 MiB buffers take about a second): each reader thread's staging buffer (one per thread, of the
        largest block it read) and the free download buffers (at most :func:`pinned_limit` bytes).
        Otherwise (the worker idle): the download buffers no array holds are released (and, until the next
        product starts, those given back later), and each reader thread's staging buffer larger than
        :attr:`staging_keep`; a thread reading now keeps its own.  (NVIDIA's driver backs each page-locked
        buffer with device memory of its size too.)  Cheap: nothing is waited for (OpenCL frees a released
        buffer once the commands using it finish).

        Returns
        -------
        dict
            :meth:`live_buffers` afterwards.
        """
        self.cache.clear()
        with self._lock:
            busy = set(self._reading)
        self.scratch.release(busy)
        self.encode_scratch.release()
        self.spares.release()
        if keep_pinned:
            return self.live_buffers()
        with self._lock:
            self.idle = True
            free, self._free = self._free, []
            self._pinned_bytes -= sum(e[1].nbytes for e in free)
            big = [t for t, (_, host) in self._staging.items()
                   if host.nbytes > self.staging_keep and t not in self._reading]
            staging = [self._staging.pop(t) for t in big]
        for buf, _ in (*free, *staging):
            buf.release()
        return self.live_buffers()

    def host_array(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A new array in page-locked memory, for downloads; ordinary memory beyond :func:`pinned_limit`.

        The memory returns to the device's free list when the array (and
        every view of it) is gone, so C blocks downloaded one after another
        reuse a few pinned buffers instead of pinning memory each time.
        """
        import weakref

        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        with self._lock:
            fits = [e for e in self._free if e[1].nbytes >= nbytes]
            entry = min(fits, key=lambda e: e[1].nbytes) if fits else None
            if entry is not None:
                self._free.remove(entry)
            elif self._pinned_bytes + nbytes > pinned_limit() or nbytes == 0:
                return _poisoned(np.empty(shape, dtype))
            else:
                self._pinned_bytes += nbytes
        if entry is None:
            entry = self._page_locked(nbytes)
        if poison.POISON:
            entry[1][:nbytes] = POISON_BYTE
        lease = _Lease(entry[1], tuple(shape), dtype)
        # Views of the array keep ``lease`` (their base), not the array: numpy collapses view chains
        # down to the first non-array base, so the memory is given back only when the last view is gone.
        weakref.finalize(lease, self._give_back, entry)
        return np.asarray(lease)

    def _give_back(self, entry) -> None:
        with self._lock:
            if not self.idle:   # a run goes on: its next C block reuses this memory
                self._free.append(entry)
                return
            self._pinned_bytes -= entry[1].nbytes
        entry[0].release()

    def pool(self, copy: bool = False) -> ThreadPoolExecutor:
        """The threads that read blocks from their stores and upload them.

        Blocks that are decoded (compressed, remote, or read through zarr)
        go to :func:`read_threads` threads: decoding is CPU work that scales
        with them.  Blocks that are only copied from local files (raw chunks)
        go to a pool of at most :data:`COPY_THREADS`: more copies at once
        contend for memory bandwidth with the uploads.
        """
        with self._lock:
            if copy not in self._pools:
                n = min(read_threads(), COPY_THREADS) if copy else read_threads()
                self._pools[copy] = ThreadPoolExecutor(n, thread_name_prefix="dgemm-copy" if copy else "dgemm-read")
            return self._pools[copy]

    def choice(self, dtype, precision: str | None = None) -> Choice:
        """The tuning database's parameters for ``dtype`` (and ``precision``) on this device.

        A wgmma kernel that failed to build here is passed over, and the
        choice's note says why.
        """
        choice = lookup(self.info, np.dtype(dtype).name, precision=precision)
        why = self.failed.get(choice.params)
        if why is None:
            return choice
        other = self._stand_in(np.dtype(dtype), precision)
        note = f"the wgmma kernel failed on this device ({why}); using the {other.params.kind.instruction} kernel"
        return dataclasses.replace(other, note=f"{other.note}; {note}" if other.note else note)

    def check_dtype(self, dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        if dtype not in SUPPORTED:
            raise TypeError(f"dgemm supports float32 and float64, not {dtype}")
        if dtype == np.float64 and not self.info.fp64:
            raise DeviceError(f"device {self.info.name!r} has no double precision (cl_khr_fp64); "
                              "use float32 or another device")
        return dtype

    def kernels(self, dtype, params: KernelParams | None = None, extra_options: tuple = ()) -> Kernels:
        """Build (once) and return the kernels for ``dtype`` and ``params``.

        ``extra_options`` go to the OpenCL compiler as well (e.g.
        ``("-cl-nv-verbose",)`` for NVIDIA's register report, see
        :meth:`build_log`).
        """
        import pyopencl as cl

        dtype = self.check_dtype(dtype)
        params = params or self.choice(dtype).params
        if params.k_major:
            if params not in self.failed:   # tried once per device: a failure is remembered, with its reason
                try:
                    return self._kernels_wgmma(dtype, params, tuple(extra_options))
                except Exception as e:   # the PTX route did not work here: the kernels it stands for instead
                    why = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                    logger.warning("dgemm: the wgmma kernel %s could not be built on %s (%s); falling back",
                                   params, self.info.name, why)
                    self.failed[params] = why
            return self.kernels(dtype, self._stand_in(dtype, params.precision).params, extra_options)
        key = (dtype, params, tuple(extra_options))
        with self._lock:
            if key not in self._kernels:
                bad = params.problems(dtype.itemsize, self.info.max_work_group_size, self.info.local_mem)
                need = params.min_compute_capability
                if need and self.info.compute_capability < need:
                    bad.append(f"MMA={params.MMA} kernels need an NVIDIA GPU of compute capability >= "
                               f"{need // 10}.{need % 10}, not {self.info.name} ({self.info.architecture})")
                if bad:
                    raise ValueError(f"invalid kernel parameters {params}: " + "; ".join(bad))
                defines = {"PRECISION": PRECISION_BITS[dtype], **params.defines()}
                options = [f"-D{k}={v}" for k, v in defines.items()]
                options += ["-I", str(sources.kernel_dir()), *extra_options]
                program = cl.Program(self.context, sources.program_source()).build(options=options)
                self._kernels[key] = Kernels(program, params, dtype)
            return self._kernels[key]

    def _stand_in(self, dtype: np.dtype, precision: str | None) -> Choice:
        """What runs where the wgmma kernel for ``precision`` cannot: the database's next choice."""
        return lookup(self.info, dtype.name, precision=precision, wgmma=False)

    def _kernels_wgmma(self, dtype, params: KernelParams, extra_options: tuple) -> Kernels:
        """The wgmma GEMM (built through :mod:`dgemm.opencl.ptx`) with the padding and transpose kernels."""
        from dgemm.opencl import wgmma

        key = (dtype, params, extra_options)
        with self._lock:
            if key in self._kernels:
                return self._kernels[key]
        bad = params.problems(dtype.itemsize, self.info.max_work_group_size, self.info.local_mem)
        if self.info.compute_capability != 90:
            bad.append(f"wgmma is sm_90's (Hopper); {self.info.name} is {self.info.architecture or 'not NVIDIA'}")
        if bad:
            raise ValueError(f"invalid kernel parameters {params}: " + "; ".join(bad))
        program = self._wgmma_program(params, extra_options)
        # The padding and transpose kernels of the regular program (any GEMM parameters build them).
        helpers = self.kernels(dtype, lookup(self.info, dtype.name, precision="fma").params).program
        with self._lock:
            return self._kernels.setdefault(key, Kernels(helpers, params, dtype, gemm_program=program))

    def _wgmma_program(self, params: KernelParams, extra_options: tuple):
        """The wgmma program for ``params``: from the disk cache (dgemm.opencl.binaries) when built before.

        Builds with ``extra_options`` (diagnostics: ``-cl-nv-verbose``) skip the cache, so that their
        compiler log is a real build's.
        """
        from dgemm.opencl import wgmma
        from dgemm.opencl.ptx import cached_program, files_digest

        def build():
            program, _, finished = wgmma.build(self.context, self.cl_device, params, extra_options)
            return program, finished
        if extra_options:
            return build()[0]
        program, hit = cached_program(self.context, self.cl_device, build,
                                      sources=files_digest(p for p in sources.kernel_dir().iterdir() if p.is_file()),
                                      options=wgmma.options(params), sites=files_digest([wgmma.__file__]),
                                      target="sm_90a")
        logger.debug("dgemm: the wgmma kernel %s %s", params, "loaded from the program cache" if hit else "built")
        return program

    def build_log(self, dtype, params: KernelParams, extra_options: tuple = ("-cl-nv-verbose",)) -> str:
        """The compiler's log for a build (registers and spills on NVIDIA with -cl-nv-verbose)."""
        import pyopencl as cl
        prog = self.kernels(dtype, params, extra_options).gemm_program
        return prog.get_build_info(self.cl_device, cl.program_build_info.LOG)

    def buffer(self, nbytes: int, what: str = "a device buffer"):
        """A new device buffer of ``nbytes`` (at least 1: OpenCL has no empty buffers); NaN under :func:`poisoned`.

        ``what`` names it in the :class:`DeviceError` raised when the device
        cannot allocate it.  Release it (``buf.release()``) when done: a
        buffer only dropped lives until the collector finds it.
        """
        import pyopencl as cl
        try:
            buf = self._allocate(cl.mem_flags.READ_WRITE, max(int(nbytes), 1), "device", what)
        except DeviceMemoryError:
            if not self.spares.release():   # (the blocks' free source buffers: asked again without them)
                raise
            buf = self._allocate(cl.mem_flags.READ_WRITE, max(int(nbytes), 1), "device", what)
        return poison.fill(self.transfer_queue, buf)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        self.staging_keep = 0
        self.trim()
        self._kernels.clear()
        self.queue.finish()
        self.transfer_queue.finish()
        self.download_queue.finish()


_BUFFER_CLASS = None


def _buffer_class():
    """:class:`pyopencl.Buffer` with a weak reference and a counted release (pyopencl is imported late)."""
    global _BUFFER_CLASS
    if _BUFFER_CLASS is None:
        import pyopencl as cl

        class DeviceBuffer(cl.Buffer):
            """A buffer that :meth:`Device.live_buffers` counts until it is released or collected."""

            def release(self):
                gone = self.__dict__.pop("_dgemm_gone", None)
                if gone is None:    # released already: pyopencl says so
                    return super().release()
                nogil.release(self, super().release)    # (NVIDIA's driver may wait in it: without Python's lock)
                gone()   # a weakref.finalize: counts down once, and not again when collected
        _BUFFER_CLASS = DeviceBuffer
    return _BUFFER_CLASS


def _release_entry(entry) -> None:
    """Release the device buffer of a panel cache entry no product uses any more (once its upload is done);
    explicitly, not by dropping the last reference: a buffer in a reference cycle would hold device memory
    until the collector runs."""
    def release(future):
        if not future.cancelled() and future.exception() is None:
            future.result()[0].release()
    if entry.future is not None:
        entry.future.add_done_callback(release)


def is_opencl_error(e: BaseException) -> bool:
    """Whether ``e`` is one of pyopencl's errors (their records do not pickle)."""
    return type(e).__module__.startswith("pyopencl")


def _size(nbytes: int) -> str:
    """``nbytes`` for people: ``'256.0 MiB (268435456 bytes)'``."""
    n = float(nbytes)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit} ({int(nbytes)} bytes)" if unit != "bytes" else f"{int(nbytes)} bytes"
        n /= 1024


def raise_plain(error: BaseException):
    """Raise ``error`` without the exception it replaces as its context.

    ``raise ... from None`` only hides the context from the traceback's
    text: tblib (installed by distributed) pickles ``__context__`` with the
    error, and pyopencl's errors do not pickle.
    """
    try:
        raise error
    finally:
        error.__context__ = None
        error.__cause__ = None


def device_error(device: str, what: str, error: BaseException) -> DeviceError:
    """A :class:`DeviceError` for OpenCL's ``error`` while doing ``what`` on ``device``: plain text, it pickles.

    >>> str(device_error("H100", "launching the GEMM kernel", RuntimeError("clEnqueueNDRangeKernel failed")))
    "device 'H100': launching the GEMM kernel failed: RuntimeError: clEnqueueNDRangeKernel failed"
    >>> type(device_error("H100", "allocating C", RuntimeError("MEM_OBJECT_ALLOCATION_FAILURE"))).__name__
    'DeviceMemoryError'
    >>> "apt-get install pocl-opencl-icd" in str(device_error("pthread-AMD EPYC", "building lz4.cl",
    ...     RuntimeError("clBuildProgram failed: error: unknown target CPU 'generic'")))
    True
    """
    what_failed = str(error).strip() or type(error).__name__
    code = getattr(error, "code", None)
    detail = f"{type(error).__name__}: {what_failed}" + (f" (OpenCL code {code})" if isinstance(code, int) else "")
    if "ALLOCATION" in what_failed.upper() or "OUT_OF" in what_failed.upper() or isinstance(error, MemoryError) \
            or type(error).__name__ == "MemoryError":
        return DeviceMemoryError(f"device {device!r}: {what} failed: {detail}; the device is out of memory: set "
                                 "DGEMM_DEVICE_MEMORY_LIMIT lower on the worker, or use smaller blocks")
    if "unknown target CPU" in what_failed:
        # pocl-binary-distribution's PoCL (3.0, LLVM 14) builds nothing on CPUs its LLVM does not know (AMD Zen 5)
        detail += ("; this PoCL's compiler does not know the host's CPU: use the system's PoCL (Debian: apt-get "
                   "install pocl-opencl-icd) alone, with OCL_ICD_VENDORS=/etc/OpenCL/vendors/pocl.icd")
    return DeviceError(f"device {device!r}: {what} failed: {detail}")


def _poisoned(array: np.ndarray) -> np.ndarray:
    """``array`` filled with NaN under :func:`poisoned` (else untouched)."""
    if poison.POISON and array.size:
        array.reshape(-1).view(np.uint8)[...] = POISON_BYTE
    return array


class _Lease:
    """Page-locked memory lent to one array and its views (their numpy ``base``)."""

    def __init__(self, host: np.ndarray, shape: tuple[int, ...], dtype: np.dtype):
        self._host = host
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "version": 3,
                                    "data": (host.__array_interface__["data"][0], False)}


def pinned_limit() -> int:
    """Bytes of page-locked download buffers a device may hold: the ``pinned-bytes`` setting."""
    return config.get("pinned-bytes")


# Raw chunks copied from files at once, per device: beyond 8 the copies contend for the host's memory
# bandwidth with the uploads (one H100, 32768² float32 in 8192² chunks from /dev/shm: 2.30 s with 8
# readers, 2.85 s with 16).
COPY_THREADS = 8


def reader_share(cpus: int, devices: int) -> int:
    """Reader threads per device worker on a host of ``cpus`` cores and ``devices`` device workers: 2 to 32.

    Decoding compressed chunks is CPU work that scales with threads, so a
    device gets its share of the cores, up to 32 (each thread holds a
    page-locked staging buffer), less a quarter: the worker's other threads
    (GEMM loop, C's encoders, event loop) need cores meanwhile, and stall
    every product when they wait for one.  One H200, 16 cores, 32768² zstd:
    12 readers 2-17 % faster than 16 in three calls of four, never slower
    (bench/NOTES.md, issue 28, nineteenth session).  Raw
    chunks are only copied, by at most :data:`COPY_THREADS` (:meth:`Device.pool`).

    >>> reader_share(64, 4), reader_share(16, 1), reader_share(2, 2), reader_share(12, 4), reader_share(128, 2)
    (12, 12, 2, 3, 32)
    """
    share = cpus // max(1, devices)
    return max(2, min(32, share - share // 4))


def read_threads() -> int:
    """Threads a device reads and uploads with: the ``read-threads`` setting (``DGEMM_READ_THREADS``); unset, this
    host's :func:`reader_share` for one device (launchers that put several device workers on a host set each one's)."""
    return config.get("read-threads") or reader_share(os.cpu_count() or 1, 1)

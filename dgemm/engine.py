"""The block product on a device: C_ij = alpha * sum_k op(A_ik) op(B_kj) + beta * C_ij.

Host blocks arrive at their true sizes.  On the device they are zero-padded
to tile multiples (transposed to the kernel's k-major A layout on the way
where needed), multiplied and accumulated over k in one device buffer, and
the padding is cut off before the single download.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from .device import Device, Kernels


def roundup(x: int, m: int) -> int:
    """Smallest multiple of ``m`` that is >= ``x``.

    >>> roundup(100, 32), roundup(96, 32), roundup(0, 32)
    (128, 96, 0)
    """
    return -(-x // m) * m


INT32_MAX = 2**31 - 1

# The padding kernels check bounds, so they run on a fixed work-group shape
# over a rounded-up grid: a fixed shape lets drivers that specialise kernels
# per launch shape (PoCL) compile them once, not once per edge-block size.
LOCAL_2D = (16, 16)


def _grid(x: int, y: int) -> tuple[int, int]:
    return (roundup(max(x, 1), LOCAL_2D[0]), roundup(max(y, 1), LOCAL_2D[1]))


@dataclass
class Stats:
    """What an engine has done: the figures the dashboard and benchmarks read."""

    flops: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    kernel_seconds: float = 0.0
    blocks: int = 0
    busy_seconds: float = 0.0
    extra: dict = field(default_factory=dict)


class BlockEngine:
    """Runs block products of one dtype on one :class:`Device`.

    The engine keeps its device buffers between calls (grown as needed) and
    serialises calls with a lock: a device runs one block product at a time.
    """

    def __init__(self, device: Device, dtype, params=None):
        self.device = device
        self.k: Kernels = device.kernels(dtype, params)
        self.dtype = self.k.dtype
        self.params = self.k.params
        self.stats = Stats()
        self._buffers: dict = {}
        self._lock = threading.Lock()

    # -- buffers --------------------------------------------------------
    def _buf(self, name: str, elements: int):
        nbytes = elements * self.dtype.itemsize
        buf = self._buffers.get(name)
        if buf is None or buf.size < nbytes:
            if buf is not None:
                buf.release()
            buf = self._buffers[name] = self.device.buffer(nbytes)
        return buf

    def release(self) -> None:
        for buf in self._buffers.values():
            buf.release()
        self._buffers.clear()

    # -- staging --------------------------------------------------------
    def _stage(self, host: np.ndarray, transpose: bool, drows: int, dcols: int, dest: str):
        """Upload ``host`` and lay it out as a zero-padded ``drows x dcols`` buffer.

        ``transpose`` stores ``host.T``.  An aligned block in the right layout
        goes straight into place; others pass through a staging buffer and the
        padding or transposing kernel.
        """
        import pyopencl as cl

        q = self.device.queue
        host = np.ascontiguousarray(host, dtype=self.dtype)
        rows, cols = host.shape
        for n in (rows * cols, drows * dcols):
            if n > INT32_MAX:
                raise ValueError(f"a block of {n} elements is too large for 32-bit indexing; use smaller blocks")
        out = self._buf(dest, drows * dcols)
        self.stats.bytes_up += host.nbytes
        if not transpose and (rows, cols) == (drows, dcols):
            if host.size:
                cl.enqueue_copy(q, out, host, is_blocking=True)
            return out
        raw = self._buf("staging", rows * cols)
        if host.size:
            cl.enqueue_copy(q, raw, host, is_blocking=True)
        if transpose:
            tt = self.k.transpose_tile
            self.k.transpose_pad(q, (roundup(drows, tt), roundup(dcols, tt)), (tt, tt),
                                 np.int32(rows), np.int32(cols), raw, np.int32(drows), np.int32(dcols), out)
        else:
            self.k.pad_zeros(q, _grid(dcols, drows), LOCAL_2D, np.int32(rows), np.int32(cols), np.int32(cols),
                             raw, np.int32(drows), np.int32(dcols), out)
        return out

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
        with self._lock:
            t0 = time.perf_counter()
            try:
                return self._product(pairs, m, n, alpha, beta, c, trans_a, trans_b)
            finally:
                self.stats.busy_seconds += time.perf_counter() - t0

    def _product(self, pairs, m, n, alpha, beta, c, trans_a, trans_b):
        import pyopencl as cl

        p, q = self.params, self.device.queue
        mp, np_ = roundup(max(m, 1), p.TSM), roundup(max(n, 1), p.TSN)
        real = self.dtype.type
        use_c = c is not None and beta != 0
        if use_c:
            if c.shape != (m, n):
                raise ValueError(f"C block has shape {c.shape}, expected {(m, n)}")
            c_dev = self._stage(c, False, mp, np_, "c")
        else:
            c_dev = self._buf("c", mp * np_)
        beta_k = beta if use_c else 0.0
        did = False
        for a, b in pairs:
            k = a.shape[0] if trans_a else a.shape[1]
            kb = b.shape[1] if trans_b else b.shape[0]
            ma = a.shape[1] if trans_a else a.shape[0]
            nb = b.shape[0] if trans_b else b.shape[1]
            if k != kb or ma != m or nb != n:
                raise ValueError(f"block shapes do not fit: A {a.shape}, B {b.shape} for C {(m, n)}")
            if k == 0 or m == 0 or n == 0:
                continue
            kp = roundup(k, p.TSK)
            at = self._stage(a, not trans_a, kp, mp, "a")
            bt = self._stage(b, trans_b, kp, np_, "b")
            gsize, lsize = p.launch(mp, np_)
            ev = self.k.gemm(q, gsize, lsize,
                             np.int32(mp), np.int32(np_), np.int32(kp), real(alpha), real(beta_k), at, bt, c_dev)
            ev.wait()
            self.stats.kernel_seconds += (ev.profile.end - ev.profile.start) * 1e-9
            self.stats.flops += 2.0 * m * n * k
            beta_k = 1.0
            did = True
        out = np.empty((m, n), dtype=self.dtype)
        if m == 0 or n == 0:
            return out
        if not did:  # K == 0: the product is empty, only beta * C remains
            if use_c:
                out[...] = real(beta) * c
            else:
                out[...] = 0
            return out
        dense = self._buf("dense", m * n)
        self.k.unpad(q, _grid(n, m), LOCAL_2D, np.int32(m), np.int32(n), np.int32(np_), c_dev, dense)
        cl.enqueue_copy(q, out, dense, is_blocking=True)
        self.stats.bytes_down += out.nbytes
        self.stats.blocks += 1
        return out

"""Timing the GEMM kernel alone on device-resident data, with a correctness check.

Used by the tuner and by the kernel benchmark.  A timed run counts only if
its output passes the check of :mod:`dgemm.accuracy`: whole rows and columns
sampled from C (the first and last always), against float64 numpy products
of the same inputs, within the tolerance of the kernel's precision; and
every entry of C is finite (C is filled with NaN before the kernel runs, so
a tile left unwritten shows wherever it is).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from dgemm.accuracy import sample_indices, sampled_error, tolerance
from dgemm.opencl.device import Device
from dgemm.opencl.params import KernelParams
from dgemm.sizes import roundup

SAMPLES = 24    # rows and columns of every timed C that are checked (the first and last among them)


@dataclass
class Timing:
    params: KernelParams
    m: int
    n: int
    k: int
    seconds: float          # median kernel time (profiling events)
    rel_err: float          # worst entry error over the sampled rows and columns (dgemm.accuracy)
    ok: bool

    @property
    def tflops(self) -> float:
        return 2.0 * self.m * self.n * self.k / self.seconds / 1e12


class KernelBench:
    """Random inputs of one size, uploaded once, for timing many parameter sets."""

    def __init__(self, device: Device, dtype, m: int, n: int, k: int, seed: int = 0):
        self.device, self.dtype = device, np.dtype(dtype)
        self.m, self.n, self.k = m, n, k
        self.rng = np.random.default_rng(seed)
        self.a = self.rng.standard_normal((m, k)).astype(self.dtype)
        self.b = self.rng.standard_normal((k, n)).astype(self.dtype)
        self._cache: dict = {}

    def _inputs(self, tiles, k_major: bool = False, prepare=None, parts: int = 1):
        """AT (K' x M') and B (K' x N') padded for these tiles, on the device.

        ``k_major``: A (M' x K') and B^T (N' x K') instead (the wgmma kernel's operands).
        ``prepare(buffer, elements)``: run on each operand once it is uploaded (the
        rounding to TF32 the engine does where it stages the wgmma kernel's operands).
        """
        import pyopencl as cl

        tm, tn, tk = tiles
        mp, np_, kp = roundup(self.m, tm), roundup(self.n, tn), roundup(self.k, tk)
        key = (mp, np_, kp, k_major, parts)
        if key not in self._cache:
            at = np.zeros((kp, mp), self.dtype)
            at[:self.k, :self.m] = self.a.T
            bp = np.zeros((kp, np_), self.dtype)
            bp[:self.k, :self.n] = self.b
            if k_major:
                at, bp = np.ascontiguousarray(at.T), np.ascontiguousarray(bp.T)
            if parts > 1:   # room for the small halves of 3xTF32, written by ``prepare``
                at, bp = np.vstack([at, np.zeros_like(at)]), np.vstack([bp, np.zeros_like(bp)])
            mf = cl.mem_flags
            ctx = self.device.context
            bufs = (cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=at),
                    cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=bp),
                    cl.Buffer(ctx, mf.READ_WRITE, mp * np_ * self.dtype.itemsize))
            if prepare is not None:
                prepare(bufs[0], at.size // parts)
                prepare(bufs[1], bp.size // parts)
            self._cache.clear()  # keep one size resident: device memory is finite
            self._cache[key] = (bufs, key[:3])
        return self._cache[key]

    def run(self, params: KernelParams, reps: int = 5, warmup: int = 1, extra_options: tuple = ()) -> Timing:
        """Time ``params`` (``extra_options``: more compiler options, e.g. a kernel's own macro)."""
        import pyopencl as cl

        kern = self.device.kernels(self.dtype, params, tuple(extra_options))
        params = kern.params   # (another kernel when the one asked for could not be built here)
        q = self.device.queue

        def prepare(buf, elements):
            n4 = elements // 4
            kern.prepare(q, (-(-n4 // 256) * 256,), (256,), buf, np.int32(n4)).wait()
        (at, bp, c), (mp, np_, kp) = self._inputs(params.tiles, params.k_major,
                                                  prepare if kern.prepare is not None else None, kern.parts)
        real = self.dtype.type
        # Poison C so unwritten elements fail the check.
        cl.enqueue_fill_buffer(q, c, real(np.nan), 0, mp * np_ * self.dtype.itemsize)
        times = []
        for i in range(warmup + reps):
            gsize, lsize = params.launch(mp, np_)
            ev = kern.gemm(q, gsize, lsize,
                           np.int32(mp), np.int32(np_), np.int32(kp), real(1.0), real(0.0), at, bp, c)
            ev.wait()
            if i >= warmup:
                times.append((ev.profile.end - ev.profile.start) * 1e-9)
        out = np.empty((mp, np_), self.dtype)
        cl.enqueue_copy(q, out, c, is_blocking=True)
        out = out[:self.m, :self.n]
        # The first and last rows and columns always: a kernel wrong in its edge tiles only is missed
        # by 24 random ones most of the time (two times in three for 8 x 8 tiles of a 1000^2 C).
        rows = sample_indices(self.m, SAMPLES, self.rng)
        cols = sample_indices(self.n, SAMPLES, self.rng)
        # All of C finite, not only the sample: a tile the kernel never wrote keeps the poison.
        err = sampled_error(self.a, self.b, out, rows, cols) if np.isfinite(out).all() else float("inf")
        return Timing(params, self.m, self.n, self.k, statistics.median(times), err,
                      bool(err <= tolerance(self.dtype, self.k, params.precision)))

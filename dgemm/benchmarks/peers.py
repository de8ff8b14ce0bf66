"""The peers dgemm is timed against: cuBLAS (through torch or cupy), numpy, and what finds them.

A peer that cannot run here says why (``(None, why)``) rather than failing
the benchmark.  cuBLAS's product is checked as dgemm's are
(:mod:`dgemm.accuracy`): a wrong product is no peer to compare with.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from dgemm.accuracy import entry_errors, tolerance, worst

SAMPLES = 16                 # rows and columns of cuBLAS's C checked
GPU_MEMORY_FRACTION = 0.8    # share of free GPU memory the cuBLAS peer may take
TF32_MATH = 3                # cuBLAS's CUBLAS_TF32_TENSOR_OP_MATH (0: the default math)


def cublas_backend() -> tuple[str | None, str]:
    """``("torch" | "cupy", "")`` when cuBLAS can be timed, else ``(None, why not)``.

    torch is preferred; cupy is tried when torch is missing or sees no CUDA device.
    """
    why = []
    try:
        import torch
    except ImportError:
        why.append("torch is not installed")
    except Exception as e:  # a broken install (missing CUDA libraries...) raises other errors
        why.append(f"torch cannot be imported ({type(e).__name__}: {e})")
    else:
        if torch.cuda.is_available():
            return "torch", ""
        why.append(f"torch {torch.__version__} sees no CUDA device")
    cupy, cupy_why = cupy_status()
    if cupy is not None:
        return "cupy", ""
    why.append(cupy_why)
    return None, "; ".join(why)


def cupy_status():
    """``(cupy, None)`` when cupy sees a CUDA device, else ``(None, why not)``."""
    try:
        import cupy
    except ImportError:
        return None, "cupy is not installed"
    except Exception as e:  # a broken install (missing CUDA libraries...) raises other errors
        return None, f"cupy cannot be imported ({type(e).__name__}: {e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver: CUDARuntimeError
        return None, f"cupy sees no CUDA device ({type(e).__name__}: {e})"
    if count < 1:
        return None, "cupy sees no CUDA device"
    return cupy, None


def cublas(dtype, m: int, n: int, k: int, reps: int = 5, backend: str | None = None,
           tf32: bool = False, gram: bool = False) -> dict | None:
    """Median time of cuBLAS's ``(m x k) @ (k x n)`` on CUDA device 0; ``None`` when there is no cuBLAS.

    Timed with CUDA events after two warm-up products, through torch or,
    failing that, cupy (``backend`` forces one).  float32 runs without
    TF32 unless ``tf32`` (the peer of dgemm's ``tf32`` path).  With ``gram``,
    the product is ``x.T @ x`` of one ``k x m`` array (``n == m``; cuBLAS's
    GEMM with the first operand transposed, no copy).  The product
    is checked too, as every timed dgemm run is: sampled rows and columns
    of C against float64 (computed on the GPU from the same inputs).
    Returns ``{"seconds", "tflops", "rel_err", "tolerance", "ok", "tf32"}``.
    """
    if backend is None:
        backend, _ = cublas_backend()
    if backend is None:
        return None
    dtype = np.dtype(dtype).name
    tf32 = bool(tf32 and dtype == "float32")
    ts = []
    if backend == "torch":
        import torch
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        try:
            dt = torch.float32 if dtype == "float32" else torch.float64
            if gram:
                b = torch.randn(k, n, device="cuda", dtype=dt)
                a = b.T
            else:
                a = torch.randn(m, k, device="cuda", dtype=dt)
                b = torch.randn(k, n, device="cuda", dtype=dt)
            for _ in range(2):
                a @ b
            i, j = (torch.linspace(0, x - 1, SAMPLES, device="cuda").long() for x in (m, n))
            ai, bj = a[i].double(), b[:, j].double()
            err = worst(entry_errors((a @ b)[i][:, j].double(), ai @ bj, ai.abs() @ bj.abs()))
            torch.cuda.synchronize()
            for _ in range(reps):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                a @ b
                e.record()
                torch.cuda.synchronize()
                ts.append(s.elapsed_time(e) / 1e3)
            del a, b
            torch.cuda.empty_cache()  # give the memory back for the OpenCL runs that follow
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
    elif backend == "cupy":
        import cupy
        from cupy_backends.cuda.libs import cublas as cublas_lib
        handle = cupy.cuda.device.get_cublas_handle()
        cublas_lib.setMathMode(handle, TF32_MATH if tf32 else 0)
        try:
            rng = cupy.random.default_rng(0)
            b = rng.standard_normal((k, n), dtype=dtype)
            a = b.T if gram else rng.standard_normal((m, k), dtype=dtype)
            for _ in range(2):
                a @ b
            i, j = (cupy.linspace(0, x - 1, SAMPLES).astype(cupy.int64) for x in (m, n))
            ai, bj = a[i].astype(cupy.float64), b[:, j].astype(cupy.float64)
            err = worst(entry_errors((a @ b)[i][:, j].astype(cupy.float64), ai @ bj, abs(ai) @ abs(bj)))
            cupy.cuda.Device().synchronize()
            for _ in range(reps):
                s, e = cupy.cuda.Event(), cupy.cuda.Event()
                s.record()
                a @ b
                e.record()
                e.synchronize()
                ts.append(cupy.cuda.get_elapsed_time(s, e) / 1e3)
            del a, b
            cupy.get_default_memory_pool().free_all_blocks()
        finally:
            cublas_lib.setMathMode(handle, 0)
    else:
        raise ValueError(f"unknown cuBLAS backend {backend!r}; use 'torch' or 'cupy'")
    sec = float(np.median(ts))
    tol = tolerance(dtype, k, "tf32" if tf32 else "fma")
    return {"seconds": sec, "tflops": 2.0 * m * n * k / sec / 1e12, "rel_err": err, "tolerance": tol,
            "ok": err <= tol, "tf32": tf32, "gram": bool(gram)}


def _cuda_free_bytes(backend: str) -> int | None:
    try:
        if backend == "torch":
            import torch
            return int(torch.cuda.mem_get_info()[0])
        import cupy
        return int(cupy.cuda.runtime.memGetInfo()[0])
    except Exception:
        return None


def cublas_shape(m: int, n: int, k: int, itemsize: int, free: int | None, block: list | None) -> tuple:
    """The product cuBLAS is timed at: the full one if A, B and C fit in ``free`` GPU bytes,
    else a square of dgemm's largest block side (halved until it fits).

    >>> cublas_shape(1000, 1000, 1000, 4, 10**9, [512, 512])
    (1000, 1000, 1000)
    >>> cublas_shape(100000, 100000, 100000, 4, 10**10, [16384, 8192])
    (16384, 16384, 16384)
    >>> cublas_shape(100000, 100000, 100000, 4, 10**9, [16384, 8192])   # 3 x 8192^2 x 4 B > 0.8 GB
    (4096, 4096, 4096)
    """
    budget = GPU_MEMORY_FRACTION * free if free else None

    def fits(a, b, c):
        return budget is None or (a * c + c * b + a * b) * itemsize <= budget

    if fits(m, n, k):
        return m, n, k
    side = max(block) if block else 8192
    side = min(side, max(m, n, k))
    while side > 256 and not fits(side, side, side):
        side //= 2
    return side, side, side


def gram_shape(m: int, k: int, itemsize: int, free: int | None) -> tuple:
    """The Gram product ``x.T @ x`` (x ``k x m``) cuBLAS is timed at: the full one if x and C fit in ``free``
    GPU bytes, else x's rows halved until they do (C stays ``m x m``).

    >>> gram_shape(2048, 2**21, 4, 80 * 10**9), gram_shape(2048, 2**21, 4, 2 * 10**10)
    ((2048, 2048, 2097152), (2048, 2048, 1048576))
    """
    budget = GPU_MEMORY_FRACTION * free if free else None
    while budget is not None and k > 256 and (k * m + m * m) * itemsize > budget:
        k //= 2
    return m, m, k


def time_cublas(dtype: str, m: int, n: int, k: int, block: list | None, reps: int,
                gram: bool = False) -> tuple[dict | None, str | None]:
    """cuBLAS in GPU memory (:func:`cublas`) at :func:`cublas_shape` (:func:`gram_shape` with ``gram``: X^T X of
    one ``k x m`` X); ``(None, why)`` when there is none."""
    backend, why = cublas_backend()
    if backend is None:
        return None, why
    itemsize, free = np.dtype(dtype).itemsize, _cuda_free_bytes(backend)
    shape = gram_shape(m, k, itemsize, free) if gram else cublas_shape(m, n, k, itemsize, free, block)
    r = cublas(dtype, *shape, reps=max(reps, 3), backend=backend, gram=gram)
    if r is None:
        return None, "cuBLAS could not be timed"
    if not r["ok"]:
        return None, f"cuBLAS's product failed its check (rel_err {r['rel_err']:.3g} > {r['tolerance']:.3g})"
    full = shape == (m, n, k)
    return {**r, "m": shape[0], "n": shape[1], "k": shape[2], "via": backend, "full_size": full,
            "note": None if full else ("the full X does not fit in GPU memory: timed on its first rows" if gram else
                                       "the full product does not fit in GPU memory: timed at dgemm's block size")}, None


def numpy_matmul(a: np.ndarray, b: np.ndarray, reps: int = 5) -> dict:
    """Median wall time (``time.perf_counter``) of ``a @ b`` in numpy, after one warm-up product."""
    (m, k), n = a.shape, b.shape[1]
    a @ b
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    sec = statistics.median(ts)
    return {"seconds": sec, "tflops": 2.0 * m * n * k / sec / 1e12 if sec > 0 else None}


def numpy_blas() -> str | None:
    """The BLAS numpy was built with (``openblas``, ``mkl``...), when numpy says."""
    try:
        cfg = np.show_config(mode="dicts")
        return cfg["Build Dependencies"]["blas"]["name"]
    except Exception:  # older numpy: show_config only prints
        return None

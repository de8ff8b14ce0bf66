"""Benchmarks behind ``dgemm bench``: the GEMM kernel alone against its peers.

:func:`kernel_bench` times the kernel with the parameters the tuning
database chooses for a device, at a list of square sizes, on
device-resident inputs (:class:`dgemm.tuning.timing.KernelBench`).  Every
timed run is checked against float64 numpy on sampled rows and columns; a
run that fails the check is reported as FAILED and its time is not counted.

Peers timed in the same run, for scale:

* cuBLAS through torch (TF32 off) or, without torch, through cupy, when
  either is importable and sees a CUDA device (:func:`cublas`);
* numpy's matmul in the same dtype on the host CPU, up to
  :data:`NUMPY_MAX_SIZE` (:func:`numpy_matmul`).

A peer that cannot run is skipped, with the reason recorded.  The record
(device, driver, date, git commit, command line, parameters and where they
came from, and per size TFLOPS, seconds, relative error and ratios to the
peers) is written as JSON, by default to ``bench/results/``.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dgemm.tuning.database import PRECISIONS

DTYPES = ("float32", "float64")
GPU_SIZES = (1024, 2048, 4096, 8192, 16384, 10000)
CPU_SIZES = (256, 512, 1024)     # a CPU OpenCL device would take hours at the GPU sizes
NUMPY_MAX_SIZE = 4096            # numpy is timed only up to this size, to keep the run quick
DEFAULT_OUT = os.path.join("bench", "results")


# -- peers ----------------------------------------------------------------------
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
    try:
        import cupy
    except ImportError:
        why.append("cupy is not installed")
    except Exception as e:
        why.append(f"cupy cannot be imported ({type(e).__name__}: {e})")
    else:
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # no driver: cupy raises CUDARuntimeError
            count, err = 0, f" ({type(e).__name__}: {e})"
        else:
            err = ""
        if count > 0:
            return "cupy", ""
        why.append(f"cupy sees no CUDA device{err}")
    return None, "; ".join(why)


def cublas(dtype, m: int, n: int, k: int, reps: int = 5, backend: str | None = None) -> dict | None:
    """Median time of cuBLAS's ``(m x k) @ (k x n)`` on CUDA device 0; ``None`` when there is no cuBLAS.

    Timed with CUDA events after two warm-up products, through torch (TF32
    off for float32) or, failing that, cupy (``backend`` forces one).  The
    product is checked too, as every timed dgemm run is: sampled rows and
    columns of C against float64 (computed on the GPU from the same inputs).
    Returns ``{"seconds", "tflops", "rel_err", "tolerance", "ok"}``.
    """
    from dgemm.tuning.timing import tolerance
    if backend is None:
        backend, _ = cublas_backend()
    if backend is None:
        return None
    dtype = np.dtype(dtype).name
    ts = []
    if backend == "torch":
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dt = torch.float32 if dtype == "float32" else torch.float64
        a = torch.randn(m, k, device="cuda", dtype=dt)
        b = torch.randn(k, n, device="cuda", dtype=dt)
        for _ in range(2):
            a @ b
        i, j = (torch.linspace(0, x - 1, SAMPLES, device="cuda").long() for x in (m, n))
        err = _sampled_error((a @ b)[i][:, j].double(), a[i].double() @ b[:, j].double(), torch)
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
    elif backend == "cupy":
        import cupy
        rng = cupy.random.default_rng(0)
        a = rng.standard_normal((m, k), dtype=dtype)
        b = rng.standard_normal((k, n), dtype=dtype)
        for _ in range(2):
            a @ b
        i, j = (cupy.linspace(0, x - 1, SAMPLES).astype(cupy.int64) for x in (m, n))
        err = _sampled_error((a @ b)[i][:, j].astype(cupy.float64),
                             a[i].astype(cupy.float64) @ b[:, j].astype(cupy.float64), cupy)
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
    else:
        raise ValueError(f"unknown cuBLAS backend {backend!r}; use 'torch' or 'cupy'")
    sec = float(np.median(ts))
    tol = float(tolerance(dtype, k))
    return {"seconds": sec, "tflops": 2.0 * m * n * k / sec / 1e12, "rel_err": err, "tolerance": tol,
            "ok": err <= tol}


SAMPLES = 16   # rows and columns of cuBLAS's C checked


def _sampled_error(got, ref, xp) -> float:
    """Largest difference relative to the largest reference entry (``xp``: torch or cupy)."""
    scale = float(xp.abs(ref).max())
    return float(xp.abs(got - ref).max()) / scale if scale > 0 else float(xp.abs(got).max())


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


# -- provenance -----------------------------------------------------------------
def git_commit() -> tuple[str, bool | None]:
    """``(short commit, dirty)`` of the checkout dgemm runs from.

    ``$DGEMM_COMMIT``, when set, names the commit: a copy of the tree (the
    GPU machine's) may carry a stale ``.git``, or none.  Else git is asked;
    else ``"unknown"``.  ``dirty`` (tracked files modified) is ``None`` when
    git was not asked.
    """
    if os.environ.get("DGEMM_COMMIT"):
        return os.environ["DGEMM_COMMIT"], None
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                           text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            s = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
            return r.stdout.strip(), (bool(s.stdout.strip()) if s.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown", None


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: ``sys.argv`` with the console script's path shortened to its name."""
    argv = list(sys.argv if argv is None else argv)
    if argv:
        base = os.path.basename(argv[0])
        if base in ("dgemm", "dask"):
            argv[0] = base
        elif argv[0].endswith(os.path.join("dgemm", "__main__.py")):
            argv[0:1] = ["python", "-m", "dgemm"]
    return shlex.join(argv)


def device_slug(name: str) -> str:
    """A device name as a file-name part.

    >>> device_slug("NVIDIA H100 80GB HBM3")
    'nvidia-h100-80gb-hbm3'
    >>> device_slug("pthread-AMD EPYC")
    'pthread-amd-epyc'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def default_sizes(info) -> list[int]:
    """The sizes ``dgemm bench kernel`` times by default: GPU sizes, or small ones on a CPU device."""
    return list(CPU_SIZES if info.type == "CPU" else GPU_SIZES)


def result_path(out_dir, info, date: str) -> Path:
    """``<out_dir>/kernel-<device>-<YYYY-MM-DD>.json``, with ``-2``, ``-3``... rather than overwriting."""
    return unique_path(out_dir, f"kernel-{device_slug(info.name)}-{date[:10]}")


def unique_path(out_dir, stem: str) -> Path:
    """``<out_dir>/<stem>.json``, or ``<stem>-2.json``, ``-3``... so no record is overwritten."""
    out_dir = Path(out_dir)
    path = out_dir / f"{stem}.json"
    i = 2
    while path.exists():
        path = out_dir / f"{stem}-{i}.json"
        i += 1
    return path


def _finite(x):
    """JSON has no NaN or infinity: such values are written as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def write_json(path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(record), indent=1) + "\n")
    tmp.replace(path)


# -- the kernel benchmark -------------------------------------------------------
def _ratio(x: float | None, peer: dict | None) -> float | None:
    if x is None or not peer or not peer.get("tflops"):
        return None
    return x / peer["tflops"]


def kernel_bench(device=None, dtypes=DTYPES, sizes=None, reps: int = 5, out_dir=DEFAULT_OUT,
                 peers: bool = True, command: str | None = None, seed: int = 0,
                 log: Callable[[str], None] | None = print) -> tuple[dict, Path]:
    """Time the GEMM kernel with the database's parameters, with peers, and write the JSON record.

    Parameters
    ----------
    device : Device, DeviceInfo or str, optional
        The device: a :class:`dgemm.opencl.device.Device`, a
        :class:`~dgemm.opencl.discovery.DeviceInfo`, or a specification as
        :func:`dgemm.opencl.discovery.select_devices` takes it (first match).
        Default: the first device a local cluster would use.
    dtypes : sequence of {"float32", "float64"}
        float64 is skipped (with the reason recorded) on a device without it.
    sizes : sequence of int, optional
        Square sizes ``n`` (C[n x n] = A[n x n] @ B[n x n]), timed in this
        order.  Default: :func:`default_sizes`.
    reps : int
        Timed repetitions per size (after one warm-up); the median counts.
    out_dir : path
        Folder of the JSON record (:func:`result_path`); it is rewritten
        after every size, so an interrupted run keeps what it measured.
    peers : bool
        Time cuBLAS and numpy too.
    command : str, optional
        The command line to record (default: :func:`command_line`).
    log : callable, optional
        Called with one line per measurement.

    Returns
    -------
    (dict, Path)
        The record and the file it was written to.  ``record["failures"]``
        counts runs that failed the correctness check or raised.
    """
    import dgemm

    from dgemm.opencl import discovery
    from dgemm.opencl.device import Device
    from dgemm.tuning.timing import KernelBench, tolerance

    log = log or (lambda line: None)
    if isinstance(device, Device):
        dev = device
    else:
        info = device if isinstance(device, discovery.DeviceInfo) else discovery.select_devices(device)[0]
        dev = Device(info)
    info = dev.info
    dtypes = [np.dtype(d).name for d in dtypes]
    for d in dtypes:
        if d not in DTYPES:
            raise TypeError(f"dgemm supports float32 and float64, not {d}")
    sizes = [int(s) for s in (sizes or default_sizes(info))]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be positive integers, not {sizes}")
    if reps < 1:
        raise ValueError(f"reps must be at least 1, not {reps}")

    commit, dirty = git_commit()
    date = utc_now()
    if peers:
        backend, cublas_why = cublas_backend()
    else:
        backend, cublas_why = None, "--no-peers"
    numpy_why = "--no-peers" if not peers else None
    try:
        import pyopencl
        cl_version = pyopencl.VERSION_TEXT
    except Exception:  # pragma: no cover - pyopencl is a dependency
        cl_version = None
    record = {
        "benchmark": "kernel",
        "device": info.name, "device_id": info.id, "device_type": info.type, "platform": info.platform,
        "vendor": info.vendor, "architecture": info.architecture, "driver": info.driver,
        "date": date, "commit": commit, "commit_dirty": dirty, "command": command or command_line(),
        "dgemm_version": dgemm.__version__, "python": sys.version.split()[0], "numpy": np.__version__,
        "pyopencl": cl_version, "reps": reps, "sizes": sizes,
        "peers": {
            "cublas": {"available": backend is not None, "via": backend, "reason": cublas_why or None,
                       "tf32": False},
            "numpy": {"available": peers, "max_size": NUMPY_MAX_SIZE, "reason": numpy_why,
                      "timer": "time.perf_counter", "blas": _numpy_blas()},
        },
        "dtypes": {},
        "failures": 0,
    }
    path = result_path(out_dir, info, date)
    for dtype in dtypes:
        if dtype == "float64" and not info.fp64:
            record["dtypes"][dtype] = {"skipped": f"{info.name} has no double precision (cl_khr_fp64)"}
            log(f"{dtype}: skipped ({record['dtypes'][dtype]['skipped']})")
            write_json(path, record)
            continue
        default = dev.choice(dtype).params.precision
        # the database's choice, then every other path this device runs natively (tensor cores)
        paths = [None] + [p for p in PRECISIONS[dtype] if p != default and not dev.choice(dtype, p).note]
        for prec in paths:
            _bench_path(dev, info, dtype, prec, sizes, reps, seed, backend, cublas_why, peers, numpy_why,
                        record, path, log)
    write_json(path, record)
    return record, path


def _bench_path(dev, info, dtype, prec, sizes, reps, seed, backend, cublas_why, peers, numpy_why,
                record, path, log):
    """Time one kernel path (``prec``: None for the database's choice) over ``sizes`` into ``record``."""
    from dgemm.tuning.timing import KernelBench, tolerance
    choice = dev.choice(dtype, prec)
    entry = {"params": choice.params.as_dict(), "source": choice.describe(), "level": choice.level,
             "key": choice.key, "database": choice.database, "tuned": choice.tuned, "sizes": []}
    record["dtypes"][dtype if prec is None else f"{dtype}:{prec}"] = entry
    log(f"{dtype}: {' '.join(f'{k}={v}' for k, v in choice.params.as_dict().items())}"
        f" from the {choice.describe()}")
    for n in sizes:
        row: dict = {"size": n, "m": n, "n": n, "k": n, "tolerance": float(tolerance(dtype, n, choice.params.precision))}
        kb = None
        try:
            kb = KernelBench(dev, dtype, n, n, n, seed=seed + n)
            t = kb.run(choice.params, reps=reps)
        except Exception as e:  # out of device memory, a failed launch...: reported, not fatal
            row.update(status="ERROR", ok=False, error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}",
                       tflops=None, seconds=None, rel_err=None)
        else:
            row.update(status="ok" if t.ok else "FAILED", ok=t.ok, rel_err=t.rel_err,
                       # a failed run's time is not a result
                       seconds=t.seconds if t.ok else None,
                       tflops=(t.tflops if t.seconds > 0 else None) if t.ok else None)
        if not row["ok"]:
            record["failures"] += 1
        # cuBLAS
        if backend is None:
            row["cublas"], row["cublas_skipped"] = None, cublas_why
        else:
            try:
                row["cublas"] = cublas(dtype, n, n, n, reps=reps, backend=backend)
            except Exception as e:  # out of CUDA memory...
                row["cublas"], row["cublas_skipped"] = None, f"{type(e).__name__}: {str(e)[:300]}"
            else:
                if not row["cublas"]["ok"]:   # a wrong product is no peer to compare with
                    row["cublas"], row["cublas_skipped"] = None, (
                        f"cuBLAS's product failed its check: {row['cublas']['rel_err']:.3g} > "
                        f"{row['cublas']['tolerance']:.3g}")
        # numpy, on the same inputs
        if not peers:
            row["numpy"], row["numpy_skipped"] = None, numpy_why
        elif n > NUMPY_MAX_SIZE:
            row["numpy"], row["numpy_skipped"] = None, f"size > {NUMPY_MAX_SIZE} (numpy is timed only up to it)"
        elif kb is None:
            row["numpy"], row["numpy_skipped"] = None, "no inputs (the kernel run failed to start)"
        else:
            row["numpy"] = numpy_matmul(kb.a, kb.b, reps=reps)
        row["ratio_to_cublas"] = _ratio(row["tflops"], row["cublas"])
        row["ratio_to_numpy"] = _ratio(row["tflops"], row["numpy"])
        del kb
        entry["sizes"].append(row)
        write_json(path, record)
        log(_row_line(dtype if prec is None else f"{dtype}:{prec}", row))


def _numpy_blas() -> str | None:
    try:
        cfg = np.show_config(mode="dicts")
        return cfg["Build Dependencies"]["blas"]["name"]
    except Exception:  # older numpy: show_config only prints
        return None


def _fmt(x, spec: str, missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def _row_line(dtype: str, r: dict) -> str:
    if r["status"] == "ERROR":
        return f"{dtype} {r['size']}: ERROR {r['error']}"
    if r["status"] == "FAILED":
        return (f"{dtype} {r['size']}: FAILED the correctness check (rel_err {r['rel_err']:.3g} > "
                f"{r['tolerance']:.3g}); time not counted")
    peers = []
    if r.get("cublas"):
        peers.append(f"cuBLAS {r['cublas']['tflops']:.4g} TFLOPS (ratio {_fmt(r['ratio_to_cublas'], '.3f')})")
    if r.get("numpy"):
        peers.append(f"numpy {_fmt(r['numpy']['tflops'], '.4g')} TFLOPS")
    return (f"{dtype} {r['size']}: {_fmt(r['tflops'], '.4g')} TFLOPS, {r['seconds']:.4g} s, "
            f"rel_err {r['rel_err']:.2g}" + (f"; {', '.join(peers)}" if peers else ""))


def format_table(record: dict) -> str:
    """The record as a text table, one line per dtype and size."""
    lines = [f"device: {record['device']} ({record['device_type']}, driver {record['driver']}); "
             f"commit {record['commit']}{' (modified)' if record.get('commit_dirty') else ''}; {record['date']}"]
    for name in ("cublas", "numpy"):
        p = record["peers"][name]
        if not p["available"]:
            lines.append(f"{'cuBLAS' if name == 'cublas' else 'numpy'}: not timed ({p['reason']})")
    head = (f"{'dtype':8} {'size':>6} {'TFLOPS':>9} {'seconds':>10} {'rel_err':>8} "
            f"{'cuBLAS TF':>9} {'ratio':>6} {'numpy TF':>9}")
    lines.append(head)
    for dtype, e in record["dtypes"].items():
        if "skipped" in e:
            lines.append(f"{dtype:8} skipped: {e['skipped']}")
            continue
        for r in e["sizes"]:
            if r["status"] != "ok":
                why = r.get("error") or f"rel_err {r['rel_err']:.3g} > tolerance {r['tolerance']:.3g}"
                lines.append(f"{dtype:8} {r['size']:>6} {r['status']:>9}  {why}")
                continue
            cub = r["cublas"]["tflops"] if r.get("cublas") else None
            npy = r["numpy"]["tflops"] if r.get("numpy") else None
            lines.append(f"{dtype:8} {r['size']:>6} {_fmt(r['tflops'], '9.4g'):>9} {r['seconds']:>10.4g} "
                         f"{r['rel_err']:>8.2g} {_fmt(cub, '9.4g'):>9} {_fmt(r['ratio_to_cublas'], '6.3f'):>6} "
                         f"{_fmt(npy, '9.4g'):>9}")
        lines.append(f"{'':8} params {' '.join(f'{k}={v}' for k, v in e['params'].items())}; {e['source']}")
    return "\n".join(lines)

"""``dgemm bench kernel``: the GEMM kernel alone against its peers.

:func:`kernel_bench` times the kernel with the parameters the tuning
database chooses for a device, and every other path the device runs
natively (tensor cores), at a list of square sizes, on device-resident
inputs (:class:`dgemm.tuning.timing.KernelBench`).  Every timed run is
checked (:mod:`dgemm.accuracy`); a run that fails the check is reported as
FAILED and its time is not counted.

Peers timed in the same run, for scale (:mod:`dgemm.benchmarks.peers`):

* cuBLAS through torch or cupy, when either sees a CUDA device: TF32 off,
  except beside dgemm's own ``tf32`` path;
* numpy's matmul in the same dtype on the host CPU, up to
  :data:`NUMPY_MAX_SIZE`.

A peer that cannot run is skipped, with the reason recorded.  The record
(device, driver, date, git commit, command line, parameters and where they
came from, and per size TFLOPS, seconds, relative error and ratios to the
peers) is written as JSON (:func:`dgemm.benchmarks.records.result_path`),
by default to ``bench/results/``.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dgemm.accuracy import tolerance
from dgemm.benchmarks.peers import cublas, cublas_backend, numpy_blas, numpy_matmul
from dgemm.benchmarks.records import DEFAULT_OUT, command_line, git_commit, result_path, utc_now, write_json
from dgemm.dtypes import DTYPES, PRECISIONS

GPU_SIZES = (1024, 2048, 4096, 8192, 16384, 10000)
CPU_SIZES = (256, 512, 1024)     # a CPU OpenCL device would take hours at the GPU sizes
NUMPY_MAX_SIZE = 4096            # numpy is timed only up to this size, to keep the run quick


def default_sizes(info) -> list[int]:
    """The sizes ``dgemm bench kernel`` times by default: GPU sizes, or small ones on a CPU device."""
    return list(CPU_SIZES if info.type == "CPU" else GPU_SIZES)


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
        Folder of the JSON record, ``<date>-<device>-kernel.json``
        (:func:`dgemm.benchmarks.records.result_path`); it is rewritten
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
                       "tf32": "beside the tf32 path only"},
            "numpy": {"available": peers, "max_size": NUMPY_MAX_SIZE, "reason": numpy_why,
                      "timer": "time.perf_counter", "blas": numpy_blas()},
        },
        "dtypes": {},
        "failures": 0,
    }
    path = result_path(out_dir, date, info.name, "kernel")
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
    from dgemm.tuning.timing import KernelBench

    try:   # built first: a kernel that cannot be built here is replaced, and the choice then says so
        dev.kernels(dtype, dev.choice(dtype, prec).params)
    except Exception:   # reported with the first size's run below
        pass
    choice = dev.choice(dtype, prec)
    tf32 = choice.params.precision == "tf32"   # cuBLAS with TF32 too: like for like
    entry = {"params": choice.params.as_dict(), "source": choice.describe(), "level": choice.level,
             "key": choice.key, "database": choice.database, "tuned": choice.tuned, "sizes": []}
    record["dtypes"][dtype if prec is None else f"{dtype}:{prec}"] = entry
    log(f"{dtype}: {' '.join(f'{k}={v}' for k, v in choice.params.as_dict().items())}"
        f" from the {choice.describe()}")
    for n in sizes:
        row: dict = {"size": n, "m": n, "n": n, "k": n, "tolerance": tolerance(dtype, n, choice.params.precision)}
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
                row["cublas"] = cublas(dtype, n, n, n, reps=reps, backend=backend, tf32=tf32)
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
        name = "cuBLAS TF32" if r["cublas"].get("tf32") else "cuBLAS"
        peers.append(f"{name} {r['cublas']['tflops']:.4g} TFLOPS (ratio {_fmt(r['ratio_to_cublas'], '.3f')})")
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

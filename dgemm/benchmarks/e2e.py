"""The end-to-end benchmark behind ``dgemm bench e2e``: Zarr in, Zarr out, against its peers.

One run generates A (m x k) and B (k x n) as Zarr arrays (raw chunks by
default; or as users write them: zarr's default codec or blosc/lz4, Zarr v2,
sharded — :func:`make_inputs`) and times, on those same inputs:

* **dgemm**: ``dgemm.matmul(A, B, out=C)`` on a :class:`~dgemm.cluster.DeviceCluster`
  (one worker per device), kernels built beforehand, wall clock.  The
  workers' counters (:meth:`dgemm.worker.DeviceState.totals`) are read
  before and after, and every numeric one is reported per worker and summed;
  worker RSS and GPU memory are sampled while it runs; a sample of C is
  checked against float64 numpy, and a wrong result fails the run.
* **dgemm's kernel in memory**, on the device a worker uses (a task on that
  worker, so no second OpenCL context holds device memory), at the same size
  when its buffers fit 32-bit indexing, else at ``kernel_size``.
* **dask.array + cupy** (threaded scheduler, same chunks), when cupy sees a
  CUDA device.
* **cuBLAS in memory** (:func:`dgemm.benchmarks.peers.time_cublas`), at the full size
  when it fits in GPU memory, else at dgemm's block size.
* **dask.array + numpy** at a smaller size, with dgemm at that size too.
* Optionally a **scaling table**: dgemm on the first 1, 2, ... devices, each
  on its own cluster.
* Optionally **the first call from a fresh script** (:func:`time_first_call`):
  a new Python process that imports dgemm and calls ``dgemm.matmul`` once
  with no cluster (it starts its own), timed from the process's start to
  the call's return, its result checked like the others.

Beside them, the host's rates that bound the run (:mod:`dgemm.benchmarks.rates`):
store reads and writes of whole chunks, and a worker's host-device copies;
and ``dgemm plan``'s predicted floor for the main run (:func:`plan_floor`),
with its default rates and with the run's measured ones.

The inputs and outputs live in a local folder or on S3 (``store="s3://..."``:
moto's server started on 127.0.0.1 for the run, or a given endpoint; see
:mod:`dgemm.benchmarks.objectstore`), where the server's raw GET and PUT
rates take the local store's place.  With ``cold``, every timed run starts
with its input files out of the page cache (:mod:`dgemm.benchmarks.pagecache`).
A peer that cannot run is recorded as ``None`` with the reason.  The JSON
record (:func:`e2e_bench`) goes to
``bench/results/<date>-<device>[-xN]-e2e-<size>-<dtype>.json``
(:func:`dgemm.benchmarks.records.result_path`).
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dgemm.accuracy import check_sample, tolerance
from dgemm.benchmarks import pagecache
from dgemm.benchmarks.inputs import random_zarr
from dgemm.benchmarks.objectstore import (LocalS3, Location, new_location, object_get_rate, object_put_rate,
                                          s3_options, split_url)
from dgemm.benchmarks.peers import cupy_status, time_cublas
from dgemm.benchmarks.rates import host_rates
from dgemm.benchmarks.records import DEFAULT_OUT, command_line, git_commit, result_path, utc_now, write_json
from dgemm.dtypes import DTYPES
from dgemm.sizes import INT32_MAX, roundup

DEFAULT_CHUNKS = 8192
E2E_GPU_SIZE = 32768              # default side with a GPU: inputs of 4 GiB each in float32
E2E_CPU_SIZE = 1024
NUMPY_SIZE = 4096                 # the dask.array + numpy peer is slow: it runs at most at this size
KERNEL_MAX_SIDE = 32768           # 32768^2 elements fit 32-bit indexing with room for padding
SAMPLE_SECONDS = 0.2              # memory sampling interval
CHECK_SAMPLES = 16                # rows and columns of C checked against numpy
INPUT_CODECS = ("raw", "default", "blosc-lz4")   # how the inputs are encoded (make_inputs)
FIRST_CALL_TIMEOUT = 900          # seconds a first-call script may take (cluster start included)


# -- inputs -----------------------------------------------------------------------
def _remote(path) -> bool:
    """Not on this host's filesystem (:func:`dgemm.storage.locations.local_path`)."""
    from dgemm.storage.locations import local_path

    return local_path(os.fspath(path)) is None


def _dir_bytes(path, storage_options: dict | None = None) -> int | None:
    """Bytes stored under ``path`` (a local folder's files, or an S3 prefix's objects); None if unreadable."""
    path = os.fspath(path)
    return Location(path, storage_options).nbytes(path)


def _remove(path, storage_options: dict | None = None) -> None:
    """Remove the array at ``path`` (a local folder or an S3 prefix); nothing if it is not there."""
    path = os.fspath(path)
    Location(path, storage_options).remove(path)


def _open(path, storage_options: dict | None = None, mode: str = "r"):
    """A local path, or a URL with its ``storage_options``, opened (:func:`dgemm.storage.locations.open_array`)."""
    from dgemm.storage.locations import open_array

    return open_array(os.fspath(path), mode=mode, storage_options=storage_options)


def _so(storage_options: dict | None) -> dict:
    """``storage_options=`` for :func:`dgemm.matmul` when there are any (local paths take none)."""
    return {"storage_options": storage_options} if storage_options else {}


def input_compressors(codec: str, zarr_format: int = 3):
    """zarr's ``compressors`` for an input codec of :data:`INPUT_CODECS` in a Zarr format.

    ``"default"`` is zarr's own default (``"auto"``: zstd in both formats),
    what an array written without naming a codec has; ``"blosc-lz4"`` is
    Blosc with LZ4 and Blosc's other defaults (byte shuffle, level 5).

    >>> input_compressors("raw"), input_compressors("default", 2)
    (None, 'auto')
    >>> input_compressors("blosc-lz4", 2)
    Blosc(cname='lz4', clevel=5, shuffle=SHUFFLE, blocksize=0)
    """
    if codec == "raw":
        return None
    if codec == "default":
        return "auto"
    if codec == "blosc-lz4":
        if zarr_format == 2:
            from numcodecs import Blosc
            return Blosc(cname="lz4")
        from zarr.codecs import BloscCodec
        return BloscCodec(cname="lz4")
    raise ValueError(f"input codec must be one of {', '.join(INPUT_CODECS)}, not {codec!r}")


def _codec_dict(codec) -> dict | str:
    """A codec as JSON: zarr v3 codecs have ``to_dict``, numcodecs' (Zarr v2) ``get_config``."""
    for method in ("to_dict", "get_config"):
        with contextlib.suppress(Exception):
            return _jsonable(getattr(codec, method)())
    return repr(codec)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return getattr(x, "value", None) if isinstance(getattr(x, "value", None), (str, int)) else str(x)


def describe_zarr(path, storage_options: dict | None = None) -> dict:
    """What zarr says the array at ``path`` is: format, chunks, shards and codecs, as JSON."""
    arr = _open(path, storage_options)
    meta = arr.metadata
    out = {"zarr_format": meta.zarr_format, "chunks": list(arr.chunks),
           "shards": list(arr.shards) if arr.shards is not None else None,
           "compressors": [_codec_dict(c) for c in arr.compressors],
           "filters": [_codec_dict(c) for c in arr.filters]}
    if meta.zarr_format == 3:
        out["codecs"] = [_codec_dict(c) for c in meta.codecs]
    return out


def _capped_shards(shards: int | None, shape, ch) -> tuple[int, int] | None:
    """The shard shape for an array: ``shards`` along each axis, capped to the array (rounded up to its chunks)."""
    if not shards:
        return None
    return tuple(min(shards, roundup(max(x, 1), c)) for x, c in zip(shape, ch))


def make_inputs(folder, m: int, n: int, k: int, chunks: int, dtype: str, seed: int, tag: str = "",
                codec: str = "raw", zarr_format: int = 3, shards: int | None = None, staging=None) -> dict:
    """Write A (m x k) and B (k x n) into ``folder``; their paths, chunks, codecs, bytes and the write time.

    Written with zarr's API (``zarr.create_array`` with zarr's defaults except
    the codec ``codec`` names, then whole chunks, or whole shards of
    ``shards`` x ``shards``, set from threads): the same arrays
    ``dask.array.to_zarr`` makes with the same codec.  Each array's entry
    carries what zarr reads back (:func:`describe_zarr`).

    ``folder`` is a local folder, or a remote
    :class:`~dgemm.benchmarks.objectstore.Location` (an S3 prefix): there
    each array is written into the local folder ``staging`` first, then
    uploaded file by file (its entry's ``upload``) and its local copy
    removed, so the objects are the same bytes as a local array's files.
    """
    remote = isinstance(folder, Location) and folder.remote
    if remote and staging is None:
        raise ValueError("inputs on a remote store are written in a local staging folder first: give staging")
    so = folder.storage_options if isinstance(folder, Location) else None
    out = {"seconds": 0.0, "codec": codec, "zarr_format": zarr_format, "shards": shards,
           "writer": "zarr.create_array (zarr's defaults but the codec) + threaded setitem of whole "
                     + ("shards" if shards else "chunks")
                     + ("; written locally, then every file uploaded (s3fs put)" if remote else "")}
    compressors = input_compressors(codec, zarr_format)
    for name, shape, s in (("a", (m, k), seed), ("b", (k, n), seed + 1)):
        path = folder / f"{name}{tag}.zarr"
        local = Path(staging) / f"{name}{tag}.zarr" if remote else path
        ch = (min(chunks, max(shape[0], 1)), min(chunks, max(shape[1], 1)))
        sh = _capped_shards(shards, shape, ch)
        t0 = time.perf_counter()
        random_zarr(local, shape, ch, dtype, seed=s, overwrite=True, compressors=compressors, shards=sh,
                    zarr_format=zarr_format)
        upload = None
        if remote:
            try:
                folder.remove(path)      # a stale copy's objects would stay beside the new ones
                upload = folder.upload(local, path)
            finally:
                shutil.rmtree(local, ignore_errors=True)
        sec = time.perf_counter() - t0
        out["seconds"] += sec
        nbytes = shape[0] * shape[1] * np.dtype(dtype).itemsize
        out[name] = {"path": str(path), "shape": list(shape), "chunks": list(ch),
                     "shards": list(sh) if sh else None, "bytes": nbytes,
                     "bytes_on_disk": _dir_bytes(path, so), "seconds": sec, "upload": upload,
                     "write_gbps": nbytes / sec / 1e9 if sec > 0 else None, "zarr": describe_zarr(path, so)}
    return out


# -- worker side ------------------------------------------------------------------------
def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _plain(x):
    """A numpy scalar as the Python number JSON writes."""
    return x.item() if isinstance(x, np.generic) else x


def _is_peak(key: str) -> bool:
    """A high-water mark (``peak_device_bytes``, ``cache_peak_bytes``): its delta would mean nothing."""
    return "peak" in key.split("_")


def _worker_probe(dask_worker=None) -> dict:
    """Run on each worker (``client.run``): its pid, device and every numeric dgemm counter."""
    from dgemm.names import TASK_SECONDS, WORKER_PLUGIN
    from dgemm.worker import device_state

    plugin = dask_worker.plugins.get(WORKER_PLUGIN) if dask_worker is not None else None
    state = plugin.state if plugin is not None and plugin.state is not None else device_state()
    counters = {k: _plain(v) for k, v in state.totals().items() if _is_number(v)}
    # The store, load and reduce tasks' seconds live in the worker's Fine Performance Metrics.
    task_keys = TASK_SECONDS
    if dask_worker is not None:
        with contextlib.suppress(Exception):
            snap = state.snapshot(dask_worker)
            counters.update({k: _plain(snap[k]) for k in task_keys if k in snap and _is_number(snap[k])
                             and k not in counters})
    return {"pid": os.getpid(), "device": state.device.info.name if state.device is not None else None,
            "counters": counters}


def counter_delta(before: dict, after: dict) -> dict:
    """``after - before`` for every numeric counter; peaks (``peak_*``, ``*_peak_*``) keep their ``after`` value.

    >>> counter_delta({"flops": 1.0, "peak_device_bytes": 5}, {"flops": 4.0, "peak_device_bytes": 3, "x": 2})
    {'flops': 3.0, 'peak_device_bytes': 3, 'x': 2}
    """
    out = {}
    for key, value in after.items():
        if not _is_number(value):
            continue
        old = before.get(key, 0)
        out[key] = value if _is_peak(key) else value - (old if _is_number(old) else 0)
    return out


def sum_counters(per_worker: list[dict]) -> dict:
    """Counters summed over workers; peaks take the maximum.

    >>> sum_counters([{"blocks": 2, "peak_x": 1}, {"blocks": 3, "peak_x": 7}])
    {'blocks': 5, 'peak_x': 7}
    """
    total: dict = {}
    for counters in per_worker:
        for key, value in counters.items():
            if key not in total:
                total[key] = value
            elif _is_peak(key):
                total[key] = max(total[key], value)
            else:
                total[key] += value
    return total


def _kernel_rate(dtype: str, m: int, n: int, k: int, reps: int, seed: int) -> dict:
    """Run as a task on a worker: dgemm's kernel alone, on that worker's device, in its memory.

    Uses the parameters the worker's engine uses for ``dtype``; the inputs
    are released before returning, so the e2e run that follows has the
    device's memory.
    """
    from dgemm.tuning.timing import KernelBench
    from dgemm.worker import device_state

    dev = device_state().device
    if dev is None:
        raise RuntimeError(f"the worker has no usable OpenCL device ({device_state().error})")
    choice = dev.choice(dtype)
    kb = KernelBench(dev, dtype, m, n, k, seed=seed)
    try:
        t = kb.run(choice.params, reps=reps)
    finally:
        del kb
        gc.collect()  # the device buffers go with the last reference
    return {"m": m, "n": n, "k": k, "reps": reps, "device": dev.info.name, "params": choice.params.as_dict(),
            "source": choice.describe(), "seconds": t.seconds if t.ok else None,
            "tflops": t.tflops if t.ok and t.seconds > 0 else None, "rel_err": t.rel_err,
            "tolerance": tolerance(dtype, k, choice.params.precision), "ok": t.ok,
            "status": "ok" if t.ok else "FAILED"}


# -- memory sampling ----------------------------------------------------------------------
def gpu_memory_used() -> dict[int, float]:
    """Memory used on each NVIDIA GPU, in MiB (``nvidia-smi``); raises when it cannot be read."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi not found")
    r = subprocess.run([exe, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise RuntimeError(f"nvidia-smi failed: {' '.join((r.stderr or r.stdout).split())[:200]}")
    used = {}
    for line in r.stdout.strip().splitlines():
        idx, _, mib = line.partition(",")
        used[int(idx)] = float(mib)
    return used


class MemorySampler:
    """Peak RSS of some processes and peak GPU memory used, sampled in a background thread.

    Use as a context manager around the timed work; :meth:`result` gives
    the peaks.  GPU memory comes from ``nvidia-smi``; without it the GPU
    entry is ``None`` and ``gpu_skipped`` says why.
    """

    def __init__(self, pids, interval: float = SAMPLE_SECONDS):
        import psutil

        self.interval = interval
        self.procs = {}
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                self.procs[pid] = psutil.Process(pid)
        self.rss_peak: dict[int, int] = {}
        self.rss_total_peak = 0
        self.gpu_base: dict[int, float] | None = None
        self.gpu_peak: dict[int, float] = {}
        self.gpu_skipped: str | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dgemm-e2e-memory", daemon=True)

    def _sample(self) -> None:
        import psutil

        total = 0
        for pid, p in self.procs.items():
            try:
                rss = p.memory_info().rss
            except psutil.Error:  # the process ended (a worker restarted)
                continue
            total += rss
            self.rss_peak[pid] = max(self.rss_peak.get(pid, 0), rss)
        self.rss_total_peak = max(self.rss_total_peak, total)
        if self.gpu_skipped is None:
            try:
                used = gpu_memory_used()
            except Exception as e:
                self.gpu_skipped = f"{type(e).__name__}: {e}"
            else:
                if self.gpu_base is None:
                    self.gpu_base = used
                for i, v in used.items():
                    self.gpu_peak[i] = max(self.gpu_peak.get(i, 0.0), v)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self._sample()  # the baseline, before the work starts
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        return False

    def result(self) -> dict:
        gpu = None
        if self.gpu_skipped is None and self.gpu_base is not None:
            gpu = {"peak_used_mib": {str(i): v for i, v in self.gpu_peak.items()},
                   "before_used_mib": {str(i): v for i, v in self.gpu_base.items()},
                   "peak_added_mib": {str(i): v - self.gpu_base.get(i, 0.0) for i, v in self.gpu_peak.items()}}
        return {"interval_seconds": self.interval, "samples": self.samples,
                "rss_peak_bytes": {str(pid): v for pid, v in self.rss_peak.items()},
                "rss_total_peak_bytes": self.rss_total_peak, "gpu": gpu, "gpu_skipped": self.gpu_skipped}


# -- dgemm ------------------------------------------------------------------------------------
def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"


def _check(a_path, b_path, c_path, storage_options: dict | None = None) -> dict:
    """:func:`dgemm.accuracy.check_sample` of the stored result (sampled rows and columns, float64)."""
    za, zb, zc = (_open(p, storage_options) for p in (a_path, b_path, c_path))
    return check_sample(za, zb, zc, n_rows=CHECK_SAMPLES, n_cols=CHECK_SAMPLES)


def _flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def _tflops(flops: float, seconds: float | None) -> float | None:
    return flops / seconds / 1e12 if seconds else None


def time_dgemm(client, workers: list[str], a_path, b_path, out_path, m: int, n: int, k: int, reps: int = 1,
               keep: bool = False, compressors="auto", storage_options: dict | None = None,
               before_each: Callable[[], dict] | None = None) -> dict:
    """Time ``dgemm.matmul(a, b, out=out)`` on ``client`` (kernels already built) and check the result.

    Returns the wall times (median counts), TFLOPS, the sampled check, the
    workers' counter deltas and their sum, the time split, bytes moved, peak
    memory and the output's ``dgemm`` attributes (plan, dgemm's own seconds).
    The output is removed afterwards unless ``keep``.  ``compressors`` is
    passed to :func:`dgemm.matmul` for the output (``None``: uncompressed),
    ``storage_options`` too (paths on S3).  ``before_each`` runs before each
    repetition, untimed (``--cold``: the inputs out of the page cache); what
    it returns goes to the entry's ``cold`` list.
    """
    import dgemm

    before = client.run(_worker_probe, workers=workers)
    times, cold = [], []
    with MemorySampler([p["pid"] for p in before.values()]) as mem:
        for _ in range(reps):
            # each repetition writes a new out: removing the last one is not part of the product
            _remove(out_path, storage_options)
            if before_each is not None:
                cold.append(before_each())
            t0 = time.perf_counter()
            dgemm.matmul(os.fspath(a_path), os.fspath(b_path), out=os.fspath(out_path), client=client,
                         compressors=compressors, **_so(storage_options))
            times.append(time.perf_counter() - t0)
    after = client.run(_worker_probe, workers=workers)
    seconds = float(np.median(times))
    per_worker = {}
    for addr, p in after.items():
        old = before.get(addr, {"counters": {}, "pid": None})
        per_worker[addr] = {"device": p["device"], "pid": p["pid"], "restarted": p["pid"] != old["pid"],
                            "counters": counter_delta(old["counters"], p["counters"]),
                            # levels such as cache_bytes read better as they are than as deltas
                            "after": p["counters"], "rss_peak_bytes": mem.rss_peak.get(p["pid"])}
    total = sum_counters([w["counters"] for w in per_worker.values()])
    zc = _open(out_path, storage_options)
    attrs = dict(zc.attrs).get("dgemm", {})
    check = _check(a_path, b_path, out_path, storage_options)
    entry = {
        "m": m, "n": n, "k": k, "workers": len(workers), "reps": reps, "times": times, "seconds": seconds,
        "tflops": _tflops(_flops(m, n, k), seconds), "dgemm_seconds": attrs.get("seconds"),
        "check": check, "ok": check["passed"], "status": "ok" if check["passed"] else "FAILED",
        "counters": {"per_worker": per_worker, "total": total,
                     "after_total": sum_counters([w["after"] for w in per_worker.values()])},
        "split": time_split(total, sum(times), len(workers)),
        "bytes": _bytes(total, out_path, m, n, k, zc.dtype.itemsize, reps, storage_options),
        "memory": mem.result(), "plan": attrs.get("plan"), "attrs": attrs,
        "output_compressors": [c.to_dict() for c in zc.compressors],
        "cold": cold or None,
    }
    if not keep:
        _remove(out_path, storage_options)
    return entry


FIRST_CALL_MARK = "DGEMM-FIRST-CALL "
FIRST_CALL_SCRIPT = """\
# A user's script: dgemm's first call, with no cluster (dgemm.matmul starts its own).
import json, sys, time
start = time.time()
import dgemm
imported = time.time()
if __name__ == "__main__":      # dgemm's local cluster spawns workers, which import the script again
    dgemm.matmul(sys.argv[1], sys.argv[2], out=sys.argv[3]{extra}{options})
    done = time.time()
    print({mark!r} + json.dumps({{"start": start, "imported": imported, "done": done}}), flush=True)
"""


def first_call_script(compressors="auto", storage_options: bool = False) -> str:
    """The script :func:`time_first_call` runs: ``import dgemm`` and one ``dgemm.matmul(a, b, out=c)``.

    ``compressors`` is left to dgemm's default (``"auto"``) as a user's call
    leaves it, or ``None`` (raw C); codec objects have no place in it.  With
    ``storage_options``, the call takes them from its fourth argument (JSON).

    >>> "compressors" in first_call_script(), "compressors=None" in first_call_script(None)
    (False, True)
    >>> "storage_options=json.loads(sys.argv[4])" in first_call_script(storage_options=True)
    True
    """
    if compressors == "auto":
        extra = ""
    elif compressors is None:
        extra = ", compressors=None"
    else:
        raise ValueError(f"the first-call script writes C with zarr's default codec or none, not {compressors!r}")
    options = ", storage_options=json.loads(sys.argv[4])" if storage_options else ""
    return FIRST_CALL_SCRIPT.format(extra=extra, options=options, mark=FIRST_CALL_MARK)


def time_first_call(a_path, b_path, out_path, m: int, n: int, k: int, devices: str | None = None,
                    compressors="auto", keep: bool = False, timeout: float = FIRST_CALL_TIMEOUT,
                    storage_options: dict | None = None, workdir=None,
                    before: Callable[[], dict] | None = None) -> dict:
    """Time dgemm's first call from a fresh script, from the process's start to the call's return.

    A new Python process (this interpreter, ``cwd`` ``workdir``, by default
    the folder of ``out_path``) runs :func:`first_call_script`: it imports
    dgemm and calls ``dgemm.matmul(a, b, out=out)`` once with no client, so
    the call starts its local cluster (``DGEMM_DEVICES`` = ``devices`` when
    given), builds or loads its kernels and allocates its buffers, as a
    user's script does.  ``seconds`` runs from just before the process is
    spawned to the return of the call (the interpreter's start, the imports
    and the call); ``exit_seconds`` is what the process took after it
    (closing its cluster).  The result is checked like every timed run.
    ``storage_options`` go to the call (as JSON, in its arguments);
    ``before`` runs first, untimed, and its answer is the entry's ``cold``.
    """
    if workdir is None and _remote(out_path):
        raise ValueError(f"the first-call script needs a local workdir: out {os.fspath(out_path)!r} is remote")
    # the script runs in workdir: local paths must not depend on this process's folder
    a_path, b_path, out_path = (p if _remote(p) else os.path.abspath(p) for p in (a_path, b_path, out_path))
    workdir = Path(workdir if workdir is not None else Path(out_path).parent).resolve()
    script = workdir / "first_call.py"
    script.write_text(first_call_script(compressors, storage_options=bool(storage_options)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if devices:
        env["DGEMM_DEVICES"] = devices
    _remove(out_path, storage_options)
    argv = [sys.executable, str(script), os.fspath(a_path), os.fspath(b_path), os.fspath(out_path)]
    if storage_options:
        argv.append(json.dumps(storage_options))
    cold = before() if before is not None else None
    t0 = time.time()       # wall clock: the child's times are compared with it
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    ended = time.time()
    marks = [line for line in proc.stdout.splitlines() if line.startswith(FIRST_CALL_MARK)]
    if proc.returncode != 0 or not marks:
        tail = " ".join((proc.stderr or proc.stdout).split()[-80:])
        raise RuntimeError(f"the first-call script exited with {proc.returncode}: {tail}")
    t = json.loads(marks[-1][len(FIRST_CALL_MARK):])
    seconds = t["done"] - t0
    zc = _open(out_path, storage_options)
    attrs = dict(zc.attrs).get("dgemm", {})
    check = _check(a_path, b_path, out_path, storage_options)
    entry = {"m": m, "n": n, "k": k, "devices": devices, "seconds": seconds,
             "tflops": _tflops(_flops(m, n, k), seconds),
             "process_start_seconds": t["start"] - t0, "import_seconds": t["imported"] - t["start"],
             "matmul_seconds": t["done"] - t["imported"], "dgemm_seconds": attrs.get("seconds"),
             "exit_seconds": ended - t["done"], "check": check, "ok": check["passed"],
             "status": "ok" if check["passed"] else "FAILED",
             "output_compressors": [_codec_dict(c) for c in zc.compressors],
             "script": script.read_text(), "cold": cold}
    if not keep:
        _remove(out_path, storage_options)
    return entry


def time_split(total: dict, wall: float, n_workers: int) -> dict:
    """Where the workers' time went: every ``*_seconds`` counter, and its share of wall x workers.

    The shares overlap (a GEMM task's busy time contains its kernel,
    transfer and read-wait time; store tasks run beside GEMM tasks), so
    they need not add up to one.

    >>> time_split({"kernel_seconds": 2.0, "blocks": 4}, 4.0, 1)
    {'wall_seconds': 4.0, 'workers': 1, 'seconds': {'kernel_seconds': 2.0}, 'share': {'kernel_seconds': 0.5}}
    """
    secs = {k: v for k, v in total.items() if k.endswith("_seconds") and _is_number(v)}
    denom = wall * max(n_workers, 1)
    return {"wall_seconds": wall, "workers": n_workers, "seconds": secs,
            "share": {k: (v / denom if denom > 0 else None) for k, v in secs.items()}}


def _bytes(total: dict, out_path, m, n, k, itemsize, reps, storage_options: dict | None = None) -> dict:
    """Bytes the run read, moved and wrote; ``*_per_input`` above 1 means re-reads or re-uploads."""
    inputs = (m * k + k * n) * itemsize * reps
    out = {"inputs": inputs, "output": m * n * itemsize * reps,
           "output_on_disk": _dir_bytes(out_path, storage_options)}
    for key, name, base in (("bytes_read", "read_per_input", inputs), ("bytes_up", "up_per_input", inputs),
                            ("bytes_down", "down_per_output", out["output"])):
        if key in total:
            out[key] = total[key]
            out[name] = total[key] / base if base else None
    return out


def _warm_up(client, workers: list[str], dtype: str, folder, block_bytes: int = 0, copy: bool = False) -> float:
    """Build every worker's kernels and run one small product, so the timed runs compile nothing.

    The product is written into ``folder`` (a local folder or a
    :class:`~dgemm.benchmarks.objectstore.Location`), so on S3 the workers
    have their S3 client before the timed runs, as their kernels.  With
    ``block_bytes``, each reader thread (of the copy pool where ``copy``:
    raw inputs) also pins its staging buffer of that size, as a warm
    cluster that ran this block size before has it: else a single timed
    repetition pins them inside its time.
    """
    import dgemm

    from dgemm.worker import build_kernels

    so = folder.storage_options if isinstance(folder, Location) else None
    t0 = time.perf_counter()
    client.run(build_kernels, dtype, workers=workers)
    if block_bytes:
        client.run(_warm_staging, block_bytes, copy, workers=workers)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((128, 128)).astype(dtype) for _ in range(2))
    out = folder / "warmup.zarr"
    dgemm.matmul(a, b, out=os.fspath(out), overwrite=True, client=client, **_so(so))
    _remove(out, so)
    return time.perf_counter() - t0


def _warm_staging(nbytes: int, copy: bool, dask_worker=None) -> int:
    """Run on a worker: pin its reader threads' staging buffers of ``nbytes`` (0 without a device)."""
    from dgemm.worker import device_state

    dev = device_state().device
    if dev is None:
        return 0
    return sum(f.result() for f in dev.warm_staging(nbytes, copy=copy))


@contextlib.contextmanager
def bench_cluster(devices: str | None, client=None):
    """``client``, or a new :class:`DeviceCluster` (closed on exit) with its client and start time."""
    if client is not None:
        yield client, None
        return
    from distributed import Client

    from dgemm.cluster import DeviceCluster

    t0 = time.perf_counter()
    cluster = DeviceCluster(devices, dashboard_address="127.0.0.1:0")
    c = Client(cluster, set_as_default=False)
    try:
        c.wait_for_workers(len(cluster.device_ids), timeout=120)
        yield c, time.perf_counter() - t0
    finally:
        with contextlib.suppress(Exception):
            c.close()
        with contextlib.suppress(Exception):
            cluster.close()


def ready_workers(client, dtype: str) -> tuple[list[str], list[str], dict]:
    """Usable workers' addresses and device names, and their descriptions (:func:`dgemm.cluster.prepare`)."""
    from dgemm.cluster import prepare

    usable = prepare(client, dtype)
    addrs = sorted(usable)
    return addrs, [usable[a]["device"].name for a in addrs], usable


# -- peers ----------------------------------------------------------------------------------
def time_dask(a_path, b_path, out_path, reps: int = 1, cupy=None, compressors="auto", keep: bool = False,
              pids=(), storage_options: dict | None = None, before_each: Callable[[], dict] | None = None) -> dict:
    """Time dask.array's ``A @ B`` from Zarr to Zarr on the threaded scheduler, and check the result.

    With ``cupy``, the blocks are moved to the GPU (``map_blocks(cupy.asarray)``)
    and back (``map_blocks(cupy.asnumpy)``); the GPU memory pool is freed
    after every repetition.  The output has the inputs' chunks and
    ``compressors`` (dgemm's output codec, for a like-with-like write).
    ``storage_options`` and ``before_each`` as for :func:`time_dgemm`.
    """
    import dask.array as da
    import zarr

    za, zb = (_open(p, storage_options) for p in (a_path, b_path))
    dtype = np.result_type(za.dtype, zb.dtype)
    A, B = da.from_zarr(za), da.from_zarr(zb)
    if cupy is not None:
        A = A.map_blocks(cupy.asarray, dtype=za.dtype, meta=cupy.empty((0, 0), za.dtype))
        B = B.map_blocks(cupy.asarray, dtype=zb.dtype, meta=cupy.empty((0, 0), zb.dtype))
        _cupy_warm_up(cupy, dtype)
    C = A @ B
    if cupy is not None:
        C = C.map_blocks(cupy.asnumpy, dtype=dtype, meta=np.empty((0, 0), dtype))
    times, cold = [], []
    extra = {"storage_options": storage_options} if storage_options and _remote(out_path) else {}
    with MemorySampler(pids or [os.getpid()]) as mem:
        for _ in range(reps):
            # each repetition writes a new out: removing the last one is not part of the product
            _remove(out_path, storage_options)
            if before_each is not None:
                cold.append(before_each())
            t0 = time.perf_counter()
            z = zarr.create_array(store=os.fspath(out_path), shape=C.shape, chunks=C.chunksize, dtype=dtype,
                                  compressors=compressors, fill_value=0, overwrite=True, **extra)
            # each block is one output chunk (or its ragged edge), so no lock; da.to_zarr would merge a
            # whole axis into one chunk when the size is not a multiple of the chunks
            da.store(C, z, lock=False, scheduler="threads")
            times.append(time.perf_counter() - t0)
            if cupy is not None:
                _free_cupy(cupy)
    m, k = za.shape
    n = zb.shape[1]
    seconds = float(np.median(times))
    check = _check(a_path, b_path, out_path, storage_options)
    entry = {"m": m, "n": n, "k": k, "reps": reps, "times": times, "seconds": seconds,
             "tflops": _tflops(_flops(m, n, k), seconds), "scheduler": "threads", "chunks": list(C.chunksize),
             "check": check, "ok": check["passed"], "output_on_disk": _dir_bytes(out_path, storage_options),
             "memory": mem.result(), "cold": cold or None}
    if not keep:
        _remove(out_path, storage_options)
    return entry


def _cupy_warm_up(cupy, dtype) -> None:
    """cuBLAS's handle and cupy's kernels are made on first use: not in the timed run."""
    x = cupy.ones((256, 256), dtype=dtype)
    cupy.asnumpy((x @ x).sum())
    del x
    _free_cupy(cupy)


def _free_cupy(cupy) -> None:
    cupy.cuda.Device().synchronize()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()


# -- the benchmark -------------------------------------------------------------------------
def _fits_int32(m: int, n: int, k: int) -> bool:
    """Whether every buffer of an in-memory ``m x n x k`` product (padded) stays within 32-bit indexing."""
    def r(x):
        return roundup(x, 256)   # generous padding to any kernel tile
    return max(r(m) * r(k), r(k) * r(n), r(m) * r(n)) <= INT32_MAX


def kernel_shape(m: int, n: int, k: int, kernel_size: int | None) -> tuple[int, int, int]:
    """The in-memory kernel's product: ``kernel_size`` cubed if given, else the full one if it fits
    32-bit indexing, else each side capped at :data:`KERNEL_MAX_SIDE`.

    >>> kernel_shape(65536, 65536, 65536, None), kernel_shape(4096, 4096, 100, None), kernel_shape(9, 9, 9, 4)
    ((32768, 32768, 32768), (4096, 4096, 100), (4, 4, 4))
    """
    if kernel_size:
        return kernel_size, kernel_size, kernel_size
    if _fits_int32(m, n, k):
        return m, n, k
    return tuple(min(x, KERNEL_MAX_SIDE) for x in (m, n, k))


def resolve_shape(size: int | None, shape, devices: str | None) -> tuple[int, int, int]:
    """``(m, n, k)`` from ``shape`` or the square ``size``; by default 32768 with a GPU, 1024 on CPU devices."""
    if size is not None and shape is not None:
        raise ValueError("give size or shape, not both")
    if shape is not None:
        vals = tuple(int(x) for x in shape)
        if len(vals) != 3 or min(vals) < 1:
            raise ValueError(f"shape must be three positive integers M, N, K, not {shape!r}")
        return vals
    if size is None:
        from dgemm.opencl.discovery import select_devices
        size = E2E_GPU_SIZE if any(d.type == "GPU" for d in select_devices(devices)) else E2E_CPU_SIZE
    if int(size) < 1:
        raise ValueError(f"size must be positive, not {size}")
    return int(size), int(size), int(size)


def result_detail(m: int, n: int, k: int, dtype: str) -> str:
    """The record name's detail: the size (or M x N x K) and the dtype.

    >>> result_detail(32768, 32768, 32768, "float64"), result_detail(96, 64, 32, "float32")
    ('32768-float64', '96x64x32-float32')
    """
    size = str(m) if m == n == k else f"{m}x{n}x{k}"
    return f"{size}-{dtype}"


def input_detail(codec: str, zarr_format: int, shards: int | None) -> str:
    """The record name's part for the inputs; empty for raw Zarr v3 chunks (the benchmark's first case).

    >>> input_detail("raw", 3, None), input_detail("default", 2, None), input_detail("default", 3, 16384)
    ('', 'default-v2', 'default-shards16384')
    """
    parts = [] if codec == "raw" else [codec]
    if zarr_format != 3:
        parts.append(f"v{zarr_format}")
    if shards:
        parts.append(f"shards{shards}")
    return "-".join(parts)


def _ratio(x: dict | None, y: dict | None) -> float | None:
    if not x or not y or not x.get("tflops") or not y.get("tflops"):
        return None
    return x["tflops"] / y["tflops"]


def _versions() -> dict:
    import dask
    import zarr
    out = {"python": sys.version.split()[0], "numpy": np.__version__, "dask": dask.__version__,
           "zarr": zarr.__version__}
    with contextlib.suppress(Exception):
        import pyopencl
        out["pyopencl"] = pyopencl.VERSION_TEXT
    return out


def e2e_bench(size: int | None = None, *, shape=None, dtype: str = "float32", chunks: int = DEFAULT_CHUNKS,
              devices: str | None = None, gpus=None, store=None, keep: bool = False, peers: bool = True,
              numpy_size: int | None = None, kernel_size: int | None = None, reps: int = 1,
              out_dir=DEFAULT_OUT, client=None, seed: int = 0, command: str | None = None,
              compressors="auto", input_codec: str = "raw", input_zarr_format: int = 3,
              shards: int | None = None, first_call: bool = False, cold: bool = False,
              s3_server: str | None = None,
              log: Callable[[str], None] | None = print) -> tuple[dict, Path | None]:
    """Time dgemm from Zarr to Zarr against its peers on the same inputs, and write the JSON record.

    Parameters
    ----------
    size : int, optional
        Square side ``m = n = k``; default 32768 when a selected device is a
        GPU, 1024 otherwise.
    shape : (int, int, int), optional
        ``(m, n, k)`` instead of ``size``.
    dtype : {"float32", "float64"}
    chunks : int
        Zarr chunk side of the inputs (capped to the matrix).
    devices : str, optional
        Devices of the cluster dgemm runs on (as :class:`~dgemm.cluster.DeviceCluster`
        takes them); ignored for the main runs when ``client`` is given.
    gpus : sequence of int, optional
        Scaling table: dgemm on the first 1, 2, ... devices of ``devices``,
        each on its own cluster; the count the main run used reuses its result.
    store : path or str, optional
        Folder for the Zarr files: a new ``dgemm-e2e-*`` folder is made in it
        (default: in the system's temporary folder).  Or ``s3://BUCKET/PREFIX``:
        inputs and outputs on an S3 server (``s3_server``), a new
        ``dgemm-e2e-*`` prefix under it; the server's raw GET and PUT rates
        (:func:`~dgemm.benchmarks.objectstore.object_get_rate`) are recorded
        in ``record["object_store"]`` in place of the local store's rates.
    keep : bool
        Keep the Zarr files (inputs and outputs); otherwise they are removed.
        Not with the local S3 server (its objects go with it).
    peers : bool
        Time dask.array + cupy, cuBLAS and dask.array + numpy (and dgemm at
        the small size, which only the dask.array + numpy peer needs).
    numpy_size : int, optional
        Side cap of the dask.array + numpy comparison (default 4096); dgemm
        runs at that size too.
    kernel_size : int, optional
        Square side of the in-memory kernel timing (default: the full size
        when it fits 32-bit indexing, else sides capped at 32768).
    reps : int
        Timed repetitions of each end-to-end run (the median counts).
    out_dir : path, optional
        Folder of the record (:func:`dgemm.benchmarks.records.result_path`, detail
        :func:`result_detail`); ``None`` writes nothing.
    client : distributed.Client, optional
        Run the main dgemm timings on this cluster instead of starting one;
        it is not closed.
    seed : int
        Seed of the inputs.
    command : str, optional
        The command line to record (default: :func:`dgemm.benchmarks.records.command_line`).
    compressors : "auto" or None or codecs
        dgemm's output codecs (:func:`dgemm.matmul`'s ``compressors``; the
        peers write with the same); ``None`` stores C uncompressed.
    input_codec : {"raw", "default", "blosc-lz4"}
        How A and B are encoded (:func:`input_compressors`): raw chunks,
        zarr's default codec (zstd), or Blosc with LZ4.
    input_zarr_format : {3, 2}
        The inputs' Zarr format.
    shards : int, optional
        Write the inputs sharded, shards of ``shards`` x ``shards`` (capped to
        the matrix) holding inner chunks of ``chunks``; a multiple of
        ``chunks``, Zarr v3 only.
    first_call : bool
        Also time dgemm's first call from a fresh script (:func:`time_first_call`),
        after the main cluster is closed, on the same inputs.
    cold : bool
        Before each timed run (dgemm's, the first call's, the peers'), drop
        its input files from the page cache (:func:`dgemm.benchmarks.pagecache.drop`;
        no root needed); each run's entry says how many bytes were cached
        before and after (``cold``).  The store's read rates are then
        measured cold too.  Local stores only.
    s3_server : str, optional
        With an ``s3://`` store: ``"local"`` (the default) starts moto's
        server on 127.0.0.1 for the run (:class:`~dgemm.benchmarks.objectstore.LocalS3`);
        an ``http(s)://`` URL names a running server (credentials from the
        environment, as s3fs finds them).
    log : callable, optional
        Called with one line per step.

    Returns
    -------
    (dict, Path or None)
        The record and its file.  ``record["failures"]`` counts dgemm runs
        (end to end or kernel) that failed their check or raised; peers'
        problems go to ``record["errors"]`` only.
    """
    import dgemm

    from dgemm.opencl.discovery import select_devices

    log = log or (lambda line: None)
    dtype = np.dtype(dtype).name
    if dtype not in DTYPES:
        raise TypeError(f"dgemm supports float32 and float64, not {dtype}")
    m, n, k = resolve_shape(size, shape, devices)
    for name, v in (("chunks", chunks), ("reps", reps), ("numpy_size", numpy_size), ("kernel_size", kernel_size),
                    ("shards", shards)):
        if v is not None and int(v) < 1:
            raise ValueError(f"{name} must be positive, not {v}")
    input_compressors(input_codec, input_zarr_format)    # an unknown codec is refused here
    if input_zarr_format not in (2, 3):
        raise ValueError(f"input_zarr_format must be 2 or 3, not {input_zarr_format!r}")
    if shards and input_zarr_format != 3:
        raise ValueError("sharded inputs need Zarr v3 (input_zarr_format=3)")
    if shards and shards % chunks:
        raise ValueError(f"shards ({shards}) must be a multiple of chunks ({chunks})")
    if first_call:
        first_call_script(compressors)   # codec objects cannot go into the script
    small = tuple(min(x, numpy_size or NUMPY_SIZE) for x in (m, n, k))
    kshape = kernel_shape(m, n, k, kernel_size)
    gpus = sorted({int(g) for g in gpus}) if gpus else []
    selection = select_devices(devices) if gpus else None  # a given client's workers may be on other hosts
    if gpus and (gpus[0] < 1 or gpus[-1] > len(selection)):
        raise ValueError(f"gpus {gpus}: the devices {devices!r} give {len(selection)} device(s)")

    store = os.fspath(store) if store is not None else None
    remote = bool(store) and "://" in store
    local_server = remote and s3_server in (None, "local")
    _check_store_options(store, remote, local_server, s3_server, cold, keep)

    commit, dirty = git_commit()
    record = {
        "benchmark": "e2e", "date": utc_now(), "commit": commit, "commit_dirty": dirty,
        "command": command or command_line(), "dgemm_version": dgemm.__version__, **_versions(),
        "host": os.uname().nodename, "cpus": os.cpu_count(),
        "devices_spec": devices, "m": m, "n": n, "k": k, "dtype": dtype, "chunks": chunks, "reps": reps,
        "flops": _flops(m, n, k), "small": {"m": small[0], "n": small[1], "k": small[2]},
        "compressors": compressors if isinstance(compressors, str) or compressors is None else repr(compressors),
        "input_codec": input_codec, "input_zarr_format": input_zarr_format, "shards": shards,
        "cold": bool(cold), "store_kind": "s3" if remote else "local",
        "failures": 0, "errors": [],
    }
    path = None

    def save():
        if path is not None:
            write_json(path, record)

    def failed(stage: str, e: BaseException):
        record["failures"] += 1
        record["errors"].append({"stage": stage, "error": _err(e)})
        log(f"{stage}: ERROR {_err(e)}")

    with contextlib.ExitStack() as stack:
        so = None
        if remote:
            # the staging of the inputs, the first-call script and the server's log: a local folder
            scratch = Path(tempfile.mkdtemp(prefix="dgemm-e2e-local-"))
            stack.callback(shutil.rmtree, scratch, True)
            if local_server:
                log("starting a local S3 server (moto) on 127.0.0.1")
                server = stack.enter_context(LocalS3(scratch / "moto.log"))
                server.make_bucket(split_url(store)[0])
                so, about = server.storage_options, server.describe()
            else:
                so, about = s3_options(s3_server), {"server": "given (--s3-server)", "endpoint": s3_server}
            folder = new_location(store, so)
            bucket = split_url(store)[0]
            if not local_server and not folder.fs().exists(bucket):
                raise ValueError(f"bucket {bucket!r} not found at {s3_server} (or not readable with the "
                                 "environment's credentials)")
            record["object_store"] = {"server": about, "prefix": folder.root}
        else:
            folder = new_location(store)
            scratch = Path(folder.root)
        record["store"] = str(folder)

        def dropper(entry):
            """``--cold``: before each timed run, ``entry``'s inputs out of the page cache."""
            if not cold:
                return None
            paths = [entry["a"]["path"], entry["b"]["path"]]
            return lambda: pagecache.drop(paths)

        try:
            form = dict(codec=input_codec, zarr_format=input_zarr_format, shards=shards, staging=scratch)
            log(f"writing A ({m} x {k}) and B ({k} x {n}) {dtype}, chunks {chunks}, {_inputs_form(record)}, "
                f"to {folder}")
            record["inputs"] = make_inputs(folder, m, n, k, chunks, dtype, seed, **form)
            log(f"inputs: {_fmt_bytes(record['inputs']['a']['bytes'] + record['inputs']['b']['bytes'])} "
                f"in {record['inputs']['seconds']:.1f} s")
            if small != (m, n, k) and peers:
                record["inputs_small"] = make_inputs(folder, *small, chunks, dtype, seed + 2, tag="_small", **form)
            ins = record["inputs"]
            ins_small = record.get("inputs_small", ins)
            run = dict(storage_options=so, compressors=compressors)

            # ---- dgemm on the main cluster: kernel in memory, end to end, the small size ----
            with bench_cluster(devices, client) as (c, start_seconds):
                workers, names, usable = ready_workers(c, dtype)
                detail = "-".join(x for x in (result_detail(m, n, k, dtype),
                                              input_detail(input_codec, input_zarr_format, shards),
                                              "s3" if remote else "", "cold" if cold else "") if x)
                path = result_path(out_dir, record["date"], names, "e2e", detail) if out_dir is not None else None
                info = usable[workers[0]]["device"]
                record.update(device=", ".join(dict.fromkeys(names)), devices=names, workers=len(workers),
                              device_type=info.type, driver=info.driver, platform=info.platform,
                              cluster_start_seconds=start_seconds)
                record["warmup_seconds"] = _warm_up(c, workers, dtype, folder,
                                                    block_bytes=chunks * chunks * np.dtype(dtype).itemsize,
                                                    copy=input_codec == "raw")
                log(f"cluster: {len(workers)} worker(s) on {record['device']}; "
                    f"warm-up {record['warmup_seconds']:.1f} s")
                record["kernel"] = _time_kernel(c, workers[0], dtype, kshape, reps, seed, failed, log)
                save()
                if remote:
                    record["host_rates"] = _object_rates(c, workers[0], ins, folder, record, log)
                else:
                    record["host_rates"] = _host_rates(c, workers[0], ins, folder, dtype, record["errors"], log,
                                                       cold=cold)
                save()
                record["dgemm"] = _run_dgemm("dgemm", c, workers, ins, folder / "c_dgemm.zarr", (m, n, k), reps,
                                             keep, failed, log, before_each=dropper(ins), **run)
                _add_floor(record, usable, ins, so, log)
                save()
                # at the full size already, the main run is the one to compare with dask.array + numpy
                record["small_is_full"] = small == (m, n, k)
                record["dgemm_small"] = None if record["small_is_full"] or not peers else _run_dgemm(
                    "dgemm small", c, workers, ins_small, folder / "c_dgemm_small.zarr", small, reps, keep, failed,
                    log, before_each=dropper(ins_small), **run)
                save()

            # ---- scaling: the first 1, 2, ... devices, each on its own cluster ----
            if gpus:
                record["scaling"] = _scaling(gpus, selection, record, ins, folder, (m, n, k), dtype, reps, failed,
                                             log, before_each=dropper(ins), **run)
                save()
            else:
                record["scaling"] = None

            # ---- the first call from a fresh script: its own cluster, after ours are gone ----
            record["first_call"] = _first_call(record, ins, folder, (m, n, k), devices, compressors, keep, failed,
                                               log, so, scratch, dropper(ins)) if first_call else None
            save()

            # ---- peers, after dgemm's clusters are gone (the GPU to themselves) ----
            record["peers"] = _peers(peers, record, ins, ins_small, folder, (m, n, k), dtype, reps, keep, log,
                                     so, dropper)
            record["ratios"] = _ratios(record)
            record["ok"] = record["failures"] == 0
            save()
        finally:
            record["kept"] = bool(keep)
            # a local S3 server's objects go with it; elsewhere only the folder this run made is removed
            if not keep and not local_server:
                with contextlib.suppress(Exception):
                    folder.remove(folder.root)
            if path is not None and path.exists():
                save()
    return record, path


def _check_store_options(store, remote: bool, local_server: bool, s3_server, cold: bool, keep: bool) -> None:
    """Refuse store, server and ``cold`` options that do not go together, before any work."""
    import importlib.util

    if store and os.path.isfile(store):
        raise ValueError(f"store {store!r} is a file: give a folder, or an s3:// URL")
    if remote:
        if not store.startswith("s3://"):
            raise ValueError(f"store must be a local folder or an s3:// URL, not {store!r}")
        split_url(store)
        for module, pip in (("s3fs", "s3fs"), ("boto3", "boto3")) + ((("moto", "'moto[server]'"),)
                                                                    if local_server else ()):
            if importlib.util.find_spec(module) is None:
                raise ValueError(f"a store on S3 needs {module}: pip install {pip}")
        if cold:
            raise ValueError("cold drops local files from the page cache; an S3 store's objects are not local "
                             "files (run without cold, or on a local store)")
        if keep and local_server:
            raise ValueError("keep: the local S3 server's objects go when it stops at the end of the run; give "
                             "s3_server the URL of a server that stays")
    elif s3_server is not None:
        raise ValueError(f"s3_server {s3_server!r} needs a store on S3 (s3://BUCKET/PREFIX)")
    if s3_server not in (None, "local") and not str(s3_server).startswith(("http://", "https://")):
        raise ValueError(f"s3_server must be 'local' or an http(s):// endpoint URL, not {s3_server!r}")
    if cold and pagecache.supported():
        raise ValueError(f"cold: {pagecache.supported()}")


def _fmt_bytes(n: float) -> str:
    from dask.utils import format_bytes
    return format_bytes(int(n))


def _inputs_form(record: dict) -> str:
    """The inputs' encoding in words: ``zstd... → "default codec, Zarr v3, shards 16384"``."""
    codec = {"raw": "raw chunks", "default": "zarr's default codec"}.get(record["input_codec"], record["input_codec"])
    return (f"{codec}, Zarr v{record['input_zarr_format']}"
            + (f", shards {record['shards']}" if record.get("shards") else ""))


def _first_call(record, ins, folder, mnk, devices, compressors, keep, failed, log, storage_options=None,
                workdir=None, before=None) -> dict:
    """:func:`time_first_call` on the main inputs, beside the warm run's time."""
    m, n, k = mnk
    try:
        r = time_first_call(ins["a"]["path"], ins["b"]["path"], folder / "c_first_call.zarr", m, n, k, devices,
                            compressors, keep, storage_options=storage_options, workdir=workdir, before=before)
    except Exception as e:
        failed("first call", e)
        return {"m": m, "n": n, "k": k, "status": "ERROR", "ok": False, "error": _err(e), "seconds": None,
                "tflops": None}
    if not r["ok"]:
        failed("first call", RuntimeError(f"wrong result: max relative error {r['check']['max_rel_err']:.3g} > "
                                          f"{r['check']['tolerance']:.3g}"))
    warm = (record.get("dgemm") or {}).get("seconds")
    r["minus_warm_seconds"] = r["seconds"] - warm if warm else None
    log(f"first call from a fresh script: {r['seconds']:.3f} s from process start ({_fmt(r['tflops'], '.4g')} TFLOPS; "
        f"import {r['import_seconds']:.2f} s, matmul {r['matmul_seconds']:.2f} s"
        + (f"; warm + {r['minus_warm_seconds']:.2f} s" if warm else "") + f") ({r['status']})")
    return r


def _time_kernel(client, addr, dtype, kshape, reps, seed, failed, log) -> dict | None:
    """dgemm's kernel in memory, as a task on ``addr`` (it holds the GPU resource, like a GEMM task)."""
    try:
        fut = client.submit(_kernel_rate, dtype, *kshape, max(reps, 3), seed, workers=[addr],
                            allow_other_workers=False, resources={"GPU": 1}, pure=False,
                            key=f"dgemm-e2e-kernel-{uuid.uuid4().hex[:8]}")
        r = fut.result()
    except Exception as e:
        failed("kernel", e)
        return {"m": kshape[0], "n": kshape[1], "k": kshape[2], "status": "ERROR", "ok": False, "error": _err(e),
                "seconds": None, "tflops": None}
    if not r["ok"]:
        failed("kernel", RuntimeError(f"wrong result: rel_err {r['rel_err']:.3g} > {r['tolerance']:.3g}"))
    log(f"kernel in memory {'x'.join(map(str, kshape))}: {_fmt(r['tflops'], '.4g')} TFLOPS ({r['status']})")
    return r


def _host_rates(client, addr, ins, folder, dtype, errors, log, cold: bool = False) -> dict | None:
    """The store's and ``addr``'s bus rates (:func:`dgemm.benchmarks.rates.host_rates`); None if they fail.

    With ``cold``, the store's reads are timed again with A dropped from the
    page cache before each thread count (``read_cold_gbps``, ``reader_cold_gbps``).
    """
    try:
        r = host_rates(ins["a"]["path"], os.fspath(folder), ins["a"]["chunks"], dtype, client, addr)
        if cold:
            r.update(_cold_read_rates(ins["a"]["path"]))
    except Exception as e:  # a full disk...: the benchmark goes on without them
        errors.append({"stage": "host_rates", "error": _err(e)})
        log(f"host rates: ERROR {_err(e)}")
        return None
    copy = r["copy_gbps"]
    log("host rates (GB/s): read " + ", ".join(f"{v:.3g} ({t} thr)" for t, v in r["read_gbps"].items() if v)
        + "; write " + ", ".join(f"{v:.3g} ({t} thr)" for t, v in r["write_gbps"].items() if v)
        + (f"; upload {_fmt(copy['upload_pageable'], '.3g')} pageable, {_fmt(copy['upload_pinned'], '.3g')} pinned"
           if copy else f"; copies not timed ({r['copy_skipped']})"))
    return r


def _cold_read_rates(a_path) -> dict:
    """The store's read rates with A out of the page cache before each thread count (zarr's and dgemm's reader)."""
    from dgemm.benchmarks.rates import READ_THREADS, READER_THREADS, reader_rate, store_read_rate

    out: dict = {"read_cold_gbps": {}, "reader_cold_gbps": {}, "cold_drops": []}
    for key, threads, rate in (("read_cold_gbps", READ_THREADS, store_read_rate),
                               ("reader_cold_gbps", READER_THREADS, reader_rate)):
        for t in threads:
            out["cold_drops"].append(pagecache.drop([a_path]))
            out[key][str(t)] = rate(a_path, t)
    return out


def _copy_rates(client, addr) -> tuple[dict | None, str | None]:
    """``addr``'s host-device copy rates (:func:`dgemm.benchmarks.rates.copy_rates`), or None and why not."""
    from dgemm.benchmarks.rates import copy_rates

    try:
        return client.submit(copy_rates, workers=[addr], allow_other_workers=False, resources={"GPU": 1},
                             pure=False).result(), None
    except Exception as e:  # a device without page-locked memory...: reported, not fatal
        return None, _err(e)


def _object_rates(client, addr, ins, folder: Location, record: dict, log) -> dict:
    """On S3: the server's raw GET rate on the inputs' chunk objects, its PUT rate, and ``addr``'s copies.

    The GET and PUT rates go to ``record["object_store"]``; what is returned
    takes the place of :func:`_host_rates`' (no local store: its read and
    write rates are empty).
    """
    so = folder.storage_options
    obj = record.setdefault("object_store", {})
    try:
        objects = folder.chunk_objects(ins["a"]["path"]) + folder.chunk_objects(ins["b"]["path"])
        obj["get"] = object_get_rate(objects, so)
        obj["put"] = object_put_rate(folder / "put-rate", max(size for _, size in objects), so)
        log(f"object store, GB/s: GET {_thr(obj['get']['gbps'])}; PUT {_thr(obj['put']['gbps'])}")
    except Exception as e:
        record["errors"].append({"stage": "object_rates", "error": _err(e)})
        log(f"object store rates: ERROR {_err(e)}")
    copy, why = _copy_rates(client, addr)
    return {"read_gbps": {}, "write_gbps": {}, "copy_gbps": copy, "copy_skipped": why,
            "store": "s3: see object_store"}


def _best(rates: dict | None) -> float | None:
    """The highest of ``{threads: GB/s}`` (None if none)."""
    vals = [v for v in (rates or {}).values() if v]
    return max(vals) if vals else None


def measured_rates(record: dict) -> dict:
    """The run's own rates in :class:`dgemm.client.plan.Rates`' terms (bytes/s, flop/s), and where each came from.

    Store reads: the best of dgemm's reader (else zarr's) over thread counts,
    cold ones with ``--cold``; on S3 the server's best raw GET.  Writes: the
    local store's best (raw chunks), or the best PUT.  PCIe: page-locked
    upload.  Kernel: dgemm's kernel in memory in this run.  A rate not
    measured is left out (the plan's default stands).
    """
    hr, obj = record.get("host_rates") or {}, record.get("object_store") or {}
    out, source = {}, {}
    if record.get("store_kind") == "s3":
        read, source["read"] = (obj.get("get") or {}).get("best_gbps"), "object GET (best over threads)"
        write, source["write"] = (obj.get("put") or {}).get("best_gbps"), "object PUT (best over threads)"
    else:
        cold = "_cold" if record.get("cold") else ""
        read = _best(hr.get(f"reader{cold}_gbps"))
        source["read"] = f"dgemm's chunk reader{', cold' if cold else ''} (best over threads)"
        if read is None:
            read, source["read"] = _best(hr.get(f"read{cold}_gbps")), f"zarr{', cold' if cold else ''} (best)"
        write, source["write"] = _best(hr.get("write_gbps")), "raw chunks (best over threads)"
    copy = hr.get("copy_gbps") or {}
    pcie = copy.get("upload_pinned") or copy.get("upload_pageable")
    source["pcie"] = "upload, page-locked" if copy.get("upload_pinned") else "upload, pageable"
    tflops = (record.get("kernel") or {}).get("tflops")
    source["flops"] = "dgemm's kernel in memory, this run"
    for key, v, scale in (("read", read, 1e9), ("write", write, 1e9), ("pcie", pcie, 1e9), ("flops", tflops, 1e12)):
        if v:
            out[key] = v * scale
        else:
            source.pop(key, None)
    return {"rates": out, "source": source}


def plan_floor(usable: dict, a_path, b_path, dtype, measured: dict | None = None,
               storage_options: dict | None = None) -> dict:
    """``dgemm plan``'s predicted floor for this product on these workers (:meth:`dgemm.client.plan.Plan.estimate`).

    The plan is made as :func:`dgemm.matmul` makes it on ``usable`` (the
    workers' tiles, memory and default block size; the inputs' chunks);
    the device cache is what ``dgemm plan`` assumes.  ``defaults`` uses
    ``dgemm plan``'s default rates (store reads 5 GB/s, writes 2 GB/s,
    PCIe 20 GB/s) and the tuning database's kernel rate; ``measured`` the
    run's own (:func:`measured_rates`), each missing one at its default.
    """
    from dgemm.cluster import device_limits, tiles_of
    from dgemm.client.plan import Rates, make_plan
    from dgemm.sizes import MEMORY_FRACTION, default_target
    from dgemm.storage import Operand
    from dgemm.opencl.database import lookup

    A, B = Operand(os.fspath(a_path), "a", storage_options), Operand(os.fspath(b_path), "b", storage_options)
    (m, k), (_, n) = A.shape, B.shape
    tiles = tiles_of(usable, dtype)
    memory, max_alloc = device_limits(usable)
    target = default_target(d["device"].type for d in usable.values())
    p = make_plan(m, n, k, dtype, tiles, a_chunks=A.chunks, b_chunks=B.chunks, target=target,
                  n_workers=len(usable), device_memory=memory, max_alloc=max_alloc)
    cache = None if memory is None else max(0.0, MEMORY_FRACTION * memory - 2 * p.device_bytes())
    db = lookup(next(iter(usable.values()))["device"], dtype).tflops
    out = {"block": list(p.block_shape), "tasks": p.n_tasks, "workers": len(usable), "cache_bytes": cache,
           "plan": p.explain(), "kernel_tflops_database": db}

    def estimate(rates):
        e = p.estimate(len(usable), rates, cache)
        busiest = max(e["workers"], key=lambda w: w["floor"], default=None)
        return {"floor_seconds": e["floor_seconds"], "bound": e["bound"], "tflops_ceiling": e["tflops_ceiling"],
                "bytes_read": e["bytes_read"], "bytes_written": e["bytes_written"], "rates": e["rates"],
                "busiest": {key: busiest[key] for key in ("tasks", "seconds", "fill", "drain")} if busiest else None,
                "text": p.explain_estimate(len(usable), rates, cache)}

    out["defaults"] = estimate(Rates(flops=db * 1e12 if db else None))
    if measured is not None:
        rates = {"flops": db * 1e12 if db else None, **measured["rates"]}
        out["measured"] = {**estimate(Rates(**rates)), "source": measured["source"]}
    return out


def _add_floor(record: dict, usable: dict, ins: dict, storage_options, log) -> None:
    """``dgemm plan``'s floor beside the main run's time (``record["dgemm"]["floor"]``); an error is only noted."""
    d = record.get("dgemm") or {}
    try:
        f = plan_floor(usable, ins["a"]["path"], ins["b"]["path"], record["dtype"], measured_rates(record),
                       storage_options)
    except Exception as e:
        record["errors"].append({"stage": "plan_floor", "error": _err(e)})
        log(f"plan floor: ERROR {_err(e)}")
        return
    run_block = ((d.get("attrs") or {}).get("run") or {}).get("block")
    f["same_blocks_as_run"] = run_block == f["block"][:2] if run_block else None
    for key in ("defaults", "measured"):
        if key in f and d.get("seconds") and f[key]["floor_seconds"]:
            f[key]["measured_over_floor"] = d["seconds"] / f[key]["floor_seconds"]
    d["floor"] = f
    log(_floor_line(d))


def _run_dgemm(stage, client, workers, ins, out, mnk, reps, keep, failed, log, compressors="auto",
               storage_options=None, before_each=None) -> dict:
    m, n, k = mnk
    try:
        r = time_dgemm(client, workers, ins["a"]["path"], ins["b"]["path"], out, m, n, k, reps, keep, compressors,
                       storage_options=storage_options, before_each=before_each)
    except Exception as e:
        failed(stage, e)
        return {"m": m, "n": n, "k": k, "status": "ERROR", "ok": False, "error": _err(e), "seconds": None,
                "tflops": None}
    if not r["ok"]:
        failed(stage, RuntimeError(f"wrong result: max relative error {r['check']['max_rel_err']:.3g} > "
                                   f"{r['check']['tolerance']:.3g}"))
    log(f"{stage} {m}x{n}x{k}: {r['seconds']:.3f} s, {_fmt(r['tflops'], '.4g')} TFLOPS, "
        f"max rel err {r['check']['max_rel_err']:.2g} ({r['status']})")
    return r


def _scaling(gpus, selection, record, ins, folder, mnk, dtype, reps, failed, log, compressors="auto",
             storage_options=None, before_each=None) -> list[dict]:
    """dgemm on the first g devices of ``selection``, for each g; speed-up and efficiency against g = 1.

    Each row keeps its run's wall times, time split, bytes and each worker's
    counters (:func:`worker_split`), so a row that scales badly shows where
    its time went.
    """
    rows = []
    for g in gpus:
        ids = [d.id for d in selection[:g]]
        if g == record["workers"] and record["dgemm"].get("seconds") is not None:
            r, reused = record["dgemm"], True
        else:
            reused = False
            try:
                with bench_cluster(",".join(ids)) as (c, _):
                    workers, _, _ = ready_workers(c, dtype)
                    _warm_up(c, workers, dtype, folder)
                    r = _run_dgemm(f"dgemm on {g} device(s)", c, workers, ins, folder / f"c_dgemm_{g}.zarr", mnk,
                                   reps, False, failed, log, compressors, storage_options, before_each)
            except Exception as e:
                failed(f"scaling {g}", e)
                r = {"seconds": None, "tflops": None, "ok": False, "error": _err(e)}
        rows.append({"gpus": g, "devices": [d.name for d in selection[:g]], "device_ids": ids,
                     "seconds": r.get("seconds"), "times": r.get("times"),
                     "best_seconds": min(r["times"]) if r.get("times") else None,
                     "tflops": r.get("tflops"), "ok": r.get("ok"), "reused_main_run": reused, "error": r.get("error"),
                     "split": r.get("split"), "bytes": r.get("bytes"), "workers": worker_split(r)})
    base = rows[0] if rows and rows[0]["gpus"] == 1 else None
    for row in rows:
        speedup = (base["seconds"] / row["seconds"]) if base and base["seconds"] and row["seconds"] else None
        row["speedup"] = speedup
        row["efficiency"] = speedup / row["gpus"] if speedup is not None else None
    return rows


SPLIT_KEYS = ("blocks", "busy_seconds", "kernel_seconds", "read_wait_seconds", "read_seconds", "upload_seconds",
              "download_seconds", "store_seconds", "bytes_read", "cache_hits", "cache_misses", "cache_evictions")


def worker_split(run: dict) -> dict:
    """Per worker of a :func:`time_dgemm` run: its device and the counters that say where its time went.

    >>> worker_split({"counters": {"per_worker": {"tcp://a:1": {"device": "X", "counters": {"blocks": 2,
    ...     "kernel_seconds": 1.5, "flops": 8.0}}}}})
    {'tcp://a:1': {'device': 'X', 'blocks': 2, 'kernel_seconds': 1.5}}
    """
    per = ((run or {}).get("counters") or {}).get("per_worker") or {}
    return {addr: {"device": w.get("device"),
                   **{k: w["counters"][k] for k in SPLIT_KEYS if k in w.get("counters", {})}}
            for addr, w in sorted(per.items())}


def _peers(peers, record, ins, ins_small, folder, mnk, dtype, reps, keep, log, storage_options=None,
           dropper=lambda ins: None) -> dict:
    out: dict = {}
    if not peers:
        for name in ("dask_cupy", "cublas", "dask_numpy"):
            out[name], out[f"{name}_skipped"] = None, "--no-peers"
        return out
    # dgemm's output codec, so that the peers' writes cost the same (zarr's default if dgemm left none)
    compressors = (record.get("dgemm") or {}).get("output_compressors", "auto")
    out["output_compressors"] = compressors
    # dask.array + cupy at the full size
    cupy, why = cupy_status()
    out["dask_cupy"], out["dask_cupy_skipped"] = None, why
    if cupy is not None:
        try:
            out["dask_cupy"] = time_dask(ins["a"]["path"], ins["b"]["path"], folder / "c_cupy.zarr", reps, cupy=cupy,
                                         compressors=compressors, keep=keep, storage_options=storage_options,
                                         before_each=dropper(ins))
            log(f"dask.array + cupy: {out['dask_cupy']['seconds']:.3f} s, "
                f"{_fmt(out['dask_cupy']['tflops'], '.4g')} TFLOPS")
        except Exception as e:
            out["dask_cupy_skipped"] = _err(e)
            record["errors"].append({"stage": "dask_cupy", "error": _err(e)})
            log(f"dask.array + cupy: ERROR {_err(e)}")
        finally:
            with contextlib.suppress(Exception):
                _free_cupy(cupy)
    else:
        log(f"dask.array + cupy: not timed ({why})")
    # cuBLAS in GPU memory
    try:
        block = (record.get("dgemm") or {}).get("attrs", {}).get("run", {}).get("block")
        out["cublas"], out["cublas_skipped"] = time_cublas(dtype, *mnk, block, reps)
    except Exception as e:  # out of CUDA memory...
        out["cublas"], out["cublas_skipped"] = None, _err(e)
        record["errors"].append({"stage": "cublas", "error": _err(e)})
    log(f"cuBLAS: {_fmt((out['cublas'] or {}).get('tflops'), '.4g')} TFLOPS"
        if out["cublas"] else f"cuBLAS: not timed ({out['cublas_skipped']})")
    # dask.array + numpy at the small size
    try:
        out["dask_numpy"], out["dask_numpy_skipped"] = time_dask(
            ins_small["a"]["path"], ins_small["b"]["path"], folder / "c_numpy.zarr", reps,
            compressors=compressors, keep=keep, storage_options=storage_options,
            before_each=dropper(ins_small)), None
        log(f"dask.array + numpy {'x'.join(str(record['small'][x]) for x in 'mnk')}: "
            f"{out['dask_numpy']['seconds']:.3f} s, {_fmt(out['dask_numpy']['tflops'], '.4g')} TFLOPS")
    except Exception as e:
        out["dask_numpy"], out["dask_numpy_skipped"] = None, _err(e)
        record["errors"].append({"stage": "dask_numpy", "error": _err(e)})
    return out


def _ratios(record: dict) -> dict:
    d, peers = record.get("dgemm"), record.get("peers") or {}
    kern = record.get("kernel")
    workers = record.get("workers") or 1
    per_device = {"tflops": d["tflops"] / workers} if d and d.get("tflops") else None
    return {"dgemm_to_dask_cupy": _ratio(d, peers.get("dask_cupy")),
            "dgemm_to_kernel": _ratio(d, kern),
            "dgemm_per_device_to_kernel": _ratio(per_device, kern),
            "dgemm_to_cublas": _ratio(d, peers.get("cublas")),
            "dgemm_small_to_dask_numpy": _ratio(record.get("dgemm_small") or d, peers.get("dask_numpy"))}


# -- the table ----------------------------------------------------------------------------
def _fmt(x, spec: str, missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def _row(name: str, r: dict | None, why: str | None = None) -> str:
    if r is None:
        return f"{name:26} not timed: {why}"
    if r.get("error"):
        return f"{name:26} ERROR {r['error']}"
    size = f"{r['m']}x{r['n']}x{r['k']}"
    check = r.get("check")
    err = check["max_rel_err"] if check else r.get("rel_err")
    status = ("ok" if r.get("ok", True) else "FAILED") if "ok" in r else ""
    return (f"{name:26} {size:>20} {_fmt(r.get('seconds'), '10.4g'):>10} {_fmt(r.get('tflops'), '9.4g'):>9} "
            f"{_fmt(err, '8.2g'):>8}  {status}")


def _thr(rates: dict | None) -> str:
    """``{threads: GB/s}`` as ``1.2 (1 thr), 3.4 (4 thr)``."""
    return ", ".join(f"{_fmt(v, '.3g')} ({t} thr)" for t, v in (rates or {}).items()) or "-"


def _server_words(record: dict) -> str:
    server = ((record.get("object_store") or {}).get("server")) or {}
    return f" (S3 at {server.get('endpoint')}: {server.get('server')})" if server else ""


def _cold_words(drops: list[dict]) -> str:
    """What ``--cold`` dropped before a run's repetitions, in words."""
    def b(x):
        return "?" if x is None else _fmt_bytes(x)
    first = drops[0]
    when = "before the timed run" if len(drops) == 1 else f"before each of {len(drops)} repetitions"
    return (f"{when} the inputs ({first['files']} files, {b(first['bytes'])}) "
            f"were dropped from the page cache: " + "; ".join(
                f"{b(x['cached_before'])} cached before, {b(x['cached_after'])} after" for x in drops))


def _floor_line(d: dict) -> str:
    """``dgemm plan``'s floor (default and measured rates) beside the measured time, in words (two lines)."""
    f = d.get("floor") or {}
    heads, details = [], []
    for key, name in (("defaults", "dgemm plan's default rates"), ("measured", "this run's rates")):
        e = f.get(key)
        if not e:
            continue
        heads.append(f"{e['floor_seconds']:.3g} s {e['bound']}-bound with {name}"
                     + (f" (measured {e['measured_over_floor']:.3g} x)" if e.get("measured_over_floor") else ""))
        r = e["rates"]
        busiest = e.get("busiest") or {}
        details.append(
            f"  {name}: read {r['read'] / 1e9:.3g}, write {r['write'] / 1e9:.3g}, PCIe {r['pcie'] / 1e9:.3g} GB/s, "
            + (f"kernel {r['flops'] / 1e12:.3g} TFLOPS" if r.get("flops") else "kernel not counted")
            + "; busiest worker: " + ", ".join(f"{k} {v:.3g} s" for k, v in (busiest.get("seconds") or {}).items())
            + f", fill {busiest.get('fill', 0):.2g} s, drain {busiest.get('drain', 0):.2g} s")
    blocks = "x".join(map(str, f.get("block", [])))
    return "\n".join(["dgemm plan's floor: " + "; ".join(heads) + f"; measured {_fmt(d.get('seconds'), '.3g')} s "
                      f"(blocks {blocks}, {f.get('tasks')} GEMM tasks on {f.get('workers')} worker(s))", *details])


def format_table(record: dict) -> str:
    """The record as text: one line per timed run, then ratios, time split, memory and scaling."""
    lines = [f"device(s): {record.get('device')} x{record.get('workers')} ({record.get('device_type')}, "
             f"driver {record.get('driver')}); commit {record['commit']}"
             f"{' (modified)' if record.get('commit_dirty') else ''}; {record['date']}",
             f"C = A @ B, {record['m']} x {record['n']} x {record['k']} {record['dtype']}, chunks {record['chunks']}, "
             f"reps {record['reps']}; store {record['store']}" + _server_words(record)]
    ins = record.get("inputs")
    if ins:
        lines.append(f"inputs: A {_fmt_bytes(ins['a']['bytes'])}, B {_fmt_bytes(ins['b']['bytes'])}"
                     + (f" ({_inputs_form(record)})" if "input_codec" in record else "")
                     + f", written in {ins['seconds']:.2f} s")
    lines.append(f"{'run':26} {'m x n x k':>20} {'seconds':>10} {'TFLOPS':>9} {'rel_err':>8}  check")
    peers = record.get("peers") or {}
    lines.append(_row(f"dgemm e2e ({record.get('workers')} worker(s))", record.get("dgemm")))
    if record.get("first_call"):
        lines.append(_row("dgemm first call (script)", record["first_call"]))
    lines.append(_row("dgemm kernel (in memory)", record.get("kernel")))
    lines.append(_row("dask.array + cupy", peers.get("dask_cupy"), peers.get("dask_cupy_skipped")))
    lines.append(_row("cuBLAS (in memory)", peers.get("cublas"), peers.get("cublas_skipped")))
    if record.get("dgemm_small"):
        lines.append(_row("dgemm e2e (small)", record.get("dgemm_small")))
    lines.append(_row("dask.array + numpy", peers.get("dask_numpy"), peers.get("dask_numpy_skipped")))
    r = record.get("ratios") or {}
    lines.append("ratios: " + "; ".join(f"{name} {_fmt(r.get(key), '.3g')}" for name, key in (
        ("dgemm/dask+cupy", "dgemm_to_dask_cupy"), ("dgemm/kernel", "dgemm_to_kernel"),
        ("dgemm per device/kernel", "dgemm_per_device_to_kernel"), ("dgemm/cuBLAS", "dgemm_to_cublas"),
        ("dgemm/dask+numpy (small)", "dgemm_small_to_dask_numpy"))))
    hr = record.get("host_rates")
    if hr:
        copy = hr.get("copy_gbps") or {}
        parts = [f"{name} " + _thr(hr[key]) for key, name in (
            ("read_gbps", "store read (zarr)"), ("reader_gbps", "store read (dgemm's reader)"),
            ("read_cold_gbps", "cold (zarr)"), ("reader_cold_gbps", "cold (dgemm's reader)"),
            ("write_gbps", "store write")) if hr.get(key)]
        parts.append(f"upload {_fmt(copy.get('upload_pageable'), '.3g')} pageable, "
                     f"{_fmt(copy.get('upload_pinned'), '.3g')} pinned; download "
                     f"{_fmt(copy.get('download_pageable'), '.3g')}" if copy else f"copies: {hr.get('copy_skipped')}")
        lines.append("host rates, GB/s: " + "; ".join(parts))
    obj = record.get("object_store") or {}
    if obj.get("get") or obj.get("put"):
        lines.append("object store, GB/s (raw whole objects, boto3): GET " + _thr((obj.get("get") or {}).get("gbps"))
                     + "; PUT " + _thr((obj.get("put") or {}).get("gbps")))
    d = record.get("dgemm") or {}
    if d.get("split"):
        sp = d["split"]
        parts = [f"{k.removesuffix('_seconds')} {v:.3g} s ({_fmt(sp['share'][k], '.0%')})"
                 for k, v in sorted(sp["seconds"].items())]
        lines.append(f"dgemm time split (worker-seconds; share of wall x {sp['workers']} worker(s)): " + ", ".join(parts))
    if d.get("floor"):
        lines.append(_floor_line(d))
    if d.get("cold"):
        lines.append("cold: " + _cold_words(d["cold"]))
    if d.get("bytes"):
        b = d["bytes"]
        moved = ", ".join(f"{key} {_fmt_bytes(b[key])}" for key in ("bytes_read", "bytes_up", "bytes_down") if key in b)
        lines.append(f"dgemm bytes: inputs {_fmt_bytes(b['inputs'])}, output {_fmt_bytes(b['output'])} "
                     f"({_fmt_bytes(b['output_on_disk']) if b.get('output_on_disk') is not None else '?'} on disk)"
                     + (f"; {moved}" if moved else ""))
    if d.get("memory"):
        mem = d["memory"]
        gpu = mem["gpu"]
        gpu_s = (", ".join(f"GPU {i}: {v:.0f} MiB (+{mem['gpu']['peak_added_mib'][i]:.0f})"
                           for i, v in gpu["peak_used_mib"].items()) if gpu else f"GPU: n/a ({mem['gpu_skipped']})")
        lines.append(f"dgemm peak memory: worker RSS {_fmt_bytes(mem['rss_total_peak_bytes'])} in all; {gpu_s}")
    if record.get("scaling"):
        lines.append(f"{'devices':>8} {'seconds':>10} {'TFLOPS':>9} {'speed-up':>9} {'efficiency':>10}")
        for row in record["scaling"]:
            lines.append(f"{row['gpus']:>8} {_fmt(row['seconds'], '10.4g'):>10} {_fmt(row['tflops'], '9.4g'):>9} "
                         f"{_fmt(row['speedup'], '9.3g'):>9} {_fmt(row['efficiency'], '10.1%'):>10}"
                         + (f"  ERROR {row['error']}" if row.get("error") else ""))
            for addr, w in (row.get("workers") or {}).items():
                lines.append(f"{'':8}   {addr}: {w.get('blocks', '?')} blocks; " + ", ".join(
                    f"{k.removesuffix('_seconds')} {w[k]:.3g} s" for k in SPLIT_KEYS if k.endswith("_seconds") and k in w)
                    + (f"; read {_fmt_bytes(w['bytes_read'])}" if "bytes_read" in w else ""))
    fc = record.get("first_call")
    if fc and fc.get("seconds") is not None:
        lines.append(f"first call from a fresh script: {fc['seconds']:.3g} s from process start = interpreter "
                     f"{fc['process_start_seconds']:.2g} s + import dgemm {fc['import_seconds']:.2g} s + matmul "
                     f"{fc['matmul_seconds']:.3g} s (dgemm's own {_fmt(fc.get('dgemm_seconds'), '.3g')} s); "
                     f"warm + {_fmt(fc.get('minus_warm_seconds'), '.3g')} s; exit {fc['exit_seconds']:.2g} s after")
        if fc.get("cold"):
            lines.append("first call cold: " + _cold_words([fc["cold"]]))
    for e in record.get("errors", []):
        lines.append(f"error in {e['stage']}: {e['error']}")
    n_failed = record.get("failures")
    lines.append("result: OK" if n_failed == 0 else f"result: {n_failed} FAILURE(S)")
    return "\n".join(lines)

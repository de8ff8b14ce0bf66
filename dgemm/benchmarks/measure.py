"""Timed runs of the end-to-end benchmark, and what the workers and the host say about them.

* :func:`time_dgemm`: ``dgemm.matmul(A, B, out=C)`` on a cluster, wall
  clock, with the workers' counters (:func:`worker_probe`, read before and
  after: :func:`counter_delta`, :func:`sum_counters`, :func:`time_split`,
  :func:`worker_split`), peak memory (:class:`MemorySampler`) and a sampled
  check of C (:func:`check_stored`);
* :func:`time_dask`: dask.array's ``A @ B`` on the same Zarr inputs, with
  numpy or cupy blocks;
* :func:`kernel_rate`: dgemm's kernel alone, in a worker's device memory,
  at the size :func:`kernel_shape` says;
* :func:`bench_cluster`, :func:`ready_workers`, :func:`warm_up`: the cluster
  a timing runs on, its usable workers, and its kernels built beforehand.

Every timed product is checked: an entry's ``ok`` says whether it passed.
"""
from __future__ import annotations

import contextlib
import gc
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable

import numpy as np

from dgemm.accuracy import tolerance
from dgemm.benchmarks.objectstore import Location, is_remote, open_zarr, remove_array, stored_bytes
from dgemm.sizes import INT32_MAX, roundup

SAMPLE_SECONDS = 0.2              # memory sampling interval
CHECK_SAMPLES = 16                # rows and columns of C checked against numpy
KERNEL_MAX_SIDE = 32768           # 32768^2 elements fit 32-bit indexing with room for padding
SPLIT_KEYS = ("blocks", "busy_seconds", "kernel_seconds", "read_wait_seconds", "read_seconds", "upload_seconds",
              "download_seconds", "store_seconds", "bytes_read", "cache_hits", "cache_misses", "cache_evictions")


def flops(m: int, n: int, k: int) -> float:
    """Floating-point operations of an ``m x n x k`` product.

    >>> flops(2, 3, 4)
    48.0
    """
    return 2.0 * m * n * k


def tflops(n_flops: float, seconds: float | None) -> float | None:
    """``n_flops`` in ``seconds`` as TFLOPS; None without a time.

    >>> tflops(3e12, 1.5), tflops(1.0, None)
    (2.0, None)
    """
    return n_flops / seconds / 1e12 if seconds else None


def check_stored(a_path, b_path, c_path, storage_options: dict | None = None, op: str = "matmul") -> dict:
    """The sampled check of the stored result against float64 (:func:`dgemm.benchmarks.shapes.check_op`:
    :func:`dgemm.accuracy.check_sample`, or for ``op="gram"`` X^T X and its symmetry, ``a_path`` being X)."""
    from dgemm.benchmarks.shapes import check_op

    za, zb, zc = (open_zarr(p, storage_options) for p in (a_path, b_path, c_path))
    return check_op(op, za, zb, zc, CHECK_SAMPLES)


def _matmul_options(storage_options: dict | None) -> dict:
    """``storage_options=`` for :func:`dgemm.matmul` when there are any (local paths take none)."""
    return {"storage_options": storage_options} if storage_options else {}


# -- what the workers count ---------------------------------------------------------------
def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _plain(x):
    """A numpy scalar as the Python number JSON writes."""
    return x.item() if isinstance(x, np.generic) else x


def _is_peak(key: str) -> bool:
    """A high-water mark (``peak_device_bytes``, ``cache_peak_bytes``): its delta would mean nothing."""
    return "peak" in key.split("_")


def worker_probe(dask_worker=None) -> dict:
    """Run on each worker (``client.run``): its pid, device and every numeric dgemm counter."""
    from dgemm.names import TASK_SECONDS, WORKER_PLUGIN
    from dgemm.worker import device_state

    plugin = dask_worker.plugins.get(WORKER_PLUGIN) if dask_worker is not None else None
    state = plugin.state if plugin is not None and plugin.state is not None else device_state()
    counters = {k: _plain(v) for k, v in state.totals().items() if _is_number(v)}
    # The store, load and reduce tasks' seconds live in the worker's Fine Performance Metrics.
    if dask_worker is not None:
        with contextlib.suppress(Exception):
            snap = state.snapshot(dask_worker)
            counters.update({k: _plain(snap[k]) for k in TASK_SECONDS if k in snap and _is_number(snap[k])
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


def _bytes(total: dict, out_path, m, n, k, itemsize, reps, storage_options: dict | None = None,
           op: str = "matmul") -> dict:
    """Bytes the run read, moved and wrote; ``*_per_input`` above 1 means re-reads or re-uploads (X counts once
    in a Gram product)."""
    from dgemm.benchmarks.shapes import input_elements

    inputs = input_elements(op, m, n, k) * itemsize * reps
    out = {"inputs": inputs, "output": m * n * itemsize * reps,
           "output_on_disk": stored_bytes(out_path, storage_options)}
    for key, name, base in (("bytes_read", "read_per_input", inputs), ("bytes_up", "up_per_input", inputs),
                            ("bytes_down", "down_per_output", out["output"])):
        if key in total:
            out[key] = total[key]
            out[name] = total[key] / base if base else None
    return out


# -- memory --------------------------------------------------------------------------------
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

    Parameters
    ----------
    pids : iterable of int
        The processes whose resident memory is sampled (one that ends is
        skipped from then on).
    interval : float
        Seconds between samples.
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
        """The peaks: each process's RSS and their sum, and each GPU's memory used (before, peak, added)."""
        gpu = None
        if self.gpu_skipped is None and self.gpu_base is not None:
            gpu = {"peak_used_mib": {str(i): v for i, v in self.gpu_peak.items()},
                   "before_used_mib": {str(i): v for i, v in self.gpu_base.items()},
                   "peak_added_mib": {str(i): v - self.gpu_base.get(i, 0.0) for i, v in self.gpu_peak.items()}}
        return {"interval_seconds": self.interval, "samples": self.samples,
                "rss_peak_bytes": {str(pid): v for pid, v in self.rss_peak.items()},
                "rss_total_peak_bytes": self.rss_total_peak, "gpu": gpu, "gpu_skipped": self.gpu_skipped}


# -- dgemm ------------------------------------------------------------------------------------
def time_dgemm(client, workers: list[str], a_path, b_path, out_path, m: int, n: int, k: int, reps: int = 1,
               keep: bool = False, compressors="auto", storage_options: dict | None = None,
               before_each: Callable[[], dict] | None = None, op: str = "matmul") -> dict:
    """Time ``dgemm.matmul(a, b, out=out)`` on ``client`` (kernels already built) and check the result.

    Parameters
    ----------
    client : distributed.Client
        The cluster dgemm runs on.
    workers : list of str
        Its workers' addresses, whose counters are read before and after.
    a_path, b_path, out_path : str or os.PathLike
        The inputs and the output (local paths or URLs).
    m, n, k : int
        The product's shape, for its rate and byte counts.
    reps : int
        Timed repetitions; the median counts.
    keep : bool
        Keep the output; otherwise it is removed afterwards.
    compressors : "auto" or None or codecs
        :func:`dgemm.matmul`'s ``compressors`` for the output (``None``: uncompressed).
    storage_options : dict, optional
        For paths on S3.
    before_each : callable, optional
        Runs before each repetition, untimed (``--cold``: the inputs out of
        the page cache); what it returns goes to the entry's ``cold`` list.
    op : {"matmul", "gram", "projection"}
        The call (:func:`dgemm.benchmarks.shapes.call_dgemm`): ``"gram"``
        times ``dgemm.gemm(a, a, trans_a=True)`` (``b_path`` is ``a_path``),
        C = X^T X of ``m x n`` = ``n x n``, k the rows of X.

    Returns
    -------
    dict
        The wall times, TFLOPS, the sampled check, the workers' counter
        deltas and their sum, the time split, bytes moved, peak memory and
        the output's ``dgemm`` attributes (plan, dgemm's own seconds).
    """
    from dgemm.benchmarks.shapes import call_dgemm

    before = client.run(worker_probe, workers=workers)
    times, cold = [], []
    with MemorySampler([p["pid"] for p in before.values()]) as mem:
        for _ in range(reps):
            # each repetition writes a new out: removing the last one is not part of the product
            remove_array(out_path, storage_options)
            if before_each is not None:
                cold.append(before_each())
            t0 = time.perf_counter()
            call_dgemm(op, a_path, b_path, out_path, client=client, compressors=compressors,
                       **_matmul_options(storage_options))
            times.append(time.perf_counter() - t0)
    after = client.run(worker_probe, workers=workers)
    seconds = float(np.median(times))
    per_worker = {}
    for addr, p in after.items():
        old = before.get(addr, {"counters": {}, "pid": None})
        per_worker[addr] = {"device": p["device"], "pid": p["pid"], "restarted": p["pid"] != old["pid"],
                            "counters": counter_delta(old["counters"], p["counters"]),
                            # levels such as cache_bytes read better as they are than as deltas
                            "after": p["counters"], "rss_peak_bytes": mem.rss_peak.get(p["pid"])}
    total = sum_counters([w["counters"] for w in per_worker.values()])
    zc = open_zarr(out_path, storage_options)
    attrs = dict(zc.attrs).get("dgemm", {})
    check = check_stored(a_path, b_path, out_path, storage_options, op)
    entry = {
        "op": op, "m": m, "n": n, "k": k, "workers": len(workers), "reps": reps, "times": times, "seconds": seconds,
        "tflops": tflops(flops(m, n, k), seconds), "dgemm_seconds": attrs.get("seconds"),
        "check": check, "ok": check["passed"], "status": "ok" if check["passed"] else "FAILED",
        "counters": {"per_worker": per_worker, "total": total,
                     "after_total": sum_counters([w["after"] for w in per_worker.values()])},
        "split": time_split(total, sum(times), len(workers)),
        "bytes": _bytes(total, out_path, m, n, k, zc.dtype.itemsize, reps, storage_options, op),
        "memory": mem.result(), "plan": attrs.get("plan"), "attrs": attrs,
        "output_compressors": [c.to_dict() for c in zc.compressors],
        "cold": cold or None,
    }
    if not keep:
        remove_array(out_path, storage_options)
    return entry


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


def kernel_rate(dtype: str, m: int, n: int, k: int, reps: int, seed: int) -> dict:
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


# -- the cluster ----------------------------------------------------------------------------
def warm_up(client, workers: list[str], dtype: str, folder, block_bytes: int = 0, copy: bool = False,
            op: str = "matmul") -> float:
    """Build every worker's kernels and run one small product, so the timed runs compile nothing.

    The product is written into ``folder`` (a local folder or a
    :class:`~dgemm.benchmarks.objectstore.Location`), so on S3 the workers
    have their S3 client before the timed runs, as their kernels.  With
    ``block_bytes``, each reader thread (of the copy pool where ``copy``:
    raw inputs) also pins its staging buffer of that size, as a warm
    cluster that ran this block size before has it: else a single timed
    repetition pins them inside its time.  ``op="gram"`` runs a small Gram
    product (``gemm(x, x, trans_a=True)``) as the timed runs do.  Returns the
    seconds it took.
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
    if op == "gram":
        dgemm.gemm(a, a, trans_a=True, out=os.fspath(out), overwrite=True, client=client, **_matmul_options(so))
    else:
        dgemm.matmul(a, b, out=os.fspath(out), overwrite=True, client=client, **_matmul_options(so))
    remove_array(out, so)
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
    """``client``, or a new :class:`DeviceCluster` (closed on exit) with its client and start time.

    Yields ``(client, seconds)``: the seconds the new cluster took to start
    with all its workers, or None for a given ``client`` (not closed).
    """
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


# -- dask.array ------------------------------------------------------------------------------
def time_dask(a_path, b_path, out_path, reps: int = 1, cupy=None, compressors="auto", keep: bool = False,
              pids=(), storage_options: dict | None = None, before_each: Callable[[], dict] | None = None,
              op: str = "matmul") -> dict:
    """Time dask.array's ``A @ B`` (``X.T @ X`` for ``op="gram"``) from Zarr to Zarr on the threaded scheduler,
    and check the result.

    Parameters
    ----------
    a_path, b_path, out_path : str or os.PathLike
        The inputs and the output (local paths or URLs).
    reps : int
        Timed repetitions; the median counts.
    cupy : module, optional
        With it, the blocks are moved to the GPU (``map_blocks(cupy.asarray)``)
        and back (``map_blocks(cupy.asnumpy)``); the GPU memory pool is
        freed after every repetition.
    compressors : "auto" or None or codecs
        The output's codecs (dgemm's, for a like-with-like write); its chunks
        are the inputs'.
    keep : bool
        Keep the output; otherwise it is removed afterwards.
    pids : iterable of int
        Processes whose memory is sampled (default: this one).
    storage_options, before_each, op
        As for :func:`time_dgemm` (:func:`dgemm.benchmarks.shapes.dask_product`).

    Returns
    -------
    dict
        The wall times, TFLOPS, the sampled check, the output's bytes stored
        and peak memory.
    """
    import dask.array as da
    import zarr

    from dgemm.benchmarks.shapes import dask_product

    za, zb = (open_zarr(p, storage_options) for p in (a_path, b_path))
    dtype = np.result_type(za.dtype, zb.dtype)
    A, B = da.from_zarr(za), da.from_zarr(zb)
    if cupy is not None:
        A = A.map_blocks(cupy.asarray, dtype=za.dtype, meta=cupy.empty((0, 0), za.dtype))
        B = B.map_blocks(cupy.asarray, dtype=zb.dtype, meta=cupy.empty((0, 0), zb.dtype))
        _cupy_warm_up(cupy, dtype)
    C = dask_product(op, A, B)
    if cupy is not None:
        C = C.map_blocks(cupy.asnumpy, dtype=dtype, meta=np.empty((0, 0), dtype))
    times, cold = [], []
    extra = {"storage_options": storage_options} if storage_options and is_remote(out_path) else {}
    with MemorySampler(pids or [os.getpid()]) as mem:
        for _ in range(reps):
            # each repetition writes a new out: removing the last one is not part of the product
            remove_array(out_path, storage_options)
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
                free_cupy(cupy)
    m, n = C.shape
    k = za.shape[0] if op == "gram" else za.shape[1]
    seconds = float(np.median(times))
    check = check_stored(a_path, b_path, out_path, storage_options, op)
    entry = {"op": op, "m": m, "n": n, "k": k, "reps": reps, "times": times, "seconds": seconds,
             "tflops": tflops(flops(m, n, k), seconds), "scheduler": "threads", "chunks": list(C.chunksize),
             "check": check, "ok": check["passed"], "output_on_disk": stored_bytes(out_path, storage_options),
             "memory": mem.result(), "cold": cold or None}
    if not keep:
        remove_array(out_path, storage_options)
    return entry


def _cupy_warm_up(cupy, dtype) -> None:
    """cuBLAS's handle and cupy's kernels are made on first use: not in the timed run."""
    x = cupy.ones((256, 256), dtype=dtype)
    cupy.asnumpy((x @ x).sum())
    del x
    free_cupy(cupy)


def free_cupy(cupy) -> None:
    """Wait for the GPU, then give back cupy's memory pools (device and pinned)."""
    cupy.cuda.Device().synchronize()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()

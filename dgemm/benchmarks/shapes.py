"""The shapes users bring to ``dgemm bench e2e --op``: a Gram matrix and a projection, beside C = A @ B.

Issue 27's targets: a Gram matrix ``C = X^T X`` (X written once and passed
as both operands, ``dgemm.gemm(X, X, trans_a=True)``; dask.array computes
``X.T @ X``) and a projection ``C = X @ W`` with a small W, on zstd files,
each at least 3x dask.array + cupy on the same files and within 0.85 of the
floor of reading and decoding the inputs once.  This module holds what the
benchmark does differently per operation:

* :func:`op_mnk`, :func:`operands`, :func:`expression`, :func:`op_detail`:
  the product's ``(m, n, k)`` (C is m x n, the depth k), the arrays the
  inputs are, and the record's words;
* :func:`call_dgemm` and :func:`dask_product`: dgemm's call and dask.array's
  expression of the operation;
* :func:`check_op`: the sampled check of a stored C against numpy float64 (a
  Gram product's symmetry too, :func:`check_gram`);
* :func:`io_rates` and :func:`io_floor`: the store's raw read rate of the
  input files and the input codec's decode rate, both on every core of this
  host, measured on the run's own inputs; the read-and-decode floor from them
  (plus the kernel and C's encoding) beside each timed figure
  (:func:`add_io_floor`, :func:`io_floor_lines`).
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dgemm.accuracy import check_sample, entry_errors, sample_indices, tolerance, worst

OPS = ("matmul", "gram", "projection")
PROJECTION_WIDTH = 256          # W's columns of a projection given by --size alone
CHECK_SAMPLES = 16              # rows and columns of C checked


# -- what each operation is -----------------------------------------------------------------
def check_shape(op: str, shape) -> tuple[int, ...] | None:
    """``shape`` as positive integers, as ``op`` takes it: gram X's ``(M, N)``; matmul and projection ``(M, N, K)``.

    >>> check_shape("gram", [8, 4]), check_shape("projection", (8, 2, 4))
    ((8, 4), (8, 2, 4))
    >>> check_shape("gram", (8, 4, 2))
    Traceback (most recent call last):
    ...
    ValueError: shape of --op gram must be X's two sizes M, N (C = X^T X is N x N), not (8, 4, 2)
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, not {op!r}")
    if shape is None:
        return None
    vals = tuple(int(x) for x in shape)
    want = 2 if op == "gram" else 3
    if len(vals) != want or min(vals) < 1:
        if op == "gram":
            raise ValueError(f"shape of --op gram must be X's two sizes M, N (C = X^T X is N x N), not {shape!r}")
        raise ValueError(f"shape must be three positive integers M, N, K, not {shape!r}")
    return vals


def op_mnk(op: str, shape, size: int) -> tuple[int, int, int]:
    """The product's ``(m, n, k)``: C is m x n, summed over k.

    gram: X of ``shape`` ``(M, N)`` (or ``size`` x ``size``) gives ``(N, N, M)``;
    projection: ``shape`` ``(M, N, K)``, X M x K and W K x N (by ``size``:
    W of :data:`PROJECTION_WIDTH` columns); matmul: ``shape``, or ``size`` cubed.

    >>> op_mnk("gram", (1000, 64), 0), op_mnk("projection", None, 1024), op_mnk("matmul", None, 7)
    ((64, 64, 1000), (1024, 256, 1024), (7, 7, 7))
    """
    if shape is not None:
        if op == "gram":
            m, n = shape
            return n, n, m
        return tuple(shape)
    if op == "projection":
        return size, min(PROJECTION_WIDTH, size), size
    return size, size, size


def operands(op: str, m: int, n: int, k: int) -> dict:
    """The arrays the inputs are: ``{name: (file stem, shape)}``; a Gram product's A and B are one X.

    >>> operands("gram", 4, 4, 9)
    {'a': ('x', (9, 4)), 'b': ('x', (9, 4))}
    >>> operands("projection", 9, 2, 4)
    {'a': ('x', (9, 4)), 'b': ('w', (4, 2))}
    """
    if op == "gram":
        return {"a": ("x", (k, n)), "b": ("x", (k, n))}
    if op == "projection":
        return {"a": ("x", (m, k)), "b": ("w", (k, n))}
    return {"a": ("a", (m, k)), "b": ("b", (k, n))}


def input_elements(op: str, m: int, n: int, k: int) -> int:
    """Elements of the distinct inputs: X once for a Gram product.

    >>> input_elements("gram", 4, 4, 9), input_elements("matmul", 2, 3, 4)
    (36, 20)
    """
    shapes = {stem: shape for stem, shape in operands(op, m, n, k).values()}
    return sum(int(np.prod(shape)) for shape in shapes.values())


def expression(op: str) -> str:
    """What C is, in words: ``C = A @ B``, ``C = X^T X``, ``C = X @ W``."""
    return {"matmul": "C = A @ B", "gram": "C = X^T X", "projection": "C = X @ W"}[op]


def op_detail(op: str, m: int, n: int, k: int, dtype: str) -> str:
    """The record name's size part: ``32768-float32`` as before for matmul, ``gram-<M>x<N>-...`` (X's shape),
    ``projection-<M>x<N>x<K>-...``.

    >>> op_detail("gram", 64, 64, 1000, "float32"), op_detail("projection", 8, 2, 4, "float64")
    ('gram-1000x64-float32', 'projection-8x2x4-float64')
    """
    if op == "matmul":
        size = str(m) if m == n == k else f"{m}x{n}x{k}"
    elif op == "gram":
        size = f"{k}x{n}"
    else:
        size = f"{m}x{n}x{k}"
    return f"{size}-{dtype}" if op == "matmul" else f"{op}-{size}-{dtype}"


def describe(op: str, m: int, n: int, k: int) -> dict:
    """The record's words for the operation: its expression and each operand's shape."""
    ops = operands(op, m, n, k)
    return {"op": op, "expression": expression(op),
            "operands": {stem: list(shape) for stem, shape in ops.values()}, "c_shape": [m, n]}


# -- dgemm, dask.array -------------------------------------------------------------------
def call_dgemm(op: str, a_path, b_path, out, **kwargs):
    """dgemm's call for ``op``: ``gemm(X, X, trans_a=True)`` for a Gram product (the one path twice), else ``matmul``."""
    import dgemm

    if op == "gram":
        return dgemm.gemm(os.fspath(a_path), os.fspath(a_path), trans_a=True, out=os.fspath(out), **kwargs)
    return dgemm.matmul(os.fspath(a_path), os.fspath(b_path), out=os.fspath(out), **kwargs)


def dask_product(op: str, A, B):
    """dask.array's expression of ``op`` on the inputs' arrays: ``X.T @ X`` for a Gram product, else ``A @ B``."""
    if op == "gram":
        return A.T @ A
    return A @ B


# -- the check -----------------------------------------------------------------------------
def check_op(op: str, a, b, c, n_samples: int = CHECK_SAMPLES) -> dict:
    """The sampled check of a stored ``c`` (zarr arrays or numpy) against numpy float64.

    C's shape first (a wrong one fails without reading it); then matmul and
    projection as :func:`dgemm.accuracy.check_sample`, a Gram product as
    :func:`check_gram` (``a`` is X; ``b`` is ignored).
    """
    if op == "gram":
        want = (a.shape[1], a.shape[1])
    else:
        want = (a.shape[0], b.shape[1])
    if tuple(c.shape) != want:
        return {"entries": 0, "max_rel_err": float("inf"), "tolerance": None, "passed": False,
                "shape": list(c.shape), "expected_shape": list(want)}
    if op == "gram":
        return check_gram(a, c, n_samples, n_samples)
    return check_sample(a, b, c, n_rows=n_samples, n_cols=n_samples)


def _columns(x, cols) -> np.ndarray:
    """Whole columns ``cols`` of ``x`` in float64.

    A zarr array reads only the chunks holding them, a slab of chunk rows
    (shard rows) per task on every core: a tall X (the issue's is 16 GiB,
    each chunk holding every column) is decoded whole, once.
    """
    if not hasattr(x, "get_orthogonal_selection"):
        return np.asarray(np.asarray(x)[:, cols], dtype=np.float64)
    k = x.shape[0]
    step = (getattr(x, "shards", None) or x.chunks)[0]
    slabs = [(r, min(r + step, k)) for r in range(0, k, step)] or [(0, 0)]
    with ThreadPoolExecutor(max(1, min(len(slabs), os.cpu_count() or 1))) as pool:
        parts = list(pool.map(lambda s: np.asarray(x.get_orthogonal_selection((slice(*s), cols)), np.float64),
                              slabs))
    return np.concatenate(parts)


def _entries(c, rows, cols) -> np.ndarray:
    got = c.get_orthogonal_selection((rows, cols)) if hasattr(c, "get_orthogonal_selection") \
        else np.asarray(c)[np.ix_(rows, cols)]
    return np.asarray(got, dtype=np.float64)


def check_gram(x, c, n_rows: int = 8, n_cols: int = 8, seed: int = 0) -> dict:
    """Check ``c = x^T x`` where sampled rows and columns cross, and that ``c`` is symmetric there.

    Reads whole columns of ``x`` (the sampled ones: C[i, j] is column i of
    X against column j) and the entries ``c[rows, cols]`` and their mirror
    ``c[cols, rows]``.  Both are measured as :func:`dgemm.accuracy.entry_errors`
    against ``|X_i|^T |X_j|``: ``max_rel_err`` against the float64 product,
    ``symmetry_err`` between an entry and its mirror; either above the
    tolerance fails.  ``exactly_symmetric`` says whether the mirror is
    bit for bit the same (dgemm mirrors one triangle; a peer need not).

    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((50, 12))
    >>> r = check_gram(x, x.T @ x)
    >>> r["passed"], r["exactly_symmetric"], r["entries"]
    (True, True, 64)
    >>> bad = x.T @ x
    >>> bad[0, 11] += 1
    >>> check_gram(x, bad)["passed"]
    False
    """
    rng = np.random.default_rng(seed)
    k, n = x.shape
    rows, cols = sample_indices(n, n_rows, rng), sample_indices(n, n_cols, rng)
    both = np.union1d(rows, cols)
    xs = _columns(x, both)
    xr, xc = xs[:, np.searchsorted(both, rows)], xs[:, np.searchsorted(both, cols)]
    ref, scale = xr.T @ xc, np.abs(xr).T @ np.abs(xc)
    got, mirror = _entries(c, rows, cols), _entries(c, cols, rows).T
    err, sym = worst(entry_errors(got, ref, scale)), worst(entry_errors(mirror, got, scale))
    tol = tolerance(np.result_type(x.dtype, c.dtype), k)
    return {"entries": int(got.size), "max_rel_err": err, "symmetry_err": sym,
            "exactly_symmetric": bool(np.array_equal(got, mirror)), "tolerance": tol,
            "passed": bool(err <= tol and sym <= tol)}


# -- the read-and-decode floor ----------------------------------------------------------------
def _gbps(nbytes: int, seconds: float) -> float | None:
    return nbytes / seconds / 1e9 if seconds > 0 else None


def _timed(threads: int, warm, work, items) -> float | None:
    """GB/s of ``sum(work(item))`` over ``items`` on a pool of ``threads``, after every thread ran ``warm()``.

    Each thread's buffers and codec contexts are made (and their pages
    touched) before the clock starts, as a warm worker's reader threads
    already have theirs.
    """
    barrier = threading.Barrier(threads)

    def first(_):
        warm()
        barrier.wait(timeout=120)      # one warm-up on each thread of the pool, not two on one

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(first, range(threads)))
        t0 = time.perf_counter()
        total = sum(pool.map(work, items))
        return _gbps(total, time.perf_counter() - t0)


def file_read_rate(path, threads: int, count: int | None = None) -> tuple[float | None, int]:
    """GB/s reading whole files of the local Zarr array at ``path`` (its chunk or shard files, no decoding)
    with ``threads`` threads; and the files read (the largest ``count``, default ``2 * threads``, at least 8)."""
    from dgemm.benchmarks.pagecache import files_under

    files = sorted(((os.path.getsize(f), f) for f in files_under([os.fspath(path)])
                    if os.path.basename(f) not in ("zarr.json", ".zarray", ".zattrs", ".zgroup")), reverse=True)
    files = files[:count or max(2 * threads, 8)]
    if not files:
        return None, 0
    local = threading.local()

    def warm():
        local.buf = bytearray(files[0][0])      # the largest file's size; zeroed, so its pages are touched

    def read(item):
        size, name = item
        view, done = memoryview(local.buf)[:size], 0
        fd = os.open(name, os.O_RDONLY)
        try:
            while done < size:
                got = os.preadv(fd, [view[done:]], done)
                if not got:
                    break
                done += got
        finally:
            os.close(fd)
        return done

    return _timed(threads, warm, read, files), len(files)


def decode_rate(arr, threads: int, count: int | None = None) -> tuple[float | None, str]:
    """GB/s (decoded bytes) of the array's codec decoding its chunks on ``threads`` threads, and how.

    The chunks (inner chunks of a shard) are X's first ones, read through
    zarr and encoded with the array's own codec steps
    (:func:`dgemm.storage.chunks.layout`: libzstd for zstd, as dgemm's reader
    decodes), untimed; then ``count`` decodes (default ``2 * threads``, at
    least 8) into each thread's reused buffer, as the reader decodes into its
    staging.  ``(None, why)`` for raw chunks (nothing to decode) or a layout
    dgemm's reader leaves to zarr.
    """
    from dgemm.storage.chunks import Unsupported, layout

    try:
        lay = layout(arr)
    except Unsupported as e:
        return None, f"left to zarr ({e})"
    if not lay.steps:
        return None, "raw chunks: nothing to decode"
    if not all(getattr(s, "encodes", True) for s in lay.steps):
        return None, "a codec dgemm cannot encode as zarr does"
    (m, n), (cr, cc) = arr.shape, lay.chunk
    cells = [(i, j) for i in range(0, m, cr) for j in range(0, n, cc)][:max(1, min(threads, 64))]
    dtype = np.dtype(arr.dtype)

    def encode(ij):
        i, j = ij
        block = np.zeros((cr, cc), lay.dtype)      # an edge chunk is stored whole, padded
        part = np.asarray(arr[i:i + cr, j:j + cc])
        block[:part.shape[0], :part.shape[1]] = part
        buf = block
        for step in reversed(lay.steps):
            buf = np.array(np.frombuffer(memoryview(step.encode(buf)).cast("B"), np.uint8))   # a copy: transient
        return buf

    with ThreadPoolExecutor(threads) as pool:
        frames = list(pool.map(encode, cells))
    local = threading.local()
    nbytes = cr * cc * dtype.itemsize

    def decode(i):
        out = local.out
        buf = frames[i % len(frames)]
        for n_, step in enumerate(lay.steps):
            buf = step.decode(buf, out if n_ == len(lay.steps) - 1 else None, "decode rate")
        return nbytes

    def warm():
        local.out = np.zeros(nbytes, np.uint8)
        decode(0)          # the thread's codec context, made on its first decode

    rate = _timed(threads, warm, decode, range(count or max(2 * threads, 8)))
    return rate, ", ".join(map(repr, lay.steps))


def io_rates(record: dict, storage_options: dict | None = None, log=None) -> dict:
    """The input files' raw read rate and the input codec's decode rate, each on every core of this host.

    On the run's own inputs (each distinct input file, ``record["inputs"]``):
    ``read_gbps`` (stored bytes per second; with ``cold``, the files dropped
    from the page cache first; on S3, the server's best raw GET of
    ``record["object_store"]``) and ``decode_gbps`` (decoded bytes per
    second, None for raw chunks).  Measured on ``threads`` = the host's CPUs.
    """
    from dgemm.benchmarks import pagecache
    from dgemm.benchmarks.objectstore import open_zarr

    threads = os.cpu_count() or 1
    ins = record["inputs"]
    x = ins["a"]
    out: dict = {"threads": threads, "array": x["path"]}
    if record.get("store_kind") == "s3":
        out["read_gbps"] = ((record.get("object_store") or {}).get("get") or {}).get("best_gbps")
        out["read_source"] = "object GET (best over threads)"
    else:
        if record.get("cold"):
            out["cold_drop"] = pagecache.drop([x["path"]])
        out["read_gbps"], out["read_files"] = file_read_rate(x["path"], threads)
        out["read_source"] = "whole chunk files, no decoding" + (", cold" if record.get("cold") else "")
    out["decode_gbps"], out["decode_codec"] = decode_rate(open_zarr(x["path"], storage_options), threads)
    if log:
        log(f"input files on {threads} threads: read {_num(out['read_gbps'])} GB/s, decode "
            f"{_num(out['decode_gbps'])} GB/s ({out['decode_codec']})")
    return out


def _num(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def io_floor(stored_bytes: float | None, input_bytes: float, rates: dict, kernel_flops: float,
             kernel_tflops: float | None, workers: int, output_bytes: float, encode_gbps: float | None) -> dict:
    """The read-and-decode floor of one product: its inputs read once and decoded once on the host's cores,
    plus the kernel and C's encoding.

    ``read`` = stored bytes at the raw read rate, ``decode`` = decoded
    bytes at the decode rate (0 for raw chunks), ``kernel`` = the flops
    dgemm ran at the in-memory kernel rate over ``workers`` devices,
    ``encode`` = C's bytes at the encode rate on every core (0 for a raw
    C).  ``seconds`` is their sum (the host's read and decode share its
    cores); ``overlapped_seconds`` the lower bound where the kernel hides
    behind the host's work.  None where the read rate is missing.

    >>> f = io_floor(8e9, 10e9, {"read_gbps": 8.0, "decode_gbps": 5.0}, 2e12, 10.0, 1, 1e9, 2.0)
    >>> f["seconds"], [round(f["parts"][k], 3) for k in ("read", "decode", "kernel", "encode")]
    (3.7, [1.0, 2.0, 0.2, 0.5])
    """
    read = rates.get("read_gbps")
    decode = rates.get("decode_gbps")
    parts = {"read": stored_bytes / (read * 1e9) if read and stored_bytes else None,
             "decode": input_bytes / (decode * 1e9) if decode else 0.0,
             "kernel": kernel_flops / (kernel_tflops * 1e12) / max(workers, 1) if kernel_tflops else None,
             "encode": output_bytes / (encode_gbps * 1e9) if encode_gbps else 0.0}
    ok = parts["read"] is not None and parts["kernel"] is not None
    host = parts["read"] + parts["decode"] + parts["encode"] if ok else None
    return {"seconds": host + parts["kernel"] if ok else None,
            "overlapped_seconds": max(host, parts["kernel"]) if ok else None,
            "read_and_decode_seconds": parts["read"] + parts["decode"] if ok else None,
            "parts": parts, "bytes": {"stored": stored_bytes, "decoded": input_bytes, "output": output_bytes},
            "kernel_flops": kernel_flops, "rates": {"read_gbps": read, "decode_gbps": decode,
                                                     "kernel_tflops": kernel_tflops, "encode_gbps": encode_gbps}}


def _stored(ins: dict) -> float | None:
    """Stored bytes of the distinct inputs (X once for a Gram product)."""
    paths = {ins[x]["path"]: ins[x].get("bytes_on_disk") for x in ("a", "b")}
    return None if None in paths.values() else float(sum(paths.values()))


def _decoded(ins: dict) -> float:
    return float(sum({ins[x]["path"]: ins[x]["bytes"] for x in ("a", "b")}.values()))


def _best(rates: dict | None) -> float | None:
    vals = [v for v in (rates or {}).values() if v]
    return max(vals) if vals else None


def add_io_floor(record: dict) -> dict | None:
    """The read-and-decode floor beside each end-to-end figure (dgemm's and the peers'), in ``record["io_floor"]``.

    One floor per size (the full one, the dask.array + numpy size), each
    with each timed run's ``seconds / floor`` (``over_floor``; issue 27's
    target is ``floor_fraction`` = floor / seconds >= 0.85 for dgemm).
    None without the input rates (``record["io_rates"]``).
    """
    rates = record.get("io_rates")
    if not rates:
        return None
    itemsize = np.dtype(record["dtype"]).itemsize
    encode = None if record.get("compressors") is None else _best((record.get("host_rates") or {}).get("encode_gbps"))
    kernel = (record.get("kernel") or {}).get("tflops")
    peers = record.get("peers") or {}
    out = {"definition": "inputs read once (stored bytes at the raw read rate) + decoded once (at the decode rate), "
                         "both on every core; + dgemm's flops at its in-memory kernel rate over the devices; "
                         "+ C encoded on every core", "rates": rates}
    small_is_full = bool(record.get("small_is_full"))
    full_runs = [("dgemm", record.get("dgemm")), ("dask_cupy", peers.get("dask_cupy"))]
    if small_is_full:       # the dask.array + numpy peer ran at the full size
        full_runs.append(("dask_numpy", peers.get("dask_numpy")))
    sizes = [("full", record.get("inputs"), full_runs)]
    if not small_is_full and record.get("inputs_small"):
        sizes.append(("small", record["inputs_small"], [("dgemm_small", record.get("dgemm_small")),
                                                        ("dask_numpy", peers.get("dask_numpy"))]))
    for size, ins, runs in sizes:
        if not ins:
            continue
        d = runs[0][1] or {}
        m, n, k = (d["m"], d["n"], d["k"]) if d.get("m") else (record["m"], record["n"], record["k"])
        # the flops the workers ran (a Gram's triangle), over the timed repetitions: one product's
        done = (((d.get("counters") or {}).get("total") or {}).get("flops") or 0.0) / max(int(d.get("reps") or 1), 1) \
            or 2.0 * m * n * k
        f = io_floor(_stored(ins), _decoded(ins), rates, done, kernel, record.get("workers") or 1,
                     m * n * itemsize, encode)
        f["m"], f["n"], f["k"], f["runs"] = m, n, k, {}
        for name, r in runs:
            sec = (r or {}).get("seconds")
            if sec and f["seconds"]:
                f["runs"][name] = {"seconds": sec, "over_floor": sec / f["seconds"], "floor_fraction": f["seconds"] / sec}
        out[size] = f
    return out


def io_floor_lines(record: dict) -> list[str]:
    """The read-and-decode floor and each run against it, in words (:func:`dgemm.benchmarks.report.format_table`)."""
    fl = record.get("io_floor") or {}
    lines = []
    for size in ("full", "small"):
        f = fl.get(size)
        if not f or not f.get("seconds"):
            continue
        p, b, r = f["parts"], f["bytes"], f["rates"]
        lines.append(f"read-and-decode floor ({f['m']}x{f['n']}x{f['k']}, inputs read once): read {b['stored'] / 1e9:.3g} GB at "
                     f"{_num(r['read_gbps'])} GB/s {p['read']:.3g} s + decode {b['decoded'] / 1e9:.3g} GB at "
                     f"{_num(r['decode_gbps'])} GB/s {p['decode']:.3g} s + kernel {p['kernel']:.3g} s + encode C "
                     f"{p['encode']:.3g} s = {f['seconds']:.3g} s; " + "; ".join(
                         f"{name} {v['seconds']:.3g} s = {v['over_floor']:.3g} x the floor ({v['floor_fraction']:.2f} of it)"
                         for name, v in f["runs"].items()))
    return lines

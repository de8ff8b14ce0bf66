"""What an end-to-end record says: its name, its ratios, and its table.

* :func:`result_detail` and :func:`input_detail`: the parts of the record's
  file name (:func:`dgemm.benchmarks.records.result_path`) that tell runs
  apart: size, dtype, how the inputs were encoded;
* :func:`ratios`: dgemm's rate over each peer's and over its own kernel's;
* :func:`format_table`: the record as text, one line per timed run, then
  the ratios, the host's rates, the time split, ``dgemm plan``'s floor,
  memory, the scaling table and the first call;
* the words the run prints as it goes (:func:`fmt`, :func:`bytes_text`,
  :func:`threads_text`, :func:`inputs_text`, :func:`floor_text`,
  :func:`error_text`).
"""
from __future__ import annotations

from dgemm.benchmarks.measure import SPLIT_KEYS
from dgemm.benchmarks.shapes import io_floor_lines


# -- the record's name ----------------------------------------------------------------------
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


# -- ratios -----------------------------------------------------------------------------------
def _ratio(x: dict | None, y: dict | None) -> float | None:
    if not x or not y or not x.get("tflops") or not y.get("tflops"):
        return None
    return x["tflops"] / y["tflops"]


def ratios(record: dict) -> dict:
    """dgemm's TFLOPS over each peer's and over its kernel's in memory (None where either is missing).

    The small-size comparison with dask.array + numpy uses the main run
    when it was already at that size.

    >>> r = ratios({"dgemm": {"tflops": 2.0}, "kernel": {"tflops": 4.0}, "workers": 2, "peers": {}})
    >>> r["dgemm_to_kernel"], r["dgemm_per_device_to_kernel"], r["dgemm_to_cublas"]
    (0.5, 0.25, None)
    """
    d, peers = record.get("dgemm"), record.get("peers") or {}
    kern = record.get("kernel")
    workers = record.get("workers") or 1
    per_device = {"tflops": d["tflops"] / workers} if d and d.get("tflops") else None
    return {"dgemm_to_dask_cupy": _ratio(d, peers.get("dask_cupy")),
            "dgemm_to_kernel": _ratio(d, kern),
            "dgemm_per_device_to_kernel": _ratio(per_device, kern),
            "dgemm_to_cublas": _ratio(d, peers.get("cublas")),
            "dgemm_small_to_dask_numpy": _ratio(record.get("dgemm_small") or d, peers.get("dask_numpy"))}


# -- words --------------------------------------------------------------------------------------
def fmt(x, spec: str, missing: str = "-") -> str:
    """``format(x, spec)``, or ``missing`` for None.

    >>> fmt(1.23456, ".3g"), fmt(None, ".3g")
    ('1.23', '-')
    """
    return missing if x is None else format(x, spec)


def bytes_text(n: float) -> str:
    """Bytes as dask writes them.

    >>> bytes_text(3 * 2**30)
    '3.00 GiB'
    """
    from dask.utils import format_bytes
    return format_bytes(int(n))


def error_text(e: BaseException) -> str:
    """An exception as one line of at most 400 characters, its type first.

    >>> error_text(ValueError("no\\n  such   thing"))
    'ValueError: no such thing'
    """
    return f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"


def threads_text(rates: dict | None) -> str:
    """``{threads: GB/s}`` in words.

    >>> threads_text({"1": 1.2, "4": 3.4}), threads_text(None)
    ('1.2 (1 thr), 3.4 (4 thr)', '-')
    """
    return ", ".join(f"{fmt(v, '.3g')} ({t} thr)" for t, v in (rates or {}).items()) or "-"


def inputs_text(record: dict) -> str:
    """The inputs' encoding in words.

    >>> inputs_text({"input_codec": "default", "input_zarr_format": 3, "shards": 16384})
    "zarr's default codec, Zarr v3, shards 16384"
    """
    codec = {"raw": "raw chunks", "default": "zarr's default codec"}.get(record["input_codec"], record["input_codec"])
    return (f"{codec}, Zarr v{record['input_zarr_format']}"
            + (f", shards {record['shards']}" if record.get("shards") else ""))


def floor_text(d: dict) -> str:
    """``dgemm plan``'s floor (default and measured rates) beside the measured time, in words.

    ``d`` is the main run's entry, with its ``floor``
    (:func:`dgemm.benchmarks.floor.add_floor`): a line of the floors, then
    one line of rates and the busiest worker's times per set of rates.
    """
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
            f"  {name}: read {fmt(r['read'] and r['read'] / 1e9, '.3g', 'unbounded')}, "
            f"write {fmt(r['write'] and r['write'] / 1e9, '.3g', 'unbounded')}, PCIe {r['pcie'] / 1e9:.3g} GB/s, "
            + (f"kernel {r['flops'] / 1e12:.3g} TFLOPS" if r.get("flops") else "kernel not counted")
            + "; busiest worker: " + ", ".join(f"{k} {v:.3g} s" for k, v in (busiest.get("seconds") or {}).items())
            + f", fill {busiest.get('fill', 0):.2g} s, drain {busiest.get('drain', 0):.2g} s")
    blocks = "x".join(map(str, f.get("block", [])))
    return "\n".join(["dgemm plan's floor: " + "; ".join(heads) + f"; measured {fmt(d.get('seconds'), '.3g')} s "
                      f"(blocks {blocks}, {f.get('tasks')} GEMM tasks on {f.get('workers')} worker(s))", *details])


def _row(name: str, r: dict | None, why: str | None = None) -> str:
    if r is None:
        return f"{name:26} not timed: {why}"
    if r.get("error"):
        return f"{name:26} ERROR {r['error']}"
    size = f"{r['m']}x{r['n']}x{r['k']}"
    check = r.get("check")
    err = check["max_rel_err"] if check else r.get("rel_err")
    status = ("ok" if r.get("ok", True) else "FAILED") if "ok" in r else ""
    return (f"{name:26} {size:>20} {fmt(r.get('seconds'), '10.4g'):>10} {fmt(r.get('tflops'), '9.4g'):>9} "
            f"{fmt(err, '8.2g'):>8}  {status}")


def _server_words(record: dict) -> str:
    server = ((record.get("object_store") or {}).get("server")) or {}
    return f" (S3 at {server.get('endpoint')}: {server.get('server')})" if server else ""


def _cold_words(drops: list[dict]) -> str:
    """What ``--cold`` dropped before a run's repetitions, in words."""
    def b(x):
        return "?" if x is None else bytes_text(x)
    first = drops[0]
    when = "before the timed run" if len(drops) == 1 else f"before each of {len(drops)} repetitions"
    return (f"{when} the inputs ({first['files']} files, {b(first['bytes'])}) "
            f"were dropped from the page cache: " + "; ".join(
                f"{b(x['cached_before'])} cached before, {b(x['cached_after'])} after" for x in drops))


# -- the table ----------------------------------------------------------------------------
def format_table(record: dict) -> str:
    """The record as text: one line per timed run, then ratios, time split, memory and scaling.

    Parameters
    ----------
    record : dict
        An end-to-end record (:func:`dgemm.benchmarks.e2e.e2e_bench`),
        finished or not: what it lacks is left out.

    Returns
    -------
    str
        Lines ending with ``result: OK`` or the number of failures.
    """
    lines = [f"device(s): {record.get('device')} x{record.get('workers')} ({record.get('device_type')}, "
             f"driver {record.get('driver')}); commit {record['commit']}"
             f"{' (modified)' if record.get('commit_dirty') else ''}; {record['date']}",
             f"{record.get('expression', 'C = A @ B')}, {record['m']} x {record['n']} x {record['k']} {record['dtype']}, "
             f"chunks {record['chunks']}, "
             f"reps {record['reps']}; store {record['store']}" + _server_words(record)]
    ins = record.get("inputs")
    if ins:
        distinct = {ins[x].get("stem", x): ins[x]["bytes"] for x in "ab"}    # a Gram product's X once
        lines.append("inputs: " + ", ".join(f"{stem.upper()} {bytes_text(b)}" for stem, b in distinct.items())
                     + (f" ({inputs_text(record)})" if "input_codec" in record else "")
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
    lines.append("ratios: " + "; ".join(f"{name} {fmt(r.get(key), '.3g')}" for name, key in (
        ("dgemm/dask+cupy", "dgemm_to_dask_cupy"), ("dgemm/kernel", "dgemm_to_kernel"),
        ("dgemm per device/kernel", "dgemm_per_device_to_kernel"), ("dgemm/cuBLAS", "dgemm_to_cublas"),
        ("dgemm/dask+numpy (small)", "dgemm_small_to_dask_numpy"))))
    lines += _rates_lines(record)
    lines += _run_lines(record.get("dgemm") or {})
    lines += io_floor_lines(record)
    lines += _scaling_lines(record.get("scaling"))
    lines += _first_call_lines(record.get("first_call"))
    for e in record.get("errors", []):
        lines.append(f"error in {e['stage']}: {e['error']}")
    n_failed = record.get("failures")
    lines.append("result: OK" if n_failed == 0 else f"result: {n_failed} FAILURE(S)")
    return "\n".join(lines)


def _rates_lines(record: dict) -> list[str]:
    """The host's store and bus rates, and the object store's raw ones."""
    lines = []
    hr = record.get("host_rates")
    if hr:
        copy = hr.get("copy_gbps") or {}
        parts = [f"{name} " + threads_text(hr[key]) for key, name in (
            ("read_gbps", "store read (zarr)"), ("reader_gbps", "store read (dgemm's reader)"),
            ("read_cold_gbps", "cold (zarr)"), ("reader_cold_gbps", "cold (dgemm's reader)"),
            ("write_gbps", "store write")) if hr.get(key)]
        parts.append(f"upload {fmt(copy.get('upload_pageable'), '.3g')} pageable, "
                     f"{fmt(copy.get('upload_pinned'), '.3g')} pinned; download "
                     f"{fmt(copy.get('download_pageable'), '.3g')}" if copy else f"copies: {hr.get('copy_skipped')}")
        lines.append("host rates, GB/s: " + "; ".join(parts))
    obj = record.get("object_store") or {}
    if obj.get("get") or obj.get("put"):
        lines.append("object store, GB/s (raw whole objects, boto3): GET "
                     + threads_text((obj.get("get") or {}).get("gbps"))
                     + "; PUT " + threads_text((obj.get("put") or {}).get("gbps")))
    return lines


def _run_lines(d: dict) -> list[str]:
    """The main dgemm run: its time split, floor, cold drops, bytes and peak memory."""
    lines = []
    if d.get("split"):
        sp = d["split"]
        parts = [f"{k.removesuffix('_seconds')} {v:.3g} s ({fmt(sp['share'][k], '.0%')})"
                 for k, v in sorted(sp["seconds"].items())]
        lines.append(f"dgemm time split (worker-seconds; share of wall x {sp['workers']} worker(s)): " + ", ".join(parts))
    if d.get("floor"):
        lines.append(floor_text(d))
    if d.get("cold"):
        lines.append("cold: " + _cold_words(d["cold"]))
    if d.get("bytes"):
        b = d["bytes"]
        moved = ", ".join(f"{key} {bytes_text(b[key])}" for key in ("bytes_read", "bytes_up", "bytes_down") if key in b)
        lines.append(f"dgemm bytes: inputs {bytes_text(b['inputs'])}, output {bytes_text(b['output'])} "
                     f"({bytes_text(b['output_on_disk']) if b.get('output_on_disk') is not None else '?'} on disk)"
                     + (f"; {moved}" if moved else ""))
    if d.get("memory"):
        mem = d["memory"]
        gpu = mem["gpu"]
        gpu_s = (", ".join(f"GPU {i}: {v:.0f} MiB (+{mem['gpu']['peak_added_mib'][i]:.0f})"
                           for i, v in gpu["peak_used_mib"].items()) if gpu else f"GPU: n/a ({mem['gpu_skipped']})")
        lines.append(f"dgemm peak memory: worker RSS {bytes_text(mem['rss_total_peak_bytes'])} in all; {gpu_s}")
    return lines


def _scaling_lines(rows: list[dict] | None) -> list[str]:
    """The scaling table, each row followed by its workers' time split."""
    if not rows:
        return []
    lines = [f"{'devices':>8} {'seconds':>10} {'TFLOPS':>9} {'speed-up':>9} {'efficiency':>10}"]
    for row in rows:
        lines.append(f"{row['gpus']:>8} {fmt(row['seconds'], '10.4g'):>10} {fmt(row['tflops'], '9.4g'):>9} "
                     f"{fmt(row['speedup'], '9.3g'):>9} {fmt(row['efficiency'], '10.1%'):>10}"
                     + (f"  ERROR {row['error']}" if row.get("error") else ""))
        for addr, w in (row.get("workers") or {}).items():
            lines.append(f"{'':8}   {addr}: {w.get('blocks', '?')} blocks; " + ", ".join(
                f"{k.removesuffix('_seconds')} {w[k]:.3g} s" for k in SPLIT_KEYS if k.endswith("_seconds") and k in w)
                + (f"; read {bytes_text(w['bytes_read'])}" if "bytes_read" in w else ""))
    return lines


def _first_call_lines(fc: dict | None) -> list[str]:
    """The first call from a fresh script, step by step."""
    if not fc or fc.get("seconds") is None:
        return []
    lines = [f"first call from a fresh script: {fc['seconds']:.3g} s from process start = interpreter "
             f"{fc['process_start_seconds']:.2g} s + import dgemm {fc['import_seconds']:.2g} s + matmul "
             f"{fc['matmul_seconds']:.3g} s (dgemm's own {fmt(fc.get('dgemm_seconds'), '.3g')} s); "
             f"warm + {fmt(fc.get('minus_warm_seconds'), '.3g')} s; exit {fc['exit_seconds']:.2g} s after"]
    if fc.get("cold"):
        lines.append("first call cold: " + _cold_words([fc["cold"]]))
    return lines

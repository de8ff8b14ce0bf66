"""What bounds an end-to-end run: the host's rates measured beside it, and ``dgemm plan``'s floor from them.

* :func:`time_host_rates`: the store's read and write rates on the run's
  own inputs (:func:`dgemm.benchmarks.rates.host_rates`; with ``--cold``
  the reads again with A out of the page cache), or on S3 the server's raw
  GET and PUT rates (:mod:`dgemm.benchmarks.objectstore`); and a worker's
  host-device copy rates;
* :func:`measured_rates`: those rates in :class:`dgemm.client.plan.Rates`'
  terms, beside dgemm's kernel in memory from the same run;
* :func:`plan_floor`: the plan :func:`dgemm.matmul` makes for these workers
  and inputs, and its predicted floor with ``dgemm plan``'s default rates
  and with the measured ones; :func:`add_floor` puts it beside the main
  run's time.

A rate that cannot be measured is recorded as an error, never a failure:
the benchmark goes on without it.
"""
from __future__ import annotations

import os

from dgemm.benchmarks import pagecache
from dgemm.benchmarks.objectstore import Location, object_get_rate, object_put_rate
from dgemm.benchmarks.rates import host_rates
from dgemm.benchmarks.report import error_text, floor_text, fmt, threads_text


# -- the host's rates, measured beside the run ----------------------------------------------------
def time_host_rates(client, addr: str, record: dict, folder: Location, log) -> dict | None:
    """The rates that bound the run, on its inputs (``record["inputs"]``) and on the worker ``addr``.

    Parameters
    ----------
    client : distributed.Client
        The run's cluster.
    addr : str
        The worker whose host-device copies are timed (as a task holding
        its ``GPU`` resource).
    record : dict
        The run's record: its inputs, dtype, ``cold`` and ``errors`` (an
        error goes there); on S3 the server's raw rates go to its
        ``object_store``.
    folder : Location
        Where the inputs are.
    log : callable
        Called with one line of the rates.

    Returns
    -------
    dict or None
        The record's ``host_rates``: read and write rates by thread count
        (empty on S3), the copy rates or why they are missing; None if the
        local store's rates failed.
    """
    if folder.remote:
        return _object_rates(client, addr, record["inputs"], folder, record, log)
    return _local_rates(client, addr, record["inputs"], folder, record["dtype"], record["errors"], log,
                        cold=record["cold"])


def _local_rates(client, addr, ins, folder, dtype, errors, log, cold: bool = False) -> dict | None:
    """The store's and ``addr``'s bus rates (:func:`dgemm.benchmarks.rates.host_rates`); None if they fail.

    With ``cold``, the store's reads are timed again with A dropped from the
    page cache before each thread count (``read_cold_gbps``, ``reader_cold_gbps``).
    """
    try:
        r = host_rates(ins["a"]["path"], os.fspath(folder), ins["a"]["chunks"], dtype, client, addr)
        if cold:
            r.update(_cold_read_rates(ins["a"]["path"]))
    except Exception as e:  # a full disk...: the benchmark goes on without them
        errors.append({"stage": "host_rates", "error": error_text(e)})
        log(f"host rates: ERROR {error_text(e)}")
        return None
    copy = r["copy_gbps"]
    log("host rates (GB/s): read " + ", ".join(f"{v:.3g} ({t} thr)" for t, v in r["read_gbps"].items() if v)
        + "; write " + ", ".join(f"{v:.3g} ({t} thr)" for t, v in r["write_gbps"].items() if v)
        + (f"; upload {fmt(copy['upload_pageable'], '.3g')} pageable, {fmt(copy['upload_pinned'], '.3g')} pinned"
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
        return None, error_text(e)


def _object_rates(client, addr, ins, folder: Location, record: dict, log) -> dict:
    """On S3: the server's raw GET rate on the inputs' chunk objects, its PUT rate, and ``addr``'s copies.

    The GET and PUT rates go to ``record["object_store"]``; what is returned
    takes the place of :func:`_local_rates`' (no local store: its read and
    write rates are empty).
    """
    so = folder.storage_options
    obj = record.setdefault("object_store", {})
    try:
        objects = folder.chunk_objects(ins["a"]["path"]) + folder.chunk_objects(ins["b"]["path"])
        obj["get"] = object_get_rate(objects, so)
        obj["put"] = object_put_rate(folder / "put-rate", max(size for _, size in objects), so)
        log(f"object store, GB/s: GET {threads_text(obj['get']['gbps'])}; PUT {threads_text(obj['put']['gbps'])}")
    except Exception as e:
        record["errors"].append({"stage": "object_rates", "error": error_text(e)})
        log(f"object store rates: ERROR {error_text(e)}")
    copy, why = _copy_rates(client, addr)
    return {"read_gbps": {}, "write_gbps": {}, "copy_gbps": copy, "copy_skipped": why,
            "store": "s3: see object_store"}


# -- the plan's floor ---------------------------------------------------------------------------
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

    >>> r = measured_rates({"host_rates": {"reader_gbps": {"1": 2.0, "4": 6.0}, "write_gbps": {"1": 1.0},
    ...                     "copy_gbps": {"upload_pinned": 25.0}}, "kernel": {"tflops": 40.0}})
    >>> r["rates"]
    {'read': 6000000000.0, 'write': 1000000000.0, 'pcie': 25000000000.0, 'flops': 40000000000000.0}
    >>> measured_rates({})["rates"]
    {}
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

    Parameters
    ----------
    usable : dict
        The workers' descriptions (:func:`dgemm.cluster.prepare`): their
        tiles, memory and default block size make the plan, as
        :func:`dgemm.matmul` makes it.
    a_path, b_path : str or os.PathLike
        The inputs (their shapes and chunks).
    dtype : str
        The product's dtype.
    measured : dict, optional
        The run's own rates (:func:`measured_rates`), each missing one at
        its default.
    storage_options : dict, optional
        For inputs on S3.

    Returns
    -------
    dict
        The plan's blocks, tasks and text; ``defaults``, the floor with
        ``dgemm plan``'s default rates (store reads 5 GB/s, writes 2 GB/s,
        PCIe 20 GB/s) and the tuning database's kernel rate; ``measured``,
        the floor with the run's rates.  The device cache is what ``dgemm
        plan`` assumes.
    """
    from dgemm.client.estimate import Rates
    from dgemm.client.plan import make_plan
    from dgemm.cluster import device_limits, tiles_of
    from dgemm.opencl.database import lookup
    from dgemm.sizes import MEMORY_FRACTION, default_target
    from dgemm.storage import Operand

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


def add_floor(record: dict, usable: dict, ins: dict, storage_options, log) -> None:
    """``dgemm plan``'s floor beside the main run's time (``record["dgemm"]["floor"]``); an error is only noted.

    The floor says whether the plan has the blocks the run used
    (``same_blocks_as_run``) and, for each set of rates, the measured time
    over it (``measured_over_floor``).
    """
    d = record.get("dgemm") or {}
    try:
        f = plan_floor(usable, ins["a"]["path"], ins["b"]["path"], record["dtype"], measured_rates(record),
                       storage_options)
    except Exception as e:
        record["errors"].append({"stage": "plan_floor", "error": error_text(e)})
        log(f"plan floor: ERROR {error_text(e)}")
        return
    run_block = ((d.get("attrs") or {}).get("run") or {}).get("block")
    f["same_blocks_as_run"] = run_block == f["block"][:2] if run_block else None
    for key in ("defaults", "measured"):
        if key in f and d.get("seconds") and f[key]["floor_seconds"]:
            f[key]["measured_over_floor"] = d["seconds"] / f[key]["floor_seconds"]
    d["floor"] = f
    log(floor_text(d))

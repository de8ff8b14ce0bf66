"""What bounds an end-to-end run: the host's rates measured beside it, and ``dgemm plan``'s floor from them.

* :func:`time_host_rates`: the store's read and write rates on the run's
  own inputs (:func:`dgemm.benchmarks.rates.host_rates`; with ``--cold``
  the reads again with A out of the page cache), or on S3 the server's raw
  GET and PUT rates (:mod:`dgemm.benchmarks.objectstore`); and a worker's
  host-device copy rates;
* :func:`measured_rates`: those rates in :class:`dgemm.client.estimate.Rates`'
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
                        cold=record["cold"], compressors=record.get("compressors", "auto"))


def _local_rates(client, addr, ins, folder, dtype, errors, log, cold: bool = False,
                 compressors="auto") -> dict | None:
    """The store's, C's codec's and ``addr``'s bus rates (:func:`dgemm.benchmarks.rates.host_rates`); None if they fail.

    With ``cold``, the store's reads are timed again with A dropped from the
    page cache before each thread count (``read_cold_gbps``, ``reader_cold_gbps``).
    """
    try:
        r = host_rates(ins["a"]["path"], os.fspath(folder), ins["a"]["chunks"], dtype, client, addr,
                       compressors=compressors)
        if cold:
            r.update(_cold_read_rates(ins["a"]["path"]))
    except Exception as e:  # a full disk...: the benchmark goes on without them
        errors.append({"stage": "host_rates", "error": error_text(e)})
        log(f"host rates: ERROR {error_text(e)}")
        return None
    copy = r["copy_gbps"]
    log("host rates (GB/s): read " + ", ".join(f"{v:.3g} ({t} thr)" for t, v in r["read_gbps"].items() if v)
        + "; write " + ", ".join(f"{v:.3g} ({t} thr)" for t, v in r["write_gbps"].items() if v)
        + "; encode C " + (", ".join(f"{v:.3g} ({t} thr)" for t, v in (r.get("encode_gbps") or {}).items() if v)
                           or "not timed")
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


def _per_core(rates: dict | None, cores: int | None) -> tuple[float | None, int | None]:
    """GB/s per core at the best of ``{threads: GB/s}`` (threads beyond the cores count as cores), and its threads."""
    got = [(v, int(t)) for t, v in (rates or {}).items() if v]
    if not got:
        return None, None
    v, t = max(got)
    return v / max(1, min(t, cores or t)), t


def measured_rates(record: dict) -> dict:
    """The run's own rates in :class:`dgemm.client.estimate.Rates`' terms (bytes/s, flop/s), and where each came from.

    ``rates``: store reads, the best of dgemm's reader (else zarr's) over
    thread counts (it decodes too: the host's ceiling where it has more cores
    than the threads measured), cold ones with ``--cold``; on S3 the server's best raw
    GET.  Writes: the local store's best (raw chunks), or the best PUT.
    PCIe: page-locked upload.  Kernel: dgemm's kernel in memory in this run.
    ``cpu``: per core, the reader's best over thread counts divided by its
    threads (it reads and decodes the inputs' codec: their decode rate with
    every core busy), and the output codec's encode rate likewise
    (``encode_gbps``, where measured); ``cores``, the host's.  A rate not
    measured is left out (the plan's default, or the codec's, stands).

    >>> r = measured_rates({"host_rates": {"reader_gbps": {"1": 2.0, "4": 6.0}, "write_gbps": {"1": 1.0},
    ...                     "copy_gbps": {"upload_pinned": 25.0}}, "kernel": {"tflops": 40.0}, "cpus": 16})
    >>> r["rates"]
    {'read': 6000000000.0, 'write': 1000000000.0, 'pcie': 25000000000.0, 'flops': 40000000000000.0}
    >>> r["cpu"]
    {'decode': 1500000000.0, 'cores': 16}
    >>> measured_rates({})["rates"]
    {}
    """
    hr, obj = record.get("host_rates") or {}, record.get("object_store") or {}
    out, source, cpu = {}, {}, {}
    cold = "_cold" if record.get("cold") else ""
    if record.get("store_kind") == "s3":
        read, source["read"] = (obj.get("get") or {}).get("best_gbps"), "object GET (best over threads)"
        write, source["write"] = (obj.get("put") or {}).get("best_gbps"), "object PUT (best over threads)"
    else:
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
    cores = record.get("cpus")
    for key, rates, what in (("decode", hr.get(f"reader{cold}_gbps"), "dgemm's chunk reader on A"),
                             ("encode", hr.get("encode_gbps"), "C's codec, encoding")):
        v, t = _per_core(rates, cores)
        if v:
            cpu[key] = v * 1e9
            source[key] = f"{what}, best over threads ({t}) per thread"
    if cores:
        cpu["cores"] = cores
    return {"rates": out, "cpu": cpu, "source": source}


def floor_of(p, n_workers: int, cache, how: dict, db_tflops: float | None, measured: dict | None = None) -> dict:
    """The floor of plan ``p`` on ``n_workers`` with ``dgemm plan``'s default rates and, given, the run's.

    ``how``: :func:`dgemm.client.estimate.estimate`'s codecs, hosts and the
    like; ``db_tflops``: the tuning database's kernel rate (None: unknown);
    ``measured``: :func:`measured_rates`.  Each missing measured rate stands
    at its default.
    """
    from dgemm.client.estimate import Rates

    def estimate(rates):
        e = p.estimate(n_workers, rates, cache, **how)
        busiest = max(e["workers"], key=lambda w: w["floor"], default=None)
        return {"floor_seconds": e["floor_seconds"], "bound": e["bound"], "tflops_ceiling": e["tflops_ceiling"],
                "bytes_read": e["bytes_read"], "bytes_decoded": e["bytes_decoded"],
                "bytes_written": e["bytes_written"], "rates": e["rates"], "codecs": e["codecs"],
                "hosts": e["hosts"],
                "busiest": {key: busiest[key] for key in ("tasks", "seconds", "fill", "drain")} if busiest else None,
                "text": p.explain_estimate(n_workers, rates, cache, **how)}

    cores = (measured or {}).get("cpu", {}).get("cores") or os.cpu_count()   # the bench runs on this host
    flops = db_tflops * 1e12 if db_tflops else None
    out = {"defaults": estimate(Rates(flops=flops, cores=cores))}
    if measured is not None:
        rates = {"flops": flops, **measured["rates"], **measured.get("cpu", {})}
        if measured["source"].get("read", "").startswith("zarr"):   # zarr reads slower than dgemm: no bound
            rates["read"] = None
        out["measured"] = {**estimate(Rates(**rates)), "source": measured["source"]}
    return out


def plan_floor(usable: dict, a_path, b_path, dtype, measured: dict | None = None,
               storage_options: dict | None = None, out_compressors="auto", shared_decode: bool = False,
               gram: bool = False, out=None) -> dict:
    """``dgemm plan``'s predicted floor for this product on these workers (:func:`dgemm.client.estimate.estimate`).

    Parameters
    ----------
    usable : dict
        The workers' descriptions (:func:`dgemm.cluster.prepare`): their
        tiles, memory and default block size make the plan, as
        :func:`dgemm.matmul` makes it; the workers' hosts, how many share
        each host's cores.
    a_path, b_path : str or os.PathLike
        The inputs (their shapes, chunks and codecs).
    dtype : str
        The product's dtype.
    measured : dict, optional
        The run's own rates (:func:`measured_rates`), each missing one at
        its default.
    storage_options : dict, optional
        For inputs on S3.
    out_compressors : "auto" or list
        C's codecs (zarr's JSON; "auto": zarr's default).
    shared_decode : bool
        The run's workers share a host cache of decoded blocks.
    gram : bool
        A Gram product X^T X: ``a_path`` and ``b_path`` are both X, read
        once for both operands, and one triangle of C is computed
        (:func:`dgemm.client.estimate.estimate`'s ``gram``).
    out : zarr.Array, optional
        C, opened writable (as :func:`dgemm.matmul` opens its output; a
        read-only array is never encoded): the room the workers' device
        encoders keep for its chunks is counted out of the panel cache too.

    Returns
    -------
    dict
        The plan's blocks, tasks and text; ``defaults``, the floor with
        ``dgemm plan``'s default rates (the store unbounded, as the page
        cache; PCIe 20 GB/s; the codecs' per-core rates) and the tuning database's
        kernel rate; ``measured``, the floor with the run's rates.
        ``cache_bytes``, the device's panel cache, is what :func:`dgemm.matmul`
        counts for these workers (:func:`dgemm.client.codecs_room.panel_cache_bytes`):
        what a block product holds and what the workers' device codecs
        keep beside it (their decode calls; the encoder's buffers where
        ``out`` is given: ``encoder_counted``) are not the cache's.  The
        ``dgemm plan`` command, which has no workers to ask, estimates the
        cache more roughly (its codecs not counted).
    """
    from dgemm.benchmarks.inputs import describe_zarr
    from dgemm.client.codecs_room import panel_cache_bytes
    from dgemm.client.estimate import codec_of
    from dgemm.client.plan import make_plan
    from dgemm.cluster import device_limits, tiles_of
    from dgemm.opencl.database import lookup
    from dgemm.sizes import default_target

    A, B = _operands(a_path, b_path, storage_options, gram)
    (m, k), (_, n) = A.shape, B.shape
    a_chunks = A.chunks
    tiles = tiles_of(usable, dtype)
    memory, max_alloc = device_limits(usable)
    target = default_target((d["device"].type for d in usable.values()), memory)
    p = make_plan(m, n, k, dtype, tiles, a_chunks=a_chunks, b_chunks=B.chunks, target=target,
                  n_workers=len(usable), device_memory=memory, max_alloc=max_alloc)
    cache = panel_cache_bytes(p, usable, A, B, out)
    first = next(iter(usable.values()))["device"]
    db = lookup(first, dtype).tflops
    codecs = [codec_of(describe_zarr(x, storage_options)["compressors"]) for x in (a_path, b_path)]
    codecs.append(codec_of("zstd" if out_compressors == "auto" else out_compressors))
    how = {"codecs": tuple(codecs), "hosts": len({d.get("host") for d in usable.values()}),
           "shared_decode": shared_decode, "device_is_host": str(getattr(first, "type", "")).upper() == "CPU",
           "chunks": (a_chunks, B.chunks), "gram": gram}
    found = {"block": list(p.block_shape), "tasks": p.n_tasks, "workers": len(usable), "cache_bytes": cache,
             "encoder_counted": out is not None,
           "plan": p.explain(), "kernel_tflops_database": db,
           "how": {**how, "codecs": [c.name for c in codecs]}}
    found.update(floor_of(p, len(usable), cache, how, db, measured))
    return found


def _operands(a_path, b_path, storage_options: dict | None = None, gram: bool = False) -> tuple:
    """The product's operands as :func:`dgemm.matmul` reads them: for a Gram product X^T X (``a_path`` and
    ``b_path`` both X), A is X transposed (its rows are K), which the plan and the codecs' count both need."""
    from dgemm.storage import Operand

    A, B = Operand(os.fspath(a_path), "a", storage_options), Operand(os.fspath(b_path), "b", storage_options)
    if gram:
        A.transpose()
    return A, B


def add_floor(record: dict, usable: dict, ins: dict, storage_options, log) -> None:
    """``dgemm plan``'s floor beside the main run's time (``record["dgemm"]["floor"]``); an error is only noted.

    The floor says whether the plan has the blocks the run used
    (``same_blocks_as_run``) and, for each set of rates, the measured time
    over it (``measured_over_floor``).  A run whose workers decoded through
    the host cache (its counters say so) is planned with shared decodes.
    The run's C is gone by now (the benchmark removes it), so the room the
    workers' device encoders kept for it is not counted out of the panel
    cache (``encoder_counted`` false): about 2 GiB of buffers at 8192²
    float32 C blocks, where C is zstd and the devices encode it.
    """
    d = record.get("dgemm") or {}
    total = (d.get("counters") or {}).get("total") or {}
    try:
        f = plan_floor(usable, ins["a"]["path"], ins["b"]["path"], record["dtype"], measured_rates(record),
                       storage_options, out_compressors=d.get("output_compressors", "auto"),
                       shared_decode=bool(total.get("host_cache_misses")), gram=record.get("op") == "gram")
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

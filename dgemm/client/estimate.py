"""The time floor of a plan: the work each resource must do, and which one binds.

A product's floor is what its slowest resource needs, all resources working
at once, plus the pipeline's drain, and for a device's kernel and copies the
fill (its first panels; the host's cores decode them within their total):

* each host's **cores**, shared by its device workers: they decode every
  block of A and B read from the store (a raw chunk is copied), and encode
  every block of C, at the codec's per-core rates (:class:`Codec`); on a CPU
  device (PoCL) they also run the kernel;
* each host's **store** reads (stored bytes, after compression) and writes;
* each **device**: its kernel (flops at the kernel's rate), its uploads
  and downloads over PCIe.

Bytes read more than once are counted: each worker reads the A and B
panels of its share (:func:`dgemm.client.plan.loads`), so workers of one
host whose shares overlap read (and decode) the same panels, unless a host
cache shares them (``shared_decode``); a worker whose device cache cannot
hold its panels reads B's again on later rows (:func:`_panel_reads`).

:func:`estimate` gives the figures, :func:`explain_estimate` says them in
words (``dgemm plan``).  :meth:`dgemm.client.plan.Plan.estimate` calls them
with the plan's shares; this module imports nothing of the plan's, so the
plan may.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dask.utils import format_bytes

GB = 1e9


@dataclass(frozen=True)
class Codec:
    """An array's codec as the floor counts it.

    ``decode`` and ``encode``: bytes of array data one core turns per second
    while every core of the host is busy; ``ratio``: array bytes over stored
    bytes.
    """

    name: str = "raw"
    decode: float = 1.1 * GB
    encode: float = 1.1 * GB
    ratio: float = 1.0


# Per core with every core busy (bytes of array data a second), measured on the H100 machine (16 cores) on
# normal float32 in 4096^2 chunks: decoding is dgemm's own chunk reader (file read + decode into the block's
# buffer: what the workers run), best over thread counts / threads, in `dgemm bench e2e`'s records
# (bench/results/2026-11-23-*-e2e-32768-float32-{default-3xtf32-0efae0a,blosc-lz4-0d98559,raw-shm-pools}:
# zstd 7.16, blosc-lz4 9.07, raw 17.9 GB/s on 16 threads; 165fedb's reader, on libzstd, 7.15).  Encoding is
# numcodecs' on 16 threads (issue 27's table: zstd -1 12.6, blosc-lz4 12.1 GB/s) but for zstd level 3, which
# dgemm's writer encodes through libzstd with one context and buffer per thread since 3b5a994
# (dgemm.storage.zstd): 6.1 GB/s on the H100's 16 cores (bench/NOTES.md, issues 27 and 28, second
# session; numcodecs' 5.2 is NUMCODECS_ZSTD_ENCODE, the writer's rate before).  zstd -1's decode is
# numcodecs' (66.6 GB/s: not measured through the reader).  One core alone is faster (zstd 3: 0.72 GB/s
# decode, 0.59 encode, by numcodecs), but the floor keeps every core busy.
NUMCODECS_ZSTD_ENCODE = 5.2 / 16 * GB
CODECS = {
    "raw": Codec("raw (copied)", 17.9 / 16 * GB, 17.9 / 16 * GB, 1.0),
    "zstd": Codec("zstd level 3", 7.16 / 16 * GB, 6.1 / 16 * GB, 1.08),
    "zstd-fast": Codec("zstd level < 0", 66.6 / 16 * GB, 12.6 / 16 * GB, 1.0),
    "lz4": Codec("blosc-lz4", 9.07 / 16 * GB, 12.1 / 16 * GB, 1.0),
}


def codec_of(compressors) -> Codec:
    """The :class:`Codec` of an array's compressors, as zarr describes them (JSON).

    ``compressors``: a list of zarr v3 codec dicts (``{"name": "zstd",
    "configuration": {"level": 3}}``) or numcodecs configs (``{"id":
    "blosc", "cname": "lz4"}``), one such dict, a name (``"zstd"``,
    ``"blosc-lz4"``, ``"default"``: Zarr's zstd), or None / ``[]`` (raw).
    A codec not measured takes zstd level 3's rates, and says so.

    >>> codec_of([{"name": "zstd", "configuration": {"level": 0, "checksum": False}}]).name
    'zstd level 3'
    >>> codec_of({"id": "blosc", "cname": "lz4", "clevel": 5}).name, codec_of(None).name
    ('blosc-lz4', 'raw (copied)')
    >>> codec_of([{"name": "gzip", "configuration": {"level": 5}}]).name
    'gzip (zstd level 3 rates assumed)'
    """
    if compressors is None or compressors == [] or compressors == "raw":
        return CODECS["raw"]
    if isinstance(compressors, (list, tuple)):
        # several compressors in a row: each decodes every byte, so their times add
        parts = [codec_of(c) for c in compressors]
        if len(parts) == 1:
            return parts[0]
        return Codec(" + ".join(p.name for p in parts), 1 / sum(1 / p.decode for p in parts),
                     1 / sum(1 / p.encode for p in parts), math.prod(p.ratio for p in parts))
    if isinstance(compressors, str):
        name, conf = compressors, {}
    else:
        name = str(compressors.get("name") or compressors.get("id") or "")
        conf = compressors.get("configuration") or compressors
    name = {"default": "zstd", "blosc-lz4": "blosc"}.get(name, name).lower()
    if name == "blosc":
        cname = str(conf.get("cname", "lz4")).lower()
        return CODECS["zstd"] if cname == "zstd" else CODECS["lz4"]
    if name == "lz4":
        return CODECS["lz4"]
    if name == "zstd":
        # level 0 is zstd's default, 3; a negative level stores normal floats nearly raw (ratio 1.00)
        return CODECS["zstd-fast"] if int(conf.get("level", 0) or 0) < 0 else CODECS["zstd"]
    return replace(CODECS["zstd"], name=f"{name} (zstd level 3 rates assumed)")


@dataclass(frozen=True)
class Rates:
    """The rates a plan's time floor assumes (bytes/s; flop/s; None where unknown or unbounded).

    ``read`` and ``write``: the store's, per host, in stored bytes (None, the
    default: no bound beyond the cores' copies, as for the page cache; a cold
    disk or an object store has one).  ``pcie``: host-device copies per
    device.  ``flops``: the kernel per device (None: not counted).
    ``decode``, ``encode``: per core, taking the place of the inputs' and the
    output's codec rates (:class:`Codec`) when measured.  ``cores``: per host
    (None: 1).  PCIe's default is PCIe 4/5 with pageable host memory;
    ``dgemm plan`` takes measured ones.
    """

    read: float | None = None
    write: float | None = None
    pcie: float = 20e9
    flops: float | None = None
    decode: float | None = None
    encode: float | None = None
    cores: int | None = None


def _whole(block: int, chunk: int | None) -> float:
    """Elements decoded per element of a block along one axis: blocks of ``block`` read whole chunks of ``chunk``.

    A block meets ``(block + chunk - gcd) / chunk`` chunks on average (blocks start at multiples of
    ``block``): 1 when the blocks follow the chunks, ``chunk / block`` when each chunk holds several blocks.

    >>> _whole(4096, 4096), _whole(8192, 4096), _whole(4096, 16384), _whole(3000, 2000)
    (1.0, 1.0, 4.0, 1.3333333333333333)
    """
    if not block or not chunk:
        return 1.0
    return (block + chunk - math.gcd(block, chunk)) / block


def _triangle(plan) -> float:
    """The share of a square product's flops in C's blocks ``i <= j`` (rows cut as the columns): what a Gram computes.

    ``(sum_i r_i)^2`` is every block; the blocks on and above the diagonal
    are half of it plus half the diagonal's ``sum_i r_i^2``.

    >>> from types import SimpleNamespace as N
    >>> from dgemm.client.plan import Cuts
    >>> _triangle(N(rows=Cuts(4096, 1024))), _triangle(N(rows=Cuts(2048, 2048)))
    (0.625, 1.0)
    """
    rows = plan.rows            # pieces of ``size`` but the last: O(1) for any count
    if not rows.count:
        return 1.0
    last = rows.extent - (rows.count - 1) * rows.size
    diagonal = (rows.count - 1) * float(rows.size) ** 2 + float(last) ** 2
    return (float(rows.extent) ** 2 + diagonal) / 2 / float(rows.extent) ** 2


def _panel_reads(load, item: int, cache_bytes: float | None, row_panel: float) -> tuple[float, float]:
    """Bytes of A and of B one worker reads: each panel once while its device cache holds them all.

    Otherwise it runs row by row, snaking (:func:`dgemm.client.plan._snake`),
    with the cache evicting the least recently used: each row after the first
    finds in the cache what it still holds of the previous row's B panels
    (what is left beside the row's A panel) and reads the rest again, at most
    once per task (``b_each``).
    """
    a, b = load.a * item, load.b * item
    if cache_bytes is None or a + b <= cache_bytes:
        return a, b
    rows = max(1, round(load.a / max(row_panel, 1)))
    again = max(0.0, b - max(0.0, cache_bytes - row_panel * item))
    return a, min(load.b_each * item, b + (rows - 1) * again)


def estimate(plan, shares, rates: Rates | None = None, cache_bytes: float | None = None, *,
             codecs=(None, None, None), hosts: int = 1, shared_decode: bool = False,
             device_is_host: bool = False, chunks=None, gram: bool = False) -> dict:
    """The bytes each resource moves and the time floor of ``plan`` placed as ``shares``.

    Parameters
    ----------
    plan : dgemm.client.plan.Plan
    shares : list of dgemm.client.plan.Load
        Each worker's share (:func:`dgemm.client.plan.loads`).
    rates : Rates, optional
    cache_bytes : float, optional
        Each device's panel cache (default: unlimited).
    codecs : (Codec or None, Codec or None, Codec or None)
        A's, B's and C's codecs (None: raw).
    hosts : int
        Hosts the workers are spread over, evenly and in order; each has
        ``rates.cores`` cores.
    shared_decode : bool
        A host decodes each block once for all its workers (a host cache).
    device_is_host : bool
        The devices are the host's own cores (PoCL): the kernel takes their
        time too, instead of overlapping it.
    chunks : ((int, int), (int, int)), optional
        op(A)'s and op(B)'s chunk shapes (default: the blocks'): a block that
        cuts chunks reads and decodes each of them whole (:func:`_whole`),
        and the fill decodes the first blocks' chunks in parallel, one core
        each.
    gram : bool
        op(A) and op(B) are one array X read both ways (X^T X or X X^T,
        :func:`dgemm.client.request.is_gram`): a worker's row panels and
        column panels are the same panels of X, read, decoded and uploaded
        once for both (counted as the larger of the two: exact for a worker
        that has all of C, a lower bound otherwise); and C is symmetric, so
        only its blocks ``i <= j`` are computed and come down
        (:func:`dgemm.client.graph.mirrored`: :func:`_triangle` of the
        flops), while every block of C is encoded and written.

    Returns
    -------
    dict
        ``floor_seconds``, ``bound`` (the resource that binds), ``workers``
        (each device's figures, its host's beside them), ``hosts``, the bytes
        read, decoded, encoded and written in all, ``tflops_ceiling``,
        ``rates`` and ``codecs`` assumed.  Costs O(workers), whatever the
        plan's size.
    """
    rates = rates or Rates()
    ca, cb, cc = (c or CODECS["raw"] for c in codecs)
    dec_a, dec_b = (rates.decode or ca.decode), (rates.decode or cb.decode)
    enc = rates.encode or cc.encode
    cores = max(int(rates.cores or 1), 1)
    item = plan.dtype.itemsize
    bm, bn, bk = plan.block_shape
    (ar, ac), (br, bc) = chunks or ((bm, bk), (bk, bn))
    # bytes decoded (and read from the store) per byte of block: whole chunks
    whole_a, whole_b = _whole(bm, ar) * _whole(bk, ac), _whole(bk, br) * _whole(bn, bc)
    chunk_bytes = max(1, min(ar * ac, br * bc) * item) if ar and ac and br and bc else None
    row_panel = bm * plan.k            # elements of one A row panel (what a worker keeps beside B's)
    tri = _triangle(plan) if gram else 1.0
    workers = [w for w in shares if w.tasks]
    n_hosts = max(1, min(hosts, len(workers)))
    on_host = [[w for i, w in enumerate(workers) if i * n_hosts // len(workers) == h] for h in range(n_hosts)]
    on_host = [g for g in on_host if g]           # an empty C: no host works
    inputs = (plan.m * plan.k + plan.k * plan.n) * item
    per, per_host = [], []
    for group in on_host:
        share = cores / len(group)     # cores per worker, at the fill and drain
        devs = []
        for load in group:
            a, b = _panel_reads(load, item, cache_bytes, row_panel)
            if gram:        # one X: its rows' panels and its columns' are the same X panels
                a, b = max(a, b), 0.0
            up, a, b = a + b, a * whole_a, b * whole_b      # blocks go up; whole chunks are read and decoded
            write = load.area * item
            flops = 2.0 * load.flop_terms * tri
            times = {"upload": up / rates.pcie, "download": write * tri / rates.pcie}
            if rates.flops:
                times["kernel"] = flops / rates.flops
            (i, j, _), (li, lj, _) = load.first, load.last
            first = (plan.rows.total(i, i + 1) + plan.cols.total(j, j + 1)) * bk * item
            fa = plan.rows.total(i, i + 1) * bk * item * whole_a
            fb = plan.cols.total(j, j + 1) * bk * item * whole_b * (not (gram and i == j))
            last = plan.rows.total(li, li + 1) * plan.cols.total(lj, lj + 1) * item
            par = share if not chunk_bytes else max(1.0, min(share, (fa + fb) / chunk_bytes))
            fill = ((fa / dec_a + fb / dec_b) / par + (fa / ca.ratio + fb / cb.ratio) / (rates.read or math.inf)
                    + first / rates.pcie)
            # C's last block is one chunk (C's chunks follow the blocks): one core encodes it
            drain = last / rates.pcie + last / enc + last / cc.ratio / (rates.write or math.inf)
            devs.append({"tasks": load.tasks, "bytes_read": a + b, "bytes_a": a, "bytes_b": b, "bytes_up": up,
                         "bytes_written": write, "flops": flops, "seconds": times, "fill": fill, "drain": drain})
        a_read, b_read = sum(d["bytes_a"] for d in devs), sum(d["bytes_b"] for d in devs)
        if shared_decode:   # one decode per block per host: at most every input once
            scale = min(1.0, inputs / (a_read + b_read)) if a_read + b_read else 1.0
            a_read, b_read = a_read * scale, b_read * scale
        written = sum(d["bytes_written"] for d in devs)
        cpu = {"decode": (a_read / dec_a + b_read / dec_b) / cores, "encode": written / enc / cores}
        if device_is_host and rates.flops:
            cpu["kernel"] = sum(d["seconds"].pop("kernel") for d in devs)
        times = {"cpu": sum(cpu.values())}
        if rates.read:
            times["read"] = (a_read / ca.ratio + b_read / cb.ratio) / rates.read
        if rates.write:
            times["write"] = written / cc.ratio / rates.write
        host = {"workers": len(devs), "cores": cores, "bytes_decoded": a_read + b_read, "bytes_encoded": written,
                "cpu": cpu, "seconds": times}
        for d in devs:
            # the host's cores and store start at once (the first panels' decode is part of their total);
            # the device's kernel and copies wait for the first panels (the fill) before they start
            device = {k: v + d["fill"] for k, v in d["seconds"].items()}
            d["seconds"] = {**times, **d["seconds"]}
            ends = {**times, **device}
            d["bound"] = max(ends, key=ends.get)
            d["floor"] = ends[d["bound"]] + d["drain"]
        host["floor"] = max(d["floor"] for d in devs)
        per += devs
        per_host.append(host)
    slow = max(per, key=lambda w: w["floor"], default={"floor": 0.0, "bound": None})
    return {"workers": per, "hosts": per_host, "floor_seconds": slow["floor"], "bound": slow["bound"],
            "bytes_read": sum(w["bytes_read"] for w in per), "bytes_inputs": inputs,
            "bytes_decoded": sum(h["bytes_decoded"] for h in per_host),
            "bytes_written": sum(w["bytes_written"] for w in per),
            "tflops_ceiling": plan.flops / slow["floor"] / 1e12 if slow["floor"] else None,
            "rates": {**vars(rates), "decode_a": dec_a, "decode_b": dec_b, "encode_c": enc, "cores": cores},
            "codecs": {"a": ca.name, "b": cb.name, "c": cc.name}}


def _gbps(x: float | None) -> str:
    return "unbounded" if not x else f"{x / GB:.3g} GB/s"


def explain_estimate(plan, shares, rates: Rates | None = None, cache_bytes: float | None = None, **how) -> str:
    """:func:`estimate` as text: the bytes, the busiest host and device, the floor and what binds, the rates."""
    e = estimate(plan, shares, rates, cache_bytes, **how)
    if not e["workers"]:
        return "placement: no GEMM tasks (C is empty)"
    r, c = e["rates"], e["codecs"]
    w = max(e["workers"], key=lambda x: x["floor"])
    h = max(e["hosts"], key=lambda x: x["floor"])
    fb = format_bytes
    cpu = " + ".join(f"{k} {_num(v, 2)} s" for k, v in h["cpu"].items())
    host = ", ".join(f"{k} {_num(v, 2)} s" for k, v in h["seconds"].items() if k != "cpu")
    device = ", ".join(f"{k} {_num(v, 2)} s" for k, v in w["seconds"].items() if k not in h["seconds"])
    inputs = e["bytes_inputs"]
    return "\n".join([
        f"placement: {len(e['workers'])} worker(s) on {len(e['hosts'])} host(s), up to "
        f"{max(x['tasks'] for x in e['workers'])} tasks each; reads {fb(e['bytes_read'])} of A and B in all "
        f"({e['bytes_read'] / inputs if inputs else 0:.2f}x the inputs' {fb(inputs)}), decodes "
        f"{fb(e['bytes_decoded'])}; encodes and writes {fb(e['bytes_written'])} of C",
        f"busiest host: cpu {_num(h['seconds']['cpu'], 2)} s ({cpu} on {h['cores']} cores)"
        + (f", store {host}" if host else "")
        + f"; busiest device: {device or 'nothing counted'}; fill {w['fill']:.2f} s, drain {w['drain']:.2f} s",
        f"time floor {_num(e['floor_seconds'], 2)} s ({e['bound']}-bound)"
        + (f", at most {e['tflops_ceiling']:.3g} TFLOPS end to end" if e["tflops_ceiling"] else ""),
        f"assuming per core: decode A {_gbps(r['decode_a'])} ({c['a']}), B {_gbps(r['decode_b'])} ({c['b']}), "
        f"encode C {_gbps(r['encode_c'])} ({c['c']}); per host: {r['cores']} cores, store reads {_gbps(r['read'])}, "
        f"writes {_gbps(r['write'])}; per device: PCIe {_gbps(r['pcie'])}, kernel "
        + (f"{r['flops'] / 1e12:.3g} TFLOPS" if r["flops"] else "rate unknown (not counted)"),
    ])


def _num(x: float, places: int) -> str:
    """``x`` with ``places`` decimals, or in scientific notation once that would print a wall of digits.

    >>> _num(1234.5678, 2), _num(6e93, 2)
    ('1234.57', '6e+93')
    """
    return f"{x:.{places}f}" if abs(x) < 1e12 else f"{x:.4g}"

"""`dgemm plan`'s floor against the measured time of every recorded end-to-end run (issue 27).

    python bench/notes/issue-27/floor_check.py [RECORDS ...] [--json OUT] [--no-issue-cases]

RECORDS: `dgemm bench e2e` records (default: bench/results/*e2e*.json beside this checkout, and the PoCL
runs of this folder, *e2e*.json).  For each
record's main run and each run of its scaling table, the plan dgemm made (the record's blocks, chunks,
codecs, workers, the host's cores, the device's memory) is estimated twice by
dgemm.client.estimate: with `dgemm plan`'s default rates (the codecs' per-core figures, the tuning
database's kernel rate as the record holds it) and with the run's own measured rates (the record's
host_rates and in-memory kernel: dgemm.benchmarks.floor.measured_rates).  A run whose workers decoded
through the host cache (its counters say so) is planned with shared decodes.  Then the cases of issue
27's table that have no record in bench/results are estimated from the figures the issue gives, with
the default rates and with the host rates of the nearest records of the same machine (NEARBY).  Prints one row per run: predicted, measured, measured / predicted, whether the
measured rates' floor is within +-30 %, and what binds.
"""
from __future__ import annotations

import argparse
import glob
import json
import os

from dgemm.benchmarks.floor import floor_of, measured_rates
from dgemm.client.estimate import codec_of
from dgemm.client.plan import make_plan
from dgemm.sizes import MEMORY_FRACTION

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.normpath(os.path.join(HERE, "..", "..", "results"))
TILES = (64, 64, 8)                 # blocks follow the chunks and the block size; the tiles only round them
MEMORY = {"H100": 79.1 * 2**30, "H200": 139.8 * 2**30}   # global memory OpenCL reports
TOLERANCE = 0.30

# Issue 27's table (2026-11-25, 3e50aed): runs without a record in bench/results.  Inputs and C in Zarr's
# default zstd, 4096^2 chunks, local disk, unless said.  Kernel rates: the tuning database's (float64
# DMMA 42.9 at 16384^3) or, for float32's 3xTF32 default, which the database has no figure for, the
# issue's "94-107 TFLOPS" (100).  The Gram run's blocks are not recorded: its k-blocks are taken to follow
# X's 16384-row chunks (dgemm's default 4096 would decode each chunk 4 times, 19 s of decode alone).
ISSUE = [
    dict(case="2xH100 49152^2 f32 zstd, 1 GPU", m=49152, k=49152, n=49152, dtype="float32", gpus=1, cores=32,
         seconds=5.27, tflops=100.0),
    dict(case="2xH100 49152^2 f32 zstd, 2 GPUs", m=49152, k=49152, n=49152, dtype="float32", gpus=2, cores=32,
         seconds=5.37, tflops=100.0),
    dict(case="2xH100 49152^2 f32 raw in (shm), C zstd, 1 GPU", m=49152, k=49152, n=49152, dtype="float32",
         gpus=1, cores=32, seconds=5.42, tflops=100.0, codec_in="raw"),
    dict(case="2xH100 49152^2 f32 raw in (shm), C zstd, 2 GPUs", m=49152, k=49152, n=49152, dtype="float32",
         gpus=2, cores=32, seconds=4.53, tflops=100.0, codec_in="raw"),
    dict(case="2xH100 49152^2 f32 zstd, host cache, 1 GPU", m=49152, k=49152, n=49152, dtype="float32", gpus=1,
         cores=32, seconds=8.87, tflops=100.0, shared=True),
    dict(case="2xH100 49152^2 f32 zstd, host cache, 2 GPUs", m=49152, k=49152, n=49152, dtype="float32",
         gpus=2, cores=32, seconds=7.26, tflops=100.0, shared=True),
    dict(case="2xH100 65536^2 f64 zstd, 1 GPU", m=65536, k=65536, n=65536, dtype="float64", gpus=1, cores=32,
         seconds=25.4, tflops=42.88),
    dict(case="2xH100 65536^2 f64 zstd, 2 GPUs", m=65536, k=65536, n=65536, dtype="float64", gpus=2, cores=32,
         seconds=23.7, tflops=42.88),
    dict(case="H100 32768^2 f32 zstd, warm", m=32768, k=32768, n=32768, dtype="float32", gpus=1, cores=16,
         seconds=2.36, tflops=100.0),
    dict(case="H100 Gram X^T X, X 2097152 x 2048 f32", m=2048, k=2097152, n=2048, dtype="float32", gpus=1,
         cores=16, seconds=7.7, tflops=100.0, a_chunks=(2048, 16384), b_chunks=(16384, 2048),
         block=(2048, 2048, 16384)),
]


def _codec_in(rec: dict):
    a = (rec.get("inputs") or {}).get("a") or {}
    if "zarr" in a:
        return codec_of(a["zarr"].get("compressors"))
    return codec_of({"default": "zstd", "blosc-lz4": "blosc-lz4"}.get(rec.get("input_codec") or "raw", "raw"))


def _codec_out(rec: dict):
    got = (rec.get("dgemm") or {}).get("output_compressors")
    if got is not None:
        return codec_of(got)
    return codec_of("zstd" if rec.get("compressors") == "auto" else None)


def _memory(device: str) -> float | None:
    return next((v for key, v in MEMORY.items() if key in device), None)


def _plan(m, n, k, dtype, chunks, workers, block, memory):
    a_chunks, b_chunks = chunks
    p = make_plan(m, n, k, dtype, TILES, a_chunks=a_chunks, b_chunks=b_chunks,
                  target=tuple(block) if block else 4096, n_workers=workers, device_memory=memory)
    cache = None if memory is None else max(0.0, MEMORY_FRACTION * memory - 2 * p.device_bytes())
    return p, cache


def record_rows(path: str) -> list[dict]:
    """One row per run of the record at ``path``: its main run, then its scaling table's other runs."""
    rec = json.load(open(path))
    d = rec.get("dgemm") or {}
    if not d.get("seconds"):
        return []
    f = d.get("floor") or {}
    total = (d.get("counters") or {}).get("total") or {}
    ch = ((rec.get("inputs") or {}).get("a") or {}).get("chunks") or [rec["chunks"]] * 2
    chunks = (tuple(ch), tuple(ch))
    how = {"codecs": (_codec_in(rec), _codec_in(rec), _codec_out(rec)), "hosts": 1,
           "shared_decode": bool(total.get("host_cache_misses")),
           "device_is_host": rec.get("device_type") == "CPU", "chunks": chunks}
    measured = measured_rates(rec)
    measured["cpu"].setdefault("cores", rec.get("cpus"))
    runs = [(rec["workers"], d["seconds"])]
    runs += [(s["gpus"], s["seconds"]) for s in rec.get("scaling") or []
             if s.get("ok") and not s.get("reused_main_run") and s["gpus"] != rec["workers"]]
    rows = []
    for workers, seconds in runs:
        memory = _memory(rec.get("device", ""))
        p, cache = _plan(rec["m"], rec["n"], rec["k"], rec["dtype"], chunks, workers, f.get("block"), memory)
        if f.get("cache_bytes") is not None and workers == rec["workers"]:
            cache = f["cache_bytes"]
        got = floor_of(p, workers, cache, how, f.get("kernel_tflops_database"), measured)
        rows.append(_row(os.path.basename(path).removesuffix(".json"), workers, rec.get("cpus"), seconds, got,
                         total if workers == rec["workers"] else None))
    return rows


# Host rates for issue 27's cases: the records of the same kind of machine (H100, 16 cores, 11-23) nearest in
# commit, zstd inputs and raw inputs in /dev/shm: their reader per core, store writes, PCIe.
NEARBY = {"zstd": "2026-11-23-nvidia-h100-80gb-hbm3-e2e-32768-float32-default-3xtf32-0efae0a.json",
          "raw": "2026-11-23-nvidia-h100-80gb-hbm3-e2e-32768-float32-raw-shm-pools.json"}


def _nearby(codec: str, cores: int) -> dict | None:
    path = os.path.join(RESULTS, NEARBY[codec])
    if not os.path.exists(path):
        return None
    got = measured_rates(json.load(open(path)))
    got["rates"].pop("flops", None)         # the case's own kernel rate stands
    got["cpu"]["cores"] = cores
    return got


def issue_rows() -> list[dict]:
    """The rows of issue 27's cases that have no record: default rates, and the nearest records' host rates."""
    rows = []
    for c in ISSUE:
        chunks = (c.get("a_chunks", (4096, 4096)), c.get("b_chunks", (4096, 4096)))
        zstd = codec_of("zstd")
        cin = codec_of(c.get("codec_in", "zstd"))
        how = {"codecs": (cin, cin, zstd), "hosts": 1, "shared_decode": c.get("shared", False),
               "device_is_host": False, "chunks": chunks}
        p, cache = _plan(c["m"], c["n"], c["k"], c["dtype"], chunks, c["gpus"], c.get("block"), MEMORY["H100"])
        got = floor_of(p, c["gpus"], cache, how, c["tflops"], {"rates": {}, "cpu": {"cores": c["cores"]},
                                                                  "source": {}})
        got.pop("measured")
        near = _nearby(c.get("codec_in", "zstd"), c["cores"])
        if near:
            got["measured"] = floor_of(p, c["gpus"], cache, how, c["tflops"], near)["measured"]
        rows.append(_row("issue 27: " + c["case"], c["gpus"], c["cores"], c["seconds"], got, None))
    return rows


def _row(case, workers, cores, seconds, got, counters) -> dict:
    out = {"case": case, "workers": workers, "cores": cores, "measured_seconds": seconds}
    for key, e in got.items():
        h = max(e["hosts"], key=lambda x: x["floor"])
        out[key] = {"floor_seconds": e["floor_seconds"], "bound": e["bound"],
                    "measured_over_floor": seconds / e["floor_seconds"] if e["floor_seconds"] else None,
                    "within": abs(e["floor_seconds"] / seconds - 1) <= TOLERANCE,
                    "bytes_decoded": e["bytes_decoded"], "cpu": h["cpu"], "codecs": e["codecs"],
                    "busiest": e["busiest"]["seconds"]}
    if counters:
        out["counters"] = {k: counters.get(k) for k in ("bytes_read", "host_cache_bytes_decoded", "read_seconds",
                                                        "store_seconds", "kernel_seconds")}
    return out


def table(rows: list[dict]) -> str:
    head = (f"{'case':70} {'w':>2} {'cores':>5} {'measured':>8} | {'default floor':>22} {'x':>5} | "
            f"{'measured-rate floor':>24} {'x':>5} {'±30%':>4}")
    lines = [head, "-" * len(head)]
    for r in rows:
        d, m = r.get("defaults"), r.get("measured")
        cell = (lambda e: (f"{e['floor_seconds']:8.3g} s {e['bound']:>10}", f"{e['measured_over_floor']:5.2f}")
                if e else ("", ""))
        (dt, dx), (mt, mx) = cell(d), cell(m)
        ok = "yes" if (m or d)["within"] else "no"
        lines.append(f"{r['case'][:70]:70} {r['workers']:>2} {r['cores'] or '':>5} {r['measured_seconds']:7.3g}s | "
                     f"{dt:>22} {dx:>5} | {mt:>24} {mx:>5} {ok:>4}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("records", nargs="*", help="e2e records (default: bench/results/*e2e*.json and this folder's)")
    ap.add_argument("--json", help="also write the rows, with each floor's split, to this file")
    ap.add_argument("--no-issue-cases", action="store_true", help="only the records, not issue 27's table")
    args = ap.parse_args(argv)
    paths = args.records or sorted(glob.glob(os.path.join(RESULTS, "*e2e*.json"))
                                   + glob.glob(os.path.join(HERE, "*e2e*.json")))
    rows = [r for path in paths for r in record_rows(path)]
    if not args.no_issue_cases:
        rows += issue_rows()
    print(table(rows))
    scored = [(r.get("measured") or r["defaults"])["within"] for r in rows]
    print(f"\nwithin ±{TOLERANCE:.0%} (measured rates where the record has them, else the defaults): "
          f"{sum(scored)} of {len(scored)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()

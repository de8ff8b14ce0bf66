"""Where the devices start to win: numpy in, numpy out, against numpy's own matmul in this process.

For each square size, the same numpy operands go through ``dgemm.matmul``
with the ``small-flops`` setting at 0 (always the devices: scatter the
blocks, compute, gather) on a warm cluster, and through numpy's BLAS here.
The record's ``crossover_flops`` is the smallest product (2·n³) from which
every larger size measured was faster on the devices: the value the
``small-flops`` setting should have on this machine.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from dgemm.accuracy import check_sample
from dgemm.benchmarks.peers import numpy_blas, numpy_matmul
from dgemm.benchmarks.records import DEFAULT_OUT, command_line, git_commit, result_path, utc_now, write_json

DEFAULT_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192)


def time_dgemm_numpy(client, a: np.ndarray, b: np.ndarray, reps: int) -> dict:
    """Median seconds of ``dgemm.matmul(a, b)`` (numpy in, numpy out) on ``client``'s devices, checked."""
    import dask

    import dgemm

    with dask.config.set({"dgemm.small-flops": 0}):
        got = dgemm.matmul(a, b, client=client)          # warm-up: kernels built, plan cached
        ok = check_sample(a, b, got)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dgemm.matmul(a, b, client=client)
            ts.append(time.perf_counter() - t0)
    sec = statistics.median(ts)
    m, k = a.shape
    n = b.shape[1]
    return {"seconds": sec, "tflops": 2.0 * m * n * k / sec / 1e12, "check": ok}


def crossover(rows: list[dict]) -> float | None:
    """The smallest flops from which the devices won at every larger size measured, None if never.

    >>> crossover([{"flops": 1, "devices_win": False}, {"flops": 8, "devices_win": True},
    ...            {"flops": 27, "devices_win": True}])
    8
    >>> crossover([{"flops": 1, "devices_win": True}, {"flops": 8, "devices_win": False}]) is None
    True
    """
    found = None
    for row in sorted(rows, key=lambda r: r["flops"], reverse=True):
        if not row["devices_win"]:
            break
        found = row["flops"]
    return found


def crossover_bench(client, *, dtypes=("float32", "float64"), sizes=DEFAULT_SIZES, reps: int = 5,
                    seed: int = 0, out_dir=DEFAULT_OUT, log=print) -> tuple[dict, object]:
    """Time numpy-in, numpy-out products on ``client``'s devices against numpy here; ``(record, path)``."""
    from dgemm.benchmarks.measure import ready_workers

    _, names, _ = ready_workers(client, dtypes[0])
    rng = np.random.default_rng(seed)
    results = {}
    for dtype in dtypes:
        rows = []
        for n in sizes:
            a = rng.standard_normal((n, n)).astype(dtype)
            b = rng.standard_normal((n, n)).astype(dtype)
            dev = time_dgemm_numpy(client, a, b, reps)
            ref = numpy_matmul(a, b, reps=reps)
            row = {"n": n, "flops": 2 * n ** 3, "dgemm_seconds": dev["seconds"], "numpy_seconds": ref["seconds"],
                   "dgemm_correct": bool(dev["check"]["passed"]),
                   "devices_win": bool(dev["check"]["passed"]) and dev["seconds"] < ref["seconds"]}
            rows.append(row)
            log(f"{dtype} {n:>6}: dgemm {dev['seconds'] * 1e3:9.1f} ms   numpy {ref['seconds'] * 1e3:9.1f} ms"
                f"{'' if row['dgemm_correct'] else '   FAILED its check'}")
        results[dtype] = {"rows": rows, "crossover_flops": crossover(rows)}
    commit, dirty = git_commit()
    date = utc_now()
    record = {"benchmark": "crossover", "date": date, "commit": commit, "commit_dirty": dirty,
              "command": command_line(), "devices": names, "numpy_blas": numpy_blas(), "reps": reps,
              "seed": seed, "results": results,
              "failures": sum(not r["dgemm_correct"] for v in results.values() for r in v["rows"])}
    path = result_path(out_dir, date, names, "crossover")
    write_json(path, record)
    return record, path

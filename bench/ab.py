"""A against B: the same Zarr → Zarr product timed with two source trees, interleaved, on the same inputs.

A refactor of the read or write path should not cost speed, and two separate
``dgemm bench e2e`` runs cannot show a few per cent: each writes its own
inputs, and the host's state drifts between them.  This tool writes A and B
once, then alternates the trees (``--rounds`` times A, B), each round in a
fresh process importing that tree's ``dgemm`` with its own local cluster,
which runs one product untimed (kernels built, page-locked memory allocated) and then times ``--reps``
(the output rewritten each time).  The record holds every time, each tree's
median and the ratio B / A.

On the GPU machine, with the older tree unpacked into an ignored folder
(``git archive COMMIT dgemm | tar -x -C .base``, carried with the run)::

    source .whl/gpu-env.sh && python3 bench/ab.py . .base --size 32768 --codec default --out "$OUT"
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# One round: the tree's dgemm, a local cluster, a warm-up, then the timed products (printed as JSON).
ROUND = r"""
import json, sys, time
import dgemm
from dgemm.cluster import DeviceCluster
from distributed import Client

a, b, out, reps, compressors = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
if __name__ == "__main__":
    kw = {} if compressors == "default" else {"compressors": None}
    with DeviceCluster(dashboard_address=":0") as cluster, Client(cluster) as client:
        times = []
        for _ in range(reps + 1):   # the first builds the kernels and allocates page-locked memory: not timed
            t0 = time.perf_counter()
            dgemm.matmul(a, b, out=out, overwrite=True, client=client, **kw)
            times.append(time.perf_counter() - t0)
    print(json.dumps({"dgemm": dgemm.__file__, "seconds": times[1:], "first": times[0]}))
"""


def run_round(tree: Path, a: str, b: str, out: str, reps: int, compressors: str, timeout: float) -> dict:
    """Time ``reps`` products with ``tree``'s dgemm in a fresh process (its own cluster)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "ab_round.py"
        script.write_text(ROUND)
        p = subprocess.run([sys.executable, str(script), a, b, out, str(reps), compressors], cwd=tree, env=env,
                           capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"the round with {tree} failed:\n{p.stderr[-3000:]}")
    result = json.loads(p.stdout.strip().splitlines()[-1])
    if not Path(result["dgemm"]).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the round meant for {tree} imported {result['dgemm']}")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="the first tree (a folder holding dgemm/), e.g. .")
    p.add_argument("b", type=Path, help="the second tree, e.g. .base")
    p.add_argument("--size", type=int, default=32768, help="square product M = N = K")
    p.add_argument("--chunks", type=int, default=4096, help="chunk side of A and B")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--codec", default="default", choices=("raw", "default", "blosc-lz4"),
                   help="how A and B are encoded; C is written with zarr's default codec, or raw with raw")
    p.add_argument("--rounds", type=int, default=3, help="rounds of A then B")
    p.add_argument("--reps", type=int, default=3, help="timed products per round")
    p.add_argument("--store", default=None, help="folder of the Zarr files (default: the temporary folder)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one round may take")
    p.add_argument("--out", default=None, help="folder of the JSON record (default: print only)")
    args = p.parse_args(argv)

    from dgemm.benchmarks.inputs import make_inputs
    from dgemm.benchmarks.records import result_path, utc_now, write_json
    from dgemm.provenance import command_line, git_commit

    trees = [args.a.resolve(), args.b.resolve()]
    for tree in trees:
        if not (tree / "dgemm" / "__init__.py").is_file():
            raise SystemExit(f"{tree} holds no dgemm/ package")
    with tempfile.TemporaryDirectory(dir=args.store, prefix="dgemm-ab-") as folder:
        n = args.size
        inputs = make_inputs(Path(folder), n, n, n, args.chunks, args.dtype, seed=0, codec=args.codec)
        a, b = str(Path(folder) / "a.zarr"), str(Path(folder) / "b.zarr")
        compressors = "raw" if args.codec == "raw" else "default"
        times: dict[str, list[float]] = {str(t): [] for t in trees}
        for r in range(args.rounds):
            for tree in trees:
                got = run_round(tree, a, b, str(Path(folder) / "c.zarr"), args.reps, compressors, args.timeout)
                times[str(tree)] += got["seconds"]
                print(f"round {r + 1}, {tree.name or tree}: " + ", ".join(f"{s:.3f}" for s in got["seconds"]) + " s",
                      flush=True)
    medians = {t: statistics.median(s) for t, s in times.items()}
    ma, mb = medians[str(trees[0])], medians[str(trees[1])]
    flops = 2.0 * n ** 3
    print(f"median: {trees[0].name or trees[0]} {ma:.3f} s ({flops / ma / 1e12:.1f} TFLOPS), "
          f"{trees[1].name or trees[1]} {mb:.3f} s ({flops / mb / 1e12:.1f} TFLOPS); B / A = {mb / ma:.3f}")
    if args.out:
        from dgemm.opencl.discovery import list_devices

        gpus = [d for d in list_devices() if d.type == "GPU"] or list_devices()
        commit, dirty = git_commit()
        record = {"benchmark": "ab", "date": utc_now(), "commit": commit, "commit_dirty": dirty,
                  "command": command_line(), "cpus": os.cpu_count(), "device": gpus[0].name if gpus else None,
                  "size": n, "chunks": args.chunks, "dtype": args.dtype, "codec": args.codec,
                  "inputs_seconds": inputs["seconds"], "trees": [str(t) for t in trees],
                  "seconds": times, "median": medians, "ratio_b_over_a": mb / ma}
        path = result_path(args.out, record["date"], record["device"] or "device", "ab", f"{n}-{args.codec}")
        write_json(path, record)
        print(f"record written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

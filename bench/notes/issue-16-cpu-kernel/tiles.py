"""NOTES.md, "Issue 16 — the CPU kernel": CPU kernel (GEMMK=1) tile sizes on the PoCL device, as ratios to
numpy timed in the same run (median of 3 kernel-then-numpy pairs per size; the cores may be shared).

    python bench/notes/issue-16-cpu-kernel/tiles.py OUT.json
"""
import argparse
import json
import os
import time

# float32 and float64 register blocks of each candidate tile (the tuned one first)
CANDIDATES = {
    "tuned 96x256x64": {"float32": dict(TSM=96, TSN=256, TSK=64, WPTM=2, WPTN=32, VWN=8),
                        "float64": dict(TSM=96, TSN=256, TSK=64, WPTM=2, WPTN=16, VWN=4)},
    "32x32x16": {"float32": dict(TSM=32, TSN=32, TSK=16, WPTM=2, WPTN=32, VWN=8),
                 "float64": dict(TSM=32, TSN=32, TSK=16, WPTM=2, WPTN=16, VWN=4)},
    "32x32x32": {"float32": dict(TSM=32, TSN=32, TSK=32, WPTM=2, WPTN=32, VWN=8),
                 "float64": dict(TSM=32, TSN=32, TSK=32, WPTM=2, WPTN=16, VWN=4)},
    "32x64x32": {"float32": dict(TSM=32, TSN=64, TSK=32, WPTM=2, WPTN=32, VWN=8),
                 "float64": dict(TSM=32, TSN=64, TSK=32, WPTM=2, WPTN=16, VWN=4)},
    "64x64x32": {"float32": dict(TSM=64, TSN=64, TSK=32, WPTM=2, WPTN=32, VWN=8),
                 "float64": dict(TSM=64, TSN=64, TSK=32, WPTM=2, WPTN=16, VWN=4)},
}


def main():
    ap = argparse.ArgumentParser(description="CPU kernel tile sizes as ratios to numpy in the same run")
    ap.add_argument("out", help="the JSON record to write")
    args = ap.parse_args()

    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import list_devices
    from dgemm.opencl.params import KernelParams
    from dgemm.provenance import command_line, git_commit, utc_now
    from dgemm.tuning.timing import KernelBench

    dev = Device([d for d in list_devices() if d.type == "CPU"][0])
    rows = []
    for dt in ("float32", "float64"):
        for n in (1024, 2048):
            kb = KernelBench(dev, dt, n, n, n, seed=1)
            a, b = kb.a, kb.b
            for name, c in CANDIDATES.items():
                p = KernelParams(WIDTH=1, GEMMK=1, **c[dt])
                rs = []
                for _ in range(3):
                    t = kb.run(p, reps=3)
                    t0 = time.perf_counter()
                    a @ b
                    rs.append((time.perf_counter() - t0) / t.seconds)
                print(dt, n, name, "ok" if t.ok else "BAD", f"ratio median {sorted(rs)[1]:.2f}", flush=True)
                rows.append({"dtype": dt, "size": n, "tiles": name, "params": p.as_dict(), "ok": t.ok,
                             "ratios_to_numpy": rs, "median_ratio": sorted(rs)[1], "tflops_last": t.tflops})
    with open(args.out, "w") as f:
        json.dump({"benchmark": "cpu-tiles", "device": dev.info.name, "date": utc_now(), "commit": git_commit()[0],
                   "command": command_line(), "cpus": os.cpu_count(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

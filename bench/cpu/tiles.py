"""CPU kernel (GEMMK=1) tile sizes on the PoCL device, as ratios to numpy timed in the same run.

python bench/cpu/tiles.py OUT.json  (median of 3 kernel-then-numpy pairs per size; the 2 cores may be shared)
"""
import datetime, json, os, subprocess, sys
import time
import numpy as np
from dgemm.opencl.device import Device
from dgemm.opencl.discovery import list_devices
from dgemm.opencl.params import KernelParams
from dgemm.tuning.timing import KernelBench
dev = Device([d for d in list_devices() if d.type == "CPU"][0])
cands = {
 "tuned 96x256x64": {"float32": dict(TSM=96, TSN=256, TSK=64, WPTM=2, WPTN=32, VWN=8), "float64": dict(TSM=96, TSN=256, TSK=64, WPTM=2, WPTN=16, VWN=4)},
 "32x32x16": {"float32": dict(TSM=32, TSN=32, TSK=16, WPTM=2, WPTN=32, VWN=8), "float64": dict(TSM=32, TSN=32, TSK=16, WPTM=2, WPTN=16, VWN=4)},
 "32x32x32": {"float32": dict(TSM=32, TSN=32, TSK=32, WPTM=2, WPTN=32, VWN=8), "float64": dict(TSM=32, TSN=32, TSK=32, WPTM=2, WPTN=16, VWN=4)},
 "32x64x32": {"float32": dict(TSM=32, TSN=64, TSK=32, WPTM=2, WPTN=32, VWN=8), "float64": dict(TSM=32, TSN=64, TSK=32, WPTM=2, WPTN=16, VWN=4)},
 "64x64x32": {"float32": dict(TSM=64, TSN=64, TSK=32, WPTM=2, WPTN=32, VWN=8), "float64": dict(TSM=64, TSN=64, TSK=32, WPTM=2, WPTN=16, VWN=4)},
}
rows = []
for dt in ("float32", "float64"):
    for n in (1024, 2048):
        kb = KernelBench(dev, dt, n, n, n, seed=1)
        a = kb.a; b = kb.b
        for name, c in cands.items():
            p = KernelParams(WIDTH=1, GEMMK=1, **c[dt])
            rs = []
            for _ in range(3):
                t = kb.run(p, reps=3)
                t0 = time.perf_counter(); a @ b; tn = time.perf_counter() - t0
                rs.append(tn / t.seconds)
            print(dt, n, name, "ok" if t.ok else "BAD", f"ratio median {sorted(rs)[1]:.2f}", flush=True)
            rows.append({"dtype": dt, "size": n, "tiles": name, "params": p.as_dict(), "ok": t.ok,
                         "ratios_to_numpy": rs, "median_ratio": sorted(rs)[1], "tflops_last": t.tflops})
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
json.dump({"benchmark": "cpu-tiles", "device": dev.info.name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "commit": commit, "command": "python bench/cpu/tiles.py " + sys.argv[1], "cpus": os.cpu_count(),
           "rows": rows}, open(sys.argv[1], "w"), indent=1)

"""NOTES.md, "Issue 16, third session (stop 16)", the row "the engine's GPU test on PROMOTE 4".

3xTF32 on wgmma at each PROMOTE (tiles per IEEE add) against the FMA kernel, through the engine, on the
data of the engine's tensor-core test (m 1000, n 700, k blocks 900 + 333, alpha 1.5, beta -0.5; normal entries
and entries spread over 2^-16 .. 2^16): the relative error (Frobenius) of each against float64, per seed.

On the GPU machine:  source .whl/gpu-env.sh && python3 bench/notes/issue-16-third-session/accuracy_promote.py [--seeds 3]
"""
import argparse
import dataclasses
import json

import numpy as np

from dgemm.opencl.device import Device
from dgemm.opencl.discovery import list_devices
from dgemm.opencl.engine import BlockEngine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    dev = Device([d for d in list_devices() if d.type == "GPU"][0])
    m, n, ks = 1000, 700, (900, 333)
    fma = dev.choice("float32", "fma").params
    x3 = dev.choice("float32", "3xtf32").params
    rows = []
    for seed in range(args.seeds):
        for wide in (False, True):
            rng = np.random.default_rng(seed)
            A = [rng.standard_normal((m, k)) for k in ks]
            B = [rng.standard_normal((k, n)) for k in ks]
            if wide:
                A = [a * np.exp2(rng.uniform(-16, 16, a.shape)) for a in A]
                B = [b * np.exp2(rng.uniform(-16, 16, b.shape)) for b in B]
            C = rng.standard_normal((m, n))
            A, B, C = [a.astype(np.float32) for a in A], [b.astype(np.float32) for b in B], C.astype(np.float32)
            ref = 1.5 * sum(a.astype(np.float64) @ b.astype(np.float64) for a, b in zip(A, B)) - 0.5 * C.astype(np.float64)
            row = {"seed": seed, "wide": wide}
            for name, p in [("fma", fma)] + [(f"3xtf32 PROMOTE {v}", dataclasses.replace(x3, PROMOTE=v)) for v in (1, 2, 4, 8)]:
                e = BlockEngine(dev, "float32", p)
                out = e.product(zip(A, B), m, n, alpha=1.5, beta=-0.5, c=C)
                row[name] = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                assert e.params == p, (e.params, p, dev.failed)
            rows.append(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

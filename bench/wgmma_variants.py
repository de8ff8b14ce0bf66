"""dgemm's wgmma kernels (KernelParams MMA=7 / 8) over a list of parameter sets, timed through KernelBench
(operands prepared as the engine prepares them; every run checked before its time counts), beside cuBLAS.

On the GPU machine:  python3 bench/wgmma_variants.py --out "$OUT" [--mma 8] [--sizes 8192,16384]
"""
import argparse
import datetime
import json
import os

from dgemm.benchmarks.peers import cublas
from dgemm.opencl.device import Device
from dgemm.opencl.discovery import list_devices
from dgemm.tuning.params import KernelParams
from dgemm.tuning.timing import KernelBench

VARIANTS = {   # (WARPSM, TSN, STAGES, GROUPM, extra compiler options)
    7: [(2, 128, 5, 8, ()), (2, 128, 6, 8, ()), (2, 128, 5, 16, ()), (2, 256, 4, 8, ())],
    8: [(2, 128, 3, 8, ()), (2, 128, 3, 8, ("-DOVERLAP=1",)), (2, 64, 4, 8, ("-DOVERLAP=1",)),
        (2, 64, 3, 8, ("-DOVERLAP=1",)), (1, 128, 4, 8, ("-DOVERLAP=1",))],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--mma", type=int, default=8)
    ap.add_argument("--sizes", default="8192,16384")
    args = ap.parse_args()
    dev = Device([d for d in list_devices() if d.type == "GPU"][0])
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        kb = KernelBench(dev, "float32", n, n, n, seed=n)
        peer = cublas("float32", n, n, n, reps=5, tf32=args.mma == 7)
        for wg, tsn, stages, groupm, extra in VARIANTS[args.mma]:
            extra = tuple(extra) + ("-cl-nv-verbose",)   # ptxas's register and spill report in the log
            p = KernelParams(MMA=args.mma, TSM=64 * wg, TSN=tsn, TSK=32, WARPSM=wg, WARPSN=1, STAGES=stages,
                             GROUPM=groupm)
            row = {"size": n, "params": p.as_dict(), "options": list(extra), "cublas_tflops": peer and peer["tflops"]}
            try:
                t = kb.run(p, reps=5, extra_options=extra)
                built = dev.kernels("float32", p, extra)
                log = built.gemm_program.get_build_info(dev.cl_device, 0x1183)   # CL_PROGRAM_BUILD_LOG
                row.update(ok=t.ok, rel_err=t.rel_err, tflops=t.tflops if t.ok else None,
                           built=built.params.as_dict(), failed=dev.failed.get(p),
                           registers=[ln.strip() for ln in log.splitlines() if "registers" in ln or "spill" in ln])
            except Exception as e:
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            rows.append(row)
            print(n, f"WG={wg} TSN={tsn} STAGES={stages} GROUPM={groupm} {' '.join(extra)}", row.get("ok"),
                  row.get("tflops"),
                  row.get("rel_err"), "cuBLAS", row["cublas_tflops"], row.get("error", ""), row.get("failed") or "",
                  row.get("registers", ""), flush=True)
    rec = {"benchmark": "wgmma-variants", "mma": args.mma, "device": dev.info.name, "driver": dev.info.driver,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "commit": os.environ.get("DGEMM_COMMIT"),
           "command": f"python3 bench/wgmma_variants.py --mma {args.mma} --sizes {args.sizes}", "rows": rows}
    with open(os.path.join(args.out, f"wgmma-variants-{args.mma}.json"), "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()

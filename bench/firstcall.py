"""Where a script's first dgemm.matmul goes (run on the GPU machine): client steps timed, workers' warm-up steps.

    python bench/firstcall.py A.zarr B.zarr OUT.zarr     (a fresh process: no cluster, dgemm starts one)

Prints one JSON line: seconds since the script started (the interpreter's own start not included) of each
client step (import, local cluster up, workers ready, prepare, plan, open output, compute, complete) and
each worker's Warmer.seconds (device open, kernel builds, staging) with its process age.
"""
import json
import time

T0 = time.time()
import dgemm  # noqa: E402

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="a script's first dgemm.matmul, step by step")
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("out")
    args = parser.parse_args()
    stamps = {"import": time.time() - T0}

    def timed(mod, name):
        fn = getattr(mod, name)

        def wrapper(*a, **k):
            s = time.time() - T0
            try:
                return fn(*a, **k)
            finally:
                stamps[name] = (round(s, 3), round(time.time() - T0, 3))
        setattr(mod, name, wrapper)

    import dgemm.cluster.local as local
    import dgemm.client.steps as steps
    for n in ("get_client", "prepare", "_plan", "_open_output", "_compute", "_complete"):
        timed(steps, n)
    timed(local, "DeviceCluster")
    dgemm.matmul(args.a, args.b, out=args.out, overwrite=True)
    stamps["done"] = time.time() - T0
    client = local._started[next(iter(local._started))][1]

    def warm(dask_worker):
        import os
        import psutil
        from dgemm.names import WORKER_PLUGIN

        p = dask_worker.plugins.get(WORKER_PLUGIN)
        w = getattr(p, "_warmer", None)
        return {"seconds": getattr(w, "seconds", None), "process_age": time.time() - psutil.Process(os.getpid()).create_time(),
                "plugin": type(p).__name__ if p else None}
    try:
        stamps["workers"] = client.run(warm)
    except Exception as e:
        stamps["workers"] = repr(e)
    stamps["t_now"] = time.time() - T0
    print("FIRSTCALL " + json.dumps(stamps, default=str), flush=True)

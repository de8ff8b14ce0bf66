"""Issue 29 on the GPU machine: a lazy result's slice, and an out= run with C's default chunks.

Run once per tree (the dgemm it imports): ``python slice_and_chunks.py slice DIR`` times
``dgemm.matmul(a, b)[:10, :10].compute()`` in a fresh process (no client: dask's local scheduler on this
process's GPU), then a second slice elsewhere in the same process; ``python slice_and_chunks.py out DIR``
times two out= runs on a DeviceCluster (the second warm) and prints C's chunks.  Prints one JSON line.
"""
import json
import os
import time

if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("slice", "out"))
    p.add_argument("folder", help="holds a.zarr and b.zarr")
    args = p.parse_args()
    what, folder = args.what, args.folder
    import numpy as np
    import zarr

    import dgemm
    a, b = os.path.join(folder, "a.zarr"), os.path.join(folder, "b.zarr")
    rec = {"what": what, "dgemm": os.path.dirname(os.path.dirname(dgemm.__file__))}
    if what == "slice":
        t0 = time.perf_counter()
        lazy = dgemm.matmul(a, b)
        got = lazy[:10, :10].compute()
        rec["first_slice_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        got2 = lazy[3000:3010, 5000:5010].compute()
        rec["second_slice_s"] = time.perf_counter() - t0
        A, B = zarr.open_array(a, mode="r"), zarr.open_array(b, mode="r")
        rec["err"] = float(max(np.abs(got - A[:10] @ B[:, :10]).max(),
                               np.abs(got2 - A[3000:3010] @ B[:, 5000:5010]).max()))
        rec["lazy_chunks"] = [lazy.chunks[0][0], lazy.chunks[1][0]]
    else:
        from distributed import Client
        with dgemm.DeviceCluster("gpu", dashboard_address=":0") as cl, Client(cl, set_as_default=False) as c:
            times = []
            for i in range(3):
                t0 = time.perf_counter()
                out = dgemm.matmul(a, b, out=os.path.join(folder, "c.zarr"), client=c, overwrite=True,
                                   compressors=None)
                times.append(time.perf_counter() - t0)
            rec["out_s"] = times
            rec["c_chunks"] = list(out.chunks)
            rec["block"] = out.attrs["dgemm"]["run"]["block"]
            rec["files"] = sum(len(f) for _, _, f in os.walk(os.path.join(folder, "c.zarr")))
    print("RESULT " + json.dumps(rec), flush=True)

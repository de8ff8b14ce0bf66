"""The dashboard's dgemm page with a GPU's figures.

Runs float32 and float64 products of random Zarr matrices on the local device
cluster (every GPU) and saves what the scheduler serves: the ``/dgemm`` page in
the middle of a run and after both, its JSON, and the scheduler's and a
worker's ``/metrics``.  The pages are self-contained HTML (inline CSS and
SVG): render them anywhere, e.g. ``chromium --headless --screenshot=...``.

Every file is named ``<date>-<device>-dashboard-<what>`` (the scheme of
``bench/results/``, :func:`dgemm.benchmarks.records.result_stem`).

Usage (on the GPU machine): ``python3 bench/gpu_dashboard.py OUT_DIR [--size N]``
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import urllib.request


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def _device_name() -> str:
    from dgemm.worker import device_state
    return device_state().device.info.name


def main() -> None:
    import dgemm
    from distributed import Client

    from dgemm.benchmarks.inputs import random_zarr
    from dgemm.benchmarks.records import result_stem, utc_now

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--size", type=int, default=16384)
    ap.add_argument("--chunk", type=int, default=4096)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    n, ch = args.size, args.chunk

    with dgemm.DeviceCluster(dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        base = cluster.dashboard_link.rsplit("/", 1)[0]
        print("dashboard", base, "devices", cluster.device_ids, flush=True)
        names = list(client.run(_device_name).values())
        stem = os.path.join(args.out, result_stem(utc_now(), names, "dashboard"))
        with tempfile.TemporaryDirectory(dir=os.environ.get("DGEMM_BENCH_TMP")) as d:
            for dt in ("float32", "float64"):
                t0 = time.perf_counter()
                random_zarr(f"{d}/a-{dt}.zarr", (n, n), (ch, ch), dt, seed=1)
                random_zarr(f"{d}/b-{dt}.zarr", (n, n), (ch, ch), dt, seed=2)
                print(f"inputs {dt} {n}: {time.perf_counter() - t0:.1f} s", flush=True)
            # compile the kernels before the timed runs (the page counts every product)
            for dt in ("float32", "float64"):
                dgemm.matmul(f"{d}/a-{dt}.zarr", f"{d}/b-{dt}.zarr", client=client, block=ch)[:ch, :ch].compute()

            saved = {"running": None}
            stop = threading.Event()

            def watch():
                while not stop.is_set():
                    try:
                        data = json.loads(get(base + "/dgemm/data.json"))
                        m = data["matmuls"][0] if data["matmuls"] else None
                        if (m and m["state"] == "running" and m["blocks_total"]
                                and m["blocks_total"] / 3 <= m["blocks_done"] <= 2 * m["blocks_total"] / 3
                                and saved["running"] is None):
                            saved["running"] = get(base + "/dgemm")
                            with open(f"{stem}-running.html", "w") as f:
                                f.write(saved["running"])
                            print("saved the page mid-run:", m["blocks_done"], "/", m["blocks_total"], flush=True)
                    except Exception as e:  # keep watching
                        print("watch:", e, flush=True)
                    time.sleep(0.25)

            th = threading.Thread(target=watch, daemon=True)
            th.start()
            for dt in ("float32", "float64"):
                t0 = time.perf_counter()
                c = dgemm.matmul(f"{d}/a-{dt}.zarr", f"{d}/b-{dt}.zarr", out=f"{d}/c-{dt}.zarr", client=client,
                                 block=ch)
                s = time.perf_counter() - t0
                print(f"matmul {dt} {n}: {s:.2f} s, {2 * n**3 / s / 1e12:.3f} TFLOPS end to end", flush=True)
                del c
            stop.set()
            th.join()
            time.sleep(2.5)  # the last heartbeats
            with open(f"{stem}-done.html", "w") as f:
                f.write(get(base + "/dgemm"))
            data = json.loads(get(base + "/dgemm/data.json"))
            with open(f"{stem}-data.json", "w") as f:
                json.dump(data, f, indent=1)
            metrics = get(base + "/metrics")
            ports = client.run(lambda dask_worker: dask_worker.http_server.port)
            worker_metrics = get(f"http://127.0.0.1:{next(iter(ports.values()))}/metrics")
            with open(f"{stem}-metrics.txt", "w") as f:
                f.write("# scheduler /metrics (dgemm_ lines)\n")
                f.writelines(ln + "\n" for ln in metrics.splitlines() if "dgemm_" in ln)
                f.write("# a worker's /metrics (dgemm_ lines)\n")
                f.writelines(ln + "\n" for ln in worker_metrics.splitlines() if "dgemm_" in ln)
            for w in data["workers"]:
                print(f"{w['name']} {w['device']}: {w['blocks']} blocks, kernel {w['kernel_seconds']:.2f} s, "
                      f"transfer {w['transfer_seconds']:.2f} s, read wait {w['read_wait_seconds']:.2f} s, "
                      f"store {w['store_seconds']:.2f} s; TFLOPS peak {w['tflops_peak']:.2f}, while busy "
                      f"{w['tflops_busy']:.2f}, kernel only {w['tflops_kernel']:.2f}", flush=True)


if __name__ == "__main__":
    main()

"""dgemm.worker.siblings and ``worker-process: host``: one process drives every device of the host.

A local cluster of two workers on this host's CPU device, in one process
(real worker processes: the first under its nanny, the second started in
it by dgemm's plugin): the scheduler sees two workers with ``GPU=1`` each;
Zarr (zstd) products of mixed dtypes are right against numpy's float64;
the process decoded each input byte once, the blocks both workers read
shared in memory, and nothing of a run is left on the board afterwards;
closing the cluster closes both; after ``client.restart()`` and after the
process is killed, both come back and compute.  The launchers' spec (one
nanny, the other devices named in its environment) is checked without
starting anything; ``dgemm worker`` in this layout is in ``test_launch.py``.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from _check import check_product, randn
from dgemm.worker import siblings


def _process(dask_worker):
    """On a worker: its process, its name and its view of the process's shared blocks and counters."""
    import os

    from dgemm.storage import sharing

    board = sharing.board()
    totals = dask_worker.plugins["dgemm"].state.totals()
    return {"pid": os.getpid(), "name": dask_worker.name, "board_entries": len(board), "board_held": board.held(),
            **{k: totals[k] for k in ("blocks", "host_cache_bytes_decoded", "host_cache_bytes_served",
                                      "host_decoded_bytes", "live_buffers")}}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_process_drives_both_devices_and_decodes_each_input_block_once(tmp_path):
    import dask
    import zarr
    from distributed import Client

    import dgemm
    from dgemm.cluster import DeviceCluster
    from dgemm.opencl.discovery import list_devices

    if not list_devices():
        pytest.skip("no OpenCL device (pip install pocl-binary-distribution)")
    rng = np.random.default_rng()
    A, B = randn(rng, (192, 160), "float64"), randn(rng, (160, 224), "float64")
    A32 = randn(rng, (224, 96), "float32")
    a = zarr.create_array(str(tmp_path / "a.zarr"), data=A, chunks=(64, 64))        # zarr's default: zstd
    b = zarr.create_array(str(tmp_path / "b.zarr"), data=B, chunks=(64, 64))
    a32 = zarr.create_array(str(tmp_path / "a32.zarr"), data=A32, chunks=(32, 32))
    with dask.config.set({"dgemm.worker-process": "host"}), \
            DeviceCluster("cpu,cpu", dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=120)
        workers = client.scheduler_info()["workers"]
        assert sorted(w["resources"].get("GPU") for w in workers.values()) == [1, 1]
        before = client.run(_process)
        assert len({p["pid"] for p in before.values()}) == 1, "two processes, not one"
        assert len(cluster.workers) == 1, "the cluster started more than one nanny"
        c = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=64)
        after = client.run(_process)
        c32 = dgemm.gemm(a32, a32, out=str(tmp_path / "c32.zarr"), client=client, block=32, trans_a=True)   # Gram
        last = [client.run(_process)]
        for i, (x, y, dt) in enumerate([(a, b, "float64"), (a32, A32.T.copy(), "float32")] * 2):   # the long-lived case
            got = dgemm.matmul(x, y, out=str(tmp_path / f"more{i}.zarr"), client=client, block=32)
            check_product(got[...], x[...], y[...], dtype=dt, what=f"product {i} of a long-lived cluster")
            last.append(client.run(_process))
    assert not cluster.workers and cluster.status.name == "closed"
    check_product(c[...], A, B, dtype="float64")
    check_product(c32[...], A32.T, A32, dtype="float32")
    grew = {k: sum(after[w][k] - before[w][k] for w in after) for k in
            ("blocks", "host_cache_bytes_decoded", "host_cache_bytes_served", "host_decoded_bytes")}
    assert all(after[w]["blocks"] > before[w]["blocks"] for w in after), after   # both devices computed
    # The process decoded each input byte once; the blocks both read were shared, not decoded twice.
    # (every chunk is decoded whole: 64 x 64 float64, the edges' too)
    assert grew["host_decoded_bytes"] == (a.nchunks + b.nchunks) * 64 * 64 * 8, grew
    assert grew["host_cache_bytes_served"] > 0 and grew["host_cache_bytes_decoded"] > 0, grew
    for snap in (after, *last):   # after every product: nothing shared left, no device buffer held
        assert all(p["board_entries"] == 0 and p["board_held"] == 0 and p["live_buffers"] == 0
                   for p in snap.values()), snap


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_restart_or_a_killed_process_brings_both_workers_back(tmp_path):
    """``client.restart()`` and a process killed outright: the nanny starts the process again, its worker starts
    the other again, and the next product runs on both, right."""
    import signal
    import time

    import dask
    import zarr
    from distributed import Client

    import dgemm
    from dgemm.cluster import DeviceCluster
    from dgemm.opencl.discovery import list_devices

    if not list_devices():
        pytest.skip("no OpenCL device (pip install pocl-binary-distribution)")
    rng = np.random.default_rng()
    A = randn(rng, (256, 192), "float32")
    a = zarr.create_array(str(tmp_path / "a.zarr"), data=A, chunks=(64, 64))

    def layout(client):
        """The workers' names and GPUs, and their processes."""
        workers = client.scheduler_info()["workers"].values()
        procs = client.run(_process)
        return sorted((w["name"], w["resources"].get("GPU")) for w in workers), {p["pid"] for p in procs.values()}

    with dask.config.set({"dgemm.worker-process": "host"}), \
            DeviceCluster("cpu,cpu", dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=120)
        names, (pid,) = layout(client)
        assert names == [(0, 1), (1, 1)]
        client.restart()
        names, pids = layout(client)
        assert names == [(0, 1), (1, 1)] and len(pids) == 1 and pid not in pids
        check_product(dgemm.matmul(a, A.T.copy(), out=str(tmp_path / "c1.zarr"), client=client, block=64)[...],
                      A, A.T, dtype="float32")
        (pid,) = pids
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                names, pids = layout(client)
            except Exception:   # a worker that left between the two questions
                continue
            if names == [(0, 1), (1, 1)] and pid not in pids:
                break
        assert names == [(0, 1), (1, 1)] and len(pids) == 1 and pid not in pids, (names, pids)
        c = dgemm.matmul(a, A.T.copy(), out=str(tmp_path / "c2.zarr"), client=client, block=64)
        assert all(p["blocks"] > 0 for p in client.run(_process).values()), "a worker ran no block after the restart"
    check_product(c[...], A, A.T, dtype="float32")


def test_the_launchers_start_one_process_whose_worker_names_the_others(monkeypatch):
    from dgemm.cluster.launch import worker_specs
    from dgemm.cluster.spec import host_worker
    from dgemm.opencl.discovery import DeviceInfo

    d = [DeviceInfo(0, i, "P", f"gpu{i}", "v", "GPU", 1, 1, 1, 1, True, None, "") for i in range(3)]
    monkeypatch.setenv("DGEMM_WORKER_PROCESS", "host")
    specs = worker_specs(None, name="job", nthreads=4, memory_limit="8GB", device_infos=d)
    assert len(specs) == 1
    (s,) = specs
    assert (s["name"], s["env"]["DGEMM_DEVICE"], s["nthreads"], s["memory_limit"]) == ("job-0", "0:0", 4, 24_000_000_000)
    assert siblings.wanted(s["env"]) == [("0:1", "job-1"), ("0:2", "job-2")]
    assert "DGEMM_HOST_CACHE" not in s["env"]
    monkeypatch.setenv("DGEMM_WORKER_PROCESS", "device")
    assert [x["name"] for x in worker_specs(None, name="job", device_infos=d)] == ["job-0", "job-1", "job-2"]
    one = host_worker(["0:0"], cpus=4)
    assert siblings.ENV not in one.env and one.nthreads == 4
    monkeypatch.setenv("DGEMM_WORKER_PROCESS", "nodes")
    with pytest.raises(ValueError, match="DGEMM_WORKER_PROCESS='nodes' must be device or host"):
        worker_specs(None, device_infos=d)


def test_a_bad_siblings_variable_is_refused_by_name():
    with pytest.raises(ValueError, match="DGEMM_SIBLINGS='0:1': expected a JSON list of"):
        siblings.wanted({siblings.ENV: "0:1"})

"""Nothing lost: worker deaths, interrupted runs, concurrent runs, memory limits, bad chunks,
a locked-down cluster, and a load of 1000+ blocks.

The tests that kill workers use a cluster of their own (``fault_client``), so
the session cluster other tests share is never disturbed; the client killed
mid-run is a separate process connected to the session cluster.  Timing
matters only in one direction: a kill must land while the run is unfinished,
and each test fails, saying so, if the run finished first.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zarr

import dgemm
from _check import check_product, randn, wait_for
from dgemm.storage import COMPLETE_ATTR, BlockMarkers, lease

ROOT = Path(__file__).resolve().parent.parent


def zarr_in(path, data, chunks, **kw):
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, **kw)
    arr[...] = data
    return arr



def markers_of(path) -> BlockMarkers | None:
    """The block markers of the run that is writing ``path`` (None before the output exists)."""
    try:
        arr = zarr.open_array(str(path), mode="r")
        meta = arr.attrs[COMPLETE_ATTR]
        owner = meta.get("owner") or meta["run"]["id"]   # markers are named by the owner (older: the run id)
    except Exception:
        return None
    return BlockMarkers(arr, owner)


def n_done(path) -> int:
    m = markers_of(path)
    return len(m.done()) if m is not None else 0


def cluster_idle(client) -> bool:
    """No task assigned to or running on any worker."""
    assigned = client.run_on_scheduler(
        lambda dask_scheduler: sum(len(ws.processing) for ws in dask_scheduler.workers.values()))
    running = client.run(lambda dask_worker: len(dask_worker.state.executing))
    return assigned == 0 and not any(running.values())


# -- a cluster of our own, to kill workers in ---------------------------------
@pytest.fixture(scope="module")
def fault_cluster():
    from conftest import CLUSTER_DEVICES, DEVICES
    if not DEVICES:
        pytest.skip("no OpenCL device on this host (install pocl-binary-distribution for a CPU one)")
    c = dgemm.DeviceCluster(CLUSTER_DEVICES, dashboard_address=":0")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def fault_client(fault_cluster):
    from distributed import Client
    with Client(fault_cluster, set_as_default=False) as c:
        c.wait_for_workers(len(fault_cluster.device_ids), timeout=120)
        yield c


def worker_pids(cluster) -> dict:
    """``{worker name: pid}`` of the worker processes whose nanny has seen them start.

    Read from the nannies, which live in this process: no message to a
    worker, so nothing waits on a worker that is dying or starting.
    """
    from distributed.core import Status

    out = {}
    for name, nanny in list(cluster.workers.items()):
        proc = getattr(nanny, "process", None)
        if proc is not None and proc.status == Status.running and proc.process is not None:
            out[name] = proc.process.pid
    return out


def restart_state(cluster, client) -> str:
    """What the nannies and the scheduler say of the workers (for a restart that did not come)."""
    nannies = {name: (str(getattr(n, "status", "?")), str(getattr(getattr(n, "process", None), "status", None)))
               for name, n in list(cluster.workers.items())}
    return f"nannies {nannies}, worker pids {worker_pids(cluster)}, scheduler sees {len(client.scheduler_info()['workers'])}"


def wait_restarted(cluster, client, killed: list, timeout: float = 60) -> None:
    """Wait until every killed worker is back; on a timeout, say what the nannies and the scheduler see."""
    try:
        wait_for(lambda: restarted(cluster, client, killed), timeout, "restarted workers")
    except AssertionError as e:
        raise AssertionError(f"{e}: {restart_state(cluster, client)}") from None


def restarted(cluster, client, killed: list) -> bool:
    """Every worker is back: a new process, started as far as its nanny and the scheduler know.

    (A worker killed after registering with the scheduler but before its
    nanny has read its start-up message makes distributed's nanny give up on
    it: a different fault from the one tested here, so kills wait for this.)
    """
    n = len(cluster.device_ids)
    pids = worker_pids(cluster)
    return len(pids) == n and not set(killed) & set(pids.values()) and len(client.scheduler_info()["workers"]) == n


# -- worker deaths ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_matmul_survives_killed_workers(fault_cluster, fault_client, tmp_path, rng):
    """SIGKILL worker processes in four events during one matmul: all of them three times, then one.

    (One worker killed last: while it restarts the others go on, so a single
    kill earlier could let them finish before the next one.)

    The nannies restart them; the scheduler re-runs the tasks they held
    (``allowed-failures`` of the DeviceCluster is 10, dask's default 3 would
    already be at its limit: every death counts against every GEMM task
    assigned to that worker).  Blocks stored twice hold the same data; the
    result is checked against numpy and is complete (every block had its marker; they go once it is).
    """
    client = fault_client
    n_workers = len(fault_cluster.device_ids)
    assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.allowed_failures) == 10
    m, k, n = 512, 512, 512
    A, B = randn(rng, (m, k), "float64"), randn(rng, (k, n), "float64")
    a = zarr_in(tmp_path / "a.zarr", A, (32, 512))
    b = zarr_in(tmp_path / "b.zarr", B, (512, 32))
    out = tmp_path / "c.zarr"
    total = (m // 32) * (n // 32)
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(dgemm.matmul, a, b, out=str(out), client=client, block=(32, 32, 512))
        killed, at = [], []
        wait_for(lambda: n_done(out) >= 8 or run.done(), 120, "the first blocks")
        for event in range(4):
            before = n_done(out)
            assert not run.done(), f"the run finished after {len(killed)} kills: make it longer"
            assert before < total
            pids = sorted(worker_pids(fault_cluster).items())          # [(name, pid)]
            victims = [pid for _, pid in (pids if event < 3 else pids[:1])]     # all, all, all, then one
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            killed += victims
            at.append(before)
            # the nannies bring them back; then let the run move on a little before the next kill
            wait_for(lambda: restarted(fault_cluster, client, killed), 60, "restarted workers")
            wait_for(lambda: n_done(out) >= before + 8 or run.done(), 120, "more blocks")
        result = run.result(timeout=180)
    print(f"killed {len(killed)} worker processes in 4 events, with {at} of {total} blocks stored")
    assert len(killed) == 3 * n_workers + 1
    check_product(result[...], A, B, dtype="float64")
    meta = dgemm.open_result(str(out)).attrs[COMPLETE_ATTR]
    assert meta["complete"] is True and meta["blocks"] == meta["blocks_run"] == total
    # every block was marked (complete checks), then the markers went with the rest of .dgemm: only resume reads them;
    # neither a marker's temporary file left by a worker killed mid-write nor a re-run task's late marker stays
    assert markers_of(out).done() == set()
    assert not (out / ".dgemm").exists(), sorted(str(p.relative_to(out)) for p in (out / ".dgemm").rglob("*"))
    assert zarr.open_array(str(out), mode="r").nchunks_initialized == total
    # the cluster is whole again (the last one killed may still be restarting) and works
    wait_for(lambda: restarted(fault_cluster, client, killed), 60, "restarted workers")
    A2, B2 = randn(rng, (50, 40), "float64"), randn(rng, (40, 30), "float64")
    check_product(dgemm.matmul(A2, B2, client=client), A2, B2, dtype="float64")


@pytest.fixture
def fresh_fault_cluster():
    """A cluster of its own: after the dozen kills of the test before, the module's cluster sometimes has a
    nanny that left distributed's books while its worker lives on (``name taken`` on a new start)."""
    from distributed import Client

    from conftest import CLUSTER_DEVICES, DEVICES
    if not DEVICES:
        pytest.skip("no OpenCL device on this host (install pocl-binary-distribution for a CPU one)")
    with dgemm.DeviceCluster(CLUSTER_DEVICES, dashboard_address="127.0.0.1:0") as c, \
            Client(c, set_as_default=False) as client:
        client.wait_for_workers(len(c.device_ids), timeout=120)
        yield c, client


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_in_place_gemm_survives_killed_workers(fresh_fault_cluster, tmp_path, rng):
    """``gemm(a, b, c, beta=..., out=c)`` with a worker SIGKILLed twice mid-run: C is updated once.

    When the workers die, dask re-runs the GEMM tasks of blocks already
    stored (their results lived on the dead workers); those must read the
    original C, not the updated one (which gave ``2 alpha AB + beta C0``).
    Each block's original is kept before it is overwritten and read back on
    a re-run; a store task of a block already marked writes nothing.  Every
    element is checked against numpy in float64, and the kept originals and
    the lease are gone once the run is complete.
    """
    fault_cluster, client = fresh_fault_cluster
    m, k, n = 512, 256, 512
    A, B, C0 = (randn(rng, s, "float64") for s in ((m, k), (k, n), (m, n)))
    a = zarr_in(tmp_path / "a.zarr", A, (32, k))
    b = zarr_in(tmp_path / "b.zarr", B, (k, 32))
    c_path = tmp_path / "c.zarr"
    zarr_in(c_path, C0, (32, 32))
    c = zarr.open_array(str(c_path), mode="r+")
    total = (m // 32) * (n // 32)
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(dgemm.gemm, a, b, c, alpha=1.5, beta=-0.5, out=c, client=client, block=(32, 32, k))
        killed, at = [], []
        wait_for(lambda: n_done(c_path) >= 16 or run.done(), 120, "the first blocks")
        for event in range(2):
            before = n_done(c_path)
            if event and run.done():   # one kill mid-run is the case; a second is a bonus
                break
            assert not run.done(), f"the run finished after {len(killed)} kills: make it longer"
            # one worker a time: the blocks it stored are re-run (their results died with it), which is the
            # case; killing every worker at once adds nothing to it and, twice in a row, sometimes leaves a
            # nanny that gives up (distributed), failing the tests after this one on the shared cluster
            victims = [pid for _, pid in sorted(worker_pids(fault_cluster).items())][event % 2:event % 2 + 1]
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            killed += victims
            at.append(before)
            wait_restarted(fault_cluster, client, killed)
            wait_for(lambda: n_done(c_path) >= before + 16 or run.done(), 120, "more blocks")
        result = run.result(timeout=180)
    print(f"killed {len(killed)} worker processes in {len(at)} events, with {at} of {total} blocks stored")
    assert 0 < at[0] < total
    check_product(zarr.open_array(str(c_path), mode="r")[...], A, B, alpha=1.5, beta=-0.5, c=C0,
                  dtype="float64")
    meta = dgemm.open_result(str(c_path)).attrs[COMPLETE_ATTR]
    assert meta["complete"] is True and meta["blocks"] == total
    assert result.store_path == c.store_path
    assert not (c_path / ".dgemm" / "original").exists() and lease.current(c) is None
    wait_for(lambda: restarted(fault_cluster, client, killed), 60, "restarted workers")


# -- the client killed: resume ------------------------------------------------
CLIENT_SCRIPT = """
import sys
import dgemm
from distributed import Client

if __name__ == "__main__":
    address, a, b, out = sys.argv[1:5]
    with Client(address, set_as_default=False) as client:
        dgemm.matmul(a, b, out=out, client=client, block=(32, 32, 512))
    print("FINISHED")
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_killed_client_then_resume_runs_only_the_missing_blocks(client, tmp_path, rng):
    """A client process is SIGKILLed mid-run; ``resume=True`` on the same ``out`` finishes it.

    The interrupted output is refused by ``open_result``; resuming with a
    different operand is refused before any work; the resumed run computes
    exactly the blocks without a marker and the result is exact.  The dead
    client's lease (renewed every 0.5 s here) goes stale, and the resume
    takes it over.
    """
    m, k, n = 512, 512, 512
    A, B = randn(rng, (m, k), "float64"), randn(rng, (k, n), "float64")
    zarr_in(tmp_path / "a.zarr", A, (32, 512))
    zarr_in(tmp_path / "b.zarr", B, (512, 32))
    zarr_in(tmp_path / "b2.zarr", B + 1, (512, 32))
    a, b, out = (str(tmp_path / x) for x in ("a.zarr", "b.zarr", "c.zarr"))
    total = (m // 32) * (n // 32)
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), client.scheduler.address, a, b, out],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(tmp_path),
                            env={**os.environ, "DGEMM_LEASE_INTERVAL": "0.5"})
    try:
        wait_for(lambda: n_done(out) >= 16 or proc.poll() is not None, 120, "the client's first blocks")
        assert proc.poll() is None, f"the client finished before it was killed: {proc.communicate()[0][-2000:]}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    # The scheduler forgets the dead client's tasks; those already running on a worker still finish.
    wait_for(lambda: cluster_idle(client), 60, "the dead client's tasks to drain")
    held = lease.current(zarr.open_array(out, mode="r"))
    assert held is not None and held.pid == proc.pid                   # the dead client's lease is left
    wait_for(lambda: not held.fresh(), 30, "the dead client's lease to go stale")
    done_before = n_done(out)
    print(f"client killed with {done_before} of {total} blocks stored")
    assert 0 < done_before < total, "the kill did not land mid-run"
    with pytest.raises(dgemm.IncompleteResultError, match="is incomplete"):
        dgemm.open_result(out)
    with pytest.raises(ValueError, match="is an incomplete dgemm output"):       # not usable as an input
        dgemm.matmul(out, np.ones((n, 2)), client=client)
    with pytest.raises(ValueError, match=r"cannot resume: .*different product: b was .*b\.zarr"):
        dgemm.matmul(a, str(tmp_path / "b2.zarr"), out=out, resume=True, client=client)
    with pytest.raises(ValueError, match="different product: operation was 'matmul', now 'gemm'.*alpha was 1.0"):
        dgemm.gemm(a, b, alpha=2.0, out=out, resume=True, client=client)
    assert n_done(out) == done_before                                   # the refusals did nothing
    result = dgemm.matmul(a, b, out=out, resume=True, client=client, block=(32, 32, 512))
    meta = result.attrs[COMPLETE_ATTR]
    print(f"resume ran {meta['blocks_run']} blocks")
    assert meta["complete"] is True and meta["resumed"] is True
    assert meta["blocks"] == total and meta["blocks_run"] == total - done_before
    check_product(dgemm.open_result(out)[...], A, B, dtype="float64")
    assert lease.current(result) is None                                # taken over, then released
    # resuming a finished output does nothing and returns it
    again = dgemm.matmul(a, b, out=out, resume=True, client=client)
    assert again.attrs[COMPLETE_ATTR]["blocks_run"] == total - done_before


def test_a_block_whose_write_fails_is_not_marked_and_resume_rewrites_it(client, tmp_path, rng):
    """A store that fails while writing its block leaves it unmarked, so ``resume=True`` writes it again.

    The output's chunk (1, 1) is a folder when the run starts, so writing that
    block fails (IsADirectoryError, on the worker).  Were the block's marker
    written before the block, resume would trust it and skip the block,
    leaving the NaN it holds: every element is checked.
    """
    A, B = randn(rng, (96, 64)), randn(rng, (64, 96))
    out = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(96, 96), chunks=(32, 32), dtype="f8",
                            fill_value=np.nan)
    obstacle = tmp_path / "c.zarr" / "c" / "1" / "1"
    obstacle.mkdir(parents=True)
    (obstacle / "keep").write_text("a folder where the chunk goes")
    with pytest.raises(OSError):
        dgemm.matmul(A, B, out=out, client=client, block=32)
    wait_for(lambda: cluster_idle(client), 60, "the failed run's tasks to drain")
    assert (1, 1) not in markers_of(tmp_path / "c.zarr").done()
    (obstacle / "keep").unlink()
    obstacle.rmdir()
    result = dgemm.matmul(A, B, out=zarr.open_array(str(tmp_path / "c.zarr"), mode="r+"), client=client,
                          block=32, resume=True)
    assert result.attrs[COMPLETE_ATTR]["blocks_run"] >= 1
    check_product(dgemm.open_result(str(tmp_path / "c.zarr"))[...], A, B, dtype="float64")


def test_an_output_missing_a_marker_is_never_marked_complete(client, tmp_path, rng, monkeypatch):
    """The last guard: after the run, a block without its completion marker keeps out incomplete.

    A marker that vanished between the run and its completion (here deleted
    on purpose, as a store that loses a write would) must make the call
    fail and leave ``out`` incomplete, however every task ended.
    """
    import dgemm.client.steps as steps

    A, B = randn(rng, (64, 64)), randn(rng, (64, 64))
    path = tmp_path / "c.zarr"
    real = steps._compute

    def compute_then_lose_a_marker(*args, **kwargs):
        real(*args, **kwargs)
        markers = markers_of(path)
        lost = min(markers.done())
        (path / markers.key(*lost)).unlink()

    monkeypatch.setattr(steps, "_compute", compute_then_lose_a_marker)
    with pytest.raises(RuntimeError, match="no completion marker"):
        dgemm.matmul(A, B, out=str(path), client=client, block=32)
    with pytest.raises(dgemm.IncompleteResultError):
        dgemm.open_result(str(path))
    monkeypatch.setattr(steps, "_compute", real)
    wait_for(lambda: cluster_idle(client), 60, "the run's tasks to drain")
    result = dgemm.matmul(A, B, out=str(path), client=client, block=32, resume=True)
    assert result.attrs[COMPLETE_ATTR]["blocks_run"] == 1
    check_product(result[...], A, B, dtype="float64")


def test_resume_after_a_failed_run_and_with_a_missing_out(client, tmp_path, rng):
    """A run that failed on an unreadable chunk is resumed once the chunk is repaired.

    Deterministic counterpart of the killed client: whatever the failed run
    stored is kept, the rest is computed.  ``resume=True`` on an ``out`` that
    does not exist yet simply writes it.
    """
    A, B = randn(rng, (128, 64), "float32"), randn(rng, (64, 96), "float32")
    a = zarr_in(tmp_path / "a.zarr", A, (32, 64), compressors=None)
    chunk = tmp_path / "a.zarr" / "c" / "3" / "0"
    good = chunk.read_bytes()
    chunk.write_bytes(b"broken")
    out = str(tmp_path / "c.zarr")
    with pytest.raises(OSError, match=r"a\.zarr rows \d+:128, columns \d+:\d+, chunk \(3, 0\) \(store key 'c/3/0'\)"):
        dgemm.matmul(a, B, out=out, client=client, block=32)
    wait_for(lambda: cluster_idle(client), 60, "the failed run's tasks to drain")
    assert markers_of(out) is not None
    done_before = n_done(out)
    chunk.write_bytes(good)
    result = dgemm.matmul(a, B, out=out, client=client, block=32, resume=True)
    meta = result.attrs[COMPLETE_ATTR]
    assert done_before < meta["blocks"] and meta["blocks_run"] == meta["blocks"] - done_before
    check_product(dgemm.open_result(out)[...], A, B, dtype="float32")
    with pytest.raises(ValueError, match="different product: precision was None, now 'tf32'"):
        dgemm.matmul(a, B, out=out, client=client, block=32, resume=True, precision="tf32")
    fresh = dgemm.matmul(a, B, out=str(tmp_path / "new.zarr"), client=client, resume=True)
    assert fresh.attrs[COMPLETE_ATTR]["resumed"] is False
    check_product(fresh[...], A, B, dtype="float32")


# -- concurrent runs ----------------------------------------------------------
def test_four_concurrent_matmuls_on_one_cluster(client, tmp_path, rng):
    """Four products submitted at once from four client threads: all correct, none mixed up."""
    cases = [
        ("zarr-f32", randn(rng, (200, 150), "float32"), randn(rng, (150, 130), "float32"), {}),
        ("zarr-f64-trans", randn(rng, (90, 160), "float64"), randn(rng, (120, 90), "float64"),
         dict(trans_a=True, trans_b=True)),
        ("numpy-ksplit", randn(rng, (40, 700), "float64"), randn(rng, (700, 30), "float64"), {}),
        ("gemm-beta", randn(rng, (110, 80), "float32"), randn(rng, (80, 100), "float32"), dict(beta=0.5)),
    ]
    barrier = threading.Barrier(len(cases))

    def one(case):
        name, A, B, kw = case
        a = zarr_in(tmp_path / f"{name}-a.zarr", A, (32, 64))
        out = str(tmp_path / f"{name}-c.zarr")
        barrier.wait()
        if name == "numpy-ksplit":                      # numpy inputs, k split over the workers
            return dgemm.matmul(A, B, out=out, client=client, block=(64, 64, 128))
        if "trans_a" in kw or "beta" in kw:
            c = randn(np.random.default_rng(7), (A.shape[0], B.shape[1]), A.dtype) if "beta" in kw else None
            return dgemm.gemm(a, B, c=c, out=out, client=client, block=32, **kw)
        return dgemm.matmul(a, B, out=out, client=client, block=32)

    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(one, cases))
    for (name, A, B, kw), res in zip(cases, results):
        c = randn(np.random.default_rng(7), (A.shape[0], B.shape[1]), A.dtype) if "beta" in kw else None
        check_product(res[...], A, B, dtype=A.dtype, c=c, what=name, **kw)
        assert dgemm.open_result(res.store_path).attrs[COMPLETE_ATTR]["complete"]


# -- device memory ------------------------------------------------------------
@pytest.fixture
def memory_limit(fault_client):
    """Set ``DGEMM_DEVICE_MEMORY_LIMIT`` in the fault cluster's workers for one test."""
    def set_limit(value):
        def setenv(v=value):
            if v is None:
                os.environ.pop("DGEMM_DEVICE_MEMORY_LIMIT", None)
            else:
                os.environ["DGEMM_DEVICE_MEMORY_LIMIT"] = v
        fault_client.run(setenv)
    yield set_limit
    set_limit(None)


def test_small_device_memory_shrinks_blocks(fault_cluster, fault_client, memory_limit, tmp_path, rng):
    """A device with little memory: the plan shrinks the blocks asked for until they fit, and the product is right."""
    from dgemm.cluster import device_limits, prepare, tiles_of
    from dgemm.sizes import MEMORY_FRACTION, working_set

    client = fault_client
    pids = worker_pids(fault_cluster)
    memory_limit("1MiB")
    A, B = randn(rng, (300, 250), "float64"), randn(rng, (250, 280), "float64")
    out = dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=client, block=1024)
    check_product(out[...], A, B, dtype="float64")
    plan = out.attrs[COMPLETE_ATTR]["plan"]
    assert "blocks shrunk: a block product of 300 x 280 x 250 needs" in plan
    bm, bn = out.chunks
    bk = int(plan.split("k-blocks of ")[1].split(";")[0])
    workers = prepare(client, "float64")
    memory, _ = device_limits(workers)
    one_device = len({w["device"].id for w in workers.values()}) == 1          # (all on this host)
    assert memory == (2**20 // len(workers) if one_device else 2**20)         # workers on one device share it
    assert working_set(bm, bn, bk, tiles_of(workers, "float64"), 8)[0] <= MEMORY_FRACTION * memory
    assert worker_pids(fault_cluster) == pids                            # no worker was lost


def test_too_little_device_memory_is_a_clear_error_before_any_work(fault_client, memory_limit, tmp_path):
    memory_limit("16KiB")
    with pytest.raises(dgemm.PlanError, match=r"no blocking of C\[64 x 64\] = .* fits: .* of the smallest "
                                                     r"device's \d+\.\d+ kiB is \d+\.\d+ kiB"):
        dgemm.matmul(np.ones((64, 64)), np.ones((64, 64)), out=str(tmp_path / "c.zarr"), client=fault_client)
    assert not (tmp_path / "c.zarr").exists()
    memory_limit("lots")
    with pytest.raises(dgemm.NoDeviceWorkerError, match="DGEMM_DEVICE_MEMORY_LIMIT='lots' is not a size"):
        dgemm.matmul(np.ones((4, 4)), np.ones((4, 4)), client=fault_client)


def test_device_limits_take_the_smallest_share():
    """The plan fits the smallest device memory, shared by the workers on one device."""
    from dgemm.cluster import device_limits
    from dgemm.opencl.discovery import DeviceInfo

    def info(dev, mem):
        return DeviceInfo(0, dev, "P", f"d{dev}", "v", "GPU", mem, 65536, 1024, 1, True, None, "")

    def desc(dev, mem, host="h1", limit=None, max_alloc=None):
        return {"ok": True, "device": info(dev, mem), "memory": mem if limit is None else min(mem, limit),
                "max_alloc": max_alloc, "host": host}

    assert device_limits({"w1": desc(0, 8 * 2**30), "w2": desc(1, 4 * 2**30, max_alloc=2**30)}) == (4 * 2**30, 2**30)
    # two workers on device 0 of host h1 share it; the same device id on another host does not
    workers = {"w1": desc(0, 8 * 2**30), "w2": desc(0, 8 * 2**30), "w3": desc(0, 6 * 2**30, host="h2")}
    assert device_limits(workers) == (4 * 2**30, None)
    assert device_limits({"w1": desc(0, 8 * 2**30, limit=2**20)}) == (2**20, None)
    assert device_limits({"w1": {"ok": True, "device": info(0, 1), "host": "h"}}) == (None, None)   # older workers


def test_describe_for_plan_reads_the_limit_in_the_worker(monkeypatch):
    from dgemm.cluster import describe_for_plan
    from dgemm.opencl.discovery import DeviceInfo

    class W:
        plugins: dict = {}
        state = type("S", (), {"total_resources": {"GPU": 1}})()

    info = DeviceInfo(0, 0, "P", "d", "v", "GPU", 2**30, 65536, 1024, 1, True, None, "")
    monkeypatch.setattr("dgemm.cluster.readiness.describe_worker",
                        lambda w: {"ok": True, "device": info, "params": {}, "stats": {}, "resources": {}})
    monkeypatch.delenv("DGEMM_DEVICE_MEMORY_LIMIT", raising=False)
    assert describe_for_plan(W())["memory"] == 2**30
    monkeypatch.setenv("DGEMM_DEVICE_MEMORY_LIMIT", "100MB")
    d = describe_for_plan(W())
    assert d["memory"] == d["memory_limit"] == 100 * 10**6 and d["ok"]
    monkeypatch.setenv("DGEMM_DEVICE_MEMORY_LIMIT", "4GiB")                 # a cap above the device: the device
    assert describe_for_plan(W())["memory"] == 2**30
    monkeypatch.setenv("DGEMM_DEVICE_MEMORY_LIMIT", "-5")
    d = describe_for_plan(W())
    assert not d["ok"] and "DGEMM_DEVICE_MEMORY_LIMIT='-5' is not a size" in d["error"]


def test_describe_for_plan_refuses_a_bad_host_cache_setting_in_its_own_words(monkeypatch):
    """The worker's codec paths (``codecs``) read the host cache's settings: a bad one makes the worker unusable
    with the setting's message, as the device memory limit's does, not a worker that does not answer."""
    from types import SimpleNamespace as NS

    from dgemm.cluster import describe_for_plan
    from dgemm.names import WORKER_PLUGIN
    from dgemm.opencl import codecs
    from dgemm.opencl.discovery import DeviceInfo

    info = DeviceInfo(0, 0, "P", "d", "v", "GPU", 2**30, 65536, 1024, 1, True, None, "")
    state = NS(device=NS(info=info), siblings=lambda: False, memory_share=lambda: 2**29)

    class W:
        plugins: dict = {WORKER_PLUGIN: NS(state=state)}
    monkeypatch.setattr("dgemm.cluster.readiness.describe_worker",
                        lambda w: {"ok": True, "device": info, "params": {}, "stats": {}, "resources": {}})
    monkeypatch.delenv("DGEMM_DEVICE_MEMORY_LIMIT", raising=False)
    monkeypatch.delenv("DGEMM_HOST_CACHE", raising=False)
    d = describe_for_plan(W())
    assert d["ok"] and d["codecs"]["memory"] == 2**29 and d["codecs"]["decode"], d
    assert d["codecs"]["share"] is (codecs.AUTO["GPU"] == "share"), d     # (auto on a GPU, as built)
    monkeypatch.setenv("DGEMM_HOST_CACHE", "relative/folder")
    d = describe_for_plan(W())
    assert not d["ok"] and "DGEMM_HOST_CACHE" in d["error"], d


def test_prepare_does_not_register_the_plugin_twice():
    """Workers still starting (after a restart) are waited for, not re-registered: that would tear
    down every worker's device under the tasks of runs in flight."""
    from dgemm.cluster import prepare
    from dgemm.opencl.discovery import DeviceInfo
    from dgemm.opencl.params import KernelParams

    info = DeviceInfo(0, 0, "P", "d", "v", "GPU", 2**30, 65536, 1024, 1, True, None, "")
    ready = {"ok": True, "device": info, "params": {"float32": {"params": KernelParams().as_dict()}},
             "stats": {}, "resources": {"GPU": 1}, "memory": 2**30, "max_alloc": None, "host": "h"}

    class Client:
        scheduler = type("S", (), {"address": "tcp://fake:1"})()

        def __init__(self):
            self.calls, self.registered = 0, []

        def wait_for_workers(self, n, timeout=None):
            pass

        def run(self, fn, **kw):
            self.calls += 1
            return {"w1": ready, "w2": None if self.calls < 3 else ready}   # w2 comes up a moment later

        def run_on_scheduler(self, fn):
            return True

        def register_plugin(self, plugin, name=None):
            self.registered.append(name)

    c = Client()
    assert set(prepare(c, "float32", timeout=5)) == {"w1", "w2"}
    assert c.registered == [] and c.calls >= 3


def test_host_memory_of_the_workers_stays_within_their_limit(fault_client, tmp_path, rng):
    """Report, not a limit test: each worker's resident memory after a product against its memory limit."""
    A, B = randn(rng, (512, 512), "float64"), randn(rng, (512, 512), "float64")
    dgemm.matmul(zarr_in(tmp_path / "a.zarr", A, (128, 128)), B, out=str(tmp_path / "c.zarr"), client=fault_client)
    from distributed.system import MEMORY_LIMIT

    info = fault_client.run(lambda dask_worker: (dask_worker.monitor.get_process_memory(),
                                                 dask_worker.memory_manager.memory_limit))
    for addr, (rss, limit) in info.items():
        print(f"{addr}: resident {rss / 2**20:.0f} MiB of a {limit / 2**20:.0f} MiB limit")
        assert rss < limit
    # the DeviceCluster shares the host's memory among its workers (not all of it to each)
    assert sum(limit for _, limit in info.values()) <= MEMORY_LIMIT


# -- corrupted and missing input chunks ---------------------------------------
@pytest.mark.parametrize("damage", ["garbage", "truncated", "unreadable"])
def test_bad_input_chunk_names_array_and_chunk(client, tmp_path, rng, damage):
    """An unreadable chunk fails the run with the array's path and the chunk's index and key; nothing complete.

    (A chunk that is simply absent is not an error in Zarr: it reads as the
    array's fill value, which is how Zarr stores chunks equal to it; a
    directory in its place reads the same way.  An input
    that is an unfinished dgemm output is refused before any work; see the
    bad-input table in test_api.py.)
    """
    A, B = randn(rng, (96, 64), "float64"), randn(rng, (64, 40), "float64")
    zarr_in(tmp_path / "a.zarr", A, (32, 32))                    # compressed (zstd)
    chunk = tmp_path / "a.zarr" / "c" / "1" / "1"
    if damage == "garbage":
        chunk.write_bytes(b"\x00not zstd at all" * 10)
    elif damage == "truncated":
        chunk.write_bytes(chunk.read_bytes()[:20])
    else:                                   # an I/O error (as root, permissions would not stop a read)
        chunk.unlink()
        chunk.symlink_to(chunk.name)        # a link to itself: ELOOP
    out = str(tmp_path / "c.zarr")
    with pytest.raises(OSError) as err:
        dgemm.matmul(str(tmp_path / "a.zarr"), B, out=out, client=client, block=32)
    msg = str(err.value)
    assert f"dgemm could not read Zarr array file://{tmp_path}/a.zarr rows " in msg
    assert "chunk (1, 1) (store key 'c/1/1')" in msg
    with pytest.raises(dgemm.IncompleteResultError):
        dgemm.open_result(out)
    assert zarr.open_array(out, mode="r").attrs[COMPLETE_ATTR]["complete"] is False


# -- security -------------------------------------------------------------------
REFUSED_CLIENTS = """
import json, os, sys
from distributed import Client
from distributed.security import Security

if __name__ == "__main__":
    address, other = sys.argv[1:3]
    stranger = Security(tls_ca_file=f"{other}/ca.pem", tls_client_cert=f"{other}/client.pem",
                        tls_client_key=f"{other}/client-key.pem", require_encryption=True)
    attempts = {"no certificates": dict(address=address), "plain TCP": dict(address="tcp://" + address[6:]),
                "another authority": dict(address=address, security=stranger)}
    out = {}
    for name, kw in attempts.items():
        try:
            c = Client(timeout=5, set_as_default=False, **kw)
            out[name] = "CONNECTED to " + str(c.scheduler_info().get("address"))
        except Exception as e:
            out[name] = f"refused: {type(e).__name__}: {e}"[:300]
    print(json.dumps(out), flush=True)
    os._exit(0)
"""


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def test_tls_cluster_refuses_clients_without_certificates(tmp_path, rng):
    """A DeviceCluster on TLS, with certificates and configuration from deploy/tls/.

    Refused: a client with no certificates, one speaking plain TCP to the TLS
    port, one whose certificate another authority signed.  Accepted: one with
    the cluster's client certificate, through which dgemm.matmul works.
    """
    pytest.importorskip("cryptography", reason="generating certificates needs cryptography (in the test extra)")
    import dask
    import yaml
    from distributed import Client
    from distributed.security import Security
    from conftest import DEVICES
    if not DEVICES:
        pytest.skip("no OpenCL device on this host (install pocl-binary-distribution for a CPU one)")

    sys.path.insert(0, str(ROOT / "deploy" / "tls"))
    try:
        import make_certs
    finally:
        sys.path.pop(0)
    make_certs.make_certs(tmp_path / "tls")
    make_certs.make_certs(tmp_path / "other")          # a stranger's authority
    text = (ROOT / "deploy" / "tls" / "dask-tls.yaml").read_text().replace("/etc/dgemm/tls", str(tmp_path / "tls"))
    config = dict(_flatten(yaml.safe_load(text)))          # dotted keys: set leaves, keep the other defaults
    with dask.config.set(config):
        security = Security()                  # everything from the configuration, as on a real machine
    assert security.require_encryption and security.tls_client_cert.endswith("client.pem")
    assert oct(os.stat(tmp_path / "tls" / "node-key.pem").st_mode & 0o777) == "0o600"
    with dask.config.set(config):
        cluster = dgemm.DeviceCluster("cpu", security=security, protocol="tls://", dashboard_address="127.0.0.1:0")
    with cluster:
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:")
        # Refused clients run in a process of their own: a Client whose connection failed can hang
        # in its __del__ when collected in this one (distributed's loop runner), which is not what
        # is tested here.
        probe = tmp_path / "probe.py"
        probe.write_text(REFUSED_CLIENTS)
        res = subprocess.run([sys.executable, str(probe), address, str(tmp_path / "other")], capture_output=True,
                             text=True, timeout=120)
        refused = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else res.stderr[-3000:]
        print(refused)
        assert isinstance(refused, dict), refused
        assert refused["no certificates"].startswith("refused"), refused
        assert refused["plain TCP"].startswith("refused"), refused
        assert refused["another authority"].startswith("refused"), refused
        with Client(address, security=security, timeout=30, set_as_default=False) as c:
            c.wait_for_workers(1, timeout=60)
            assert all(w.startswith("tls://127.0.0.1:") for w in c.scheduler_info()["workers"])
            A, B = randn(rng, (70, 50), "float32"), randn(rng, (50, 60), "float32")
            out = dgemm.matmul(A, B, out=str(tmp_path / "c.zarr"), client=c, block=32)
            check_product(out[...], A, B, dtype="float32")
        # the defaults of a DeviceCluster: scheduler and dashboard on localhost only
        assert cluster.scheduler.listeners[0].listen_address.startswith("tls://127.0.0.1:")
        http = cluster.scheduler.http_server
        bound = {s.getsockname()[0] for s in http._sockets.values()}
        assert bound == {"127.0.0.1"}, f"the dashboard listens on {bound}"


PATHS = ["c $(touch PWNED).zarr", "c; touch PWNED #.zarr", "c `touch PWNED`.zarr",
         "c' + __import__('os').system('touch PWNED') + '.zarr", 'c" {0} %s {__class__} \\n.zarr',
         "c | touch PWNED && .zarr", "ç✓ unicode.zarr"]


@pytest.mark.parametrize("name", PATHS)
def test_out_paths_are_used_as_given(client, tmp_path, rng, name, monkeypatch):
    """Metacharacters in ``out`` are just characters: the array lands at exactly that path, nothing runs."""
    monkeypatch.chdir(tmp_path)
    A, B = randn(rng, (20, 10), "float32"), randn(rng, (10, 15), "float32")
    out = tmp_path / name
    res = dgemm.matmul(A, B, out=str(out), client=client)
    assert out.is_dir() and (out / "zarr.json").is_file()
    check_product(dgemm.open_result(str(out))[...], A, B, dtype="float32")
    assert res.attrs[COMPLETE_ATTR]["complete"]
    assert not list(tmp_path.rglob("PWNED")) and not (ROOT / "PWNED").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_no_eval_exec_or_shell_in_the_package():
    """Nothing in dgemm turns data into code: no eval/exec, no shell."""
    import re
    bad = re.compile(r"\b(eval|exec)\s*\(|shell\s*=\s*True|os\.system\s*\(|os\.popen\s*\(|pickle\.loads?\s*\(")
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in sorted((ROOT / "dgemm").glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if bad.search(line)]
    assert hits == []


# -- load ---------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_thousand_blocks(client, tmp_path, rng):
    """1024 C blocks (32 x 32 of a 1024 x 1024 result): 2049 tasks, every block stored and marked, exact."""
    A, B = randn(rng, (1024, 32), "float32"), randn(rng, (32, 1024), "float32")
    a = zarr_in(tmp_path / "a.zarr", A, (32, 32))
    b = zarr_in(tmp_path / "b.zarr", B, (32, 32))
    out = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=32)
    meta = out.attrs[COMPLETE_ATTR]
    assert meta["blocks"] == meta["blocks_run"] == 1024
    assert "grid: 32 x 32 C blocks" in meta["plan"]
    check_product(out[...], A, B, dtype="float32")
    assert out.nchunks_initialized == 1024
    # complete: its 1024 markers were all there (complete checks them), and are gone, .dgemm with them
    assert markers_of(tmp_path / "c.zarr").done() == set() and not (tmp_path / "c.zarr" / ".dgemm").exists()


def test_overhead_script(cluster, tmp_path):
    """bench/overhead.py runs and writes its JSON record (a small run, on the session's cluster)."""
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "overhead.py"), "--size", "128", "--block", "32",
                          "--null-tasks", "50", "--out", str(tmp_path / "o.json"),
                          "--scheduler", cluster.scheduler_address],
                         capture_output=True, text=True, timeout=240, cwd=str(ROOT))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rec = json.loads((tmp_path / "o.json").read_text())
    for key in ("device", "date", "commit", "command", "tasks", "wall_s", "overhead_per_task_ms",
                "null_task_ms"):
        assert key in rec, key
    assert rec["blocks"] == 16 and rec["tasks"] == 2 * 16 + 1


def test_in_place_gemm_resumes_from_the_kept_originals(client, tmp_path, rng):
    """An in-place gemm that failed mid-run is finished by ``resume=True``: blocks done stay, the others
    read the original C (the kept copy where a block was written but not marked), every element right."""
    from dgemm.storage import ZarrBlock
    from dgemm.storage.originals import Originals

    A, B, C0 = randn(rng, (128, 64)), randn(rng, (64, 96)), randn(rng, (128, 96))
    a = zarr_in(tmp_path / "a.zarr", A, (32, 64), compressors=None)
    c = zarr_in(tmp_path / "c.zarr", C0, (32, 32))
    chunk = tmp_path / "a.zarr" / "c" / "3" / "0"
    good = chunk.read_bytes()
    chunk.write_bytes(b"broken")
    with pytest.raises(OSError, match="chunk \\(3, 0\\)"):
        dgemm.gemm(a, B, c, beta=0.5, out=c, client=client, block=32)
    chunk.write_bytes(good)
    owner = c.attrs[COMPLETE_ATTR]["owner"]
    done = BlockMarkers(c, owner).done()
    i, j = next((i, j) for i in range(4) for j in range(3) if (i, j) not in done)
    # as a store task killed between writing its block and marking it leaves C: original kept, block written
    Originals(c, owner).keep(i, j, ZarrBlock(c, (32 * i, 32 * i + 32), (32 * j, 32 * j + 32)))
    c[32 * i:32 * i + 32, 32 * j:32 * j + 32] = 1e6
    result = dgemm.gemm(a, B, c, beta=0.5, out=c, client=client, block=32, resume=True)
    meta = result.attrs[COMPLETE_ATTR]
    assert meta["complete"] and meta["resumed"] and meta["blocks_run"] == 12 - len(done)
    check_product(result[...], A, B, beta=0.5, c=C0, dtype="float64")
    assert not (tmp_path / "c.zarr" / ".dgemm" / "original").exists()

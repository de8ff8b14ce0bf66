"""Issue 26: a worker gives its memory back after every product, and device errors reach the user readable.

The distributed test runs products one after another on one real worker
process (a DeviceCluster of one PoCL device) and checks, after each, that
the worker's live OpenCL buffers (counted by the device:
:meth:`dgemm.opencl.device.Device.live_buffers`, no gc internals) and its
RSS come back to the idle worker's.  Before the fix, reference cycles
(panel cache entry -> its future -> the future's callback -> the entry) and a
panel cache kept across runs held every run's staged blocks, and the
engines' accumulators of every dtype stayed: the buffers grew run after run
until Python's collector happened to run.
"""
from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
import zarr

import dgemm
from conftest import CLUSTER_DEVICES, DEVICES
from dgemm.errors import DeviceError, DeviceMemoryError

MiB = 1 << 20


def _probe(dask_worker=None):
    """On the worker: its device's live buffers, panel cache bytes and RSS."""
    import psutil

    from dgemm.opencl.device import pinned_limit

    state = dask_worker.plugins["dgemm"].state
    out = dict(state.device.live_buffers())
    out.update(cache_bytes=state.device.cache.bytes, rss=psutil.Process().memory_info().rss,
               keep=state.device.staging_keep, threads=state.device.pool()._max_workers,
               pinned_limit=pinned_limit())
    return out


def _release_idle(dask_worker=None):
    """On the worker: what its idle timer does after IDLE_SECONDS without a product, now."""
    return dask_worker.plugins["dgemm"].state.release_idle(0.0)


def _zarr(path, data, chunks):
    z = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype)
    z[...] = data
    return str(path)


def _products(tmp_path, rng):
    """20 products: float32 and float64; square, tall-skinny, Gram X^T X, transposed operands."""
    inputs = {}
    for dt in ("float32", "float64"):
        sq = rng.standard_normal((768, 768)).astype(dt)
        tall = rng.standard_normal((2048, 256)).astype(dt)
        small = rng.standard_normal((256, 384)).astype(dt)
        inputs[dt] = {name: (_zarr(tmp_path / f"{name}-{dt}.zarr", x, (256, 256)), x)
                      for name, x in (("sq", sq), ("tall", tall), ("small", small))}
    kinds = [
        ("square", "sq", "sq", {}),
        ("tall-skinny", "tall", "small", {}),
        ("gram", "tall", "tall", {"trans_a": True}),
        ("trans_b", "sq", "sq", {"trans_b": True}),
        ("trans_ab", "small", "tall", {"trans_a": True, "trans_b": True}),
    ]
    out = []
    for i in range(20):
        dt = ("float32", "float64")[i % 2]
        name, a, b, kw = kinds[(i // 2) % len(kinds) if i < 10 else (i * 3) % len(kinds)]
        out.append((dt, name, inputs[dt][a], inputs[dt][b], kw))
    return out


def _wait_idle(client, timeout=20.0):
    """The worker's probe once its device buffers are all given back (or the last one at ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        (probe,) = client.run(_probe).values()
        if probe["buffers"] == 0 or time.monotonic() > deadline:
            return probe
        time.sleep(0.2)


@pytest.fixture(scope="module")
def one_worker():
    """A DeviceCluster of one real worker process on the first PoCL/CPU device."""
    from distributed import Client

    if not DEVICES:
        pytest.skip("no OpenCL device on this host (install pocl-binary-distribution for a CPU one)")
    with dgemm.DeviceCluster(CLUSTER_DEVICES.split(",")[0], dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(1, timeout=120)
        yield client


def test_memory_comes_back_after_every_product(one_worker, tmp_path, rng):
    """After each of 20 mixed products: no device buffer left, staging bounded, RSS back to idle."""
    client = one_worker
    products = _products(tmp_path, rng)
    # Idle: after one product of each dtype (the kernels are built, the reader threads have their
    # staging buffers) and their release.
    for dt in ("float32", "float64"):
        a = products[0 if dt == "float32" else 1][2]
        dgemm.matmul(a[0], a[0], out=str(tmp_path / f"warm-{dt}.zarr"), client=client)
    idle = _wait_idle(client)
    assert idle["buffers"] == 0 and idle["cache_bytes"] == 0, idle
    client.run(_release_idle)
    idle = _wait_idle(client)
    rows = []
    for i, (dt, name, (a, xa), (b, xb), kw) in enumerate(products):
        out = str(tmp_path / f"c-{dt}.zarr")
        dgemm.gemm(a, b, out=out, overwrite=True, client=client, **kw)
        got = zarr.open_array(out, mode="r")[...]
        want = (xa.T if kw.get("trans_a") else xa) @ (xb.T if kw.get("trans_b") else xb)
        np.testing.assert_allclose(got, want, rtol=1e-3 if dt == "float32" else 1e-10,
                                   atol=1e-3 if dt == "float32" else 1e-10)
        probe = _wait_idle(client)
        rows.append((i, dt, name, probe))
        print(f"product {i:2d} {dt} {name:11s}: device buffers {probe['buffers']} ({probe['buffer_bytes']} B), "
              f"page-locked {probe['pinned_buffers']} ({probe['pinned_bytes'] / MiB:.1f} MiB), "
              f"cache {probe['cache_bytes']} B, RSS {probe['rss'] / MiB:.1f} MiB "
              f"(idle {idle['rss'] / MiB:.1f})")
        # at the run's end: no device buffer, no cache entry
        assert probe["buffers"] == 0 and probe["buffer_bytes"] == 0, (i, dt, name, probe)
        assert probe["cache_bytes"] == 0, (i, dt, name, probe)
        # page-locked memory kept for the next run, within its bound: a staging buffer per reader thread
        # (decoding and copying; the blocks here are within the default block) and the pinned-bytes setting
        assert probe["pinned_bytes"] <= probe["pinned_limit"] + 2 * probe["threads"] * probe["keep"], \
            (i, dt, name, probe)
        assert probe["rss"] <= idle["rss"] * 1.05 + max(0, probe["pinned_bytes"] - idle["pinned_bytes"]) + 8 * MiB, \
            (i, dt, name, probe, idle)
        if i % 5 == 4:   # idle (the worker's timer, IDLE_SECONDS): back to the idle worker's figures
            client.run(_release_idle)
            probe = _wait_idle(client)
            print(f"           idle    : device buffers {probe['buffers']}, page-locked {probe['pinned_buffers']} "
                  f"({probe['pinned_bytes'] / MiB:.1f} MiB), RSS {probe['rss'] / MiB:.1f} MiB, "
                  f"{probe['threads']} readers, keep {probe['keep'] / MiB:.1f} MiB")
            assert probe["buffers"] == 0 and probe["cache_bytes"] == 0, probe
            # at most one staging buffer of the default block per reader thread (decoding and copying)
            assert probe["pinned_bytes"] <= max(idle["pinned_bytes"], 2 * probe["threads"] * probe["keep"]), probe
            # RSS: the idle worker's, give or take 5 % and the bounded staging pool's difference
            assert probe["rss"] <= idle["rss"] * 1.05 + max(0, probe["pinned_bytes"] - idle["pinned_bytes"]), \
                (i, probe, idle)


def _watch_slots(dask_worker=None, stop=False):
    """On the worker: from now (until ``stop``), each buffer a decode or encode slot takes is noted with the slot's
    budget then, the bytes the slot holds after it and the bytes asked; returns and forgets what was noted, and the
    sizes each scratch keeps now."""
    state = dask_worker.plugins["dgemm"].state
    seen, state.slot_takes = getattr(state, "slot_takes", []), []
    for name in ("scratch", "encode_scratch"):
        scratch = getattr(state.device, name)
        scratch.__dict__.pop("buffer", None)
        if stop:
            continue

        def buffer(what, nbytes, _real=scratch.buffer, _name=name, _scratch=scratch):
            got = _real(what, nbytes)
            if _scratch.holding():
                state.slot_takes.append((_name, what, _scratch.budget, _scratch.held(), max(nbytes, 1)))
            return got
        scratch.buffer = buffer
    return seen, {name: dict(getattr(state.device, name)._sizes) for name in ("scratch", "encode_scratch")}


def test_memory_comes_back_with_device_codecs(one_worker, tmp_path, rng):
    """device-codecs on: each reader thread's decode buffers and queue (Device.scratch) are given back at
    every run's end, not kept, while the results stay exact: no device buffer left after any product.  Within a
    product each decode and encode slot knows what it may hold (its budget: its new buffers are made as large as
    their names have been, within it); after it, only the names' sizes are kept, not the buffers."""
    import _device_codecs

    client = one_worker
    products = _products(tmp_path, rng)[:6]
    set_codecs = _device_codecs.setting(client)
    try:
        next(set_codecs)("on")
        client.run(_watch_slots)
        encoded = 0
        for i, (dt, name, (a, xa), (b, xb), kw) in enumerate(products):
            out = str(tmp_path / f"dc-{dt}.zarr")
            _, grew = _device_codecs.run_counted(
                client, lambda: dgemm.gemm(a, b, out=out, overwrite=True, client=client, **kw),
                ("device_decoded_bytes",))
            assert grew["device_decoded_bytes"] > 0, (i, name, "the device decoded nothing")
            got = zarr.open_array(out, mode="r")[...]
            want = (xa.T if kw.get("trans_a") else xa) @ (xb.T if kw.get("trans_b") else xb)
            np.testing.assert_allclose(got, want, rtol=1e-3 if dt == "float32" else 1e-10,
                                       atol=1e-3 if dt == "float32" else 1e-10)
            probe = _wait_idle(client)
            assert probe["buffers"] == 0 and probe["buffer_bytes"] == 0, (i, dt, name, probe)
            ((takes, after),) = client.run(_watch_slots).values()
            assert any(t[0] == "scratch" for t in takes), (i, dt, name, "no decode slot took a buffer")
            assert all(t[2] > 0 for t in takes), (i, dt, name, "a slot took a buffer with no budget said", takes)
            over = [t for t in takes if t[3] > t[2]]
            assert not over, (i, dt, name, "a slot past its budget (what the panel cache leaves it)", over)
            encoded += sum(t[0] == "encode_scratch" for t in takes)
            assert after["scratch"], (i, dt, name, "no size kept", after)
        assert encoded, "no encode slot took a buffer"
    finally:
        client.run(_watch_slots, stop=True)
        next(set_codecs, None)


def _cache_budget(dask_worker=None):
    return dask_worker.plugins["dgemm"].state.device.cache.budget


def _budgets_off_and_on(client, tmp_path, a, b, want) -> dict:
    """The worker's panel-cache budget after the product of Zarr paths ``a`` and ``b`` (float64 ``want``) under
    device-codecs off, then on; each C checked.  The client's plan counts the same cache, less its margin
    (:func:`dgemm.client.codecs_room.panel_cache_bytes`, with what the worker's description says of its codecs): checked
    for each mode, so that the growing-rectangle order sees the cache the worker has; and so does the floor
    ``dgemm bench e2e`` records beside the run (:func:`dgemm.benchmarks.floor.plan_floor`), which counts the
    encoder's room only where C is there to read."""
    import _device_codecs

    from dgemm.benchmarks.floor import plan_floor
    from dgemm.client import steps
    from dgemm.client.codecs_room import panel_cache_bytes
    from dgemm.client.request import Request
    from dgemm.cluster import prepare

    set_codecs = _device_codecs.setting(client)
    configure = next(set_codecs)
    budgets = {}
    try:
        for mode in ("off", "on"):
            configure(mode)
            out = str(tmp_path / f"c-{mode}.zarr")
            req = Request.check("matmul", a, b, out=out, client=client)
            workers = prepare(client, req.dtype)
            plan = steps._plan(req, workers)
            dgemm.matmul(a, b, out=out, client=client)
            np.testing.assert_allclose(zarr.open_array(out, mode="r")[...], want, rtol=1e-4, atol=1e-4)
            (budgets[mode],) = client.run(_cache_budget).values()
            c = zarr.open_array(out, mode="r+")
            seen = panel_cache_bytes(plan, workers, req.a, req.b, c, req.drop, req.beta)
            assert seen == pytest.approx(0.9 * budgets[mode], abs=1), (mode, seen, budgets[mode])
            floor = plan_floor(workers, a, b, req.dtype.name, out=c)
            assert floor["block"][:2] == list(plan.block_shape[:2])
            assert floor["cache_bytes"] == pytest.approx(0.9 * budgets[mode], abs=1), (mode, floor, budgets[mode])
            assert floor["encoder_counted"]
            bare = plan_floor(workers, a, b, req.dtype.name)        # (as the benchmark's: C gone)
            assert not bare["encoder_counted"]
            assert bare["cache_bytes"] == pytest.approx(
                panel_cache_bytes(plan, workers, req.a, req.b, None, req.drop, req.beta), abs=1)
            if mode == "off":       # (nothing of the codecs on the device: C's absence changes nothing)
                assert bare["cache_bytes"] == pytest.approx(floor["cache_bytes"], abs=1)
    finally:
        next(set_codecs, None)
    return budgets


def test_the_panel_cache_leaves_the_decode_slots_and_the_encoder_room(one_worker, tmp_path, rng):
    """device-codecs on: the panel cache's budget is the same product's under off, less what the device's
    decode slots may hold (SLOTS calls of BATCH of the largest input block, each the whole chunks it decodes:
    frames, literals, origins, scratch, and each chunk's tables) and what its encoder keeps for C's blocks (zstd
    chunks, ENCODE_SLOTS blocks at once: each one's copy, the frames, tables), so that the cache and the codecs
    never ask the device for more than its share together."""
    from dgemm.opencl.scratch import ENCODE_SLOTS, SLOTS
    from dgemm.storage import encoded
    from dgemm.worker import encoding
    from dgemm.storage import ZarrBlock
    from dgemm.worker.decoding import BATCH, call_bytes

    client = one_worker
    xa, xb = rng.standard_normal((96, 80)).astype("float32"), rng.standard_normal((80, 64)).astype("float32")
    a, b = _zarr(tmp_path / "a.zarr", xa, (32, 32)), _zarr(tmp_path / "b.zarr", xb, (32, 32))
    budgets = _budgets_off_and_on(client, tmp_path, a, b, xa @ xb.astype(np.float64))
    # one block each: the arrays are below the CPU's block size
    za, zb = zarr.open_array(a, mode="r"), zarr.open_array(b, mode="r")
    largest = max(call_bytes(ZarrBlock(za, (0, 96), (0, 80))), call_bytes(ZarrBlock(zb, (0, 80), (0, 64))))
    c = encoded.chunks_of(zarr.open_array(str(tmp_path / "c-on.zarr"), mode="r+"), (0, 96), (0, 64))
    assert c is not None, "C's chunks (zarr's default zstd) are not ones the device encodes"
    kept = encoding.device_bytes(c, ENCODE_SLOTS)
    assert kept >= ENCODE_SLOTS * 2 * c.chunk_nbytes * len(c.pieces)     # (each slot: the block's copy, the frames)
    assert budgets["off"] > 0
    assert budgets["off"] - budgets["on"] == SLOTS * BATCH * largest + kept, budgets


def _limit_device_memory(value, dask_worker=None):
    """On a worker: its ``device-memory-limit`` (bytes; None: unset); its device's type."""
    import dask

    dask.config.set({"dgemm.device-memory-limit": value})
    return dask_worker.plugins["dgemm"].state.device.info.type


def _decode_cap(dask_worker=None):
    """On a worker: the cap its device's shared decode calls keep to, and the device's memory share."""
    from dgemm.worker import decoding

    state = dask_worker.plugins["dgemm"].state
    return decoding._batches(state.device).cap, state.memory_share()


def test_the_decode_slots_keep_to_their_part_of_a_small_devices_memory(one_worker, tmp_path, rng):
    """device-codecs on, on a device (``device-memory-limit``) whose memory share leaves each decode slot a call of
    one and a half of the largest input block: the panel cache leaves the slots that cap's bytes, not BATCH
    blocks' (which took from the cache what the inputs' panels needed: bench/NOTES.md, issue 28, twenty-fourth
    session), the worker has its device's shared calls keep to that cap (what they take under it:
    tests/test_decoding.py), and the products are right."""
    import os

    if os.environ.get("DGEMM_DEVICE_MEMORY_LIMIT"):
        pytest.skip("DGEMM_DEVICE_MEMORY_LIMIT is set: it overrides the limit this test gives the worker")

    from dgemm.opencl.scratch import ENCODE_SLOTS, SLOTS
    from dgemm.sizes import cache_budget
    from dgemm.storage import ZarrBlock, encoded
    from dgemm.worker import encoding
    from dgemm.worker.decoding import BATCH, SLOTS_SHARE, call_bytes, call_cap

    client = one_worker
    xa, xb = rng.standard_normal((96, 80)).astype("float32"), rng.standard_normal((80, 64)).astype("float32")
    a, b = _zarr(tmp_path / "a.zarr", xa, (32, 32)), _zarr(tmp_path / "b.zarr", xb, (32, 32))
    za, zb = zarr.open_array(a, mode="r"), zarr.open_array(b, mode="r")
    largest = max(call_bytes(ZarrBlock(za, (0, 96), (0, 80))), call_bytes(ZarrBlock(zb, (0, 80), (0, 64))))
    (kind,) = client.run(_limit_device_memory, None).values()
    want = int(1.5 * largest * SLOTS / SLOTS_SHARE)     # the share whose cap is 1.5 of the largest block's call
    memory = -(-want * (1 << 20) // cache_budget(1 << 20, 0, kind))
    try:
        client.run(_limit_device_memory, memory)
        budgets = _budgets_off_and_on(client, tmp_path, a, b, xa @ xb.astype(np.float64))
        (got,) = client.run(_decode_cap).values()
    finally:
        client.run(_limit_device_memory, None)
    cap, share = got
    assert cap == call_cap(share) and largest < cap < BATCH * largest, (cap, share, largest)
    c = encoded.chunks_of(zarr.open_array(str(tmp_path / "c-on.zarr"), mode="r+"), (0, 96), (0, 64))
    kept = encoding.device_bytes(c, ENCODE_SLOTS)
    assert budgets["off"] > 0 and budgets["on"] > 0, budgets
    assert budgets["off"] - budgets["on"] == SLOTS * cap + kept, budgets


def _device_memory_used() -> int | None:
    """Bytes of GPU memory in use on the first NVIDIA GPU (nvidia-smi), None where it cannot tell."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
        return int(out.split()[0]) * MiB
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_gpu_memory_comes_back_between_large_products(tmp_path):
    """On one GPU worker: float32, float64, then float32 again, each product's panels filling the device.

    Before the fix, a product found the last one's panel cache and
    accumulators still on the device (issue 26: 19 GB, then 89, 122 and 137
    of 143 GB used on an H200; on an H100 a MemoryError without a message).
    The cache budget (80 % of the device, less a product's own buffers) is
    what each product may fill; after each, no buffer may be left and the
    device memory in use (nvidia-smi) must be back to the idle worker's.
    """
    import shutil

    from distributed import Client

    gpus = [d for d in DEVICES if d.type == "GPU"]
    mem = gpus[0].global_mem
    share = None
    with dgemm.DeviceCluster(gpus[0].id, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(1, timeout=300)
        (idle,) = client.run(_probe).values()
        idle_used = _device_memory_used()
        for dt in ("float32", "float64", "float32"):
            itemsize = np.dtype(dt).itemsize
            # A and B a tenth of the device each: their panels, cached, fill a quarter of it, and the
            # products before (float32 and float64 engines alike) must be gone to leave room
            # (and no more than the disk holds: A, B and C of both dtypes)
            share = min(0.1 * mem, 0.8 * shutil.disk_usage(tmp_path).free / 6) if dt == "float32" else share
            n = int((share / itemsize) ** 0.5) // 4096 * 4096
            rng = np.random.default_rng(0)
            paths = []
            for name in ("a", "b"):
                path = tmp_path / f"{name}-{dt}.zarr"
                if not path.exists():
                    z = zarr.create_array(store=str(path), shape=(n, n), chunks=(4096, 4096), dtype=dt,
                                          compressors=None)
                    for r in range(0, n, 4096):
                        z[r:r + 4096] = rng.random((min(4096, n - r), n), dtype=dt)
                paths.append(str(path))
            t0 = time.perf_counter()
            dgemm.matmul(*paths, out=str(tmp_path / "c.zarr"), overwrite=True, client=client, compressors=None)
            seconds = time.perf_counter() - t0
            probe = _wait_idle(client, timeout=60)
            used = _device_memory_used()
            print(f"{dt} {n}^2: {seconds:.1f} s; device buffers {probe['buffers']}, cache {probe['cache_bytes']}, "
                  f"page-locked {probe['pinned_bytes'] / MiB:.0f} MiB, RSS {probe['rss'] / MiB:.0f} MiB "
                  f"(idle {idle['rss'] / MiB:.0f}); GPU memory used {used and used / MiB} MiB "
                  f"(idle {idle_used and idle_used / MiB})")
            assert probe["buffers"] == 0 and probe["cache_bytes"] == 0, (dt, probe)
            assert probe["pinned_bytes"] <= probe["pinned_limit"] + 32 * (8192 * 8192 * 8), (dt, probe)
            if used is not None and idle_used is not None:
                # the context, the built programs and the page-locked pool (which NVIDIA's driver backs with
                # device memory too) stay; the products' buffers must not
                assert used <= idle_used + 0.05 * mem + probe["pinned_bytes"], (dt, used, idle_used)
        client.run(_release_idle)   # what the idle timer does: back to the idle worker
        probe = _wait_idle(client)
        used = _device_memory_used()
        print(f"idle: device buffers {probe['buffers']}, page-locked {probe['pinned_bytes'] / MiB:.0f} MiB, "
              f"RSS {probe['rss'] / MiB:.0f} MiB; GPU memory used {used and used / MiB} MiB")
        assert probe["buffers"] == 0 and probe["pinned_bytes"] <= 2 * probe["threads"] * probe["keep"], probe
        assert probe["rss"] <= idle["rss"] * 1.05 + probe["pinned_bytes"] + 512 * MiB, (probe, idle)
        if used is not None and idle_used is not None:
            assert used <= idle_used * 1.05 + probe["pinned_bytes"] + 256 * MiB, (used, idle_used)


def test_device_error_pickles_with_its_message():
    """A DeviceError crosses process boundaries (dask pickles a task's error) with its message."""
    from dgemm.opencl.device import device_error

    e = device_error("NVIDIA H100", "allocating a staged 16384x16384 float64 block of 2.0 GiB (2147483648 bytes)",
                     MemoryError("clCreateBuffer failed: MEM_OBJECT_ALLOCATION_FAILURE"))
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is DeviceMemoryError and isinstance(back, DeviceError) and str(back) == str(e)
    assert "NVIDIA H100" in str(back) and "2147483648 bytes" in str(back) and "staged" in str(back)
    assert "MEM_OBJECT_ALLOCATION_FAILURE" in str(back) and "DGEMM_DEVICE_MEMORY_LIMIT" in str(back)


def _cl_memory_error():
    """pyopencl's own MemoryError, as a failed clCreateBuffer raises it (its record does not pickle)."""
    import pyopencl as cl

    err = cl.MemoryError(cl._cl._ErrorRecord("clCreateBuffer failed", -4, "MEM_OBJECT_ALLOCATION_FAILURE"))
    with pytest.raises(TypeError):
        pickle.dumps(err)   # what the user used to get: Exception('MemoryError(<..._ErrorRecord object...>)')
    return err


def test_allocation_failure_in_the_engine_is_a_device_error(any_device, monkeypatch):
    """A failed allocation during a block product raises a DeviceError naming the device, what and how large."""
    import pyopencl as cl

    from dgemm.opencl import device as device_module
    from dgemm.opencl.engine import BlockEngine

    engine = BlockEngine(any_device, "float32")
    err = _cl_memory_error()
    cls = device_module._buffer_class()

    class Failing(cls):
        def __init__(self, context, flags, nbytes):
            if nbytes >= 64 * 64 * 4:   # the staged blocks and the accumulator, not smaller ones
                raise err
            super().__init__(context, flags, nbytes)
    monkeypatch.setattr(device_module, "_BUFFER_CLASS", Failing)
    before = any_device.live_buffers()
    a = np.ones((100, 70), np.float32)
    b = np.ones((70, 90), np.float32)
    with pytest.raises(DeviceError) as info:
        engine.product([(a, b)], 100, 90)
    text = str(info.value)
    assert any_device.info.name in text and "allocating" in text and "bytes" in text, text
    assert "MEM_OBJECT_ALLOCATION_FAILURE" in text, text
    # as dask sends it: tblib (which distributed installs) pickles the traceback and the context too
    from tblib import pickling_support
    pickling_support.install()
    back = pickle.loads(pickle.dumps(info.value))
    assert str(back) == text and isinstance(back, RuntimeError) and info.value.__context__ is None
    monkeypatch.setattr(device_module, "_BUFFER_CLASS", cls)
    # nothing the failed product allocated is left behind
    assert any_device.live_buffers()["buffers"] <= before["buffers"] + len(engine._buffers)
    engine.release()
    assert isinstance(err, cl.Error)


def test_an_opencl_error_in_a_launch_is_a_device_error(any_device, monkeypatch):
    """An OpenCL error a kernel launch raises is a DeviceError naming the launch."""
    from dgemm.opencl.engine import BlockEngine

    engine = BlockEngine(any_device, "float32")
    err = _cl_memory_error()

    def gemm(*args, **kwargs):
        raise err
    monkeypatch.setattr(engine.k, "gemm", gemm)
    try:
        with pytest.raises(DeviceError, match=r"launching the GEMM kernel on \d+x\d+x\d+ float32"):
            engine.product([(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))], 8, 8)
    finally:
        monkeypatch.undo()
        engine.release()


def test_panel_cache_entries_hold_no_reference_cycle(any_device):
    """A dropped cache entry is freed by reference counting alone, and its buffer released at once."""
    import gc
    import weakref

    from dgemm.opencl.engine import BlockEngine

    engine = BlockEngine(any_device, "float32")
    any_device.cache.budget = 1 << 30
    any_device.spares.release()
    before = any_device.live_buffers()["buffers"]

    class Block:   # a block that reads itself (see dgemm.opencl.engine)
        def __init__(self, x, name):
            self.x, self.name, self.shape, self.dtype, self.copies = x, name, x.shape, x.dtype, False

        def key(self):
            return self.name

        def fill_into(self, out):
            out[...] = self.x
    a = Block(np.ones((40, 30), np.float32), "a")
    b = Block(np.ones((30, 20), np.float32), "b")
    gc.disable()
    try:
        got = engine.stream([a], [b], 40, 20, scope="run-1")
        assert (got == 30).all()
        entries = [weakref.ref(e) for e in any_device.cache._entries.values()]
        assert len(entries) == 2 and any_device.live_buffers()["buffers"] > before
        any_device.cache.clear()
        assert all(r() is None for r in entries), "a dropped entry outlived its cache in a reference cycle"
        engine.stream([a], [b], 40, 20, scope="run-1")
        assert {k[0] for k in any_device.cache.keys()} == {"run-1"}
        engine.stream([a], [b], 40, 20, scope="run-2")   # a new run: run-1's entries go
        assert {k[0] for k in any_device.cache.keys()} == {"run-2"}, "the panel cache outlived its run"
        any_device.cache.clear()
        engine.release()
        any_device.spares.release()     # (the blocks' free source buffers, which a run's trim gives back)
        assert any_device.live_buffers()["buffers"] == before, "a buffer outlived its entry"
    finally:
        gc.enable()
        any_device.cache.budget = 0


def test_a_gemm_tasks_opencl_error_reaches_the_client_readable(monkeypatch):
    """Any pyopencl error a GEMM task raises (a kernel build, say) leaves the worker as a DeviceError that pickles."""
    import types

    import dgemm.worker
    from dgemm.worker.tasks import gemm_block

    err = _cl_memory_error()

    def engine(dtype, precision=None):
        raise err
    state = types.SimpleNamespace(device=types.SimpleNamespace(info=types.SimpleNamespace(name="Fake GPU")),
                                  engine=engine)
    monkeypatch.setattr(dgemm.worker, "device_state", lambda: state)
    with pytest.raises(DeviceError) as info:
        gemm_block([], [], None, 8, 8, 1.0, 0.0, False, False, "<f4")
    text = str(pickle.loads(pickle.dumps(info.value)))
    assert "Fake GPU" in text and "8x8" in text and "MEM_OBJECT_ALLOCATION_FAILURE" in text, text

"""dgemm.storage.hostcache: decoded blocks shared by the processes of one host.

Real processes (multiprocessing, spawn) race on the same blocks and each
block is decoded once; a claimer killed while decoding is taken over; the
size limit evicts the least recently used blocks and never one being
written; runs (scopes) never see each other's blocks; a damaged file is
decoded again, never used.  The last test runs a Zarr (zstd) product on a
local cluster of two dgemm workers sharing this host's CPU device.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

from dgemm.storage import hostcache
from dgemm.storage.hostcache import HostCache

SHAPE = (96, 80)
BLOCK_BYTES = SHAPE[0] * SHAPE[1] * 8


def expected(i: int, shape=SHAPE, dtype="f8") -> np.ndarray:
    """Block ``i``'s bytes: random (never zeros), the same in every process."""
    return np.random.default_rng(1000 + i).standard_normal(shape).astype(dtype)


def decoder(i: int, log: str | None = None, pause: float = 0.0):
    """A decode for block ``i`` that notes each call in ``log`` (one line per decode, any process)."""
    def decode(out):
        if log is not None:
            with open(log, "a") as f:
                f.write(f"{i} {os.getpid()}\n")
        time.sleep(pause)   # a slow read: the others must wait for it, not decode it again
        out[...] = expected(i, out.shape, out.dtype)
    return decode


def poisoned(shape=SHAPE, dtype="f8") -> np.ndarray:
    return np.full(shape, np.nan, dtype)


def decodes(log) -> list[str]:
    return log.read_text().split("\n")[:-1] if log.exists() else []


# -- processes racing ---------------------------------------------------------------
def _racer(base, limit, blocks, log, barrier, results):
    cache = HostCache(base, limit)
    barrier.wait()
    wrong = []
    for i in blocks:
        out = poisoned()
        cache.fetch("run1", ("block", i), out, decoder(i, log, pause=0.05))
        if not np.array_equal(out, expected(i)):
            wrong.append(i)
    results.put((os.getpid(), dict(cache.counts), wrong))


def test_processes_racing_decode_each_block_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    n_blocks, log = 8, tmp_path / "decodes.log"
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(tmp_path), 1 << 30, list(range(n_blocks)), str(log), barrier,
                                              results)) for _ in range(2)]
    for p in procs:
        p.start()
    got = _gather(procs, results)
    assert all(wrong == [] for _, _, wrong in got), got
    lines = decodes(log)
    assert sorted(int(x.split()[0]) for x in lines) == list(range(n_blocks)), lines   # each block decoded once
    counts = [c for _, c, _ in got]
    assert sum(c.get("misses", 0) for c in counts) == n_blocks
    assert sum(c.get("hits", 0) for c in counts) == n_blocks
    assert sum(c.get("bytes_decoded", 0) for c in counts) == n_blocks * BLOCK_BYTES


def _gather(procs, results, limit=120.0) -> list:
    """Each process's result, failing at once when one died without giving it."""
    import queue

    got, deadline = [], time.monotonic() + limit
    while len(got) < len(procs) and time.monotonic() < deadline:
        try:
            got.append(results.get(timeout=0.5))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a racing process failed (exit codes {dead}); see its traceback above"
    assert len(got) == len(procs), "the racing processes did not finish"
    for p in procs:
        p.join(timeout=60)
    return got


def _claim_and_hang(base, claimed):
    cache = HostCache(base, 1 << 30)

    def decode(out):
        claimed.set()
        time.sleep(600)
    cache.fetch("run1", ("block", 7), poisoned(), decode)


@contextlib.contextmanager
def claiming(base, target, *args, kill: bool = True):
    """A spawned process running ``target(base, claimed, *args)``, given once it has claimed its block;
    killed at the end (``kill``), else waited for."""
    ctx = multiprocessing.get_context("spawn")
    claimed = ctx.Event()
    child = ctx.Process(target=target, args=(str(base), claimed, *args))
    child.start()
    try:
        assert claimed.wait(timeout=120), "the child never claimed the block"
        yield child
    finally:
        if kill:
            os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=60)


def test_a_killed_claimer_is_taken_over(tmp_path):
    with claiming(tmp_path, _claim_and_hang):
        cache, log, out, done = HostCache(str(tmp_path), 1 << 30), tmp_path / "decodes.log", poisoned(), []
        waiter = threading.Thread(target=lambda: done.append(cache.fetch("run1", ("block", 7), out,
                                                                         decoder(7, str(log)))))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not decodes(log)   # the claim holds: we wait rather than decode too
    waiter.join(timeout=60)
    assert done == [False] and len(decodes(log)) == 1    # taken over: decoded here
    np.testing.assert_array_equal(out, expected(7))
    again = poisoned()
    assert cache.fetch("run1", ("block", 7), again, decoder(7, str(log))) is True
    np.testing.assert_array_equal(again, expected(7))
    assert len(decodes(log)) == 1


def _claim_and_share(base, claimed, pause):
    cache = HostCache(base, 1 << 30)

    def decode(out):
        claimed.set()
        time.sleep(pause)   # the parent asks meanwhile
        out[...] = expected(7)
    cache.fetch("run1", ("block", 7), poisoned(), decode)


class Counting(HostCache):
    """A cache that counts its looks for a shared block and its scans of the folder."""

    looks = scans = 0

    def _read(self, *args):
        self.looks += 1
        return super()._read(*args)

    def _make_room(self, *args):
        self.scans += 1
        return super()._make_room(*args)


def test_a_waiter_is_woken_when_the_block_is_shared_not_looking_again_and_again(tmp_path):
    """While another process decodes a block, a worker asking for it waits on the claim itself: it looks
    for the block before claiming, and once when the claim goes (a waiter that slept and looked again
    looked tens of times in a second's decode)."""
    with claiming(tmp_path, _claim_and_share, 1.0, kill=False) as child:
        cache, log, out = Counting(str(tmp_path), 1 << 30), tmp_path / "decodes.log", poisoned()
        assert cache.fetch("run1", ("block", 7), out, decoder(7, str(log))) is True   # served, not decoded
    assert child.exitcode == 0 and not decodes(log)
    np.testing.assert_array_equal(out, expected(7))
    assert cache.looks <= 3, cache.looks


@pytest.mark.timeout(120)   # a waiter that waited for ever would hang here
def test_a_claimer_that_never_finishes_is_waited_for_at_most_wait_seconds(tmp_path, monkeypatch):
    """A claimer that hangs (stopped, or reading from a store that does not answer) holds a waiter for
    :data:`~dgemm.storage.hostcache.WAIT` seconds at most: then the waiter decodes the block itself."""
    with claiming(tmp_path, _claim_and_hang) as child:
        monkeypatch.setattr(hostcache, "WAIT", 0.5)
        cache, log, out = HostCache(str(tmp_path), 1 << 30), tmp_path / "decodes.log", poisoned()
        assert cache.fetch("run1", ("block", 7), out, decoder(7, str(log))) is False   # decoded here
        assert len(decodes(log)) == 1 and child.is_alive()                             # the claim still held
        np.testing.assert_array_equal(out, expected(7))


# -- one process ----------------------------------------------------------------------
def blk(cache, scope, i) -> str:
    """The file of block ``i`` (as :func:`expected` shapes it) in run ``scope``."""
    ident = cache.identity(scope, ("block", i), poisoned())
    return os.path.join(cache.folder(scope), hostcache._digest(ident) + ".blk")


def fetch(cache, scope, i, log=None):
    out = poisoned()
    served = cache.fetch(scope, ("block", i), out, decoder(i, log))
    np.testing.assert_array_equal(out, expected(i))
    return served


def test_least_recently_used_blocks_are_evicted(tmp_path):
    per_file = os.path.getsize(_one_file(tmp_path / "probe"))
    cache = HostCache(str(tmp_path / "c"), int(2.5 * per_file))
    assert [fetch(cache, "r", i) for i in (0, 1)] == [False, False]
    now = time.time()
    os.utime(blk(cache, "r", 0), (now - 100, now - 100))   # 0 is the older of the two ...
    os.utime(blk(cache, "r", 1), (now - 50, now - 50))
    assert fetch(cache, "r", 0) is True                     # ... until a hit makes it the most recent
    assert fetch(cache, "r", 2) is False                    # no room for three: 1 goes
    assert [os.path.exists(blk(cache, "r", i)) for i in range(3)] == [True, False, True]
    assert cache.counts["evictions"] == 1 and cache.usage() <= cache.limit
    assert fetch(cache, "r", 1) is False and cache.usage() <= cache.limit


def test_blocks_being_written_are_never_evicted(tmp_path):
    per_file = os.path.getsize(_one_file(tmp_path / "probe"))
    cache = HostCache(str(tmp_path / "c"), int(2.5 * per_file))
    fetch(cache, "r", 0)
    folder = cache.folder("r")
    writing = os.path.join(folder, "feed.1.2.3.tmp")      # another worker's block, half written
    with open(writing, "wb") as f:
        f.truncate(2 * per_file)
    dead = os.path.join(folder, "beef.1.2.3.tmp")         # a writer that died long ago
    with open(dead, "wb") as f:
        f.truncate(per_file)
    old = time.time() - 2 * hostcache.STALE_TMP
    os.utime(dead, (old, old))
    age_tally(cache)       # the files above came behind the tally's back: the folder is counted once it is old
    assert fetch(cache, "r", 1) is False
    assert os.path.exists(writing) and not os.path.exists(dead)
    assert not os.path.exists(blk(cache, "r", 0))          # the one block that could go
    assert not os.path.exists(blk(cache, "r", 1))          # and still no room: used, not shared
    assert cache.usage() <= cache.limit
    fd = os.open(os.path.join(cache.root, ".space.lock"), os.O_RDONLY)
    try:
        assert hostcache._read_tally(fd)[0] == cache.usage()  # the refusal's count kept for the next asker
    finally:
        os.close(fd)


def age_tally(cache, seconds=None):
    """Make the tally of ``cache``'s bytes ``seconds`` old (default: older than RESCAN), its count unchanged."""
    fd = os.open(os.path.join(cache.root, ".space.lock"), os.O_RDWR)
    try:
        used, _ = hostcache._read_tally(fd)
        when = time.time() - (2 * hostcache.RESCAN if seconds is None else seconds)
        os.pwrite(fd, hostcache._TALLY.pack(used or 0, when), 0)
    finally:
        os.close(fd)


def test_blocks_that_fit_the_tally_are_shared_without_a_scan_and_a_wrong_tally_is_mended(tmp_path):
    """Reserving room for a block reads and adds to the tally of bytes held, and scans the folder only where
    the tally says the block would not fit or is older than RESCAN seconds: a tally left too high (a run's
    folder cleared) costs one scan and no eviction; one too low (files it never saw) lasts RESCAN seconds."""
    per_file = os.path.getsize(_one_file(tmp_path / "probe"))
    cache = Counting(str(tmp_path / "c"), int(4.5 * per_file))
    for i in range(4):
        assert fetch(cache, "r", i) is False
    assert cache.scans == 1                               # the first: no tally yet
    assert fetch(cache, "r", 4) is False and cache.scans == 2     # the tally's 4 blocks and this one do not fit
    assert cache.counts["evictions"] == 1 and cache.usage() <= cache.limit
    assert cache.clear("r")                               # a finished run: the tally still counts its 4 blocks
    assert fetch(cache, "s", 0) is False and cache.scans == 3 and cache.counts["evictions"] == 1
    assert os.path.exists(blk(cache, "s", 0))             # shared: the scan found the room
    for i in (1, 2):
        assert fetch(cache, "s", i) is False
    assert cache.scans == 3 and cache.usage() == 3 * per_file
    behind = os.path.join(cache.folder("s"), "cafe.1.2.3.tmp")   # bytes the tally never saw
    with open(behind, "wb") as f:
        f.truncate(3 * per_file)
    age_tally(cache, hostcache.RESCAN / 2)
    assert fetch(cache, "s", 3) is False and cache.scans == 3     # not counted yet: shared, over the limit
    assert os.path.exists(blk(cache, "s", 3)) and cache.usage() > cache.limit
    age_tally(cache)
    assert fetch(cache, "s", 4) is False and cache.scans == 4     # counted again: the oldest blocks evicted
    assert cache.counts["evictions"] == 5 and os.path.exists(behind) and os.path.exists(blk(cache, "s", 4))
    assert cache.usage() <= cache.limit


def test_a_block_larger_than_the_cache_is_decoded_and_not_kept(tmp_path):
    cache = HostCache(str(tmp_path), BLOCK_BYTES // 2)
    log = tmp_path / "decodes.log"
    assert [fetch(cache, "r", 0, str(log)) for _ in range(2)] == [False, False]
    assert len(decodes(log)) == 2 and cache.usage() == 0


def _one_file(base) -> str:
    """A cached block's file (to learn its size, header included)."""
    cache = HostCache(str(base), 1 << 30)
    fetch(cache, "r", 0)
    return blk(cache, "r", 0)


def test_runs_never_see_each_others_blocks(tmp_path):
    cache, log = HostCache(str(tmp_path), 1 << 30), tmp_path / "decodes.log"
    first, second = poisoned(), poisoned()
    cache.fetch("run-a", ("block", 0), first, decoder(0, str(log)))
    cache.fetch("run-b", ("block", 0), second, decoder(1, str(log)))   # the input was rewritten between runs
    np.testing.assert_array_equal(first, expected(0))
    np.testing.assert_array_equal(second, expected(1))
    assert fetch(cache, "run-a", 0) is True
    assert cache.clear("run-a") and not os.path.exists(cache.folder("run-a"))
    assert os.path.exists(cache.folder("run-b")) and not cache.clear("run-a")
    # the dtype is part of what a file holds: the same key, shape and size as int64 is another block
    ints = np.full(SHAPE, -1, "i8")
    want = np.random.default_rng(7).integers(1, 1 << 40, SHAPE)

    def decode(out):
        out[...] = want
    assert cache.fetch("run-b", ("block", 0), ints, decode) is False
    np.testing.assert_array_equal(ints, want)


@pytest.mark.parametrize("damage", ["truncated", "longer", "flipped byte", "header", "other block"])
def test_a_damaged_file_is_decoded_again(tmp_path, damage):
    cache, log = HostCache(str(tmp_path), 1 << 30), tmp_path / "decodes.log"
    fetch(cache, "r", 3, str(log))
    path = blk(cache, "r", 3)
    size = os.path.getsize(path)
    if damage == "truncated":
        os.truncate(path, size - 8)
    elif damage == "longer":
        with open(path, "ab") as f:
            f.write(b"\0" * 8)
    elif damage in ("flipped byte", "header"):
        at = size - BLOCK_BYTES // 2 if damage == "flipped byte" else 0
        with open(path, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x10]))
    else:   # another block's file under this one's name
        os.replace(_one_file(tmp_path / "other"), path)
    assert fetch(cache, "r", 3, str(log)) is False       # decoded again, the right bytes
    assert len(decodes(log)) == 2
    assert fetch(cache, "r", 3, str(log)) is True        # and shared again, whole
    assert len(decodes(log)) == 2


def test_old_files_are_swept_at_start(tmp_path):
    cache = HostCache(str(tmp_path), 1 << 30)
    fetch(cache, "old", 0)
    fetch(cache, "new", 1)
    old = time.time() - 2 * hostcache.MAX_AGE
    os.utime(blk(cache, "old", 0), (old, old))
    HostCache._swept.discard(cache.root)
    HostCache(str(tmp_path), 1 << 30)                      # a worker starting
    assert not os.path.exists(cache.folder("old")) and os.path.exists(blk(cache, "new", 1))


def test_the_folder_is_private(tmp_path):
    root = hostcache.root(str(tmp_path))
    os.makedirs(root)
    os.chmod(root, 0o777)
    HostCache(str(tmp_path), 1 << 30)                       # ours: only made private again
    assert os.stat(root).st_mode & 0o777 == 0o700
    if os.getuid() != 0:
        pytest.skip("giving the folder to another user needs root")
    os.chown(root, 12345, 12345)
    with pytest.raises(PermissionError, match="is not a folder of this user"):
        HostCache(str(tmp_path), 1 << 30)


# -- settings -------------------------------------------------------------------------
@pytest.fixture
def unset(monkeypatch):
    for name in ("DGEMM_HOST_CACHE", "DGEMM_HOST_CACHE_BYTES"):
        monkeypatch.delenv(name, raising=False)


def test_settings(unset, monkeypatch, tmp_path):
    import dask

    from dgemm import config

    assert config.get("host-cache") == "off" and hostcache.settings() is None   # off unless asked for
    for value, want in (("on", "on"), (True, "on"), ("0", "off"), (str(tmp_path), str(tmp_path))):
        with dask.config.set({"dgemm.host-cache": value}):
            assert config.get("host-cache") == want
    with dask.config.set({"dgemm.host-cache": str(tmp_path), "dgemm.host-cache-bytes": "3MiB"}):
        assert hostcache.settings() == (str(tmp_path), 3 << 20)
        assert hostcache.current() is hostcache.current() and hostcache.current().root.startswith(str(tmp_path))
    monkeypatch.setenv("DGEMM_HOST_CACHE", "relative/folder")
    with pytest.raises(ValueError, match="DGEMM_HOST_CACHE='relative/folder' must be auto, on, off or an absolute"):
        config.get("host-cache")
    monkeypatch.setenv("DGEMM_HOST_CACHE", "off")
    assert hostcache.current() is None


def test_launchers_turn_it_on_where_a_host_has_several_device_workers(unset):
    import dask

    from dgemm.cluster.spec import device_worker

    assert "DGEMM_HOST_CACHE" not in device_worker(1, ["0:0", "0:1"]).env   # off by default (measured slower)
    with dask.config.set({"dgemm.host-cache": "auto"}):
        assert device_worker(1, ["0:0", "0:1"]).env["DGEMM_HOST_CACHE"] == "on"
        assert "DGEMM_HOST_CACHE" not in device_worker(0, ["0:0"]).env   # one device worker: nothing to share


def test_in_process_stores_are_not_shared():
    import zarr

    assert not hostcache.shareable(zarr.create_array(zarr.storage.MemoryStore(), shape=(4, 4), dtype="f8"))


# -- blocks read through the cache ----------------------------------------------------
def test_a_zarr_block_reads_through_the_cache_as_it_reads_itself(tmp_path):
    """:func:`hostcache.through` wraps the Zarr blocks of a run that the placement marked shared: read like
    the bare block (the engine's one call), decoded once (False) then served (True); an in-process array
    is not shared (None); unmarked blocks, arrays in memory, no cache or no run pass by; a damaged chunk
    raises the block's one read error."""
    import zarr

    from dgemm.storage import ZarrBlock

    data = expected(3)
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=SHAPE, chunks=(32, 40), dtype="f8")   # zstd
    arr[...] = data
    cache = HostCache(str(tmp_path / "shm"), 1 << 30)
    ref = ZarrBlock(arr, (0, SHAPE[0]), (0, SHAPE[1]), host_shared=True)
    mine = ZarrBlock(arr, (0, SHAPE[0]), (0, SHAPE[1]))        # read by this worker alone
    assert hostcache.through(cache, "run", mine) is mine and mine.key() == ref.key()
    shared = hostcache.through(cache, "run", ref)
    assert isinstance(shared, hostcache.Shared)
    assert (shared.shape, shared.dtype, shared.key(), shared.copies) == (ref.shape, ref.dtype, ref.key(), False)
    for served in (False, True):
        out = poisoned()
        assert shared.fill_into(out) is served
        np.testing.assert_array_equal(out, data)
    assert cache.counts == {"misses": 1, "hits": 1, "bytes_decoded": BLOCK_BYTES, "bytes_served": BLOCK_BYTES}
    held = np.ones(3)
    assert hostcache.through(cache, "run", held) is held
    assert hostcache.through(None, "run", ref) is ref and hostcache.through(cache, None, ref) is ref
    mem = zarr.create_array(zarr.storage.MemoryStore(), shape=SHAPE, dtype="f8")
    mem[...] = data
    out = poisoned()
    assert hostcache.through(cache, "run", ZarrBlock(mem, ref.rows, ref.cols, host_shared=True)).fill_into(out) is None
    np.testing.assert_array_equal(out, data)
    (tmp_path / "a.zarr" / "c" / "1" / "1").write_bytes(b"not zstd")
    with pytest.raises(OSError) as err:
        hostcache.through(cache, "run2", ref).fill_into(poisoned())   # a run that has not shared it
    assert str(err.value).startswith(f"dgemm could not read Zarr array file://{tmp_path}/a.zarr rows 0:96, "
                                     f"columns 0:80, chunk (1, 1) (store key 'c/1/1'): ")
    assert "dgemm could not" not in str(err.value.__cause__)                 # explained once, not twice


# -- end to end -----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_workers_of_a_host_decode_each_input_block_once(tmp_path, unset):
    """A Zarr (zstd) product on two dgemm workers sharing the CPU device: right, and the host decoded
    each input byte once (not once per worker), and the run's blocks are gone when it returns."""
    import dask
    import zarr
    from distributed import Client
    from zarr.codecs import ZstdCodec

    import dgemm
    from dgemm.cluster import DeviceCluster
    from dgemm.opencl.discovery import list_devices

    if not list_devices():
        pytest.skip("no OpenCL device (pip install pocl-binary-distribution)")
    rng = np.random.default_rng()
    a_np, b_np = rng.standard_normal((192, 160)), rng.standard_normal((160, 224))
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=a_np.shape, chunks=(64, 64), dtype="f8",
                          compressors=ZstdCodec())
    b = zarr.create_array(str(tmp_path / "b.zarr"), shape=b_np.shape, chunks=(64, 64), dtype="f8",
                          compressors=ZstdCodec())
    a[...], b[...] = a_np, b_np
    shm = tmp_path / "shm"
    with dask.config.set({"dgemm.host-cache": str(shm)}), \
            DeviceCluster("cpu,cpu", dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=120)
        assert set(client.run(lambda: hostcache.settings()[0]).values()) == {str(shm)}
        c = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=64)
        totals = client.run(lambda dask_worker: dask_worker.plugins["dgemm"].state.totals())
        # Operands in memory (a warm-up's, a mixed product's) pass the cache by: nothing to share.
        mixed = dgemm.matmul(a_np, b, out=str(tmp_path / "mixed.zarr"), client=client, block=64)
        np.testing.assert_allclose(mixed[...], a_np @ b_np, rtol=1e-12, atol=1e-12)
        after = client.run(lambda dask_worker: dask_worker.plugins["dgemm"].state.totals())
    np.testing.assert_allclose(c[...], a_np @ b_np, rtol=1e-12, atol=1e-12)
    # The mixed product went through the cache for B (Zarr) only.
    assert sum(t["host_cache_misses"] for t in after.values()) > sum(t["host_cache_misses"] for t in totals.values())
    assert all(t["blocks"] > 0 for t in totals.values()), totals          # both workers computed
    inputs = a_np.nbytes + b_np.nbytes
    decoded = sum(t["host_cache_bytes_decoded"] for t in totals.values())
    served = sum(t["host_cache_bytes_served"] for t in totals.values())
    read = sum(t["bytes_read"] for t in totals.values())
    assert sum(t["host_cache_hits"] for t in totals.values()) > 0 and served > 0   # the workers shared blocks
    # Decoded once per host: the blocks both workers read through the cache, the others (marked by the
    # placement as one worker's) read as they are, never through it.
    assert 0 < decoded < read <= 1.1 * inputs, (read, decoded, served, inputs)
    assert read + served > inputs                                         # without the cache: read twice
    root = hostcache.root(str(shm))
    assert not [d for d in os.listdir(root) if d.startswith("run-")], os.listdir(root)   # forgotten at its end

"""The helper threads that encode a run's last C blocks (dgemm.storage.threads, write_region's ``threads``).

A store task encodes its block's chunks on its own thread while the worker
has block products to run, and deals them to helper threads as well once it
has none (the run's drain: :func:`dgemm.worker.tasks.encode_threads`).  The
chunks written with helpers must be the very bytes written without them
(zstd, Blosc, raw; v2 and v3; edge chunks; local files and S3 objects), the
counters must say which chunks a helper encoded, a failing chunk must fail
the write only once every other chunk is done, and the helpers must leave
no memory behind.
"""
from __future__ import annotations

import os
import threading
import time

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from dgemm.storage import chunks, fastpaths, source, store_block, threads, zstd
from test_encoding import chunk_files

LAYOUTS = {
    "v3 zstd": {"compressors": ZstdCodec(level=3)},
    "v3 blosc": {"compressors": BloscCodec(cname="lz4", shuffle="shuffle")},
    "v3 raw": {"compressors": None},
    "v2 zstd": {"compressors": numcodecs.Zstd(level=3), "zarr_format": 2},
}


# -- shared: the items dealt to this thread and the helpers -------------------------------------------------
@pytest.mark.parametrize("n_threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n_items", [0, 1, 5, 16])
def test_shared_gives_every_result_in_order(n_threads, n_items):
    seen = []

    def fn(x, helper):
        seen.append((x, helper, threading.get_ident()))
        return x * x
    assert threads.shared(fn, list(range(n_items)), n_threads) == [x * x for x in range(n_items)]
    assert sorted(x for x, *_ in seen) == list(range(n_items))
    used = min(n_threads, n_items)
    # the calling thread takes its share as itself (helper False); each helper's items run on pool threads
    me = threading.get_ident()
    assert {x for x, helper, t in seen if not helper} == set(range(0, n_items, max(used, 1)))
    assert all(t == me for _, helper, t in seen if not helper)
    assert all(t != me for _, helper, t in seen if helper)
    assert sum(helper for _, helper, _ in seen) == n_items - len(range(0, n_items, max(used, 1)))


@pytest.mark.parametrize("failing", [0, 1])     # on this thread's share, on a helper's
def test_shared_raises_the_error_once_every_other_item_is_done(failing):
    done, started = [], threading.Event()

    def fn(x, helper):
        if x == failing:
            started.wait(5)
            raise OSError(f"chunk {x} could not be written")
        started.set()
        time.sleep(0.05)          # the others still writing when the failure comes
        done.append(x)
        return x
    with pytest.raises(OSError, match=f"chunk {failing} could not be written"):
        threads.shared(fn, list(range(6)), 3)
    # dealt in turn to 3 threads: the failing item's thread stops there, the other two finish their shares
    share = set(range(failing % 3, 6, 3))
    assert sorted(done) == [x for x in range(6) if x not in share]
    time.sleep(0.2)
    assert len(done) == 4, "a write went on after the error was raised"


# -- write_region with helpers --------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n_threads", [2, 4])
def test_helped_writes_store_the_same_chunks(tmp_path, rng, layout, n_threads):
    """A block of 3 x 4 chunks (edge chunks on both axes) written with helpers: the same files as without."""
    data = rng.standard_normal((70, 90)).astype("float32")
    files = {}
    for label, n in (("alone", 1), ("helped", n_threads)):
        arr = zarr.create_array(str(tmp_path / f"{label}.zarr"), shape=data.shape, chunks=(32, 24),
                                dtype="float32", **LAYOUTS[layout])
        before = fastpaths.snapshot()
        store_block(arr, (0, 70), (0, 90), data, threads=n)
        grew = fastpaths.since(before)
        assert grew["storage_write_direct"] == 12 and grew["storage_write_zarr"] == 0, grew
        # the helpers' share of the 12 chunks: all but those dealt to this thread (every n-th)
        assert grew["storage_write_helped"] == (0 if n == 1 else 12 - len(range(0, 12, n))), grew
        files[label] = chunk_files(arr)
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / f"{label}.zarr"), mode="r")[...], data)
    assert files["helped"] == files["alone"]


def test_helped_writes_on_s3_are_one_batch_of_the_same_objects(s3, rng):
    data = rng.standard_normal((70, 90)).astype("float32")
    objects = {}
    for label, n in (("alone", 1), ("helped", 3)):
        url = s3.url(f"threads/{label}-{rng.integers(1 << 30)}.zarr")
        arr = zarr.create_array(url, shape=data.shape, chunks=(32, 24), dtype="float32",
                                compressors=ZstdCodec(level=3), storage_options=s3.storage_options)
        arr = zarr.open_array(url, mode="r+", storage_options=s3.storage_options)
        before = fastpaths.snapshot()
        store_block(arr, (0, 70), (0, 90), data, threads=n)
        grew = fastpaths.since(before)
        assert grew["storage_write_batched"] == 12 and grew["storage_s3_put_batch"] == 1, grew
        assert grew["storage_write_helped"] == (0 if n == 1 else 8), grew
        np.testing.assert_array_equal(zarr.open_array(url, mode="r", storage_options=s3.storage_options)[...], data)
        fs = s3.fs()
        root = url.removeprefix("s3://")
        objects[label] = {k.removeprefix(root): fs.cat(k) for k in fs.find(root) if "/c/" in k}
    assert objects["helped"] == objects["alone"] and len(objects["alone"]) == 12


def test_a_chunk_that_cannot_be_written_fails_the_helped_write(tmp_path, rng, monkeypatch):
    """One chunk's file refused: the write raises its error once the other threads' chunks are written."""
    data = rng.standard_normal((64, 64)).astype("float32")
    arr = zarr.create_array(str(tmp_path / "c.zarr"), shape=data.shape, chunks=(16, 16), dtype="float32",
                            compressors=ZstdCodec(level=3))
    real = chunks._write_file
    written = []

    def refuse_one(path, buf):
        if path.endswith(os.path.join("c", "2", "1")):
            raise PermissionError(f"[Errno 13] Permission denied: {path!r}")
        real(path, buf)
        written.append(path)
    monkeypatch.setattr(chunks, "_write_file", refuse_one)
    with pytest.raises(PermissionError, match="Permission denied"):
        store_block(arr, (0, 64), (0, 64), data, threads=4)
    # chunk (2, 1) is the 10th of 16, dealt to the second of 4 threads (chunks 1, 5, 9, 13): that thread
    # stops there, every other chunk is written before the error reaches the caller
    assert len(written) == 14 and not any(p.endswith(os.path.join("c", "3", "1")) for p in written)


def test_helpers_keep_no_memory_after_the_run(tmp_path, rng):
    """The helpers' zstd encoders (and their output buffers) are freed with every thread's at the run's end."""
    data = rng.standard_normal((256, 256)).astype("float32")
    arr = zarr.create_array(str(tmp_path / "c.zarr"), shape=data.shape, chunks=(64, 64), dtype="float32",
                            compressors=ZstdCodec(level=3))
    store_block(arr, (0, 256), (0, 256), data, threads=4)
    held = [c for c in list(zstd._ALL) if c.out.nbytes or c.cctx]
    assert held, "the helped write encoded nothing through libzstd"
    zstd.release()
    assert not [c for c in list(zstd._ALL) if c.out.nbytes or c.cctx]
    # and no helper kept a scratch chunk: an edge chunk's buffer is made for its one write
    arr = zarr.create_array(str(tmp_path / "e.zarr"), shape=(70, 70), chunks=(64, 64), dtype="float32",
                            compressors=ZstdCodec(level=3))
    store_block(arr, (0, 70), (0, 70), rng.standard_normal((70, 70)).astype("float32"), threads=4)
    assert any(t.name.startswith("dgemm-encode") for t in threading.enumerate())
    # probes on the helper threads: none holds a scratch chunk
    probes = [threads.pool().submit(lambda: (threading.get_ident(), getattr(source._LOCAL, "chunk", None)))
              for _ in range(32)]
    assert all(chunk is None for _, chunk in (p.result() for p in probes))


# -- one chunk a block: libzstd's own threads inside the chunk ----------------------------------------------
def test_a_lone_chunk_is_encoded_by_libzstds_threads_into_a_frame_every_decoder_reads(tmp_path, rng, any_device):
    """A block of one 16 MiB zstd chunk written with 4 threads: libzstd compresses it in jobs (two at level 3),
    one standard frame that numcodecs, zarr and the device's decoder (PoCL here) all read as the values; its
    size within a few bytes of the one-thread frame's; counted as helped."""
    import pyopencl as cl

    from dgemm.opencl.codecs import zstd_decode

    if zstd.library() is None:
        pytest.skip("no libzstd on this host: zstd chunks are encoded by numcodecs, on one thread")
    data = rng.standard_normal((2048, 2048)).astype("float32")
    frames = {}
    for label, n in (("alone", 1), ("threads", 4)):
        arr = zarr.create_array(str(tmp_path / f"{label}.zarr"), shape=data.shape, chunks=data.shape,
                                dtype="float32", compressors=ZstdCodec(level=3))
        before = fastpaths.snapshot()
        store_block(arr, (0, 2048), (0, 2048), data, threads=n)
        grew = fastpaths.since(before)
        assert grew["storage_write_direct"] == 1, grew
        assert (grew["storage_write_helped"], grew["storage_write_helped_bytes"]) == ((1, data.nbytes) if n > 1 else (0, 0))
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / f"{label}.zarr"), mode="r")[...], data)
        frames[label] = chunk_files(arr)[(0, 0)]
        # this thread's libzstd context compressed with libzstd's threads (its frames may equal one thread's
        # where no block's tables change at the jobs' edges)
        assert zstd._contexts(zstd.library()).workers == (4 if n > 1 else 0)
    frame = frames["threads"]
    assert abs(len(frame) - len(frames["alone"])) < 0.001 * len(frame)
    np.testing.assert_array_equal(np.frombuffer(numcodecs.Zstd().decode(frame), np.float32), data.ravel())
    out = any_device.buffer(data.nbytes, "test output")
    try:
        cl.enqueue_fill_buffer(any_device.queue, out, np.uint8(0xA5), 0, out.size).wait()
        zstd_decode.decode_zstd(any_device, [frame], out)
        got = np.empty(data.size, np.float32)
        cl.enqueue_copy(any_device.queue, got, out).wait()
    finally:
        out.release()
    np.testing.assert_array_equal(got, data.ravel())

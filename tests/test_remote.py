"""dgemm.storage.remote: many GETs and PUTs of an S3 zarr store at once, on moto's server (the ``s3`` fixture).

Every answer is checked against what was written (fresh random bytes), and
against zarr's own ``store.get`` where both read the same thing.
"""
from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from dgemm.storage import remote


def _store(s3, prefix: str, read_only: bool = False, **options):
    from zarr.storage import FsspecStore

    return FsspecStore.from_url(s3.url(prefix), storage_options=dict(s3.storage_options, **options),
                                read_only=read_only)


@pytest.fixture
def objects(s3, rng):
    """A fresh prefix holding a few objects of random bytes: (prefix, {key: bytes})."""
    prefix = f"remote-{uuid.uuid4().hex[:8]}"
    data = {f"c/{i}/0": rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            for i, n in enumerate([1, 1000, 3 * 2**20 + 7, 70_001])}
    fs = s3.fs()
    for key, value in data.items():
        fs.pipe_file(f"{s3.bucket}/{prefix}/{key}", value)
    return prefix, data


def _zarr_get(store, key, rng):
    from zarr.abc.store import RangeByteRequest, SuffixByteRequest

    req = None if rng is None else SuffixByteRequest(rng[1]) if rng[0] == "suffix" else RangeByteRequest(*rng)
    got = sync(store.get(key, default_buffer_prototype(), byte_range=req))
    return None if got is None else got.to_bytes()


def test_whole_objects_ranges_suffixes_and_missing_keys_read_as_zarr_reads_them(s3, objects):
    prefix, data = objects
    store = _store(s3, prefix)
    big = data["c/2/0"]
    requests = [(k, None) for k in data] + [
        ("c/2/0", (0, 10)), ("c/2/0", (2**20 + 3, 2**21 - 5)), ("c/2/0", (len(big) - 9, len(big) + 100)),
        ("c/3/0", ("suffix", 16)), ("c/0/0", ("suffix", 5)), ("c/1/0", (999, 1000)),
        ("c/9/9", None), ("c/9/9", (0, 4)), ("c/9/9", ("suffix", 4)), ("nothing", None),
        ("c/2/0", (np.int64(5), np.uint64(9))), ("c/1/0", (7, 7)), ("c/1/0", ("suffix", 0))]
    got = remote.get_many(store, requests)
    want = [data[k] for k in data] + [
        big[:10], big[2**20 + 3:2**21 - 5], big[len(big) - 9:], data["c/3/0"][-16:], data["c/0/0"],
        data["c/1/0"][999:], None, None, None, None, big[5:9], b"", b""]
    assert len(got) == len(want)
    for (key, rng), g, w in zip(requests, got, want):
        if w is None:
            assert g is None, (key, rng)
        else:
            assert bytes(g) == w, (key, rng)
            if len(w):
                assert bytes(g) == _zarr_get(store, key, rng), (key, rng)     # and what zarr's path reads


def test_keys_are_relative_to_the_store_root_as_zarr_joins_them(s3, objects):
    prefix, data = objects
    root = _store(s3, "")            # the bucket itself
    got = remote.get_many(root, [(f"{prefix}/c/1/0", None), ("c/1/0", None)])
    assert bytes(got[0]) == data["c/1/0"] and got[1] is None
    assert _zarr_get(root, "c/1/0", None) is None


def test_many_threads_at_once_each_get_their_own_bytes(s3, rng):
    prefix = f"remote-threads-{uuid.uuid4().hex[:8]}"
    fs = s3.fs()
    data = {f"k/{i}": rng.integers(0, 256, int(n), dtype=np.uint8).tobytes()
            for i, n in enumerate(rng.integers(1, 300_000, 24))}
    for key, value in data.items():
        fs.pipe_file(f"{s3.bucket}/{prefix}/{key}", value)
    store = _store(s3, prefix)
    keys = list(data)
    errors, done = [], []

    def reader(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(6):
                pick = [keys[i] for i in r.choice(len(keys), 5, replace=False)]
                ranges = []
                for k in pick:
                    a = int(r.integers(0, len(data[k])))
                    ranges.append((k, (a, a + int(r.integers(1, 50_000)))))
                got = remote.get_many(store, [(k, None) for k in pick] + ranges)
                for (k, _), g in zip([(k, None) for k in pick], got[:5]):
                    assert bytes(g) == data[k]
                for (k, (a, b)), g in zip(ranges, got[5:]):
                    assert bytes(g) == data[k][a:b]
            done.append(seed)
        except BaseException as e:      # noqa: BLE001  (reported below, from the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    assert sorted(done) == list(range(16))


def test_wrong_credentials_raise_permission_error_naming_the_object(s3, objects):
    prefix, data = objects
    for options in ({"secret": "not-the-secret"}, {"key": "AKIANOTAKEY", "secret": "x"}):
        store = _store(s3, prefix, **options)
        with pytest.raises(PermissionError, match=f"s3://{s3.bucket}/{prefix}/c/1/0"):
            remote.get_many(store, [("c/1/0", None)])
        with pytest.raises(PermissionError):       # a missing key too: refused, not read as missing
            remote.get_many(store, [("c/9/9", None), ("c/1/0", (0, 3))])
        with pytest.raises(PermissionError):
            remote.put_many(store, [("c/8/8", b"x")])


def test_a_missing_bucket_reads_as_zarr_reads_it(s3):
    """Missing is what the store's allowed_exceptions say, as in zarr: by default a missing bucket too."""
    from zarr.storage import FsspecStore

    fs = _store(s3, "").fs
    path = f"no-such-bucket-{uuid.uuid4().hex[:8]}/x"
    lenient = FsspecStore(fs, path=path)
    assert remote.get_many(lenient, [("c/0", None)]) == [None] == [_zarr_get(lenient, "c/0", None)]
    strict = FsspecStore(fs, path=path, allowed_exceptions=())
    with pytest.raises(FileNotFoundError, match="NoSuchBucket"):
        remote.get_many(strict, [("c/0", None)])


def test_stores_it_does_not_know_return_none(s3, tmp_path, objects):
    from zarr.storage import LocalStore, MemoryStore

    assert remote.handles(_store(s3, "x")) and not remote.handles(MemoryStore())
    assert remote.get_many(LocalStore(str(tmp_path)), [("a", None)]) is None
    assert remote.get_many(MemoryStore(), [("a", None)]) is None
    assert remote.put_many(MemoryStore(), [("a", b"1")]) is None
    prefix, _ = objects
    # an s3fs session the caller built: its credentials cannot be taken over
    import aiobotocore.session
    with_session = _store(s3, prefix, session=aiobotocore.session.AioSession())
    assert remote.get_many(with_session, [("c/1/0", None)]) is None and not remote.handles(with_session)
    # options only an aiobotocore client knows
    aio_only = _store(s3, prefix, config_kwargs={"connector_args": {"limit": 4}})
    assert remote.get_many(aio_only, [("c/1/0", None)]) is None


def test_bad_ranges_are_refused_before_any_request(s3, objects):
    prefix, _ = objects
    store = _store(s3, prefix)
    for rng in [(-1, 4), ("suffix", -2), (1.5, 3), ("start", 3), (1, 2, 3)]:
        with pytest.raises(ValueError, match="byte range"):
            remote.get_many(store, [("c/1/0", None), ("c/1/0", rng)])


def test_put_many_writes_what_zarr_then_reads(s3, rng):
    prefix = f"remote-put-{uuid.uuid4().hex[:8]}"
    store = _store(s3, prefix)
    items = [(f"c/{i}", rng.integers(0, 256, int(n), dtype=np.uint8)) for i, n in
             enumerate(rng.integers(1, 2_000_000, 6))]
    items.append(("c/bytes", rng.integers(0, 256, 999, dtype=np.uint8).tobytes()))
    assert remote.put_many(store, items) is True
    for key, value in items:
        assert _zarr_get(store, key, None) == bytes(value)
    # over an object already there
    assert remote.put_many(store, [("c/0", b"new")]) is True
    assert _zarr_get(store, "c/0", None) == b"new"
    # the filesystem's listing cache (which zarr's listing reads) hears of new objects
    fs = store.fs
    listed = sync(fs._ls(f"{s3.bucket}/{prefix}/c"))
    assert remote.put_many(store, [("c/late", b"late")]) is True
    assert f"{s3.bucket}/{prefix}/c/late" not in listed
    assert f"{s3.bucket}/{prefix}/c/late" in sync(fs._ls(f"{s3.bucket}/{prefix}/c"))


def test_put_many_refuses_a_read_only_store(s3):
    prefix = f"remote-ro-{uuid.uuid4().hex[:8]}"
    store = _store(s3, prefix, read_only=True)
    with pytest.raises(ValueError, match="read-only"):
        remote.put_many(store, [("c/0", b"x")])
    assert _zarr_get(_store(s3, prefix), "c/0", None) is None


def test_a_zarr_array_read_through_get_many_matches_zarr(s3, rng):
    """The chunk keys zarr writes are the keys get_many reads: decoded, they give the array back."""
    url = s3.url(f"remote-arr-{uuid.uuid4().hex[:8]}/a.zarr")
    A = rng.standard_normal((40, 30))
    arr = zarr.create_array(url, shape=A.shape, chunks=(16, 16), dtype="float64",
                            storage_options=s3.storage_options)
    arr[...] = A
    arr = zarr.open_array(url, mode="r", storage_options=s3.storage_options)
    grid = [(i, j) for i in range(3) for j in range(2)]
    keys = [arr.metadata.encode_chunk_key(ij) for ij in grid]
    got = remote.get_many(arr.store, [(k, None) for k in keys])
    assert type(arr.metadata.codecs[-1]).__name__ == "ZstdCodec"      # zarr's default: decoded below
    import numcodecs

    out = np.full(A.shape, np.nan)
    for (i, j), raw in zip(grid, got):
        block = np.frombuffer(numcodecs.Zstd().decode(raw), "<f8").reshape(16, 16)
        rows, cols = slice(16 * i, min(16 * i + 16, 40)), slice(16 * j, min(16 * j + 16, 30))
        out[rows, cols] = block[:rows.stop - rows.start, :cols.stop - cols.start]
    np.testing.assert_array_equal(out, A)


def test_a_dropped_connection_is_retried_and_a_refusal_is_not(s3, objects, monkeypatch):
    from botocore.exceptions import ConnectionClosedError

    prefix, data = objects
    store = _store(s3, prefix)
    s3client = remote._s3_of(store)[0]
    real, calls, drops = s3client.client.get_object, [], [1]

    def flaky(**kw):
        calls.append(kw["Key"])
        if drops:
            drops.pop()
            raise ConnectionClosedError(endpoint_url=s3.endpoint)
        return real(**kw)

    monkeypatch.setattr(s3client.client, "get_object", flaky)
    monkeypatch.setattr(remote.time, "sleep", lambda s: None)
    assert bytes(remote.get_many(store, [("c/1/0", None)])[0]) == data["c/1/0"]
    assert len(calls) == 2
    calls.clear()
    assert remote.get_many(store, [("c/9/9", None)]) == [None]      # a missing key: asked once
    assert len(calls) == 1

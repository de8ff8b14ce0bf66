"""dgemm.storage.remote: many GETs and PUTs of an S3 zarr store at once, on moto's server (the ``s3`` fixture).

Every answer is checked against what was written (fresh random bytes), and
against zarr's own ``store.get`` where both read the same thing.
"""
from __future__ import annotations

import socket
import threading
import time
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
        ("c/2/0", (np.int64(5), np.uint64(9))), ("c/1/0", (7, 7)), ("c/1/0", ("suffix", 0)),
        ("c/1/0", (1000, 1010)), ("c/1/0", (5000, 6000))]
    got = remote.get_many(store, requests)
    want = [data[k] for k in data] + [
        big[:10], big[2**20 + 3:2**21 - 5], big[len(big) - 9:], data["c/3/0"][-16:], data["c/0/0"],
        data["c/1/0"][999:], None, None, None, None, big[5:9], b"", b"", b"", b""]
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


class Proxy:
    """A TCP proxy in front of moto that does to the next requests what ``plan`` says, then passes them on.

    ``plan``: "drop" (the connection closed once the request arrived, no
    answer), "503" (S3's ``SlowDown``) or "slow" (passed on 2 s late); ``requests`` counts the request
    lines it saw (GETs and PUTs: moto signs nothing here that the proxy
    changes, the Host it checks is the proxy's, as the client signed it).
    """

    def __init__(self, target: str):
        host, port = target.rsplit("//", 1)[1].split(":")
        self.target, self.plan, self.requests = (host, int(port)), [], []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        upstream = None
        try:
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    return
                line = data.split(b"\r\n", 1)[0]
                if line.split(b" ")[0] in (b"GET", b"PUT", b"DELETE", b"HEAD", b"POST"):
                    self.requests.append(line.decode())
                    action = self.plan.pop(0) if self.plan else "pass"
                    if action == "slow":          # the answer comes late (the server busy)
                        time.sleep(2)
                    if action == "drop":
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    if action == "503":
                        body = b"<Error><Code>SlowDown</Code><Message>Please reduce your rate</Message></Error>"
                        conn.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                        continue
                if upstream is None:
                    upstream = socket.create_connection(self.target)
                    threading.Thread(target=self._back, args=(upstream, conn), daemon=True).start()
                upstream.sendall(data)
        except OSError:
            return
        finally:
            conn.close()
            if upstream is not None:
                upstream.close()

    @staticmethod
    def _back(upstream, conn):
        try:
            while data := upstream.recv(1 << 20):
                conn.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.closed = True
        self.server.close()


def test_a_dropped_connection_and_a_503_are_retried_and_a_refusal_is_not(s3, objects):
    prefix, data = objects
    proxy = Proxy(s3.endpoint)
    try:
        store = _store(s3, prefix, endpoint_url=proxy.endpoint)
        assert remote.handles(store)
        proxy.plan[:] = ["drop"]
        assert bytes(remote.get_many(store, [("c/1/0", None)])[0]) == data["c/1/0"]
        assert len(proxy.requests) == 2                     # asked again after the connection was dropped
        proxy.requests.clear()
        proxy.plan[:] = ["503", "drop"]
        assert remote.put_many(store, [("c/new", b"written")]) is True
        assert len(proxy.requests) == 3
        assert bytes(remote.get_many(store, [("c/new", None)])[0]) == b"written"
        proxy.requests.clear()
        assert remote.get_many(store, [("c/9/9", None)]) == [None]      # a missing key: asked once
        assert len(proxy.requests) == 1
        bad = _store(s3, prefix, endpoint_url=proxy.endpoint, secret="not-the-secret")
        proxy.requests.clear()
        with pytest.raises(PermissionError):
            remote.get_many(bad, [("c/1/0", None)])
        assert len(proxy.requests) == 1                     # refused credentials: asked once
        # retries are bounded (botocore's config, as s3fs passes it): a server that keeps dropping fails the read
        few = _store(s3, prefix, endpoint_url=proxy.endpoint, config_kwargs={"retries": {"max_attempts": 2}})
        proxy.requests.clear()
        proxy.plan[:] = ["drop"] * 10
        with pytest.raises(OSError):
            remote.get_many(few, [("c/1/0", None)])
        assert len(proxy.requests) == 3
    finally:
        proxy.close()


def test_a_put_slower_than_the_read_timeout_is_not_cut_off(s3):
    """botocore's read timeout is per socket read; obstore's runs from the request's start, upload included."""
    prefix = f"remote-slow-{uuid.uuid4().hex[:8]}"
    proxy = Proxy(s3.endpoint)
    try:
        store = _store(s3, prefix, endpoint_url=proxy.endpoint, config_kwargs={"read_timeout": 1})
        proxy.plan[:] = ["slow"]
        assert remote.put_many(store, [("c/0", b"late")]) is True
        assert len(proxy.requests) == 1                     # not timed out, not sent again
        assert bytes(remote.get_many(store, [("c/0", None)])[0]) == b"late"
        proxy.requests.clear()
        proxy.plan[:] = ["slow"]                            # a GET answered late is asked again, as botocore does
        assert bytes(remote.get_many(store, [("c/0", None)])[0]) == b"late"
        assert len(proxy.requests) == 2
    finally:
        proxy.close()


# -- the conditional writes the lease takes itself with ------------------------------------------

def test_conditional_writes_succeed_only_on_the_object_as_read(s3, rng):
    prefix = f"remote-cond-{uuid.uuid4().hex[:8]}"
    cond = remote.conditional(_store(s3, prefix))
    assert cond is not None and cond.atomic
    first, second = (rng.integers(0, 256, 1000, dtype=np.uint8).tobytes() for _ in range(2))
    assert cond.get("lease") is None
    tag = cond.put("lease", first, None)                   # If-None-Match: * on nothing: written
    assert tag and cond.get("lease") == (first, tag)
    assert cond.put("lease", second, None) is None         # one is there now: refused
    assert cond.put("lease", second, '"0123456789abcdef0123456789abcdef"') is None    # another ETag
    assert cond.get("lease") == (first, tag)
    new = cond.put("lease", second, tag)                   # If-Match: the one read: written
    assert new and new != tag and cond.get("lease") == (second, new)
    assert cond.delete("lease", tag) is False              # the old ETag: kept
    assert cond.get("lease") == (second, new)
    assert cond.delete("lease", new) is True
    assert cond.get("lease") is None
    assert cond.put("lease", first, new) is None           # If-Match on a deleted object: refused, not created
    assert cond.delete("lease", new) is False
    assert cond.get("lease") is None and cond.atomic
    assert _zarr_get(_store(s3, prefix), "lease", None) is None


def test_conditional_on_a_read_only_store_refuses_to_write(s3):
    cond = remote.conditional(_store(s3, f"remote-cond-ro-{uuid.uuid4().hex[:8]}", read_only=True))
    with pytest.raises(ValueError, match="read-only"):
        cond.put("lease", b"x", None)
    with pytest.raises(ValueError, match="read-only"):
        cond.delete("lease", '"x"')


def test_conditional_read_of_a_missing_bucket_raises_rather_than_finding_no_lease(s3):
    from zarr.storage import FsspecStore

    fs = _store(s3, "").fs
    cond = remote.conditional(FsspecStore(fs, path=f"no-such-bucket-{uuid.uuid4().hex[:8]}/x"))
    with pytest.raises(FileNotFoundError, match="NoSuchBucket"):
        cond.get("lease")


def test_conditional_with_wrong_credentials_raises_permission_error(s3):
    cond = remote.conditional(_store(s3, f"remote-cond-bad-{uuid.uuid4().hex[:8]}", secret="not-the-secret"))
    for call in (lambda: cond.get("lease"), lambda: cond.put("lease", b"x", None),
                 lambda: cond.delete("lease", '"x"')):
        with pytest.raises(PermissionError):
            call()


# -- s3fs's settings, as obstore is given them --------------------------------------------------

class Recorder:
    """An HTTP server that answers every request as S3 would a good one, and records what it got."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, body: bytes, status: int = 200):
                self.send_response(status)
                self.send_header("ETag", '"0123456789abcdef0123456789abcdef"')
                self.send_header("Last-Modified", "Thu, 26 Nov 2026 06:00:00 GMT")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                self._answer(b"recorded")

            def do_PUT(self):
                seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._answer(b"")

            def do_DELETE(self):
                seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                self._answer(b"", 204)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder():
    r = Recorder()
    yield r
    r.close()


def _recorded_store(endpoint: str, **options):
    from zarr.storage import FsspecStore

    return FsspecStore.from_url("s3://bucket/root", storage_options=options, read_only=False)


def test_an_endpoint_with_a_path_region_and_requester_pays_reach_the_requests(recorder):
    endpoint = recorder.endpoint + "/under/a/path"
    store = _recorded_store(endpoint, key="K", secret="S", endpoint_url=endpoint, requester_pays=True,
                            client_kwargs={"region_name": "eu-west-3"},
                            s3_additional_kwargs={"ServerSideEncryption": "AES256"})
    assert bytes(remote.get_many(store, [("c/0", None)])[0]) == b"recorded"
    assert remote.put_many(store, [("c/1", b"x")]) is True
    cond = remote.conditional(store)
    assert cond.delete("lease", '"abc"') is True
    (get, path, headers), (put, put_path, put_headers), (delete, del_path, del_headers) = recorder.seen
    assert (get, path) == ("GET", "/under/a/path/bucket/root/c/0")
    assert (put, put_path) == ("PUT", "/under/a/path/bucket/root/c/1")
    assert (delete, del_path) == ("DELETE", "/under/a/path/bucket/root/lease")
    assert del_headers["if-match"] == '"abc"'
    for h in (headers, put_headers, del_headers):
        assert "Credential=K/" in h["authorization"] and "/eu-west-3/s3/aws4_request" in h["authorization"]
        assert h.get("x-amz-request-payer") == "requester"
    assert put_headers.get("x-amz-server-side-encryption") == "AES256"


def test_the_aws_environment_changes_nothing_the_storage_options_set(recorder, monkeypatch):
    """obstore reads AWS_* variables botocore ignores beside given keys (a session token, unsigned requests...)."""
    for name, value in {"AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "x", "AWS_SESSION_TOKEN": "ENVTOKEN",
                        "AWS_SKIP_SIGNATURE": "true", "AWS_REQUEST_PAYER": "true", "AWS_REGION": "ap-south-2",
                        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true",
                        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(name, value)
    store = _recorded_store(recorder.endpoint, key="K", secret="S", endpoint_url=recorder.endpoint,
                            client_kwargs={"region_name": "eu-west-3"})
    assert bytes(remote.get_many(store, [("c/0", None)])[0]) == b"recorded"
    [(_, path, headers)] = recorder.seen
    assert path == "/bucket/root/c/0"
    assert "Credential=K/" in headers["authorization"] and "/eu-west-3/s3/" in headers["authorization"]
    assert "x-amz-security-token" not in headers and "x-amz-request-payer" not in headers


def test_anon_requests_are_not_signed(recorder, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "FROM-THE-ENVIRONMENT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    store = _recorded_store(recorder.endpoint, anon=True, endpoint_url=recorder.endpoint)
    assert bytes(remote.get_many(store, [("c/0", None)])[0]) == b"recorded"
    assert remote.conditional(store).delete("lease", '"abc"') is True
    assert len(recorder.seen) == 2
    for _, _, headers in recorder.seen:
        assert "authorization" not in headers


def test_credentials_of_a_profile_are_found_as_botocore_finds_them(s3, objects, tmp_path, monkeypatch):
    prefix, data = objects
    creds = tmp_path / "credentials"
    creds.write_text(f"[other]\naws_access_key_id = AKIANOTAKEY\naws_secret_access_key = x\n"
                     f"[dgemm-{prefix}]\naws_access_key_id = {s3.key}\naws_secret_access_key = {s3.secret}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    options = {"endpoint_url": s3.endpoint, "client_kwargs": {"region_name": "us-east-1"}}
    from zarr.storage import FsspecStore

    store = FsspecStore.from_url(s3.url(prefix), storage_options=dict(options, profile=f"dgemm-{prefix}"))
    assert bytes(remote.get_many(store, [("c/1/0", None)])[0]) == data["c/1/0"]
    other = FsspecStore.from_url(s3.url(prefix), storage_options=dict(options, profile="other"))
    with pytest.raises(PermissionError):
        remote.get_many(other, [("c/1/0", None)])


def test_settings_obstore_cannot_take_leave_the_store_to_zarr(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    from zarr.storage import FsspecStore

    def store(**options):
        return FsspecStore.from_url("s3://bucket/root", storage_options=dict({"key": "K", "secret": "S"}, **options))

    assert remote.handles(store(endpoint_url=s3.endpoint))
    assert not remote.handles(store())           # AWS, no region: botocore would follow the bucket's redirect
    assert remote.handles(store(client_kwargs={"region_name": "eu-west-3"}))
    assert not remote.handles(store(endpoint_url=s3.endpoint, config_kwargs={"s3": {"addressing_style": "virtual"}}))
    assert not remote.handles(store(endpoint_url=s3.endpoint, s3_additional_kwargs={"ACL": "public-read"}))
    assert not remote.handles(store(endpoint_url=s3.endpoint, client_kwargs={"config": object()}))
    assert not remote.handles(store(endpoint_url=s3.endpoint, config_kwargs={"signature_version": "s3"}))

"""Many S3 GETs and PUTs for a zarr store at once, from many threads, without zarr's event loop.

zarr's ``FsspecStore`` over s3fs does every request on one event-loop thread per
process, and aiohttp reads each body in Python on that thread: on the H100
host, 16 reader threads got about 0.02 GB/s each through it (3.4 s per 64 MB
chunk) where plain boto3 GETs from 16 threads read 4.0 GB/s from the same moto
server.  :func:`get_many` and :func:`put_many` send the requests through one
botocore client (urllib3: a connection per request in flight, the body read by
the thread that asked for it) built from the store's own s3fs settings, and
fan a call's requests out over a thread pool, so a call of several requests
runs them concurrently as ``asyncio.gather`` did.

Chosen by measurement against a local moto server (``python -m moto.server``,
signatures unchecked), 24 objects of 16, 32 and 64 MB (0.94 GB), whole-object
GETs spread over 1/4/8/16 threads, each thread one request per call, on the
development machine: 2 cores, which the server shares (its CPU per GB is
about that of the client), so every rate is bounded by those 2 cores; the
client's CPU seconds per GB say how a path would fare on more cores.  GB/s by
threads, and this process's CPU s/GB:

===============================================  =====================  ========
path                                             1 / 4 / 8 / 16 threads  CPU s/GB
===============================================  =====================  ========
(a) zarr ``store.get`` on zarr's loop (before)   0.26 0.29 0.20 0.23     2.5-2.8
(b) s3fs's sync ``fs.cat_file`` (fsspec's loop)  0.19 0.22 0.20 0.22     2.7-2.9
(c) a boto3 client per thread                    0.44 0.64 0.58 0.46     1.3-2.1
(c') one botocore client, many connections       0.51 0.87 0.76 0.79     1.2-1.3
(d) an event loop and an s3fs per thread         0.23 0.22 0.15 0.09     3.1-9.0
(e) obstore (Rust) called from each thread       0.51 0.62 0.54 0.60     0.9-1.1
(e') zarr's ``ObjectStore`` (obstore), its loop  0.45 0.66 0.67 0.60     0.9-1.1
this module (c'), a later run, busier machine    0.40 0.42 0.52 0.49     1.2-1.4
(a) in that same later run                       0.17 0.16 0.15 0.19     3.0-3.6
===============================================  =====================  ========

4 MB ranges, 8 per call, were bound by moto (9 server CPU s/GB: it reads the
whole object per range) at 0.05-0.09 GB/s for every path; client CPU 1.4-1.6
s/GB here, 2.0-2.3 for (a).  PUTs of whole objects, also moto-bound: 0.11-0.13
GB/s here and 0.10-0.12 through zarr's ``store.set``, client CPU 2.2 and 3.3-3.7
s/GB.  obstore costs the client least CPU, but it is a new dependency with its
own credential chain (no AWS profiles but through a boto3 provider), so it
could not take over every s3fs setting; a zarr ``ObjectStore`` is left to zarr
(e' reads as fast as e: its loop only awaits Rust).  s3fs's whole-object read
also costs the server twice the CPU: a HEAD, then 50 MB range GETs.

Only what can be taken over faithfully is: an ``S3FileSystem`` (not a
subclass) with no caller-made session, no bucket-region cache and no session
options but a profile; its key, secret, token, anon, endpoint, ``client_kwargs``,
``config_kwargs`` (timeouts included), ``use_ssl``, ``requester_pays`` and
``s3_additional_kwargs`` are passed as s3fs passes them.  Errors are s3fs's
(:func:`s3fs.errors.translate_boto_error`), and a missing key reads as None
exactly where zarr's store would (its ``allowed_exceptions``): wrong
credentials raise :class:`PermissionError`, never read as missing.
"""
from __future__ import annotations

import numbers
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from dgemm.storage import fastpaths

# Requests of one call run at once on this many threads (per process, shared by all callers); real S3
# rewards many connections, and a thread waiting on the network costs little.
POOL_THREADS = 64
# Idle connections kept: callers run a request themselves too, so more than the pool's threads.
_CONNECTIONS = 2 * POOL_THREADS + 64
_MAX_PUT = 5 * 2**30        # S3's limit for one PUT; larger objects need a multipart upload (left to zarr)

_LOCK = threading.Lock()
_CLIENTS: dict = {}          # settings token -> _S3, for this process
_POOL: list = [None, None]   # [pid, ThreadPoolExecutor]: clients and threads do not survive a fork


def handles(store) -> bool:
    """Whether :func:`get_many` and :func:`put_many` read and write ``store`` (else they return None)."""
    return _s3_of(store) is not None


def get_many(store, requests: list) -> list | None:
    """The bytes of many keys (or parts of them) of ``store``, fetched concurrently; None if not an S3 store here.

    Parameters
    ----------
    store : zarr store
        A ``zarr.storage.FsspecStore`` over an ``s3fs.S3FileSystem`` is read
        here; anything else returns None (the caller then uses ``store.get``).
    requests : list of (str, range)
        ``(key, None | (start, stop) | ("suffix", n))``: the key relative to
        the store's root; the whole object, bytes ``[start, stop)`` (clipped
        to the object, as S3 does), or its last ``n`` bytes.  An empty range
        reads as ``b""`` without a request.

    Returns
    -------
    list or None
        One ``bytes`` per request, in order, or None for a key the store does
        not hold (where zarr's ``store.get`` would return None); None as a
        whole when ``store`` is not one this module reads.

    Raises
    ------
    PermissionError
        Credentials the server refuses (or access denied), naming the object.
    OSError
        Any other failure, as s3fs would raise it; nothing else reads as None.
    ValueError
        A malformed range (before any request is sent).
    """
    found = _s3_of(store)
    if found is None:
        return None
    s3, fs, root, allowed = found
    for key, rng in requests:
        _check_range(key, rng)
    return _run(lambda req: s3.get(fs, _path(root, req[0]), req[1], allowed), list(requests))


def put_many(store, items: list) -> bool | None:
    """Write many objects of ``store`` concurrently; None (nothing written) if not an S3 store here.

    Parameters
    ----------
    store : zarr store
        As for :func:`get_many`; it must be writable.
    items : list of (str, bytes-like)
        ``(key, value)``: the key relative to the store's root, and the whole
        object, written over any object of that key (as ``store.set``).

    Returns
    -------
    True, or None
        None when ``store`` is not one this module writes, or an object is
        too large for one PUT (5 GiB): the caller then uses ``store.set``.

    Raises
    ------
    ValueError
        The store is read-only (before anything is written).
    PermissionError, OSError
        As s3fs would raise them; objects written before a failure stay.
    """
    found = _s3_of(store)
    if found is None:
        return None
    items = [(key, _as_bytes(value)) for key, value in items]
    if any(len(value) >= _MAX_PUT for _, value in items):
        return None
    if getattr(store, "read_only", False):
        raise ValueError(f"store {store!r} was opened read-only: nothing written")
    s3, fs, root, _ = found
    _run(lambda item: s3.put(fs, _path(root, item[0]), item[1]), items)
    fastpaths.record("s3_put_batch", sum(len(value) for _, value in items))
    return True


def conditional(store) -> Conditional | None:
    """Reads with their ETag and writes conditioned on it, for the keys of ``store``; None if not an S3 store here.

    The output's lease (:mod:`dgemm.storage.lease`) takes and renews itself
    through it, so that of two writers only one can hold it.
    """
    found = _s3_of(store)
    if found is None:
        return None
    s3, fs, root, _ = found
    return Conditional(s3, fs, root, bool(getattr(store, "read_only", False)))


# The error codes of a server that does not do conditional writes and says so (``501 NotImplemented``, as S3
# answered before it added them in 2024): the request goes again without the condition.
_NO_CONDITIONS = ("NotImplemented", "501")
# The object changed since it was read: 412 (another ETag, or one there now), 404 (gone; AWS and moto answer
# ``If-Match`` on a missing object so), 409 (AWS: another conditional write of it was in flight).
_CHANGED = ("PreconditionFailed", "412", "NoSuchKey", "404", "ConditionalRequestConflict", "409")


class Conditional:
    """One S3 store's keys, read with their ETag and written only if unchanged since (S3's conditional writes).

    :meth:`put` sends ``If-None-Match: *`` (write only if there is no
    object) or ``If-Match: <etag>`` (only if the object is still the one
    read), and the server decides: of two writers, one wins.  Where the
    server refuses the conditions (``501 NotImplemented``), the write is
    sent again without them, and this process's later writes to that server
    go without (:attr:`atomic` turns False): a read, then a write, as for
    any other store.  A server that ignores them writes unconditionally.
    """

    def __init__(self, s3: _S3, fs, root: str, read_only: bool):
        self.s3, self.fs, self.root, self.read_only = s3, fs, root, read_only

    @property
    def atomic(self) -> bool:
        """False once the server refused a conditional PUT (this process writes it unconditionally since)."""
        return "PutObject" not in self.s3.refused

    def get(self, key: str) -> tuple[bytes, str] | None:
        """``(the object's bytes, its ETag)``, or None when there is no object ``key``."""
        bucket, name, _ = _split(self.fs, _path(self.root, key))

        def get():
            reply = self.s3.client.get_object(**self.s3.get_extra, Bucket=bucket, Key=name)
            body = reply["Body"]
            try:
                return body.read(), reply["ETag"]
            finally:
                body.close()
        try:
            return self.s3._retrying(get)
        except Exception as e:
            if _code(e) in ("NoSuchKey", "404"):
                return None
            _raise_translated(e, f"s3://{bucket}/{name}")

    def put(self, key: str, data: bytes, match: str | None) -> str | None:
        """Write ``key`` if it is as read: absent (``match`` None) or with ETag ``match``; the new ETag, or None if not.

        None means another writer changed (or deleted) the object since it
        was read: nothing was written.  A request retried after a reply lost
        may also find its own write there: the caller reads to tell.
        """
        if self.read_only:
            raise ValueError(f"s3 store {self.root!r} was opened read-only: nothing written")
        condition = {"IfNoneMatch": "*"} if match is None else {"IfMatch": match}
        reply = self._write("PutObject", self.s3.client.put_object, key, condition,
                            dict(self.s3.put_extra, Body=data))
        return None if reply is None else reply.get("ETag") or ""

    def delete(self, key: str, match: str) -> bool:
        """Delete ``key`` if its ETag is still ``match``; False (nothing deleted) if another writer changed it."""
        if self.read_only:
            raise ValueError(f"s3 store {self.root!r} was opened read-only: nothing deleted")
        return self._write("DeleteObject", self.s3.client.delete_object, key, {"IfMatch": match}, {}) is not None

    def _write(self, op: str, call, key: str, condition: dict, kwargs: dict):
        """A conditional write of ``key``: the server's reply, or None where another writer changed it first."""
        bucket, name, _ = _split(self.fs, _path(self.root, key))
        try:
            return self._send(op, call, condition, dict(kwargs, Bucket=bucket, Key=name)) or {}
        except Exception as e:
            if _code(e) in _CHANGED:
                return None
            _raise_translated(e, f"s3://{bucket}/{name}")
        finally:
            with _LOCK:
                self.fs.invalidate_cache(_path(self.root, key))

    def _send(self, op: str, call, condition: dict, kwargs: dict):
        """``call(**kwargs, **condition)``; without the condition where the server refuses it (remembered)."""
        if op not in self.s3.refused:
            try:
                return self.s3._retrying(lambda: call(**kwargs, **condition))
            except Exception as e:
                if _code(e) not in _NO_CONDITIONS:
                    raise
                with _LOCK:
                    self.s3.refused.add(op)
        return self.s3._retrying(lambda: call(**kwargs))


def _raise_translated(error: Exception, what: str):
    """Raise s3fs's exception for the botocore ``error`` (the error itself where s3fs has none)."""
    translated = _translated(error, what)
    if translated is error:
        raise error
    raise translated from error


# -- which stores, and their client ---------------------------------------------------------------

def _s3_of(store):
    """(the :class:`_S3` for ``store``'s filesystem, the filesystem, its root path, its allowed exceptions), or None."""
    try:
        from zarr.storage import FsspecStore
    except ImportError:
        return None
    if not isinstance(store, FsspecStore):
        return None
    fs, root = getattr(store, "fs", None), getattr(store, "path", None)
    allowed = getattr(store, "allowed_exceptions", None)
    if not isinstance(root, str) or not isinstance(allowed, tuple):
        return None
    settings = _settings(fs)
    if settings is None:
        return None
    from fsspec.utils import tokenize

    token = (os.getpid(), tokenize(settings))
    s3 = _CLIENTS.get(token)
    if s3 is None:
        with _LOCK:
            s3 = _CLIENTS.get(token)
            if s3 is None:
                s3 = _S3.make(settings)
                if s3 is None:
                    return None
                _CLIENTS[token] = s3
    return s3, fs, root, allowed


def _settings(fs) -> dict | None:
    """What s3fs's ``set_session`` would create its client with, or None when it cannot be taken over."""
    try:
        from s3fs import S3FileSystem
    except ImportError:
        return None
    if type(fs) is not S3FileSystem:
        return None
    try:
        if (getattr(fs, "storage_options", None) or {}).get("session") is not None:
            return None          # a session the caller made: its credentials and hooks are its own
        if fs.cache_regions:
            return None          # s3fs finds each bucket's region itself
        session = dict(fs.kwargs)
        profile = session.pop("profile", None)
        if session:
            return None          # other AioSession options
        client_kwargs = dict(fs.client_kwargs)
        init = {"aws_access_key_id": fs.key, "aws_secret_access_key": fs.secret,
                "aws_session_token": fs.token, "endpoint_url": fs.endpoint_url}
        init = {k: v for k, v in init.items() if v is not None and v != client_kwargs.get(k)}
        if "use_ssl" not in client_kwargs:
            init["use_ssl"] = fs.use_ssl
        if hasattr(fs, "_prepare_config_kwargs"):
            config = dict(fs._prepare_config_kwargs())
        else:
            config = dict(fs.config_kwargs)
            config.setdefault("connect_timeout", fs.connect_timeout)
            config.setdefault("read_timeout", fs.read_timeout)
        anon = bool(fs.anon)
        if anon:
            drop = {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
            init = {k: v for k, v in init.items() if k not in drop}
            client_kwargs = {k: v for k, v in client_kwargs.items() if k not in drop}
        extra = dict(fs.s3_additional_kwargs)
        extra.update(getattr(fs, "req_kw", None) or ({"RequestPayer": "requester"} if fs.requester_pays else {}))
        if extra.get("RequestPayer", "") is None:
            extra.pop("RequestPayer")
        return {"profile": profile, "init": init, "client": client_kwargs, "config": config, "anon": anon,
                "extra": extra, "retries": int(getattr(fs, "retries", 5))}
    except (AttributeError, TypeError, ValueError):
        return None              # an s3fs whose settings are not where this one keeps them


class _S3:
    """One botocore S3 client (thread-safe, a pool of connections) and what s3fs adds to each request."""

    def __init__(self, client, extra: dict, retries: int):
        self.client = client
        self.retries = max(1, retries)
        members = {op: set(client.meta.service_model.operation_model(op).input_shape.members)
                   for op in ("GetObject", "PutObject")}
        # as s3fs filters its s3_additional_kwargs: only those the operation takes
        self.get_extra = {k: v for k, v in extra.items() if k in members["GetObject"]}
        self.put_extra = {k: v for k, v in extra.items() if k in members["PutObject"]}
        self.refused: set[str] = set()   # operations whose conditional form the server refused (Conditional)

    @classmethod
    def make(cls, settings: dict):
        import botocore.session
        from botocore.config import Config

        config = dict(settings["config"])
        config["max_pool_connections"] = max(int(config.get("max_pool_connections") or 10), _CONNECTIONS)
        if settings["anon"]:
            from botocore import UNSIGNED
            config["signature_version"] = UNSIGNED
        try:
            conf = Config(**config)       # aiobotocore-only options (AioConfig) raise here
            session = botocore.session.Session(profile=settings["profile"])
            client = session.create_client("s3", config=conf, **settings["init"], **settings["client"])
        except Exception:
            return None                   # zarr's path, through s3fs, raises what is wrong
        return cls(client, settings["extra"], settings["retries"])

    def get(self, fs, path: str, rng, allowed: tuple):
        bucket, key, version = _split(fs, path)
        if rng is not None:
            if rng[0] == "suffix":
                if rng[1] == 0:
                    return b""
                header = f"bytes=-{int(rng[1])}"
            else:
                if rng[1] <= rng[0]:
                    return b""
                header = f"bytes={int(rng[0])}-{int(rng[1]) - 1}"
        kwargs = dict(self.get_extra, Bucket=bucket, Key=key, **({"VersionId": version} if version else {}))
        if rng is not None:
            kwargs["Range"] = header

        def get():
            body = self.client.get_object(**kwargs)["Body"]
            try:
                return body.read()
            finally:
                body.close()
        try:
            return self._retrying(get)
        except Exception as e:
            error = _translated(e, f"s3://{bucket}/{key}")
            if isinstance(error, allowed):
                return None
            if _code(e) in ("InvalidRange", "416"):
                return b""                # as zarr's FsspecStore: a range past the end reads as nothing
            if error is e:
                raise
            raise error from e

    def put(self, fs, path: str, value: bytes) -> None:
        bucket, key, _ = _split(fs, path)
        try:
            self._retrying(lambda: self.client.put_object(**self.put_extra, Bucket=bucket, Key=key, Body=value))
        except Exception as e:
            error = _translated(e, f"s3://{bucket}/{key}")
            if error is e:
                raise
            raise error from e
        with _LOCK:          # as s3fs after a PUT: its listings (zarr's list) see the new object
            fs.invalidate_cache(path)

    def _retrying(self, call):
        """``call()``, again on the errors s3fs retries that botocore does not (a body cut off, a timeout)."""
        from botocore.exceptions import (ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError,
                                         IncompleteReadError, ReadTimeoutError, ResponseStreamingError)

        transient = (ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError, IncompleteReadError,
                     ReadTimeoutError, ResponseStreamingError)
        for attempt in range(self.retries):
            try:
                return call()
            except Exception as e:
                if attempt == self.retries - 1 or not (isinstance(e, transient) or _code(e) == "SlowDown"):
                    raise
                time.sleep(min(1.7**attempt * 0.1, 15))    # s3fs's backoff


def _translated(error: Exception, what: str) -> Exception:
    """s3fs's exception for a botocore error (``PermissionError`` for a refused key...), naming the object."""
    from s3fs.errors import translate_boto_error

    exc = translate_boto_error(error, set_cause=False)
    if exc is error:
        return error
    message = f"{what}: {_code(error)}: {getattr(exc, 'strerror', None) or exc}"
    try:
        return type(exc)(exc.errno, message) if getattr(exc, "errno", None) is not None else type(exc)(message)
    except TypeError:
        return exc


def _code(error: Exception) -> str | None:
    """The S3 error code of a botocore ``ClientError`` (None for other errors)."""
    response = getattr(error, "response", None)
    return (response.get("Error") or {}).get("Code") if isinstance(response, dict) else None


def _split(fs, path: str) -> tuple[str, str, str | None]:
    """(bucket, key, version id) as s3fs splits ``path`` (access-point ARNs and ``?versionId=`` included)."""
    bucket, key, version = fs.split_path(path)
    if not bucket or not key:
        raise ValueError(f"{path!r} names no object (bucket/key)")
    return bucket, key, version


def _path(root: str, key: str) -> str:
    """zarr's FsspecStore path of ``key``: the store's root and the key joined by ``/``."""
    root = root.rstrip("/")
    return (f"{root}/{key}" if root else key).rstrip("/")


def _integer(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_range(key, rng) -> None:
    if not isinstance(key, str):
        raise ValueError(f"key {key!r} is not a string")
    if rng is None:
        return
    ok = isinstance(rng, tuple) and len(rng) == 2 and (
        (isinstance(rng[0], str) and rng[0] == "suffix" and _integer(rng[1]) and rng[1] >= 0)
        or (all(_integer(v) for v in rng) and 0 <= rng[0]))
    if not ok:
        raise ValueError(f"{key!r}: byte range {rng!r} is neither None, (start, stop) with 0 <= start, "
                         "nor ('suffix', n) with n >= 0")


def _as_bytes(value) -> bytes | bytearray:
    """``value`` as botocore takes a body (bytes; a copy of any other buffer)."""
    if isinstance(value, (bytes, bytearray)):
        return value
    return memoryview(value).cast("B").tobytes()


def _pool() -> ThreadPoolExecutor:
    pid = os.getpid()
    if _POOL[0] != pid:
        with _LOCK:
            if _POOL[0] != pid:
                _POOL[1] = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="dgemm-s3")
                _POOL[0] = pid
    return _POOL[1]


def _run(fn, items: list) -> list:
    """``[fn(i) for i in items]``, concurrently: the pool runs them, and the caller runs those not yet started.

    The caller never only waits on a queue: with the pool busy with other
    callers' requests it does its own one by one, so no call can starve.
    """
    if len(items) <= 1:
        return [fn(i) for i in items]
    futures = [_pool().submit(fn, i) for i in items[1:]]
    try:
        out = [fn(items[0])]
        for item, future in zip(items[1:], futures):
            out.append(fn(item) if future.cancel() else future.result())
        return out
    finally:
        for future in futures:
            future.cancel()

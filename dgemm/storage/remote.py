"""Many S3 GETs and PUTs for a zarr store at once, from many threads, through obstore, without zarr's event loop.

zarr's ``FsspecStore`` over s3fs does every request on one event-loop thread
per process, and aiohttp reads each body in Python on that thread (16 reader
threads got about 0.02 GB/s each through it on the H100 host).
:func:`get_many` and :func:`put_many` send a store's requests through
obstore's *synchronous* calls (Rust: the GIL is released while a request is
in flight, the body lands in one buffer returned without a copy), a call's
requests fanned out over a thread pool, so that many callers and many
requests run at once.  obstore's async API (what zarr's ``ObjectStore``
uses) is not used: it read a 64 MiB object 20-30x slower from threads, and
its multipart PUT above 5 MiB doubled the server's CPU; every PUT here is
one request (objects up to S3's 5 GiB).  Against the botocore client this
module was before (moto, 2 cores): about half the client's CPU per GB on
1 MiB GETs and on PUTs, the same on 64 MiB GETs (bench/NOTES.md, issue 29).

The store is still the ``FsspecStore`` over an ``s3fs.S3FileSystem`` that
``storage_options=`` makes; its settings are translated to an obstore
``S3Store`` only where the translation is faithful (:func:`_settings`),
else this module declines and zarr's path serves the store: key, secret,
token (or the credentials botocore finds for the profile: environment,
``~/.aws``, instance roles), ``anon``, the endpoint (a path in it kept),
the region (``client_kwargs``, or botocore's configured one; with no region
and no endpoint, where botocore would follow the bucket's region redirect,
declined), ``requester_pays``, server-side encryption, ``verify``, the
connect timeout, the read timeout (GETs only: reqwest's runs from the
request's start, a PUT's upload included) and the retries.

Errors are what s3fs raises: a missing object (or bucket) is
:class:`FileNotFoundError`, read as None exactly where zarr's store would
(its ``allowed_exceptions``); refused credentials are :class:`PermissionError`,
never read as missing; anything else :class:`OSError`; each names the object
and S3's error code.  Connection errors, timeouts and 5xx answers are
retried by obstore (s3fs's ``retries`` times, s3fs's backoff).
"""
from __future__ import annotations

import numbers
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from dgemm.storage import fastpaths

# Requests of one call run at once on this many threads (per process, shared by all callers); real S3
# rewards many connections, and a thread waiting on the network costs little (obstore releases the GIL).
POOL_THREADS = 64
_MAX_PUT = 5 * 2**30        # S3's limit for one PUT; larger objects need a multipart upload (left to zarr)

_LOCK = threading.Lock()
_CLIENTS: dict = {}          # (pid, settings token) -> _S3, for this process
_POOL: list = [None, None]   # [pid, ThreadPoolExecutor]: threads do not survive a fork


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
        One bytes-like object (buffer protocol: ``bytes()``, ``memoryview``,
        ``np.frombuffer`` take it without a copy) per request, in order, or
        None for a key the store does not hold (where zarr's ``store.get``
        would return None); None as a whole when ``store`` is not one this
        module reads.

    Raises
    ------
    PermissionError
        Credentials the server refuses (or access denied), naming the object.
    OSError
        Any other failure (``FileNotFoundError`` where the store does not
        allow it); nothing else reads as None.
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
        object, written over any object of that key (as ``store.set``), in
        one PUT.

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
        As for :func:`get_many`; objects written before a failure stay.
    """
    found = _s3_of(store)
    if found is None:
        return None
    items = [(key, _as_buffer(value)) for key, value in items]
    if any(value.nbytes >= _MAX_PUT for _, value in items):
        return None
    if getattr(store, "read_only", False):
        raise ValueError(f"store {store!r} was opened read-only: nothing written")
    s3, fs, root, _ = found
    _run(lambda item: s3.put(fs, _path(root, item[0]), item[1]), items)
    fastpaths.record("s3_put_batch", sum(value.nbytes for _, value in items))
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


class Conditional:
    """One S3 store's keys, read with their ETag and written only if unchanged since (S3's conditional writes).

    :meth:`put` sends ``If-None-Match: *`` (write only if there is no
    object: obstore's ``mode="create"``) or ``If-Match: <etag>`` (only if
    the object is still the one read: an update of that ETag), and
    :meth:`delete` ``If-Match`` (obstore's delete takes no condition: that
    request is signed by botocore's SigV4 signer and sent here); the server
    decides: of two writers, one wins.  Where the server refuses the
    conditions (``501 NotImplemented``), the request is sent again without
    them, and this process's later ones to that server go without
    (:attr:`atomic` turns False): a read, then a write, as for any other
    store.  A server that ignores them writes unconditionally.
    """

    def __init__(self, s3: _S3, fs, root: str, read_only: bool):
        self.s3, self.fs, self.root, self.read_only = s3, fs, root, read_only

    @property
    def atomic(self) -> bool:
        """False once the server refused a conditional PUT (this process writes it unconditionally since)."""
        return "PutObject" not in self.s3.refused

    def get(self, key: str) -> tuple[bytes, str] | None:
        """``(the object's bytes, its ETag)``, or None when there is no object ``key``."""
        import obstore

        bucket, name, what = self._where(key)
        try:
            got = obstore.get(self.s3.store(bucket), name)
            return bytes(got.bytes()), got.meta["e_tag"]
        except Exception as e:
            if isinstance(e, FileNotFoundError) and _code(e) != "NoSuchBucket":
                return None
            _raise(e, what)

    def put(self, key: str, data: bytes, match: str | None) -> str | None:
        """Write ``key`` if it is as read: absent (``match`` None) or with ETag ``match``; the new ETag, or None if not.

        None means another writer changed (or deleted) the object since it
        was read: nothing was written.  A request retried after a reply lost
        may also find its own write there: the caller reads to tell.
        """
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        bucket, name, what = self._where(key, "written")
        store = self.s3.store(bucket, put=True)
        mode = "overwrite" if not self.atomic else "create" if match is None else {"e_tag": match}
        try:
            try:
                return obstore.put(store, name, data, mode=mode, use_multipart=False).get("e_tag") or ""
            except (AlreadyExistsError, PreconditionError):
                return None      # 412: another ETag, or an object there now; 404: gone since the read
            except Exception as e:
                if _code(e) in _CONFLICT:
                    return None
                if mode == "overwrite" or _code(e) not in _NO_CONDITIONS:
                    raise
            with _LOCK:
                self.s3.refused.add("PutObject")
            return obstore.put(store, name, data, mode="overwrite", use_multipart=False).get("e_tag") or ""
        except Exception as e:
            _raise(e, what)
        finally:
            with _LOCK:
                self.fs.invalidate_cache(_path(self.root, key))

    def delete(self, key: str, match: str) -> bool:
        """Delete ``key`` if its ETag is still ``match``; False (nothing deleted) if another writer changed it."""
        import obstore

        bucket, name, what = self._where(key, "deleted")
        try:
            if "DeleteObject" not in self.s3.refused:
                status, code = self.s3.delete_if(bucket, name, match)
                if status < 300:
                    return True
                if code in _CHANGED or str(status) in _CHANGED:
                    return False
                if code not in _NO_CONDITIONS and str(status) not in _NO_CONDITIONS:
                    error = PermissionError if status in (401, 403) else OSError
                    raise error(f"{what}: {code or status}: a DELETE with If-Match answered {status}")
                with _LOCK:
                    self.s3.refused.add("DeleteObject")
            obstore.delete(self.s3.store(bucket), name)
            return True
        except Exception as e:
            _raise(e, what)
        finally:
            with _LOCK:
                self.fs.invalidate_cache(_path(self.root, key))

    def _where(self, key: str, change: str | None = None) -> tuple[str, str, str]:
        if change and self.read_only:
            raise ValueError(f"s3 store {self.root!r} was opened read-only: nothing {change}")
        bucket, name, _ = _split(self.fs, _path(self.root, key))
        return bucket, name, f"s3://{bucket}/{name}"


# The error codes of a server that does not do conditional writes and says so (``501 NotImplemented``, as S3
# answered before it added them in 2024): the request goes again without the condition.
_NO_CONDITIONS = ("NotImplemented", "501")
_CONFLICT = ("ConditionalRequestConflict", "409")    # AWS: another conditional write of it was in flight
# A conditional DELETE found the object changed: 412, 404 (gone), 409.
_CHANGED = ("PreconditionFailed", "412", "NoSuchKey", "404") + _CONFLICT


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
    if token not in _CLIENTS:
        with _LOCK:
            if token not in _CLIENTS:
                _CLIENTS[token] = _S3.make(settings)     # None (declined) too: botocore's lookups are not free
    s3 = _CLIENTS[token]
    return None if s3 is None else (s3, fs, root, allowed)


# The options of s3fs's filesystem, its botocore client and its requests that obstore takes as they are meant;
# any other makes this module decline the store (zarr's path, through s3fs, then honours it).
_CLIENT_KWARGS = {"region_name", "endpoint_url", "use_ssl", "verify",
                  "aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
_CONFIG_KWARGS = {"connect_timeout", "read_timeout", "retries", "max_pool_connections", "region_name",
                  "signature_version", "s3"}
_EXTRA = {"ServerSideEncryption": "server_side_encryption", "SSEKMSKeyId": "sse_kms_key_id"}


def _settings(fs) -> dict | None:
    """What the obstore stores for ``fs`` are made from (:meth:`_S3.make`), or None when it cannot be taken over."""
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
        session, client, config = dict(fs.kwargs), dict(fs.client_kwargs), dict(fs.config_kwargs)
        profile = session.pop("profile", None)
        extra = dict(fs.s3_additional_kwargs)
        payer = bool(fs.requester_pays) or extra.pop("RequestPayer", None) == "requester"
        style = dict(config.get("s3") or {"addressing_style": "path"})
        verify = client.get("verify", True)
        if session or set(client) - _CLIENT_KWARGS or set(config) - _CONFIG_KWARGS or set(extra) - set(_EXTRA) \
                or style.pop("addressing_style", "path") not in ("path", "auto") or style \
                or not isinstance(verify, (bool, str)):
            return None          # (virtual-hosted requests: an endpoint's URL would have to be rebuilt)
        anon, signature = bool(fs.anon), config.get("signature_version")
        if signature not in (None, "s3v4"):
            from botocore import UNSIGNED
            if signature is not UNSIGNED:
                return None      # another signature than SigV4
            anon = True
        key, secret, token = (client.get(f"aws_{k}", getattr(fs, attr)) for k, attr in
                              (("access_key_id", "key"), ("secret_access_key", "secret"), ("session_token", "token")))
        endpoint = client.get("endpoint_url") or fs.endpoint_url
        if not endpoint and not client.get("use_ssl", fs.use_ssl):
            return None          # plain http to AWS
        timeouts = {name: float(config.get(name, getattr(fs, name))) for name in ("connect_timeout", "read_timeout")
                    if config.get(name, getattr(fs, name)) is not None}
        retries = dict(config.get("retries") or {})
        if "total_max_attempts" in retries or "max_attempts" in retries:     # botocore's, as s3fs passes them
            retries = retries.get("total_max_attempts", int(retries.get("max_attempts", 0)) + 1) - 1
        else:
            retries = getattr(fs, "retries", 5)                               # s3fs's own
        return {"profile": profile, "anon": anon,
                "credentials": None if anon or not (key and secret) else (key, secret, token),
                "endpoint": endpoint, "region": client.get("region_name") or config.get("region_name"),
                "payer": payer, "verify": verify, "extra": {_EXTRA[k]: v for k, v in extra.items()},
                "timeouts": timeouts, "retries": max(int(retries), 0)}
    except (AttributeError, TypeError, ValueError):
        return None              # an s3fs whose settings are not where this one keeps them


class _S3:
    """The obstore stores (one per bucket, made on first use) of one set of s3fs settings."""

    def __init__(self, settings: dict, region: str, creds):
        self.endpoint, self.region, self.creds = settings["endpoint"], region, creds
        self.retries, self.verify = settings["retries"], settings["verify"]
        # everything set, so that obstore's own reading of AWS_* variables changes nothing botocore would not
        self.config = dict(settings["extra"], region=region, skip_signature=settings["anon"],
                           request_payer=settings["payer"], conditional_put="etag",
                           virtual_hosted_style_request=False)
        if self.endpoint:        # (the service-specific variable would win over ``endpoint`` in obstore)
            self.config["endpoint"] = self.config["aws_endpoint_url_s3"] = self.endpoint.rstrip("/")
        # obstore's 30 s for a whole request would cut a large object's slow transfer (10 minutes: 5 GiB at
        # 10 MB/s); a GET that stalls is what read_timeout (botocore's meaning) catches
        self.client = {"allow_http": bool(self.endpoint and self.endpoint.startswith("http://")),
                       "timeout": timedelta(minutes=10), "allow_invalid_certificates": self.verify is False}
        for name, seconds in settings["timeouts"].items():
            self.client[name] = timedelta(seconds=seconds)
        # reqwest's read timeout runs from the request's start, its body's upload included (botocore's is
        # per socket read): a PUT slower to upload than s3fs's 15 s would time out, again and again
        self.put_client = {k: v for k, v in self.client.items() if k != "read_timeout"}
        if isinstance(self.verify, str):
            with open(self.verify) as f:
                self.client["root_certificate"] = f.read()
        # s3fs's bound and backoff (0.1 s, times 1.7, at most 15 s); obstore retries connection errors,
        # timeouts and 5xx answers, never a 4xx
        self.retry = {"max_retries": self.retries, "backoff": {
            "init_backoff": timedelta(seconds=0.1), "max_backoff": timedelta(seconds=15), "base": 1.7}}
        self.stores: dict = {}
        self.refused: set[str] = set()   # operations whose conditional form the server refused (Conditional)

    @classmethod
    def make(cls, settings: dict):
        """The client for ``settings`` (:func:`_settings`), or None where its credentials or region are unknown."""
        region, creds = settings["region"], settings["credentials"]
        try:
            if region is None or creds is None and not settings["anon"]:
                import botocore.session
                session = botocore.session.Session(profile=settings["profile"])
                region = region or session.get_config_variable("region")
                if creds is None and not settings["anon"]:
                    creds = session.get_credentials()     # the environment, ~/.aws, an instance's role...
                    if creds is None:
                        return None       # zarr's path raises botocore's NoCredentialsError
            if region is None:
                if settings["endpoint"] is None:
                    return None           # botocore follows the bucket's region redirect; obstore would not
                region = "us-east-1"      # botocore's signing region for an endpoint without one
            return cls(settings, region, creds)
        except Exception:
            return None                   # a profile botocore does not know, a certificate file not there...

    def store(self, bucket: str, put: bool = False):
        """obstore's ``S3Store`` for ``bucket``, for GETs or for PUTs (made once per process)."""
        store = self.stores.get((bucket, put))
        if store is None:
            from obstore.store import S3Store

            with _LOCK:
                store = self.stores.get((bucket, put))
                if store is None:
                    store = self.stores[bucket, put] = S3Store(
                        bucket, config=self.config, client_options=self.put_client if put else self.client,
                        retry_config=self.retry, credential_provider=None if self.creds is None else self._credentials)
        return store

    def _credentials(self) -> dict:
        """The credentials to sign with, as obstore asks for them (a given key, or botocore's, refreshed)."""
        from datetime import datetime, timezone

        refreshes = hasattr(self.creds, "refresh_needed")
        if hasattr(self.creds, "get_frozen_credentials"):
            frozen = self.creds.get_frozen_credentials()
            key, secret, token = frozen.access_key, frozen.secret_key, frozen.token
        else:
            key, secret, token = self.creds
        return {"access_key_id": key, "secret_access_key": secret, "token": token,
                # botocore refreshes ahead of expiry: asked again every 5 minutes, obstore follows it
                "expires_at": datetime.now(timezone.utc) + timedelta(minutes=5) if refreshes else None}

    def get(self, fs, path: str, rng, allowed: tuple):
        import obstore

        bucket, key, version = _split(fs, path)
        options = {"version": version} if version else {}
        if rng is not None:
            if rng[1] == 0 if rng[0] == "suffix" else rng[1] <= rng[0]:
                return b""
            options["range"] = {"suffix": int(rng[1])} if rng[0] == "suffix" else (int(rng[0]), int(rng[1]))
        try:
            return obstore.get(self.store(bucket), key, options=options).bytes()
        except Exception as e:
            if rng is not None and _code(e) in ("InvalidRange", "416"):
                return b""                # as zarr's FsspecStore: a range past the end reads as nothing
            error = _translated(e, f"s3://{bucket}/{key}")
            if isinstance(error, allowed):
                return None
            _raise(e, f"s3://{bucket}/{key}")

    def put(self, fs, path: str, value) -> None:
        import obstore

        bucket, key, _ = _split(fs, path)
        try:
            obstore.put(self.store(bucket, put=True), key, value, use_multipart=False)
        except Exception as e:
            _raise(e, f"s3://{bucket}/{key}")
        with _LOCK:          # as s3fs after a PUT: its listings (zarr's list) see the new object
            fs.invalidate_cache(path)

    def delete_if(self, bucket: str, key: str, match: str) -> tuple[int, str | None]:
        """A ``DELETE`` with ``If-Match: match``, signed by botocore (SigV4): (the HTTP status, S3's error code)."""
        import ssl
        import urllib.error
        import urllib.request
        from urllib.parse import quote

        endpoint = self.endpoint.rstrip("/") if self.endpoint else f"https://s3.{self.region}.amazonaws.com"
        url = f"{endpoint}/{bucket}/{quote(key, safe='/~')}"
        headers = {"If-Match": match, **({"x-amz-request-payer": "requester"} if self.config["request_payer"]
                                         else {})}
        context = ssl.create_default_context(cadata=self.client.get("root_certificate"))
        if self.verify is False:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        for attempt in range(self.retries + 1):
            signed = headers
            if self.creds is not None:
                from botocore.auth import S3SigV4Auth
                from botocore.awsrequest import AWSRequest
                from botocore.credentials import Credentials

                request = AWSRequest(method="DELETE", url=url, headers=dict(headers))
                creds = self._credentials()
                S3SigV4Auth(Credentials(creds["access_key_id"], creds["secret_access_key"], creds["token"]),
                            "s3", self.region).add_auth(request)
                signed = dict(request.headers.items())
            try:
                with urllib.request.urlopen(urllib.request.Request(url, method="DELETE", headers=signed),
                                            timeout=60, context=context if url.startswith("https") else None) as r:
                    return r.status, None
            except urllib.error.HTTPError as e:
                code = re.search(r"<Code>([^<]+)</Code>", e.read().decode("utf-8", "replace"))
                if e.code < 500 or e.code == 501 or attempt == self.retries:
                    return e.code, code.group(1) if code else None
            except OSError:               # the connection refused, dropped, timed out: as obstore, again
                if attempt == self.retries:
                    raise
            time.sleep(min(1.7**attempt * 0.1, 15))


def _raise(error: Exception, what: str):
    """Raise what s3fs raises for an obstore ``error`` (:func:`_translated`); any other error as it is."""
    translated = _translated(error, what)
    if translated is error:
        raise error
    raise translated from error


def _translated(error: Exception, what: str) -> Exception:
    """s3fs's exception for an obstore ``error``: not found, refused or another OSError, naming the object."""
    import errno

    from obstore.exceptions import BaseError, PermissionDeniedError, UnauthenticatedError

    if not isinstance(error, BaseError) and not type(error).__module__.startswith("obstore"):
        return error
    text = str(error)
    found = re.search(r"<Message>([^<]*)</Message>", text)
    detail = found.group(1) if found else (text.split("\n\nDebug source")[0].splitlines() or [""])[0][:300]
    message = f"{what}: {_code(error) or type(error).__name__}: {detail}"
    if isinstance(error, FileNotFoundError):           # obstore's NotFoundError: a 404, of the key or the bucket
        return FileNotFoundError(errno.ENOENT, message)
    if isinstance(error, (PermissionDeniedError, UnauthenticatedError)):
        return PermissionError(errno.EACCES, message)
    return OSError(message)


def _code(error: Exception) -> str | None:
    """S3's error code in an obstore error (the ``<Code>`` of its body), else the HTTP status it names."""
    text = str(error)
    found = re.search(r"<Code>([^<]+)</Code>", text) or re.search(r"status code: (\d{3})", text)
    return found.group(1) if found else None


def _split(fs, path: str) -> tuple[str, str, str | None]:
    """(bucket, key, version id) as s3fs splits ``path`` (``?versionId=`` included)."""
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


def _as_buffer(value) -> memoryview:
    """``value`` as obstore takes a body: a flat, contiguous buffer of bytes (a copy only where it is not)."""
    view = memoryview(value)
    if not view.c_contiguous:
        return memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


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

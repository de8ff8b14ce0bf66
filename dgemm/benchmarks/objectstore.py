"""Object storage for ``dgemm bench e2e --store s3://...``: a local S3 server, the bench's folder, the floor.

* :func:`start_moto` / :class:`LocalS3`: moto's S3-compatible server
  (``moto.server.ThreadedMotoServer``) as a process of its own on
  127.0.0.1, on a free port.  The tests' ``s3`` fixture (tests/s3server.py) starts it the
  same way, with request signatures checked.
* :class:`Location`: where the benchmark's Zarr arrays live, a local folder
  or an S3 prefix with the ``storage_options`` that reach it; paths are
  joined with ``/`` and removed or measured the same way in both;
  :func:`open_zarr`, :func:`remove_array` and :func:`stored_bytes` take a
  path of either kind with its ``storage_options``.
* :func:`object_get_rate` and :func:`object_put_rate`: the raw object rates
  of the server, whole objects by concurrent threads with boto3 (no Zarr,
  no decoding), the floor beside which dgemm's figure on that store is read.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

REGION = "us-east-1"
# moto's server, unless told to check signatures, accepts any credentials; s3fs still signs with these.
DUMMY_KEY = "dgemm-bench"
GET_THREADS = (1, 4, 16)
GET_BYTES = 2**30                # bytes each GET-rate measurement reads at least (all objects if fewer)
PUT_THREADS = (1, 4)
PUT_OBJECTS = 8                  # objects each PUT-rate measurement writes
ZARR_METADATA = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}


# -- the local server ------------------------------------------------------------------
# moto's ThreadedMotoServer in a process of its own: it binds a free port itself (port 0) and is serving once
# start() returns, so the port it prints is ready.  A process, not a thread of the caller: the server's
# request handling (GIL-bound, a CPU-second per GB) must not share a process with the clients it is measured
# against.  It ends when its parent closes its standard input (or dies).
_SERVER = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address=sys.argv[1], port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
"""


def start_moto(log=None, env: dict | None = None, host: str = "127.0.0.1",
               timeout: float = 60) -> tuple[str, subprocess.Popen]:
    """Start moto's S3-compatible server (``moto.server.ThreadedMotoServer``) in a process of its own, on a
    free port of ``host``; its endpoint URL and process.

    Parameters
    ----------
    log : file, optional
        Gets the server's log (opened ``w+``, so a failure can quote it);
        default: discarded.
    env : dict, optional
        The server's environment (default: this process's); moto reads its
        settings (``INITIAL_NO_AUTH_ACTION_COUNT``...) from it.
    timeout : float
        Seconds to wait for the server to start.

    Raises
    ------
    ModuleNotFoundError
        moto's server is not installed (``pip install 'moto[server]'``).
    RuntimeError
        The server did not start; the message quotes its output.
    """
    import importlib.util
    import selectors

    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("moto.server") is None:
        raise ModuleNotFoundError("the local S3 server needs moto's server: pip install 'moto[server]'")
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, host], env=env if env is not None else dict(os.environ),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=log if log is not None else subprocess.DEVNULL, text=True)
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline().strip() if sel.select(timeout) else ""
    if not line.isdigit():
        stop_process(proc)
        tail = ""
        if log is not None and hasattr(log, "seek"):
            log.flush()
            log.seek(0)
            tail = log.read()[-3000:]
        raise RuntimeError(f"moto's server did not start on {host} within {timeout:g} s: {line} {tail}".strip())
    return f"http://{host}:{line}", proc


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Terminate ``proc`` (kill it if it does not end within ``timeout``) and reap it."""
    if proc.poll() is not None:
        return
    for stream in (proc.stdin, proc.stdout):   # moto's: closing its input ends it too
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class LocalS3:
    """A moto server for one benchmark run: started on entry, stopped (objects and all) on exit.

    Signatures are not checked (any key is accepted); :attr:`storage_options`
    carry the endpoint and a dummy key, as a user's options would carry a
    real one.  Buckets are created with :meth:`make_bucket`.
    """

    def __init__(self, log_path=None):
        self.log_path = log_path
        self.endpoint: str | None = None
        self.proc: subprocess.Popen | None = None
        self._log = None

    def __enter__(self):
        self._log = open(self.log_path, "w+") if self.log_path else None
        # no AWS_* variables: the server needs none, and a profile of the user's must not change its answers
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        try:
            self.endpoint, self.proc = start_moto(self._log, env)
        except BaseException:
            if self._log is not None:
                self._log.close()
            raise
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            stop_process(self.proc)
        if self._log is not None:
            self._log.close()
        return False

    @property
    def storage_options(self) -> dict:
        """What s3fs needs to reach the server: endpoint, a dummy key, the region."""
        return s3_options(self.endpoint, key=DUMMY_KEY, secret=DUMMY_KEY)

    def make_bucket(self, bucket: str) -> None:
        """Create ``bucket`` on the server (nothing if it exists)."""
        client = boto3_client(self.storage_options)
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)

    def describe(self) -> dict:
        """The server, for the record."""
        import importlib.metadata as md

        version = None
        with contextlib.suppress(Exception):
            version = md.version("moto")
        return {"server": "moto (ThreadedMotoServer, a process of its own)", "endpoint": self.endpoint,
                "moto": version, "pid": self.proc.pid if self.proc else None}


def s3_options(endpoint: str | None, key: str | None = None, secret: str | None = None) -> dict:
    """s3fs ``storage_options`` for an endpoint: signed requests (``anon=False``), the key if given.

    Without a key, s3fs takes the credentials from the environment (``AWS_*``,
    a profile), as for any S3 server.

    >>> s3_options("http://127.0.0.1:9000", "k", "s")["client_kwargs"]
    {'region_name': 'us-east-1'}
    >>> sorted(s3_options("http://h:1"))
    ['anon', 'client_kwargs', 'endpoint_url']
    """
    opts: dict = {"anon": False, "client_kwargs": {"region_name": os.environ.get("AWS_REGION", REGION)}}
    if endpoint:
        opts["endpoint_url"] = endpoint
    if key is not None:
        opts.update(key=key, secret=secret)
    return opts


def boto3_client(storage_options: dict | None, max_pool: int = 10):
    """A boto3 S3 client reaching what the s3fs ``storage_options`` reach (endpoint, key, region)."""
    import boto3
    from botocore.config import Config

    so = storage_options or {}
    kwargs = {"endpoint_url": so.get("endpoint_url"),
              "region_name": (so.get("client_kwargs") or {}).get("region_name", REGION),
              "config": Config(max_pool_connections=max_pool, retries={"max_attempts": 3})}
    if so.get("key") is not None:
        kwargs.update(aws_access_key_id=so["key"], aws_secret_access_key=so.get("secret"))
    return boto3.client("s3", **{k: v for k, v in kwargs.items() if v is not None})


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → ``("bucket", "some/prefix")``.

    >>> split_url("s3://b/x/y/"), split_url("s3://b")
    (('b', 'x/y'), ('b', ''))
    """
    if not url.startswith("s3://"):
        raise ValueError(f"not an s3:// URL: {url!r}")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket (s3://BUCKET/PREFIX)")
    return bucket, prefix.strip("/")


# -- the bench's folder -------------------------------------------------------------------------
@dataclass(frozen=True)
class Location:
    """A folder of Zarr arrays: a local folder, or an S3 prefix with the ``storage_options`` that reach it.

    ``location / "a.zarr"`` is the array's path (a string); :meth:`remove`
    and :meth:`nbytes` work on such paths in both kinds.

    >>> str(Location("/tmp/x") / "a.zarr"), Location("s3://b/p/") / "a.zarr"
    ('/tmp/x/a.zarr', 's3://b/p/a.zarr')
    """

    root: str
    storage_options: dict | None = field(default=None, compare=False)

    @property
    def remote(self) -> bool:
        return "://" in self.root and not self.root.startswith("file://")

    def __truediv__(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def __fspath__(self) -> str:
        return self.root

    def __str__(self) -> str:
        return self.root

    def fs(self):
        """The fsspec filesystem of a remote location (listings not cached)."""
        import fsspec

        fs = fsspec.filesystem(self.root.split("://", 1)[0], **(self.storage_options or {}))
        fs.invalidate_cache()
        return fs

    def remove(self, path) -> None:
        """Remove the array or folder at ``path`` (inside this location); nothing if it is not there."""
        path = os.fspath(path)
        if not path.startswith(self.root.rstrip("/")):
            raise ValueError(f"{path!r} is not inside {self.root!r}: not removed")
        if not self.remote:
            shutil.rmtree(path, ignore_errors=True)
            return
        fs = self.fs()
        with contextlib.suppress(FileNotFoundError):
            if fs.find(path):
                fs.rm(path, recursive=True)

    def nbytes(self, path) -> int | None:
        """Bytes stored under ``path`` (files of a folder, objects under a prefix); None if unreadable."""
        path = os.fspath(path)
        if not self.remote:
            if not os.path.isdir(path):
                return None
            total = 0
            for root, _, files in os.walk(path):
                for f in files:
                    with contextlib.suppress(OSError):
                        total += os.path.getsize(os.path.join(root, f))
            return total
        try:
            return int(sum(self.fs().du(path, total=False).values()))
        except Exception:
            return None

    def chunk_objects(self, path) -> list[tuple[str, int]]:
        """``(url, bytes)`` of every object under ``path`` but Zarr's metadata: its chunks (or shards)."""
        fs = self.fs()
        scheme = self.root.split("://", 1)[0]
        found = fs.find(os.fspath(path), detail=True)
        return [(f"{scheme}://{name}", int(info["size"])) for name, info in sorted(found.items())
                if name.rsplit("/", 1)[-1] not in ZARR_METADATA]

    def upload(self, local_folder, path) -> dict:
        """Copy the local folder ``local_folder`` (a Zarr array) to ``path``, every file concurrently."""
        local_folder = os.fspath(local_folder)
        lpaths, rpaths = [], []
        for root, _, files in os.walk(local_folder):
            for f in files:
                lp = os.path.join(root, f)
                lpaths.append(lp)
                rpaths.append(f"{os.fspath(path).rstrip('/')}/{os.path.relpath(lp, local_folder)}")
        t0 = time.perf_counter()
        self.fs().put(lpaths, rpaths)
        seconds = time.perf_counter() - t0
        nbytes = sum(os.path.getsize(p) for p in lpaths)
        return {"objects": len(lpaths), "bytes": nbytes, "seconds": seconds,
                "gbps": nbytes / seconds / 1e9 if seconds > 0 else None}


def is_remote(path) -> bool:
    """Not on this host's filesystem (:func:`dgemm.storage.locations.local_path`)."""
    from dgemm.storage.locations import local_path

    return local_path(os.fspath(path)) is None


def stored_bytes(path, storage_options: dict | None = None) -> int | None:
    """Bytes stored under ``path`` (a local folder's files, or an S3 prefix's objects); None if unreadable."""
    path = os.fspath(path)
    return Location(path, storage_options).nbytes(path)


def remove_array(path, storage_options: dict | None = None) -> None:
    """Remove the array at ``path`` (a local folder or an S3 prefix); nothing if it is not there."""
    path = os.fspath(path)
    Location(path, storage_options).remove(path)


def open_zarr(path, storage_options: dict | None = None, mode: str = "r"):
    """A local path, or a URL with its ``storage_options``, opened (:func:`dgemm.storage.locations.open_array`)."""
    from dgemm.storage.locations import open_array

    return open_array(os.fspath(path), mode=mode, storage_options=storage_options)


def new_location(store, storage_options: dict | None = None) -> Location:
    """A new ``dgemm-e2e-*`` folder inside ``store`` (a local folder, made if missing, or an S3 prefix)."""
    import tempfile

    store = os.fspath(store) if store is not None else None
    if store and "://" in store:
        return Location(f"{store.rstrip('/')}/dgemm-e2e-{uuid.uuid4().hex[:8]}", storage_options)
    if store:
        os.makedirs(store, exist_ok=True)
    return Location(os.path.abspath(tempfile.mkdtemp(prefix="dgemm-e2e-", dir=store)))


# -- the server's own rates ---------------------------------------------------------------------
def _gbps(nbytes: int, seconds: float) -> float | None:
    return nbytes / seconds / 1e9 if seconds > 0 else None


def object_get_rate(objects: list[tuple[str, int]], storage_options: dict | None, threads=GET_THREADS,
                    min_bytes: int = GET_BYTES) -> dict:
    """GB/s of whole-object GETs of ``objects`` (``(url, bytes)``) by 1, 4, 16... concurrent threads.

    Each thread count reads the first objects of the list (each once) until
    ``min_bytes`` and at least two objects per thread are read, or all of
    them; one boto3 client, its connection pool as large as the threads.
    The bodies are read and dropped: no Zarr, no decoding, no copy into an
    array.  A first, untimed GET opens a connection.
    """
    if not objects:
        raise ValueError("no objects to read")
    threads = tuple(threads)
    client = boto3_client(storage_options, max_pool=max(threads))

    def get(url_size):
        bucket, key = split_url(url_size[0])
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        n = 0
        while True:
            piece = body.read(8 * 2**20)
            if not piece:
                return n
            n += len(piece)

    get(min(objects, key=lambda o: o[1]))
    rates, counts = {}, {}
    for t in threads:
        todo, nbytes = [], 0
        for obj in objects:
            if nbytes >= min_bytes and len(todo) >= 2 * t:
                break
            todo.append(obj)
            nbytes += obj[1]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(t) as pool:
            got = sum(pool.map(get, todo))
        seconds = time.perf_counter() - t0
        if got != nbytes:
            raise RuntimeError(f"GET read {got} bytes of {nbytes} listed")
        rates[str(t)] = _gbps(got, seconds)
        counts[str(t)] = {"objects": len(todo), "bytes": got, "seconds": seconds}
    return {"gbps": rates, "reads": counts, "method": "boto3 get_object, whole objects, one client, threads",
            "object_bytes": {"min": min(o[1] for o in objects), "max": max(o[1] for o in objects)},
            "best_gbps": max((v for v in rates.values() if v), default=None)}


def object_put_rate(prefix: str, object_bytes: int, storage_options: dict | None, threads=PUT_THREADS,
                    count: int = PUT_OBJECTS) -> dict:
    """GB/s of whole-object PUTs of ``count`` objects of ``object_bytes`` under ``prefix`` (removed after)."""
    client = boto3_client(storage_options, max_pool=max(threads))
    bucket, key0 = split_url(prefix)
    body = os.urandom(min(object_bytes, 2**20)) * max(1, object_bytes // 2**20)
    body = body[:object_bytes] if len(body) >= object_bytes else body + bytes(object_bytes - len(body))
    rates = {}
    written = []
    try:
        for t in threads:
            keys = [f"{key0.rstrip('/')}/put-rate-{t}/{i}" for i in range(count)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(t) as pool:
                list(pool.map(lambda key: client.put_object(Bucket=bucket, Key=key, Body=body), keys))
            rates[str(t)] = _gbps(len(body) * count, time.perf_counter() - t0)
            written += keys
    finally:
        for key in written:
            with contextlib.suppress(Exception):
                client.delete_object(Bucket=bucket, Key=key)
    return {"gbps": rates, "object_bytes": len(body), "objects": count,
            "method": "boto3 put_object, whole objects, one client, threads",
            "best_gbps": max((v for v in rates.values() if v), default=None)}

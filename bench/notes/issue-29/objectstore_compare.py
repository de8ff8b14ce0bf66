"""obstore against dgemm's S3 client (dgemm/storage/remote.py) on the same GETs and PUTs (issue 29).

remote.py was a hand-written botocore client when this was first run; since then it sends its requests
through obstore's sync calls, and the remote-* rows measure what it adds (the zarr store's s3fs settings
mapped, its thread pool, its errors).  The botocore client's rows come from running this script from a
git worktree of the commit before 2100a09 (that tree first on the Python path, its own copy of this
script); the record names remote.py's implementation.

    python bench/notes/issue-29/objectstore_compare.py [--sizes 64,1] [--concurrency 1,8,32] [--rounds 2]

Starts moto's S3 server (dgemm.benchmarks.objectstore.start_moto: a process of its own on 127.0.0.1, signatures
unchecked), or uses --endpoint, writes whole objects of each size (MiB) and reads them back, at each concurrency:

  remote-threads   N threads, each calling remote.get_many / put_many with one request per call
  remote-batch     one thread, calls of N requests (remote.py fans each call out over its own thread pool)
  obstore-threads  N threads, each calling obstore.get(...).bytes() / obstore.put(...) (sync, Rust inside)
  obstore-async    one asyncio loop, N requests in flight (obstore.get_async / put_async, as zarr's ObjectStore)

PUTs through obstore go as one request (use_multipart=False, as remote.py does); --obstore-multipart adds
obstore's default (a multipart upload above 5 MiB, which is what zarr's ObjectStore.set does for a large chunk).
Each measurement moves --requests-mib MiB (at least one request per thread) after one warm-up call, over
--rounds rounds; the best round's GB/s is kept with this process's CPU seconds per GB and the server's.
Every GET's bytes are checked against what was written. Needs obstore (pip install obstore; not a dgemm
dependency), s3fs, zarr and moto[server]. Prints one JSON line per measurement, and writes the whole record
(cpus, date, commit, command, results) to --out (default bench/results/<date>-<host>-obstore-vs-remote.json).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REGION = "us-east-1"
KEY = "bench"          # moto without signature checks takes any key; both clients sign with this one
ROOT = Path(__file__).resolve().parents[3]


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of this process (or of process ``pid``, from /proc)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    import psutil
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def payload(nbytes: int, i: int) -> bytes:
    """Distinct, incompressible bytes per object (a hash chain would be slow: a counter-seeded generator)."""
    import numpy as np
    return np.random.default_rng(i).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


class Remote:
    """dgemm.storage.remote through a zarr FsspecStore over s3fs, as a worker reaches an S3 output."""

    def __init__(self, endpoint: str, bucket: str, prefix: str):
        from zarr.storage import FsspecStore

        from dgemm.storage import remote
        self.remote = remote
        options = {"key": KEY, "secret": KEY, "endpoint_url": endpoint, "client_kwargs": {"region_name": REGION}}
        self.store = FsspecStore.from_url(f"s3://{bucket}/{prefix}", storage_options=options, read_only=False)
        assert remote.handles(self.store), "remote.py does not take this store"

    def get(self, keys: list[str]) -> list[bytes]:
        return self.remote.get_many(self.store, [(k, None) for k in keys])

    def put(self, items: list[tuple[str, bytes]]) -> None:
        assert self.remote.put_many(self.store, items)


class Obstore:
    """obstore's S3Store on the same bucket and prefix."""

    def __init__(self, endpoint: str, bucket: str, prefix: str, multipart: bool):
        import obstore
        from obstore.store import S3Store
        self.obs, self.multipart = obstore, multipart
        self.store = S3Store(bucket, prefix=prefix, endpoint=endpoint, region=REGION, access_key_id=KEY,
                             secret_access_key=KEY, virtual_hosted_style_request=False,
                             client_options={"allow_http": True, "timeout": "300s"})

    def get(self, keys: list[str]) -> list:
        # obstore's Bytes (a buffer, as zarr's ObjectStore wraps it): no copy into a Python bytes
        return [self.obs.get(self.store, k).bytes() for k in keys]

    def put(self, items: list[tuple[str, bytes]]) -> None:
        for k, v in items:
            self.obs.put(self.store, k, v, use_multipart=None if self.multipart else False)

    async def get_async(self, key: str):
        return await (await self.obs.get_async(self.store, key)).bytes_async()   # as zarr's ObjectStore.get

    async def put_async(self, key: str, value: bytes) -> None:
        await self.obs.put_async(self.store, key, value, use_multipart=None if self.multipart else False)


def threaded(fn, jobs: list, threads: int) -> list:
    """Run ``fn(job)`` for every job on ``threads`` threads, each taking the next job as it finishes one."""
    out, lock, it = [None] * len(jobs), threading.Lock(), iter(range(len(jobs)))

    def worker():
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            out[i] = fn(jobs[i])
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def in_flight(make, jobs: list, n: int) -> list:
    """``await make(job)`` for every job on one event loop, ``n`` at a time."""
    async def main():
        sem = asyncio.Semaphore(n)

        async def one(job):
            async with sem:
                return await make(job)
        return await asyncio.gather(*(one(j) for j in jobs))
    return asyncio.run(main())


def run_op(client: str, op: str, c: int, remote: Remote, obs: Obstore, keys: list[str], data: dict):
    """One measurement's requests: GET ``keys`` (returns their bytes) or PUT them."""
    if op == "get":
        if client == "remote-threads":
            return threaded(lambda k: remote.get([k])[0], keys, c)
        if client == "remote-batch":
            return [b for i in range(0, len(keys), c) for b in remote.get(keys[i:i + c])]
        if client.startswith("obstore-threads"):
            return threaded(lambda k: obs.get([k])[0], keys, c)
        return in_flight(obs.get_async, keys, c)
    items = [(k, data[k]) for k in keys]
    if client == "remote-threads":
        threaded(lambda kv: remote.put([kv]), items, c)
    elif client == "remote-batch":
        for i in range(0, len(items), c):
            remote.put(items[i:i + c])
    elif client.startswith("obstore-threads"):
        threaded(lambda kv: obs.put([kv]), items, c)
    else:
        in_flight(lambda kv: obs.put_async(*kv), items, c)
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="\n".join(__doc__.splitlines()[2:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="64,1", help="object sizes, MiB, comma-separated (default 64,1)")
    p.add_argument("--concurrency", default="1,8,32", help="requests in flight, comma-separated (default 1,8,32)")
    p.add_argument("--requests-mib", type=int, default=1024,
                   help="MiB each measurement moves (at least one request per thread; default 1024)")
    p.add_argument("--objects-mib", type=int, default=1024, help="MiB of distinct objects per size (default 1024)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every measurement; the best kept (default 2)")
    p.add_argument("--clients", default="remote-threads,remote-batch,obstore-threads,obstore-async",
                   help="which clients, comma-separated")
    p.add_argument("--ops", default="get,put", help="get, put or both (default get,put)")
    p.add_argument("--obstore-multipart", action="store_true",
                   help="also obstore's default PUT (multipart above 5 MiB, as zarr's ObjectStore.set)")
    p.add_argument("--endpoint", help="an S3 endpoint to use (its server CPU is then not measured); "
                                      "default: start moto's server here")
    p.add_argument("--bucket", default=None, help="bucket (created; default a fresh name)")
    p.add_argument("--out", type=Path, default=None,
                   help="the JSON record (default bench/results/<date>-<host>-obstore-vs-remote.json)")
    args = p.parse_args(argv)

    import boto3

    from dgemm.benchmarks.objectstore import start_moto, stop_process

    proc = None
    endpoint = args.endpoint
    if endpoint is None:
        endpoint, proc = start_moto()
    bucket = args.bucket or f"bench-{uuid.uuid4().hex[:8]}"
    results = []
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=KEY,
                     aws_secret_access_key=KEY).create_bucket(Bucket=bucket)
        remote = Remote(endpoint, bucket, "objects")
        clients = args.clients.split(",")
        if args.obstore_multipart:
            clients += [c + "-multipart" for c in clients if c.startswith("obstore")]
        for mib in (int(s) for s in args.sizes.split(",")):
            nbytes = mib * 2**20
            nobj = max(1, args.objects_mib // mib)
            names = [f"{mib}mib/{i}" for i in range(nobj)]
            data = {k: payload(nbytes, i) for i, k in enumerate(names)}
            digest = {k: hashlib.blake2b(v, digest_size=16).digest() for k, v in data.items()}
            remote.put(list(data.items()))          # the objects every GET reads
            for op in args.ops.split(","):
                for c in (int(s) for s in args.concurrency.split(",")):
                    n = max(c, args.requests_mib // mib)
                    keys = [names[i % nobj] for i in range(n)]
                    for client in clients:
                        if op == "get" and client.endswith("-multipart"):
                            continue              # the same GETs
                        obs = Obstore(endpoint, bucket, "objects", multipart=client.endswith("-multipart"))
                        run_op(client, op, c, remote, obs, keys[:c], data)    # warm: connections, threads
                        best = None
                        for _ in range(args.rounds):
                            cpu0, srv0 = cpu_seconds(), cpu_seconds(proc.pid) if proc else 0.0
                            t0 = time.perf_counter()
                            got = run_op(client, op, c, remote, obs, keys, data)
                            wall = time.perf_counter() - t0
                            cpu, srv = cpu_seconds() - cpu0, (cpu_seconds(proc.pid) - srv0) if proc else None
                            if got is not None:
                                bad = [k for k, b in zip(keys, got)
                                       if hashlib.blake2b(b, digest_size=16).digest() != digest[k]]
                                assert not bad, f"{client} read wrong bytes for {bad[:3]}"
                            gb = n * nbytes / 1e9
                            row = {"op": op, "client": client, "object_mib": mib, "concurrency": c, "requests": n,
                                   "seconds": round(wall, 3), "gb_per_s": round(gb / wall, 3),
                                   "client_cpu_s_per_gb": round(cpu / gb, 3),
                                   "server_cpu_s_per_gb": round(srv / gb, 3) if srv is not None else None}
                            if best is None or row["gb_per_s"] > best["gb_per_s"]:
                                best = row
                        print(json.dumps(best), flush=True)
                        results.append(best)
            del data
    finally:
        if proc is not None:
            stop_process(proc)

    import obstore
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    now = datetime.datetime.now(datetime.timezone.utc)
    host = socket.gethostname()
    record = {"benchmark": "obstore vs dgemm.storage.remote, whole-object GETs and PUTs on moto",
              "date": now.isoformat(timespec="seconds"), "host": host, "cpus": os.cpu_count(),
              "cpu": platform.processor() or platform.machine(), "commit": commit, "commit_dirty": dirty,
              "command": " ".join([Path(sys.argv[0]).as_posix().split(str(ROOT) + "/")[-1], *sys.argv[1:]]),
              "python": platform.python_version(), "obstore": obstore.__version__,
              "server": "moto (ThreadedMotoServer, own process, same host)" if proc else endpoint,
              "remote_py": "obstore" if "obstore" in (remote.remote.__doc__ or "").split("\n")[0]
              else "botocore", "rounds": args.rounds, "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
              "results": results}
    out = args.out or ROOT / "bench" / "results" / f"{now:%Y-%m-%d}-{host}-obstore-vs-remote.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The output's lease on S3, taken and kept by conditional writes: of two writers, the server lets one win.

The lease (:mod:`dgemm.storage.lease`) is read, judged, then written.  On
S3 the write carries ``If-None-Match: *`` (there was no lease) or
``If-Match: <etag>`` (there was one: stale, or this call's own), so a
writer whose read is out of date writes nothing.  Each race here is forced
in the window between the read and the write, on a real moto server (the
``s3`` fixture, signatures checked): both writers read before either
writes, or another run takes the lease over right after this run read it.
The last test runs against a moto server that refuses the conditions as
S3 did before August 2024 (``501 NotImplemented``): the lease is then a
read and a write, as on any other store.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
import zarr

from dgemm.benchmarks.objectstore import REGION, stop_process
from dgemm.errors import OutputBusyError, OutputTakenOverError
from dgemm.storage import keys, lease, remote

SHORT = 0.05   # a lease interval: stale after lease.EXPIRY of them


def output(options: dict, url: str):
    arr = zarr.create_array(url, shape=(8, 8), chunks=(4, 4), dtype="float64", storage_options=options)
    arr[...] = 1.5
    return zarr.open_array(url, mode="r+", storage_options=options)


def stale_lease_of(array) -> lease.Holder:
    """A lease of a writer that died: written, never renewed, now past its expiry."""
    dead = lease.Lease(array, "dead-owner", "out", interval=SHORT)
    dead.acquire()
    time.sleep(lease.EXPIRY * SHORT * 2)
    held = lease.current(array)
    assert held is not None and held.id == dead.id and not held.fresh()
    return held


class ReadThen:
    """Patches the lease's tagged read so that ``then()`` runs right after the first read by thread ``who``."""

    def __init__(self, monkeypatch, then, who: str | None = None):
        self.real, self.then, self.who, self.done = lease._read_tagged, then, who, False
        monkeypatch.setattr(lease, "_read_tagged", self)

    def __call__(self, cond, key):
        got = self.real(cond, key)
        if not self.done and self.who in (None, threading.current_thread().name):
            self.done = True
            self.then()
        return got


@pytest.mark.parametrize("found", ["no_lease", "stale_lease"])
@pytest.mark.parametrize("how", ["claim", "acquire"])
def test_two_writers_that_read_the_same_lease_one_holds_the_output_the_other_is_refused(s3, monkeypatch, found,
                                                                                         how):
    """Both read (no lease, or the same stale one) before either writes: the server lets only the first write."""
    arr = output(s3.storage_options, s3.url(f"lease-race-{uuid.uuid4().hex[:8]}/c.zarr"))
    dead = stale_lease_of(arr) if found == "stale_lease" else None
    writers = {name: lease.Lease(arr, f"owner-{name}", "out") for name in ("first", "second")}
    assert all(w._cond is not None and w._cond.atomic for w in writers.values())

    # each writer's first read waits for the other's: both judge the same lease before either writes; then
    # the first writes, and only then the second
    both_read = threading.Barrier(2, timeout=60)
    first_wrote = threading.Event()
    real_read, real_put = lease._read_tagged, remote.Conditional.put
    looked = set()

    def read(cond, key):
        got = real_read(cond, key)
        me = threading.current_thread().name
        if me not in looked:
            looked.add(me)
            assert (got[0].id if got[0] else None) == (dead.id if dead else None)
            both_read.wait()
        return got

    def put(self, key, data, match):
        me = threading.current_thread().name
        if me == "second":
            assert first_wrote.wait(60)
        try:
            return real_put(self, key, data, match)
        finally:
            if me == "first":
                first_wrote.set()

    monkeypatch.setattr(lease, "_read_tagged", read)
    monkeypatch.setattr(remote.Conditional, "put", put)
    outcome = {}

    def write(name):
        try:
            w = writers[name]
            outcome[name] = w.claim(arr) if how == "claim" else w.acquire()
        except BaseException as e:
            outcome[name] = e

    threads = [threading.Thread(target=write, args=(name,), name=name) for name in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not isinstance(outcome["first"], BaseException), outcome
    assert isinstance(outcome["second"], OutputBusyError), outcome
    assert "being written by another dgemm run" in str(outcome["second"])
    if how == "claim":
        assert (outcome["first"].id if outcome["first"] else None) == (dead.id if dead else None)
    held = lease.current(arr)
    assert held.id == writers["first"].id and held.fresh()
    writers["first"].fence().check(0, 0)
    with pytest.raises(OutputTakenOverError):
        writers["second"].fence().check(0, 0)


def test_a_renewal_after_another_run_took_the_lease_over_fails_and_the_run_learns_it(s3, monkeypatch):
    """The run reads its own lease, another run takes it over (stale by then), then the run's renewal is refused."""
    arr = output(s3.storage_options, s3.url(f"lease-renew-{uuid.uuid4().hex[:8]}/c.zarr"))
    mine = lease.Lease(arr, "owner-mine", "out", interval=SHORT)
    mine.acquire()
    time.sleep(lease.EXPIRY * SHORT * 2)   # this run stalled (a long GC pause, a frozen VM): its lease is stale
    other = lease.Lease(arr, "owner-other", "out")
    ReadThen(monkeypatch, lambda: other.claim(arr), who=threading.current_thread().name)

    with pytest.raises(OutputTakenOverError, match="taken over by another run"):
        with mine.kept():
            pytest.fail("the run went on computing on an output another run holds")
    assert mine.lost is not None and mine.lost.id == other.id
    held = lease.current(arr)
    assert held.id == other.id and held.fresh()     # the other run's lease stands
    with pytest.raises(OutputTakenOverError):
        mine.fence().check(0, 0)
    other.fence().check(0, 0)


@pytest.mark.parametrize("step", ["release", "stop"])
def test_a_release_or_stop_after_another_run_took_the_lease_over_leaves_its_lease(s3, monkeypatch, step):
    """Ending a run whose lease another run took over meanwhile must neither delete nor replace the other's."""
    arr = output(s3.storage_options, s3.url(f"lease-end-{uuid.uuid4().hex[:8]}/c.zarr"))
    mine = lease.Lease(arr, "owner-mine", "out", interval=SHORT)
    mine.acquire()
    time.sleep(lease.EXPIRY * SHORT * 2)
    other = lease.Lease(arr, "owner-other", "out")
    ReadThen(monkeypatch, lambda: other.claim(arr), who=threading.current_thread().name)

    getattr(mine, step)()
    held = lease.current(arr)
    assert held is not None and held.id == other.id and held.fresh()
    other.fence().check(0, 0)


# -- a server without conditional writes ----------------------------------------------------------

# moto's server with its PUT and DELETE refusing If-Match / If-None-Match, as S3 did before August 2024.
_REFUSING = """
import sys
from moto.s3.responses import S3Response
from moto.server import ThreadedMotoServer

REFUSED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NotImplemented</Code><Message>A header you '
           b'provided implies functionality that is not implemented</Message></Error>')

def refusing(method):
    def handler(self):
        if self.headers.get("If-Match") or self.headers.get("If-None-Match"):
            return 501, {"Content-Type": "application/xml"}, REFUSED
        return method(self)
    return handler

S3Response.put_object = refusing(S3Response.put_object)
S3Response.delete_object = refusing(S3Response.delete_object)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def refusing_s3():
    """Storage options reaching a bucket of a moto server that refuses conditional writes (501)."""
    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen([sys.executable, "-c", _REFUSING], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = proc.stdout.readline().strip()
        assert port.isdigit(), "the refusing moto server did not start"
        options = {"key": "refusing", "secret": "refusing", "endpoint_url": f"http://127.0.0.1:{port}",
                   "client_kwargs": {"region_name": REGION}}
        bucket = f"dgemm-refusing-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=options["endpoint_url"], region_name=REGION,
                     aws_access_key_id="refusing", aws_secret_access_key="refusing").create_bucket(Bucket=bucket)
        yield options, bucket
    finally:
        stop_process(proc)


def test_a_server_that_refuses_conditional_writes_gets_a_read_then_a_write(refusing_s3):
    """Taken, renewed, checked, stopped and released as on any store; the refusal is remembered, not raised."""
    options, bucket = refusing_s3
    arr = output(options, f"s3://{bucket}/c.zarr")
    mine = lease.Lease(arr, "owner-mine", "out")
    assert mine._cond is not None and mine._cond.atomic
    assert mine.claim(arr) is None
    assert not mine._cond.atomic          # the server said 501: this process writes it unconditionally since
    assert lease.current(arr).id == mine.id
    assert mine.renew()
    with pytest.raises(OutputBusyError):   # the check before the write still refuses a second writer
        lease.Lease(arr, "owner-other", "out").claim(arr)
    mine.fence().check(0, 0)
    mine.stop()
    assert lease.current(arr).stopping
    mine.release()
    assert lease.current(arr) is None and keys.get(arr.store, lease.lease_key(arr)) is None

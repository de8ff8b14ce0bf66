"""Who writes an output: the lease of the live run, and the fence its tasks check.

Each fresh run draws an *owner* token, recorded in the output's ``dgemm``
attribute (its block markers and kept originals are named by it; ``resume``
continues it).  A run that is writing holds a **lease**: a small JSON object
``<array>/.dgemm/lease`` naming the call (a fresh id per call, also for a
resume), its host, process and start time, renewed by the client every
``dgemm.lease-interval`` seconds while it computes.  A lease not renewed for
:data:`EXPIRY` intervals is *stale*: its writer died.

* A second writer (``overwrite=True``, ``resume=True``, an in-place update)
  of an output whose lease is fresh is refused before any work
  (:func:`refuse_if_held`, :class:`OutputBusyError`); a stale lease is taken over.
* Every store task checks that the lease still names its call before it
  writes its block and again before it marks it (:class:`Fence`); the task
  of a run whose lease is gone or another's writes nothing more and fails
  (:class:`OutputTakenOverError`).  An interrupted run deletes its lease
  first, so its tasks still in flight stop at their next check.

On S3 (an output :mod:`dgemm.storage.remote` reaches), the lease is read
with its ETag and written only if unchanged since, by S3's conditional
writes: ``If-None-Match: *`` where there was none, ``If-Match: <etag>``
where there was one (a stale lease taken over, this call's own renewed or
stopped), and deleted with ``If-Match``.  Of two writers that both found
no lease (or the same stale one), the server lets one write; the other
reads again, finds the winner's fresh lease and is refused; a renewal (or
a stop, a release) after another call took the lease over writes nothing
and the run learns it lost the output.  Where the server refuses the
conditions (``501 NotImplemented``: some S3-compatible servers, S3 before
it added them in 2024) or ignores them, and on other object stores, the
lease is a read, then a write: two writers starting within the same round
trip can both pass the check, and the loser's tasks then fail at their
first check (a local output's lease is created exclusively where it
replaces an output, :meth:`Lease.claim`).  The lease makes the common
cases safe everywhere: a run started while another is writing, a
restart after Ctrl-C, a crashed writer.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from dgemm import config
from dgemm.errors import OutputBusyError, OutputTakenOverError
from dgemm.storage import keys, remote

EXPIRY = 3   # intervals without a renewal after which a lease is stale
_TAKES = 5   # conditional writes a call tries while other calls keep changing the lease (each is re-read)


def lease_key(array) -> str:
    return f"{keys.root(array)}/lease"


# The prefix of a stopped call's lease id: held while its running tasks drain, named by no fence.
STOPPING = "stopping-"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@dataclass(frozen=True)
class Holder:
    """A lease as stored: which call holds the output, from where, until when."""

    id: str                        # the call
    owner: str                     # the output's owner token (kept by resume)
    host: str
    pid: int
    started: float                 # time.time() of the call's start
    renewed: float
    expires: float
    scheduler: str | None = None   # the cluster its tasks run on, once computing
    token: str | None = None       # the call's graph token: its task keys contain it

    @property
    def stopping(self) -> bool:
        """Whether the call was stopped and holds the output only until its running tasks are done."""
        return self.id.startswith(STOPPING)

    def fresh(self, now: float | None = None) -> bool:
        """Whether its writer renewed it lately (a lease without an expiry is stale)."""
        return isinstance(self.expires, (int, float)) and (time.time() if now is None else now) < self.expires

    def describe(self) -> str:
        where = f", tasks on {self.scheduler}" if self.scheduler else ""
        return f"process {self.pid} on {self.host}, started {_when(self.started)}{where}"

    def dumps(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def loads(cls, raw: bytes) -> Holder:
        d = json.loads(raw)
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


def read(store, key: str) -> Holder | None:
    """The lease at ``key``, None when there is none.

    A store whose writes are not atomic may show a lease half written:
    read again a few times before calling it unreadable.
    """
    for attempt in range(5):
        raw = keys.get(store, key)
        if raw is None:
            return None
        try:
            return Holder.loads(raw)
        except (ValueError, TypeError):
            time.sleep(0.05 * (attempt + 1))
    raise OSError(f"dgemm: the lease {key!r} of out cannot be read (not a dgemm lease); remove it to go on")


def _read_tagged(cond, key: str) -> tuple[Holder | None, str | None]:
    """The lease at ``key`` with its ETag, through S3 (whose writes are atomic); (None, None) when there is none."""
    got = cond.get(key)
    if got is None:
        return None, None
    try:
        return Holder.loads(got[0]), got[1]
    except (ValueError, TypeError):
        raise OSError(f"dgemm: the lease {key!r} of out cannot be read (not a dgemm lease); remove it to go on")


def current(array) -> Holder | None:
    """The lease of ``array`` (an existing output), None when no run holds it."""
    return read(array.store, lease_key(array))


def refuse_if_held(array, where: str, mine: str | None = None) -> Holder | None:
    """Refuse a second writer of ``array`` while a live run holds it; return a stale lease to take over.

    ``mine`` is the id of a lease this call holds itself (not refused).

    Raises
    ------
    OutputBusyError
        A fresh lease of another call: the message names it and says how to go on.
    """
    return _judge(current(array), where, mine)


def _judge(held: Holder | None, where: str, mine: str | None = None) -> Holder | None:
    """:func:`refuse_if_held` for the lease ``held`` as read: a stale one to take over, or None; raises if live."""
    if held is None or held.id == mine:
        return None
    if held.id in _GIVEN_UP and held.pid == os.getpid() and held.host == socket.gethostname():
        # a run of this very process that failed and could not delete its lease (a full disk): not another
        # writer, but a dead one, taken over as a stale lease is (its tasks drained first)
        return held
    if held.fresh() and held.stopping:
        raise OutputBusyError(
            f"out {where} is held by a dgemm run that was stopped ({held.describe()}) while the last of its "
            f"tasks finish writing; try again in a few seconds (at the latest at {_when(held.expires)}, when "
            f"its lease expires)")
    if held.fresh():
        raise OutputBusyError(
            f"out {where} is being written by another dgemm run ({held.describe()}; its lease was renewed "
            f"{_when(held.renewed)}); two runs must not write one output. Wait for it to finish (then "
            f"open_result, or resume=True if it failed), or stop it (Ctrl-C in its session cancels its tasks). "
            f"If it is no longer running, its lease expires at {_when(held.expires)} and this call will then "
            f"take over; or write the result somewhere else")
    return held


# Ids of the leases that runs of this process gave up but could not stop or delete (the store refused the
# write or the delete: a full disk).  Such a lease stays fresh until it expires, but it names no live run:
# refuse_if_held lets this process take it over at once.  Another process still sees a live writer.
_GIVEN_UP: set[str] = set()


@dataclass(frozen=True)
class Fence:
    """What a store task checks: the output's lease still names its call (picklable, tiny)."""

    store: object
    key: str
    id: str
    where: str

    def check(self, i: int, j: int, stored: bool = False) -> None:
        """Raise :class:`OutputTakenOverError` unless this call still holds the lease."""
        held = read(self.store, self.key)
        if held is not None and held.id == self.id:
            return
        if held is None:
            who = "its lease was released: the run was cancelled"
        elif held.stopping:
            who = "its run was stopped"
        else:
            who = f"now {held.describe()}"
        done = "stored but did not mark it" if stored else "wrote nothing"
        raise OutputTakenOverError(f"dgemm: out {self.where} was taken over by another run ({who}); this run's "
                                   f"task for block ({i}, {j}) {done}, and its other tasks write nothing more")


class Lease:
    """The lease this call holds on its output (client side): acquired, renewed while computing, released.

    A call's :class:`~dgemm.storage.output_run.OutputRun` holds it.

    ``interval`` defaults to the ``dgemm.lease-interval`` setting.
    """

    def __init__(self, array, owner: str, where: str, interval: float | None = None):
        store = array.store
        if store.read_only:   # an output opened to look at (before it is replaced): the lease is written
            store = store.with_read_only(False)
        self.store, self.key, self.owner, self.where = store, lease_key(array), owner, where
        self.id = uuid.uuid4().hex
        self.interval = float(interval or config.get("lease-interval"))
        self.started = time.time()
        self.scheduler: str | None = None
        self.token: str | None = None
        self.lost: Holder | None = None     # who took it, when a renewal found the lease another's
        self._lock = threading.Lock()
        # S3's conditional writes where the store is one remote.py reaches (else None: a read, then a write)
        self._cond = remote.conditional(store)

    def _record(self) -> Holder:
        now = time.time()
        return Holder(self.id, self.owner, socket.gethostname(), os.getpid(), self.started, now,
                      now + EXPIRY * self.interval, self.scheduler, self.token)

    def acquire(self) -> None:
        """Write the lease (the caller has checked that no live run holds the output).

        On S3, written only if it is still as checked (none, or a stale one).

        Raises
        ------
        OutputBusyError
            Another live call took the lease since the check (S3 only).
        """
        if self._cond is not None:
            self._take()
            return
        keys.put(self.store, self.key, self._record().dumps())

    def _take(self) -> Holder | None:
        """Write this call's lease where there is none or a stale one, conditionally; the stale one taken over.

        Read, judged (:func:`refuse_if_held`), then written only if unchanged
        since: a call that loses the race reads the winner's lease and is refused.
        """
        for _ in range(_TAKES):
            held, tag = _read_tagged(self._cond, self.key)
            stale = _judge(held, self.where, self.id)
            if self._write(tag)[0]:
                return stale
        raise OutputBusyError(f"out {self.where}: its lease changed {_TAKES} times while this call tried to take "
                              "it: other dgemm runs are starting to write it; try again")

    def _write(self, tag: str | None) -> tuple[bool, Holder | None]:
        """Write this call's record if the lease is still the one read (ETag ``tag``; None: no lease).

        Returns whether this call holds it now and, when not, whose it is.
        """
        if self._cond.put(self.key, self._record().dumps(), tag) is not None:
            return True, None
        held, _ = _read_tagged(self._cond, self.key)
        # only this call writes its id: a PUT retried after its reply was lost finds its own write
        return (held is not None and held.id == self.id), held

    def claim(self, array) -> Holder | None:
        """Take the lease of an existing output before anything of it is deleted; returns a stale one taken over.

        Written only if there is none (exclusively where the store can), so
        of two calls replacing one output at once, one holds it and the other
        is refused, however long deleting the old output takes.

        Raises
        ------
        OutputBusyError
            Another live call holds it.
        """
        if self._cond is not None:
            return self._take()
        if keys.put_new(self.store, self.key, self._record().dumps()):
            return None
        stale = refuse_if_held(array, self.where, mine=self.id)
        self.acquire()
        return stale

    def renew(self) -> bool:
        """Extend the lease; False (and :attr:`lost` set) when another call holds it now."""
        with self._lock:
            if self._cond is not None:
                held, tag = _read_tagged(self._cond, self.key)
            else:
                held, tag = read(self.store, self.key), None
            if held is None or held.id != self.id:
                self.lost = held
                return False
            if self._cond is None:
                keys.put(self.store, self.key, self._record().dumps())
                return True
            ok, now = self._write(tag)     # refused if another call took it since the read
            if not ok:
                self.lost = now
            return ok

    def release(self) -> None:
        """Delete the lease if it is still this call's: in-flight tasks fail their next check; others may write."""
        with self._lock:
            if self._cond is not None:
                held, tag = _read_tagged(self._cond, self.key)
                if held is not None and held.id == self.id:
                    self._cond.delete(self.key, tag)   # kept if another call took it since the read
                return
            held = read(self.store, self.key)
            if held is not None and held.id == self.id:
                keys.delete(self.store, self.key)

    def stop(self) -> None:
        """Fence this call's tasks off, but keep other writers out until :meth:`release` (they drain meanwhile).

        The lease passes to a new id that no task's fence names, so every
        task still to check fails; a second writer is refused until the
        caller releases it (or it expires, if the caller dies too).  Where
        the new lease cannot be written (the write raises), the lease keeps
        its id, so :meth:`release` can still delete it.
        """
        with self._lock:
            if self._cond is not None:
                held, tag = _read_tagged(self._cond, self.key)
            else:
                held, tag = read(self.store, self.key), None
            if held is None or held.id != self.id:
                return
            mine = self.id
            self.id = STOPPING + mine
            try:
                if self._cond is None:
                    keys.put(self.store, self.key, self._record().dumps())
                elif not self._write(tag)[0]:
                    self.id = mine     # another call took it since the read: nothing of this call's to stop
            except BaseException:
                self.id = mine
                raise

    def give_up(self) -> None:
        """Release the lease of a run that ended; where even that fails, let this process take it over at once.

        A store that refuses writes (a full disk, ``ENOSPC``) may refuse the
        delete too; the lease then stays until it expires, so the run is
        recorded here as given up (:func:`refuse_if_held`): a ``resume=True``
        of this process goes on at once, while other processes still wait.
        """
        try:
            self.release()
        except Exception:
            _GIVEN_UP.add(self.id)

    def forsake(self) -> None:
        """Record, in this process, that the run holding this lease ended (its lease could not be stopped)."""
        _GIVEN_UP.add(self.id)

    def fence(self) -> Fence:
        return Fence(self.store, self.key, self.id, self.where)

    def check(self, what: str) -> None:
        """Raise :class:`OutputTakenOverError` unless this call still holds the lease (``what``: about to ...)."""
        held = read(self.store, self.key)
        if held is None or held.id != self.id:
            who = held.describe() if held is not None else "its lease is gone"
            raise OutputTakenOverError(f"dgemm: out {self.where} was taken over by another run ({who}) before "
                                       f"this run could {what}")

    @contextmanager
    def kept(self, scheduler: str | None = None, token: str | None = None):
        """Renew the lease every :attr:`interval` seconds (in a thread) while the block runs."""
        self.scheduler, self.token = scheduler, token
        stop = threading.Event()

        def renewing():
            while not stop.wait(self.interval):
                try:
                    if not self.renew():
                        return
                except Exception:   # a store hiccup: try again at the next interval, the lease lasts longer
                    pass

        if not self.renew():         # records the scheduler and token now
            raise OutputTakenOverError(f"dgemm: out {self.where} was taken over by another run "
                                       f"({self.lost.describe() if self.lost else 'its lease is gone'}) "
                                       "before this run started computing")
        thread = threading.Thread(target=renewing, name="dgemm-lease", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

"""One call's run on its output, from before any work to the end: checked, opened, held, completed or abandoned.

Before a cluster is used, :func:`already_complete` refuses an output that
another live run is writing, or one to resume that another product wrote.
Once the product is planned, :meth:`OutputRun.open` creates the output, or
replaces an old one, or reopens the one to resume, or takes C to update in
place, and holds its lease (:mod:`dgemm.storage.lease`); the run's store
tasks write through what it hands them (:attr:`~OutputRun.markers`,
:attr:`~OutputRun.originals`, :meth:`~OutputRun.fence`).  The run ends
with :meth:`~OutputRun.complete`, which marks the output complete only when
every block has its marker, or, interrupted or failed, with
:meth:`~OutputRun.abandon`.  Running and stopping tasks is the client's
(:mod:`dgemm.client.steps`): this module knows no cluster.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dgemm.storage import keys
from dgemm.storage.lease import Fence, Holder, Lease, lease_key, refuse_if_held
from dgemm.storage.locations import location
from dgemm.storage.markers import COMPLETE_ATTR, BlockMarkers, mark_complete, run_id
from dgemm.storage.originals import Originals
from dgemm.storage.outputs import NotAnArrayError, OutputSpec, check_replaceable, create_output, open_existing

Block = tuple[int, int]


def already_complete(spec: OutputSpec, fingerprint: dict):
    """Before any work: refuse a held output, or one to resume that another product wrote.

    Parameters
    ----------
    spec : OutputSpec
        The checked output of the call.
    fingerprint : dict
        What identifies the product (operation, shape, dtype, operands, scalars, precision).

    Returns
    -------
    zarr.Array or None
        The output to resume when its run already completed (nothing to do), else None.

    Raises
    ------
    OutputBusyError
        Another live run holds the output's lease.
    ValueError
        ``resume``, and the output records no run, or another product's.
    """
    existing = _existing(spec)
    if existing is not None:   # a second writer is refused here, before a cluster is used
        refuse_if_held(existing, _where(existing))
    if not spec.resume:
        return None
    _check_resumable(spec.array, fingerprint)
    return spec.array if spec.array.attrs[COMPLETE_ATTR].get("complete") else None


def write_empty(spec: OutputSpec, fingerprint: dict):
    """The output of a product with no elements: nothing to compute, created complete at once.

    Returns
    -------
    zarr.Array
    """
    chunks = tuple(max(s, 1) for s in spec.shape)
    array = create_output(spec, spec.chunks or chunks,
                          {"operation": "empty", "run": {"id": run_id(fingerprint), **fingerprint}})
    mark_complete(array, {"seconds": 0.0})
    return array


class OutputRun:
    """One call writing its output: the array, the blocks it computes, the lease it holds, and their records.

    Made by :meth:`open`, never directly.

    Attributes
    ----------
    array : zarr.Array
        The output, marked incomplete until :meth:`complete`.
    grid : tuple of int
        Its blocks, rows by columns.
    pending : list of tuple of int
        The ``(i, j)`` of the blocks this run computes: all of them, or, resumed,
        those without a marker.
    resumed : bool
        Whether the run continues an interrupted one.
    markers : BlockMarkers
        The per-block completion markers of the output's owner.
    originals : Originals or None
        The kept original C blocks, when the run updates the C it reads.
    lease : Lease
        The lease the run holds on the output.
    took_over : Holder or None
        The stale lease of a dead writer that this run replaced.
    """

    def __init__(self, array, owner: str, grid: Block, pending: list[Block], *, resumed: bool, in_place: bool,
                 took_over: Holder | None, lease: Lease | None = None):
        self.array, self.grid, self.pending, self.resumed = array, grid, pending, resumed
        self.originals = Originals(array, owner) if in_place else None
        self.took_over = took_over
        self.lease = lease or Lease(array, owner, _where(array))
        # the store tasks' markers: each checked against the lease once written (a straggler's taken back)
        self.markers = BlockMarkers(array, owner, fence=self.lease.fence())
        self.lease.acquire()

    @classmethod
    def open(cls, spec: OutputSpec, fingerprint: dict, *, block: Block, grid: Block, drop: tuple = (),
             about: dict | None = None, reads_c=None, chunks: tuple[int, ...] | None = None) -> OutputRun:
        """Create the output, or reopen the one to resume, and take its lease.

        A resumed output must have been cut into the same blocks: its run id
        (a hash of the fingerprint with the block grid) must match.  A fresh
        run draws a new owner token (naming its block markers); a resume
        continues the stored one.  Another live run's lease is refused
        (checked again here, just before writing); a stale one is taken over.
        An output replaced (``overwrite``) is held before it is emptied.

        Parameters
        ----------
        spec : OutputSpec
            The checked output.
        fingerprint : dict
            What identifies the product (as for :func:`already_complete`).
        block, grid : tuple of int
            The planned C block's shape and the grid of blocks (rows, columns).
        drop : tuple of int
            Axes of the 2-D product that the output does not have (matmul of vectors).
        about : dict, optional
            What the output's ``dgemm`` attribute says of the call (operation, operands, plan).
        reads_c : zarr.Array, optional
            The Zarr C the product reads; the output being that array makes the run in place.
        chunks : tuple of int, optional
            A new output's chunks, each block holding whole ones (default: one chunk per block); the
            user's (``spec.layout``) go first.

        Returns
        -------
        OutputRun

        Raises
        ------
        OutputBusyError
            Another live run holds the output's lease.
        ValueError
            A resumed output was cut into other blocks (or its run changed).
        """
        fingerprint = {**fingerprint, "block": list(block), "grid": list(grid)}
        identity = run_id(fingerprint)
        existing = _existing(spec)
        stale = refuse_if_held(existing, _where(existing)) if existing is not None else None
        if spec.resume:
            array = spec.array
            stored = array.attrs[COMPLETE_ATTR].get("run", {})
            # already_complete refused other products; the C blocks are out's chunks, so the grid matches
            # too.  Checked again because a run id that differs (attributes edited, an older dgemm's plan)
            # would resume into blocks cut another way.
            if stored.get("id") != identity:
                raise ValueError("cannot resume: " + (_differences(stored, fingerprint) or
                                                      "out was cut into different blocks") +
                                 "; pass overwrite=True to start again")
            # outputs of an older dgemm have no owner: their markers are named by the run id
            owner = array.attrs[COMPLETE_ATTR].get("owner") or identity
            done = BlockMarkers(array, owner).done(grid)
            return cls(array, owner, grid, sorted(_all_blocks(grid) - done), resumed=True,
                       in_place=_is_read_as_c(array, reads_c), took_over=stale)
        owner = uuid.uuid4().hex[:16]
        if chunks is None:
            chunks = tuple(s for ax, s in enumerate(block) if ax not in drop)
        attrs = {**(about or {}), "owner": owner, "run": {"id": identity, **fingerprint}}
        claimed = emptied = None
        if spec.overwrite and spec.array is None:
            check_replaceable(spec.target, spec.storage_options)   # again: files saved there since the checks
        try:
            if existing is not None and spec.array is None:
                claimed = Lease(existing, owner, _where(existing))
                stale, emptied = _replace(existing, claimed, stale)
            array = create_output(spec, chunks, attrs, over=emptied)   # written over: the lease claimed stays
            BlockMarkers(array, owner).reset(keep={lease_key(array)})   # earlier runs' markers and originals
            return cls(array, owner, grid, sorted(_all_blocks(grid)), resumed=False,
                       in_place=_is_read_as_c(array, reads_c), took_over=stale, lease=claimed)
        except BaseException:
            # a write failed (a full disk): the lease claimed to replace the output names no live run now
            if claimed is not None:
                claimed.give_up()
            raise

    def fence(self) -> Fence:
        """What each store task checks before it writes: the lease still names this run."""
        return self.lease.fence()

    def took_over_tasks(self, scheduler: str) -> str | None:
        """The graph token of the dead writer whose lease this run took over, if its tasks ran on ``scheduler``.

        Those tasks may still be running there: the caller waits for them
        before this run writes.
        """
        held = self.took_over
        if held is not None and held.scheduler == scheduler and held.token:
            return held.token
        return None

    @contextmanager
    def held(self, scheduler: str | None = None, token: str | None = None) -> Iterator[OutputRun]:
        """Renew the lease while the run computes, recording the cluster and graph token its tasks run under.

        Raises
        ------
        OutputTakenOverError
            Another run took the output over before this one started computing.
        """
        started = False
        try:
            with self.lease.kept(scheduler, token):
                started = True
                yield self
        except BaseException:
            # The lease could not be renewed as the run started (a full disk): no task of it ran, and the
            # caller abandons only a run that started; give its lease up here, or this process's own
            # resume=True would find it "being written by another dgemm run" until it expires.
            if not started:
                self.lease.give_up()
            raise

    def abandon(self, drained: Callable[[], bool]) -> None:
        """End a run that was interrupted or failed: fence its tasks off, and give up the output once none runs.

        Stopping the lease first makes every task still to write fail its
        check while other writers stay refused; ``drained`` (the caller's:
        it knows the cluster) waits for the tasks already writing, which
        nothing can stop, and says whether none is left.  Only then is the
        lease released, so a call right after this one finds nothing of this
        run still writing; with tasks left, the stopped lease is left to
        expire (``lease-interval``), keeping other writers out that long.
        A lease that the store refuses to stop or delete (a full disk) is
        left, recorded as given up in this process
        (:meth:`~dgemm.storage.lease.Lease.give_up`): a ``resume=True`` of
        this process takes it over at once; other processes wait for it to
        expire.
        """
        try:
            self.lease.stop()
        except Exception:
            # The stopped lease could not be written (a full disk refuses even that): the lease still names
            # this run, whose tasks go on to drain.  Recorded as given up, so that this process's next call
            # takes it over (after draining them) rather than finding a live writer.
            self.lease.forsake()
        if drained():
            self.lease.give_up()

    def complete(self, seconds: float, flops: float) -> None:
        """Mark the output complete, once every block's marker says it is stored; then give up its lease.

        An in-place run's kept originals go then: C is the result; and so
        do the lease and then the block markers, which only ``resume`` reads:
        under ``.dgemm/`` a finished output keeps nothing, its ``dgemm``
        attribute alone says it is complete (to :func:`already_complete` and
        ``open_result``), not even a marker that a store task still running
        writes after this (it finds the lease gone and takes it back).

        Parameters
        ----------
        seconds : float
            How long the computation took (recorded, with the TFLOPS it gives when no block was skipped).
        flops : float
            The product's floating-point operations, all blocks.

        Raises
        ------
        RuntimeError
            A block has no marker: the output stays incomplete, for ``resume=True`` to finish.
        OutputTakenOverError
            Another run took the output over.
        """
        completed = False
        try:
            all_blocks = _all_blocks(self.grid)
            missing = all_blocks - self.markers.done(self.grid)
            if missing:  # never mark complete what is not: every block must have its marker
                raise RuntimeError(f"dgemm: {len(missing)} of {len(all_blocks)} blocks of {self.array.store_path} "
                                   f"have no completion marker after the run (first: {min(missing)}); out is left "
                                   "incomplete, resume=True finishes it")
            self.lease.check("mark it complete")
            blocks_run = len(self.pending)
            mark_complete(self.array, {"seconds": seconds, "tflops": flops / seconds / 1e12 if seconds and
                                       blocks_run == len(all_blocks) else None,
                                       "blocks": len(all_blocks), "blocks_run": blocks_run,
                                       "resumed": self.resumed})
            if self.originals is not None:   # complete: C is the result now, its originals are no longer needed
                self.originals.remove()      # (while held: a run taking over next keeps originals of its own)
            completed = True
        finally:   # given up even where the store refuses to delete it (a full disk): see abandon
            self.lease.give_up()
        if completed:
            # Removed once the lease is given up: a store task still running (dask re-runs a task whose
            # worker died) whose marker lands after this finds the lease gone and takes it back
            # (BlockMarkers.mark), so nothing is left under .dgemm.
            try:   # marked complete already: a marker left here (a store refusing deletes) is never read again
                self.markers.remove()
            except Exception:
                pass
            keys.prune(self.lease.store, keys.root(self.array))   # the empty .dgemm folder of a local output


def _existing(spec: OutputSpec):
    """The output already there that this call would write into (None for a new one)."""
    if spec.array is not None:
        return spec.array
    if not spec.overwrite:   # check_output refused an existing target
        return None
    try:
        return open_existing(spec.target, spec.storage_options)
    except NotAnArrayError:   # a group, an empty folder: no run of dgemm holds it
        return None


def _where(array) -> str:
    return str(getattr(array, "store_path", array))


def _all_blocks(grid: Block) -> set[Block]:
    return {(i, j) for i in range(grid[0]) for j in range(grid[1])}


def _is_read_as_c(array, reads_c) -> bool:
    """Whether the output is the C the product reads: the run updates it in place."""
    return reads_c is not None and location(reads_c) == location(array)


def _replace(existing, lease: Lease, stale: Holder | None):
    """Hold an output about to be replaced, then empty it; returns a stale lease taken over and the emptied array.

    Deleting a large output takes a while: the lease is taken first and
    the array's metadata (marked incomplete) kept to the end, so a second
    call meanwhile finds the output held, and a reader finds it unfinished.
    Only the lease and the metadata are left: the new output's metadata is
    written over the old (:func:`~dgemm.storage.outputs.create_output`), the
    lease kept all along.
    """
    import zarr

    stale = lease.claim(existing) or stale
    node = existing.path.strip("/")
    old = zarr.open_array(lease.store, path=node, mode="r+")
    old.attrs[COMPLETE_ATTR] = {"complete": False, "replacing": True}
    metadata = {f"{node}/{n}" if node else n for n in ("zarr.json", ".zarray", ".zattrs")}
    keys.clear_except(lease.store, node, metadata | {lease.key})
    return stale, old


def _check_resumable(array, fingerprint: dict) -> None:
    """Refuse to resume into an output made by a different product (before any work)."""
    stored = array.attrs[COMPLETE_ATTR].get("run")
    if not isinstance(stored, dict):
        raise ValueError(f"cannot resume: out ({array.store_path}) records no dgemm run to resume "
                         "(written by an older dgemm, or an empty product); pass overwrite=True to start again")
    diff = _differences(stored, fingerprint)
    if diff:
        raise ValueError(f"cannot resume: out ({array.store_path}) was written by a different product: {diff}; "
                         "pass overwrite=True to start again")


def _differences(stored: dict, now: dict) -> str:
    """What differs between a stored run fingerprint and this call's (ignoring the block fields not yet known)."""
    out = []
    for key, value in now.items():
        old = stored.get(key)
        if _plain(old) != _plain(value):
            out.append(f"{key} was {old!r}, now {value!r}")
    return "; ".join(out)


def _plain(x: Any):
    """Lists and tuples alike, as JSON stores them."""
    return json.loads(json.dumps(x))

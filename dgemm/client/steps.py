"""The steps of a checked call (:class:`dgemm.client.request.Request`), each its own function.

An output to resume is checked against this call first (:func:`_finished`);
only then is a cluster found or started, the product planned, the graph run
and the output marked complete.
"""
from __future__ import annotations

import copy
import dataclasses
import time
import uuid

import numpy as np

from dgemm.client import graph as graph_mod
from dgemm.cluster import device_limits, get_client, prepare, tiles_of
from dgemm.storage import hostcache
from dgemm.client.plan import Plan, make_plan
from dgemm.sizes import default_target
from dgemm.scheduler import placement
from dgemm.client.request import Request
from dgemm.storage import COMPLETE_ATTR, BlockMarkers, create_output, location, mark_complete, run_id
from dgemm.storage import keys
from dgemm.storage.lease import Lease, Writer, refuse_if_held


def run(req: Request):
    """The steps after the checks: resume check, plan, run, completion.

    Without ``out``: operands all in memory give a numpy result at once
    (:func:`_in_memory`); others a lazy dask array, planned for the client
    given or current, else for no cluster at all (:func:`_unplaced`) — the
    call builds a graph and starts nothing.
    """
    finished = _finished(req)
    if finished is not None:
        return finished
    if req.m == 0 or req.n == 0:   # trivial shapes need no device
        return _empty(req)
    if req.spec is None and _in_memory_operands(req):
        return _in_memory(req)
    token = uuid.uuid4().hex[:12]
    if req.spec is None and req.client is None and _current_client() is None:
        return _lazy(req, _unplaced(req), token)
    client = get_client(req.client, req.devices, dtype=req.dtype)
    workers = prepare(client, req.dtype)
    plan = _plan(req, workers)
    if req.spec is None:
        return _lazy(req, plan, token)
    result, markers, todo = _open_output(req, plan)
    t0 = time.perf_counter()
    if todo:
        _compute(req, plan, token, client, workers, result, markers, todo)
    _complete(req, plan, result, markers, len(todo), time.perf_counter() - t0)
    return result


def _finished(req: Request):
    """Before any work: refuse an output another live run is writing, or one of another product (resume);
    return it when already complete."""
    if req.spec is None:
        return None
    existing = _existing(req.spec)
    if existing is not None:   # a second writer is refused here, before a cluster is used
        refuse_if_held(existing, _where(existing))
    if not req.spec.resume:
        return None
    _check_resumable(req.spec.array, req.fingerprint)
    return req.spec.array if req.spec.array.attrs[COMPLETE_ATTR].get("complete") else None


def _existing(spec):
    """The output already there that this call would write into (None for a new one)."""
    if spec.array is not None:
        return spec.array
    if not spec.overwrite:   # check_output refused an existing target
        return None
    import zarr

    target = spec.target
    options = getattr(spec, "storage_options", None) if isinstance(target, str) and "://" in target else None
    try:
        return zarr.open_array(target, mode="r", **({"storage_options": options} if options else {}))
    except Exception:   # nothing there, or not an array: no run of dgemm holds it
        return None


def _where(array) -> str:
    return str(getattr(array, "store_path", array))


def _plan(req: Request, workers: dict) -> Plan:
    """Cut the product into blocks for these workers' kernels and memory."""
    tiles = tiles_of(workers, req.dtype, req.precision)
    target = req.block or default_target(d["device"].type for d in workers.values())
    memory, max_alloc = device_limits(workers)
    return make_plan(req.m, req.n, req.k, req.dtype, tiles, a_chunks=req.a.chunks, b_chunks=req.b.chunks,
                     out_chunks=req.out_chunks, target=target, n_workers=len(workers), device_memory=memory,
                     max_alloc=max_alloc, exact=req.block is not None)


def _current_client():
    """The client dask would compute with now (``distributed.default_client``), or None."""
    try:
        from distributed import default_client
        return default_client()
    except ValueError:
        return None


def _unplaced(req: Request) -> Plan:
    """A plan for no cluster in particular: the lazy result is computed wherever dask computes it.

    Blocks follow the inputs' chunks up to the default (GPU) block size; any
    device's kernel pads them to its tiles, so no tile multiple is needed.
    """
    target = req.block or default_target([])
    return make_plan(req.m, req.n, req.k, req.dtype, (1, 1, 1), a_chunks=req.a.chunks, b_chunks=req.b.chunks,
                     target=target, exact=req.block is not None)


def _in_memory_operands(req: Request) -> bool:
    """Whether every operand the product reads is an in-memory (numpy) array."""
    used = [req.a, req.b] + ([req.c] if req.c is not None and req.beta != 0 else [])
    return all(isinstance(x.data, np.ndarray) for x in used)


def _host_array(x) -> np.ndarray:
    """An in-memory operand as the product sees it (promoted, transposed)."""
    return x.data.T if x.trans else x.data


def _in_memory(req: Request) -> np.ndarray:
    """numpy in, numpy out: small products by numpy here, others on the devices, gathered back."""
    from dgemm.client import inmemory

    c = _host_array(req.c) if req.c is not None and req.beta != 0 else None
    if req.k == 0 or inmemory.is_small(2 * req.m * req.n * req.k):   # k == 0: no product, just beta * C
        out = inmemory.host_product(_host_array(req.a), _host_array(req.b), c, alpha=req.alpha, beta=req.beta,
                                    dtype=req.dtype)
    else:
        client = get_client(req.client, req.devices, dtype=req.dtype)
        workers = prepare(client, req.dtype)
        plan = _plan(req, workers)
        token = uuid.uuid4().hex[:12]
        held = []
        ops = {}
        for name, x, rows, cols in (("a", req.a, plan.rows, plan.ks), ("b", req.b, plan.ks, plan.cols),
                                    ("c", req.c if c is not None else None, plan.rows, plan.cols)):
            if x is None:
                continue
            sr, sc = (cols, rows) if x.trans else (rows, cols)
            x = copy.copy(x)
            x.data, futures = inmemory.scatter_blocks(client, x.data, sr, sc, f"dgemm-scattered-{name}-{token}")
            held += futures
            ops[name] = x
        req = dataclasses.replace(req, **ops)
        try:
            return client.compute(_lazy(req, plan, token), sync=True)
        finally:   # the scattered blocks go now, even when the call failed or was interrupted
            client.cancel(held)
    out = np.squeeze(out, axis=req.drop) if req.drop else out
    return out[()] if out.ndim == 0 else out   # a scalar, as numpy.matmul gives for two vectors


def _lazy(req: Request, plan: Plan, token: str):
    """The result as a lazy dask array whose blocks the devices compute."""
    import dask.array as da

    g = graph_mod.build(plan, req.a, req.b, req.c, alpha=req.alpha, beta=req.beta, token=token,
                        precision=req.precision)
    arr = da.Array(g.hlg(), g.result_name, chunks=(tuple(b - a for a, b in plan.rows),
                                                   tuple(b - a for a, b in plan.cols)),
                   dtype=req.dtype, meta=np.empty((0, 0), dtype=req.dtype))
    return arr[tuple(0 if ax in req.drop else slice(None) for ax in range(2))] if req.drop else arr


def _grid(plan: Plan) -> tuple[int, int]:
    return (len(plan.rows), len(plan.cols))


def _all_blocks(plan: Plan) -> set[tuple[int, int]]:
    return {(i, j) for i in range(len(plan.rows)) for j in range(len(plan.cols))}


def _open_output(req: Request, plan: Plan):
    """Create the output, or reopen the one to resume, and take its lease; returns
    ``(array, writer, blocks to compute)`` (:class:`dgemm.storage.lease.Writer`).

    A resumed output must have been cut into the same blocks: its run id
    (a hash of the fingerprint with the block grid) must match.  A fresh run
    draws a new owner token (naming its block markers); a resume continues
    the stored one.  Another live run's lease is refused (checked again here,
    just before writing); a stale one is taken over.
    """
    grid = _grid(plan)
    fingerprint = {**req.fingerprint, "block": list(plan.block_shape[:2]), "grid": list(grid)}
    run = run_id(fingerprint)
    existing = _existing(req.spec)
    stale = refuse_if_held(existing, _where(existing)) if existing is not None else None
    if req.spec.resume:
        result = req.spec.array
        stored = result.attrs[COMPLETE_ATTR].get("run", {})
        # _finished refused other products already; the C blocks are out's chunks, so the grid matches
        # too.  Checked again because a run id that differs (attributes edited, an older dgemm's plan)
        # would resume into blocks cut another way.
        if stored.get("id") != run:
            raise ValueError("cannot resume: " + (_differences(stored, fingerprint) or
                                                  "out was cut into different blocks") +
                             "; pass overwrite=True to start again")
        # outputs of an older dgemm have no owner: their markers are named by the run id
        owner = result.attrs[COMPLETE_ATTR].get("owner") or run
        writer = Writer.open(result, owner, _in_place(req, result), stale)
        return result, writer, sorted(_all_blocks(plan) - writer.markers.done(grid))
    owner = uuid.uuid4().hex[:16]
    chunks = tuple(s for ax, s in enumerate(plan.block_shape[:2]) if ax not in req.drop)
    meta = {"operation": req.op, "a": req.a.label, "b": req.b.label, "plan": plan.explain(), "owner": owner,
            "run": {"id": run, **fingerprint}}
    claimed = None
    if existing is not None and req.spec.array is None:
        claimed = Lease(existing, owner, _where(existing))
        stale = _replace(existing, claimed) or stale
    result = create_output(req.spec, chunks, meta)
    BlockMarkers(result, owner).reset()   # earlier runs' markers, originals and lease
    writer = Writer.open(result, owner, _in_place(req, result), stale, lease=claimed)
    return result, writer, sorted(_all_blocks(plan))


def _replace(existing, lease: Lease):
    """Hold an output about to be replaced, then empty it; returns a stale lease taken over.

    Deleting a large output takes a while: the lease is taken first and
    the array's metadata (marked incomplete) kept to the end, so a second
    call meanwhile finds the output held, and a reader finds it unfinished.
    """
    import zarr

    stale = lease.claim(existing)
    node = existing.path.strip("/")
    old = zarr.open_array(lease.store, path=node, mode="r+")
    old.attrs[COMPLETE_ATTR] = {"complete": False, "replacing": True}
    metadata = {f"{node}/{n}" if node else n for n in ("zarr.json", ".zarray", ".zattrs")}
    keys.clear_except(lease.store, node, metadata | {lease.key})
    return stale


def _in_place(req: Request, result) -> bool:
    """Whether the run overwrites the C it reads (``out`` is ``c``, ``beta != 0``)."""
    return (req.c is not None and req.beta != 0 and req.c.zarr is not None
            and location(req.c.zarr) == location(result))


def _compute(req: Request, plan: Plan, token: str, client, workers: dict, result, writer: Writer,
             todo: list) -> None:
    """Compute and store the blocks ``todo`` on the cluster, each marked once stored, holding out's lease.

    Interrupted (Ctrl-C) or failed, the run is stopped before the exception
    goes on (:func:`_abandon`): nothing of it is left running to write into
    ``out`` after this returns.
    """
    from dask.delayed import Delayed

    address = client.scheduler.address
    with writer.lease.kept(address, token):
        future = None
        try:
            if writer.took_over is not None and writer.took_over.scheduler == address and writer.took_over.token:
                _drain(client, writer.took_over.token)   # a dead client's tasks may still be running there
            # each worker its rectangle of C blocks, so it reads only its share of A and B
            where = sorted(workers) if len(workers) > 1 and placement.ensure(client) else None
            g = graph_mod.build(plan, req.a, req.b, req.c, alpha=req.alpha, beta=req.beta, token=token,
                                blocks=todo, precision=req.precision, workers=where, originals=writer.originals)
            done_key = graph_mod.add_store(g, plan, result, req.drop, token, writer.markers, blocks=todo,
                                           fence=writer.lease.fence(), originals=writer.originals)
            future = client.compute(Delayed(done_key, g.hlg()))
            if req.progress:
                from distributed import progress as show_progress
                show_progress(future, scheduler=address)  # the client given, not just the default
            future.result()
        except BaseException:
            _abandon(client, future, writer, token)
            raise
        finally:
            hostcache.forget(client, token)   # the run's decoded input blocks leave the hosts' shared memory


def _abandon(client, future, writer: Writer, token: str) -> None:
    """Stop a run that was interrupted or failed: cancel its tasks, fence them off, wait for those running.

    Stopping the lease first makes every task still to write fail its check
    while other writers stay refused; the tasks already writing are waited
    for (dask cannot stop a running task), and only then is ``out`` given up,
    so a call right after this one finds nothing of this run still writing.
    If some are still running after the wait, the stopped lease is left to
    expire (``lease-interval``), keeping other writers out that long.
    """
    try:
        if future is not None:
            client.cancel([future], force=True)
    except Exception:   # a lost cluster: nothing to cancel
        pass
    writer.lease.stop()
    if _drain(client, token):
        writer.lease.release()


def _drain(client, token: str, per_task: float = 10.0, least: float = 10.0) -> bool:
    """Wait (bounded: ``per_task`` seconds per task found running, at least ``least``) until no task whose
    key holds ``token`` is running on a worker of ``client``'s cluster; whether none is left."""
    running = _running(client, token)
    deadline = time.monotonic() + max(least, per_task * running)
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        running = _running(client, token)
    if running:
        import warnings
        warnings.warn(f"dgemm: {running} task(s) of the stopped run {token} were still running after "
                      f"{max(least, per_task * running):.0f} s; a block they are writing may still land, so out "
                      "stays refused to other writers until the stopped run's lease expires", RuntimeWarning,
                      stacklevel=3)
    return not running


def _running(client, token: str) -> int:
    """How many tasks whose key holds ``token`` run on the workers now (asked of the workers themselves)."""
    def count(dask_worker, token=token):
        state = dask_worker.state
        return sum(token in str(ts.key) for ts in (*state.executing, *state.long_running))

    try:
        return sum(client.run(count, on_error="ignore").values())
    except Exception:   # no cluster to ask
        return 0


def _complete(req: Request, plan: Plan, result, writer: Writer, blocks_run: int, seconds: float) -> None:
    """Mark the output complete, once every block's marker says it is stored; then give up its lease."""
    try:
        all_blocks = _all_blocks(plan)
        missing = all_blocks - writer.markers.done(_grid(plan))
        if missing:  # never mark complete what is not: every block must have its marker
            raise RuntimeError(f"dgemm: {len(missing)} of {len(all_blocks)} blocks of {result.store_path} have "
                               f"no completion marker after the run (first: {min(missing)}); out is left "
                               "incomplete, resume=True finishes it")
        writer.lease.check("mark it complete")
        mark_complete(result, {"seconds": seconds, "tflops": plan.flops / seconds / 1e12 if seconds and
                               blocks_run == len(all_blocks) else None,
                               "blocks": len(all_blocks), "blocks_run": blocks_run,
                               "resumed": bool(req.spec.resume)})
        if writer.originals is not None:   # complete: C is the result now, its originals are no longer needed
            writer.originals.remove()
    finally:
        writer.lease.release()


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


def _plain(x):
    """Lists and tuples alike, as JSON stores them."""
    import json
    return json.loads(json.dumps(x))


def _empty(req: Request):
    """A product with no elements: nothing to compute, an output (if any) complete at once."""
    if req.spec is None:
        if _in_memory_operands(req):
            return np.zeros(req.shape, dtype=req.dtype)
        import dask.array as da
        return da.zeros(req.shape, dtype=req.dtype)
    chunks = tuple(max(s, 1) for s in req.shape)
    result = create_output(req.spec, req.spec.chunks or chunks,
                           {"operation": "empty", "run": {"id": run_id(req.fingerprint), **req.fingerprint}})
    mark_complete(result, {"seconds": 0.0})
    return result

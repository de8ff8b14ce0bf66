"""The steps of a checked call (:class:`dgemm.request.Request`), each its own function.

An output to resume is checked against this call first (:func:`_finished`);
only then is a cluster found or started, the product planned, the graph run
and the output marked complete.
"""
from __future__ import annotations

import time
import uuid

import numpy as np

from dgemm import graph as graph_mod
from dgemm.cluster import device_limits, get_client, prepare, tiles_of
from dgemm.plan import Plan, default_target, make_plan
from dgemm.scheduler import placement
from dgemm.request import Request
from dgemm.storage import COMPLETE_ATTR, BlockMarkers, create_output, mark_complete, run_id


def run(req: Request):
    """The steps after the checks: resume check, plan, run, completion."""
    finished = _finished(req)
    if finished is not None:
        return finished
    if req.m == 0 or req.n == 0:   # trivial shapes need no device
        return _empty(req)
    client = get_client(req.client, req.devices)
    workers = prepare(client, req.dtype)
    plan = _plan(req, workers)
    token = uuid.uuid4().hex[:12]
    if req.spec is None:
        return _lazy(req, plan, token)
    result, markers, todo = _open_output(req, plan)
    t0 = time.perf_counter()
    if todo:
        _compute(req, plan, token, client, workers, result, markers, todo)
    _complete(req, plan, result, markers, len(todo), time.perf_counter() - t0)
    return result


def _finished(req: Request):
    """Resume check, before any work: refuse an output of another product; return it when already complete."""
    if req.spec is None or not req.spec.resume:
        return None
    _check_resumable(req.spec.array, req.fingerprint)
    return req.spec.array if req.spec.array.attrs[COMPLETE_ATTR].get("complete") else None


def _plan(req: Request, workers: dict) -> Plan:
    """Cut the product into blocks for these workers' kernels and memory."""
    tiles = tiles_of(workers, req.dtype, req.precision)
    target = req.block or default_target(d["device"].type for d in workers.values())
    memory, max_alloc = device_limits(workers)
    return make_plan(req.m, req.n, req.k, req.dtype, tiles, a_chunks=req.a.chunks, b_chunks=req.b.chunks,
                     out_chunks=req.out_chunks, target=target, n_workers=len(workers), device_memory=memory,
                     max_alloc=max_alloc, exact=req.block is not None)


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
    """Create the output, or reopen the one to resume; returns ``(array, markers, blocks to compute)``.

    A resumed output must have been cut into the same blocks: its run id
    (a hash of the fingerprint with the block grid) must match.
    """
    grid = _grid(plan)
    fingerprint = {**req.fingerprint, "block": list(plan.block_shape[:2]), "grid": list(grid)}
    run = run_id(fingerprint)
    if req.spec.resume:
        result = req.spec.array
        stored = result.attrs[COMPLETE_ATTR].get("run", {})
        if stored.get("id") != run:
            raise ValueError("cannot resume: " + (_differences(stored, fingerprint) or
                                                  "out was cut into different blocks") +
                             "; pass overwrite=True to start again")
        markers = BlockMarkers(result, run)
        return result, markers, sorted(_all_blocks(plan) - markers.done(grid))
    chunks = tuple(s for ax, s in enumerate(plan.block_shape[:2]) if ax not in req.drop)
    meta = {"operation": req.op, "a": req.a.label, "b": req.b.label, "plan": plan.explain(),
            "run": {"id": run, **fingerprint}}
    result = create_output(req.spec, chunks, meta)
    markers = BlockMarkers(result, run)
    markers.reset()
    return result, markers, sorted(_all_blocks(plan))


def _compute(req: Request, plan: Plan, token: str, client, workers: dict, result, markers: BlockMarkers,
             todo: list) -> None:
    """Compute and store the blocks ``todo`` on the cluster, each marked once stored."""
    from dask.delayed import Delayed

    # each worker its rectangle of C blocks, so it reads only its share of A and B
    where = sorted(workers) if len(workers) > 1 and placement.ensure(client) else None
    g = graph_mod.build(plan, req.a, req.b, req.c, alpha=req.alpha, beta=req.beta, token=token, blocks=todo,
                        precision=req.precision, workers=where)
    done_key = graph_mod.add_store(g, plan, result, req.drop, token, markers, blocks=todo)
    future = client.compute(Delayed(done_key, g.hlg()))
    if req.progress:
        from distributed import progress as show_progress
        show_progress(future, scheduler=client.scheduler.address)  # the client given, not just the default
    future.result()


def _complete(req: Request, plan: Plan, result, markers: BlockMarkers, blocks_run: int, seconds: float) -> None:
    """Mark the output complete, once every block's marker says it is stored."""
    all_blocks = _all_blocks(plan)
    missing = all_blocks - markers.done(_grid(plan))
    if missing:  # never mark complete what is not: every block must have its marker
        raise RuntimeError(f"dgemm: {len(missing)} of {len(all_blocks)} blocks of {result.store_path} have no "
                           f"completion marker after the run (first: {min(missing)}); out is left incomplete, "
                           "resume=True finishes it")
    mark_complete(result, {"seconds": seconds, "tflops": plan.flops / seconds / 1e12 if seconds and
                           blocks_run == len(all_blocks) else None,
                           "blocks": len(all_blocks), "blocks_run": blocks_run, "resumed": bool(req.spec.resume)})


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
        import dask.array as da
        return da.zeros(req.shape, dtype=req.dtype)
    chunks = tuple(max(s, 1) for s in req.shape)
    result = create_output(req.spec, req.spec.chunks or chunks,
                           {"operation": "empty", "run": {"id": run_id(req.fingerprint), **req.fingerprint}})
    mark_complete(result, {"seconds": 0.0})
    return result

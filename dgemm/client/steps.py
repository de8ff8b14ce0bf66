"""The steps of a checked call (:class:`dgemm.client.request.Request`), each its own function.

An output to resume is checked against this call first (:func:`_finished`);
only then is a cluster found or started, the product planned, the output
opened, the graph run and the output marked complete.  What happens to the
output (created, replaced, resumed, held, completed, abandoned) is
:class:`dgemm.storage.output_run.OutputRun`'s; the steps here run the tasks
and stop them.
"""
from __future__ import annotations

import copy
import dataclasses
import time
import uuid

import numpy as np

from dgemm.client import graph as graph_mod
from dgemm.client import prestart
from dgemm.client.codecs_room import panel_cache_bytes
from dgemm.client.plan import Plan, block_size, check_graph_size, make_plan
from dgemm.client.request import Request
from dgemm.cluster import check_worker_access, device_limits, get_client, prepare, tiles_of
from dgemm.errors import PlanError
from dgemm.scheduler import placement
from dgemm.sizes import default_target
from dgemm.storage import hostcache
from dgemm.storage.layout import default_chunks
from dgemm.storage.output_run import OutputRun, already_complete, write_empty


def run(req: Request):
    """The steps after the checks: resume check, plan, open the output, compute, complete.

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
    # Before a cluster is found or started: the devices' plan below only cuts finer (smaller default
    # blocks on CPUs, blocks shrunk to fit memory; rounding to tiles grows a block by less than a tile), so
    # a plan for no cluster beyond a generous multiple of the limit is an absurd shape, refused at once.
    _unplaced(req, slack=8)
    client = get_client(req.client, req.devices, dtype=req.dtype, start_method=prestart.start_method(),
                        device_infos=prestart.devices())
    workers = prepare(client, req.dtype)
    plan = _plan(req, workers)
    if req.spec is None:
        return _lazy(req, plan, token)
    if req.urls:   # credentials this process found of its own (environment, ~/.aws) do not reach the workers
        check_worker_access(client, req.urls, req.storage_options)
    output = _open_output(req, plan)
    t0 = time.perf_counter()
    if output.pending:
        _compute(req, plan, token, client, workers, output)
    _complete(output, plan, time.perf_counter() - t0)
    return output.array


def _finished(req: Request):
    """Before any work: refuse an output another live run is writing, or one of another product (resume);
    return it when already complete."""
    return None if req.spec is None else already_complete(req.spec, req.fingerprint)


def _plan(req: Request, workers: dict) -> Plan:
    """Cut the product into blocks for these workers' kernels and memory."""
    tiles = tiles_of(workers, req.dtype, req.precision)
    memory, max_alloc = device_limits(workers)
    target = req.block or default_target((d["device"].type for d in workers.values()), memory)
    plan = _fitted(req, target, tiles, lambda fixed: make_plan(
        req.m, req.n, req.k, req.dtype, tiles, a_chunks=req.a.chunks, b_chunks=req.b.chunks, out_chunks=fixed,
        target=target, n_workers=len(workers), device_memory=memory, max_alloc=max_alloc,
        exact=req.block is not None))
    check_graph_size(plan)   # before any graph or output: an absurd shape is refused at once
    return plan


def _fitted(req: Request, target, tiles, make) -> Plan:
    """``make(out_chunks)`` for the first C blocks of :func:`_c_blocks` whose plan fits the devices."""
    choices = _c_blocks(req, target, tiles)
    for n, fixed in enumerate(choices):
        try:
            return make(fixed)
        except PlanError:
            if n == len(choices) - 1:
                raise
    raise AssertionError("no choice of C blocks")


def _c_blocks(req: Request, target, tiles) -> list:
    """The C blocks (rows, columns) to plan with, in order of preference; None: the plan's own.

    An existing output fixes them (``req.out_chunks``).  A new output's
    chunks or shards given by the user (``req.out_unit``) make them
    multiples of those, as near the target as the devices' memory allows.
    A lazy result follows the inputs' chunks along M and N (rows of A's,
    columns of B's, as ``dask.array.matmul``), from :data:`LAZY_CHUNKS_FROM`
    up to the target: each of its chunks is one block, so a slice computes
    only the chunks it touches (unless ``block=`` was given: then its
    blocks are the plan's).
    """
    targets = (target,) * 3 if isinstance(target, int) else tuple(target)
    if req.out_chunks is not None:
        return [req.out_chunks]
    if req.out_unit is not None:
        counts = [max(1, t // u) for t, u in zip(targets, req.out_unit)]
        out = []
        while True:
            out.append(tuple(min(q * u, max(e, 1)) for q, u, e in zip(counts, req.out_unit, (req.m, req.n))))
            if counts == [1, 1]:
                return out
            counts = [max(1, q // 2) for q in counts]
    if req.spec is not None or req.block is not None:   # block= given: the lazy result's chunks are its blocks
        return [None]
    chunks = (req.a.chunks[0], req.b.chunks[1])

    def follows(c, t):
        return c and min(LAZY_CHUNKS_FROM, t) <= c <= t

    if not any(follows(c, t) for c, t in zip(chunks, targets)):
        return [None]
    fixed = tuple(c if follows(c, t) else block_size(e, t, tile, c)
                  for c, t, tile, e in zip(chunks, targets, tiles, (req.m, req.n)))
    return [fixed, None]


# The smallest input chunks a lazy result follows: smaller ones are grouped into the plan's blocks, each
# of which is a device product with its own overhead (and the graph a task per block).
LAZY_CHUNKS_FROM = 128


def _current_client():
    """The client dask would compute with now (``distributed.default_client``), or None."""
    try:
        from distributed import default_client
        return default_client()
    except ValueError:
        return None


def _unplaced(req: Request, slack: int = 1) -> Plan:
    """A plan for no cluster in particular: the lazy result is computed wherever dask computes it.

    Blocks follow the inputs' chunks up to the default (GPU) block size; any
    device's kernel pads them to its tiles, so no tile multiple is needed.
    Too many block products are refused (:func:`check_graph_size`, with its ``slack``).
    """
    target = req.block or default_target([])
    plan = _fitted(req, target, (1, 1, 1), lambda fixed: make_plan(
        req.m, req.n, req.k, req.dtype, (1, 1, 1), a_chunks=req.a.chunks, b_chunks=req.b.chunks,
        out_chunks=fixed if req.spec is None else None, target=target, exact=req.block is not None))
    check_graph_size(plan, slack=slack)
    return plan


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
        client = get_client(req.client, req.devices, dtype=req.dtype, start_method=prestart.start_method(),
                            device_infos=prestart.devices())
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


def _open_output(req: Request, plan: Plan) -> OutputRun:
    """The output this call writes, opened for these blocks and held (:meth:`OutputRun.open`)."""
    reads_c = req.c.zarr if req.c is not None and req.beta != 0 else None
    block = plan.block_shape[:2]
    chunks = None if req.spec.layout is not None and req.spec.layout.chunks else \
        default_chunks(req.spec.shape, block, (req.a.chunks[0], req.b.chunks[1]), req.drop)
    return OutputRun.open(req.spec, req.fingerprint, block=block, chunks=chunks,
                          grid=(len(plan.rows), len(plan.cols)), drop=req.drop,
                          about={"operation": req.op, "a": req.a.label, "b": req.b.label, "plan": plan.explain()},
                          reads_c=reads_c)


def _compute(req: Request, plan: Plan, token: str, client, workers: dict, output: OutputRun) -> None:
    """Compute and store the output's pending blocks on the cluster, each marked once stored, holding its lease.

    Interrupted (Ctrl-C) or failed, the run is stopped before the exception
    goes on (:func:`_cancel`, :meth:`OutputRun.abandon`): nothing of it is
    left running to write into ``out`` after this returns.
    """
    address = client.scheduler.address
    with output.held(address, token):
        future = None
        try:
            dead_writers_token = output.took_over_tasks(address)
            if dead_writers_token:
                _drain(client, dead_writers_token)   # a dead client's tasks may still be running there
            # each worker its rectangle of C blocks, so it reads only its share of A and B
            where = sorted(workers) if len(workers) > 1 and placement.ensure(client) else None
            g = graph_mod.build(plan, req.a, req.b, req.c, alpha=req.alpha, beta=req.beta, token=token,
                                blocks=output.pending, precision=req.precision, workers=where,
                                originals=output.originals,
                                cache_bytes=panel_cache_bytes(plan, workers, req.a, req.b, output.array, req.drop,
                                                              req.beta))
            done_key = graph_mod.add_store(g, plan, output.array, req.drop, token, output.markers,
                                           blocks=output.pending, fence=output.fence(), originals=output.originals)
            future = _submit(client, g, done_key)
            if req.progress:   # the share of the flops done, as the dashboard counts it (not of the tasks)
                from dgemm.client.progress import show_progress
                show_progress(client, future, token)
            future.result()
        except BaseException:
            _cancel(client, future)
            output.abandon(lambda: _drain(client, token))
            raise
        finally:
            hostcache.forget(client, token)   # the run's decoded input blocks leave the hosts' shared memory


def _submit(client, g, done_key):
    """The run's graph sent to the scheduler; the future of its ``done`` task.

    Asked for the done task alone, the scheduler reaches the GEMM tasks
    through the store tasks' dependencies, a set, and sends them to their
    workers in no particular order, and a worker starts the first to arrive
    (often one of its last: its blocks and its read-ahead were read first,
    0.2-0.3 s before the first product ran on a 32768² run; bench/NOTES.md,
    issue 28, fourteenth session).  Asked also for each worker's first GEMM
    tasks (:attr:`Graph.leading`), it sends those first, in priority order;
    their futures are dropped at once, so nothing holds their results but
    their store tasks.
    """
    from dask.delayed import Delayed

    hlg = g.hlg()
    futures = client.compute([Delayed(done_key, hlg)] + [Delayed(k, hlg, layer=k[0]) for k in g.leading])
    return futures[0]


def _cancel(client, future) -> None:
    """Cancel a stopped run's tasks not yet started (dask cannot stop those running: :func:`_drain` waits)."""
    try:
        if future is not None:
            client.cancel([future], force=True)
    except Exception:   # a lost cluster: nothing to cancel
        pass


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
                      stacklevel=2)
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


def _complete(output: OutputRun, plan: Plan, seconds: float) -> None:
    """Mark the output complete (:meth:`OutputRun.complete`: only once every block has its marker)."""
    output.complete(seconds, plan.flops)


def _empty(req: Request):
    """A product with no elements: nothing to compute, an output (if any) complete at once."""
    if req.spec is None:
        if _in_memory_operands(req):
            return np.zeros(req.shape, dtype=req.dtype)
        import dask.array as da
        return da.zeros(req.shape, dtype=req.dtype)
    return write_empty(req.spec, req.fingerprint)

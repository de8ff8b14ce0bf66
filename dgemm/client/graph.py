"""The Dask graph of a GEMM, built on the client; its tasks run :mod:`dgemm.worker.tasks`.

Layers, named for the dashboard's task stream:

``dgemm-gemm``    one task per C block (and k segment): reads its A and B
                  blocks in the worker, multiplies on the device, accumulates
                  over k there.  Asks for its share of resource ``GPU=1``
                  (:func:`gpu_share`).
``dgemm-reduce``  adds the k segments of a C block (only when k is split).
``dgemm-mirror``  a Gram product's C (X^T X, X X^T: symmetric): the blocks
                  ``i <= j`` are computed, the others are their transposes
                  (only when the product is one, :func:`mirrored`).
``dgemm-store``   writes one C block (whole chunks) to the output store, as long
                  as its run owns the output (:mod:`dgemm.storage.lease`).
``dgemm-done``    one task that depends on every store.

Inputs held by dask (or numpy, turned into ``dgemm-load`` tasks) arrive as
task dependencies; Zarr inputs arrive as :class:`~dgemm.storage.ZarrBlock`
references and are read by the worker that needs them.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed.comm import get_address_host

from dgemm import config, names
from dgemm.client.order import grow, panel_bytes
from dgemm.client.plan import Plan, assign, check_graph_size
from dgemm.client.request import is_gram
from dgemm.storage import BlockMarkers, Operand, ZarrBlock
from dgemm.storage.lease import Fence
from dgemm.storage.originals import OriginalBlock, Originals
from dgemm.worker.tasks import done, gemm_block, mirror, reduce_blocks, store

MIRROR = "dgemm-mirror"


def gpu_share() -> float:
    """A GEMM task's share of its worker's ``GPU=1``: one over the ``gemm-tasks`` setting, read on the client.

    With 2, a worker runs two GEMM tasks at once: the device still runs one
    product at a time (the engine's lock), while the other sets up, asks
    for its inputs, and enqueues its kernels as soon as the first one's
    result is coming down (:class:`dgemm.opencl.turn.Turn`).
    """
    return 1 / (config.get("gemm-tasks") or 1)


@dataclass
class Graph:
    layers: dict
    dependencies: dict
    result_name: str          # keys (result_name, i, j) hold the C blocks
    # The GEMM tasks each worker starts with, first of all (its first gemm-tasks ones): the client asks for
    # them by name so that the scheduler sends them before the others (dgemm.client.steps._compute)
    leading: list = field(default_factory=list)

    def hlg(self) -> HighLevelGraph:
        return HighLevelGraph(self.layers, self.dependencies)


def _merge(graph: Graph, coll) -> str | None:
    if coll is None:
        return None
    g = coll.__dask_graph__()
    if not isinstance(g, HighLevelGraph):
        g = HighLevelGraph.from_collections(coll.name, g)
    graph.layers.update(g.layers)
    graph.dependencies.update(g.dependencies)
    return coll.name


def build(plan: Plan, a: Operand, b: Operand, c: Operand | None, *, alpha: float, beta: float,
          token: str, blocks=None, precision: str | None = None, workers=None,
          originals: Originals | None = None, cache_bytes: float | None = None) -> Graph:
    """The layers that compute the C blocks of ``plan`` (``blocks``: a list of ``(i, j)``, default all).

    ``precision`` picks the kernel family on each worker (see :func:`dgemm.opencl.database.lookup`).
    ``workers`` (addresses of the device workers) places the blocks for
    locality (:func:`dgemm.client.plan.assign`): each worker gets a rectangle of C
    blocks and runs it row by row, so its A and B panels are read once into
    its device's cache.  The placement is loose: if a worker dies, its blocks
    go to the others; if every worker dies at once,
    :class:`dgemm.scheduler.placement.PlacementPlugin` (which must be on the scheduler)
    hands them to the workers that come back.

    ``originals``: ``out`` is ``c`` (an in-place update), whose blocks the
    store tasks overwrite; each GEMM task reads its block of C through
    :class:`~dgemm.storage.originals.OriginalBlock`, the original even when
    it runs again after its block was written.

    ``cache_bytes``: the panel cache of the smallest worker's device, where
    known.  A worker whose panels all fit in it runs its blocks as a growing
    rectangle rather than row by row (:func:`dgemm.client.order.grow`), so
    that its reads spread over the run.

    A plan of more than :data:`~dgemm.client.plan.MAX_BLOCK_PRODUCTS` block
    products is refused (:func:`~dgemm.client.plan.check_graph_size`)
    before anything is built.

    A symmetric product (:func:`mirrored`: a Gram product whose rows and
    columns are cut alike) computes the blocks ``i <= j`` only, each
    staged once for both of its sides on the device (``twin``); a
    ``dgemm-mirror`` layer holds every C block, those below the diagonal
    the transposes of those above.
    """
    check_graph_size(plan)   # every block product is named below: refuse a plan too large to build, first
    graph = Graph({}, {}, "")
    a_ref, a_coll = a.block_refs(plan.rows, plan.ks)
    b_ref, b_coll = b.block_refs(plan.ks, plan.cols)
    use_c = c is not None and beta != 0
    c_ref, c_coll = c.block_refs(plan.rows, plan.cols) if use_c else (None, None)
    if use_c and originals is not None:
        c_block = c_ref

        def c_ref(i, j):
            return OriginalBlock(c_block(i, j), originals, i, j)
    inputs = {name for name in (_merge(graph, a_coll), _merge(graph, b_coll), _merge(graph, c_coll)) if name}

    gname = f"{names.GEMM}-{token}"
    split = len(plan.segments) > 1
    dt = plan.dtype.str
    reserve = plan.device_bytes()
    symmetric = mirrored(plan, a, b, beta)
    wanted = _blocks(plan, blocks)
    grid = sorted({(min(i, j), max(i, j)) for i, j in wanted}) if symmetric else wanted
    tasks = [(i, j, s) for i, j in grid for s in range(len(plan.segments))]
    order = [grow(mine, panel_bytes(plan, mine), cache_bytes)
             for mine in assign(tasks, len(workers) if workers else 1, plan)]

    refs = _block_refs(plan, order, a_ref, b_ref, workers)

    dsk, where, priority = {}, {}, {}
    leading = max(1, round(1 / gpu_share()))
    for w, mine in enumerate(order):
        ahead = _read_ahead(mine, refs, plan, symmetric)
        for pos, (i, j, s) in enumerate(mine):
            (r0, r1), (c0, c1) = plan.rows[i], plan.cols[j]
            key = (gname, i, j, s) if split else (gname, i, j)
            if pos < leading:
                graph.leading.append(key)
            first = s == 0
            dsk[key] = (gemm_block, *refs(i, j, s),
                        c_ref(i, j) if (use_c and first) else None,
                        r1 - r0, c1 - c0, float(alpha), float(beta) if first else 0.0,
                        a.trans, b.trans, dt, precision, token, reserve, ahead(pos),
                        *((True,) if symmetric else ()))   # twin (gemm_block's last argument)
            if workers:
                where[key] = [workers[w]]
            priority[key] = len(mine) - pos   # each worker runs its blocks in the order given
    annotations = {"resources": {"GPU": gpu_share()}, "priority": priority.__getitem__}
    if workers:
        annotations.update(workers=where.__getitem__, allow_other_workers=True)
    graph.layers[gname] = MaterializedLayer(dsk, annotations=annotations)
    graph.dependencies[gname] = inputs
    graph.result_name = gname
    if split:
        _add_tree_reduction(graph, plan, gname, token, grid)
    if symmetric:
        _add_mirror(graph, token, wanted)
    return graph


def mirrored(plan: Plan, a: Operand, b: Operand, beta: float) -> bool:
    """Whether C is symmetric and cut alike along rows and columns, so only its blocks ``i <= j`` are computed.

    A Gram product (:func:`dgemm.client.request.is_gram`: one array X, X^T X
    or X X^T, ``beta == 0``) whose plan cuts rows and columns at the same
    places; otherwise (an output's chunks that differ along the two axes)
    every block is computed.
    """
    return is_gram(a, b, beta) and plan.rows == plan.cols


def _add_mirror(graph: Graph, token: str, grid) -> None:
    """Every C block of ``grid`` under ``dgemm-mirror-<token>``: ``(i, j)`` with ``i < j`` as computed, the
    others the transposes of their mirror images (stored by their own store tasks, markers and fence alike),
    a diagonal block its own upper triangle mirrored (:func:`dgemm.worker.tasks.mirror`)."""
    name, src = f"{MIRROR}-{token}", graph.result_name
    graph.layers[name] = MaterializedLayer({(name, i, j): (src, i, j) if i < j else
                                            (mirror, (src, i, i), True) if i == j else (mirror, (src, j, i))
                                            for i, j in grid})
    graph.dependencies[name] = {src}
    graph.result_name = name


def _block_refs(plan: Plan, order, a_ref, b_ref, workers):
    """``refs(i, j, s)``: the A and B blocks of task ``(i, j, s)``, those that several workers of one host
    read marked ``host_shared``, with ``host_readers`` their count.

    ``order[w]`` are the tasks of ``workers[w]`` (addresses; a host is an
    address's host, as for dask).  Only marked blocks go through a host cache
    where it is on (:func:`dgemm.storage.hostcache.through`); with one worker
    per host nothing is marked.  Readers are counted by block (a Gram's X
    block read as A by one worker and as B by another is one block); each
    block's reference is made once and handed to every task that reads it
    (a task's own blocks, its read-ahead list's).
    Where tasks move to other workers (a worker lost, work stolen), a block
    is read twice or shared for nothing: slower, never wrong.
    """
    readers: dict = {}      # ("a", i, kk) / ("b", kk, j): the workers whose tasks read it
    for w, mine in enumerate(order):
        for i, j, s in mine:
            for kk in range(*plan.segments[s]):
                readers.setdefault(("a", i, kk), set()).add(w)
                readers.setdefault(("b", kk, j), set()).add(w)
    made = {at: (a_ref if at[0] == "a" else b_ref)(*at[1:]) for at in readers}
    hosts = [_host(w) for w in workers] if workers else []
    if len(set(hosts)) < len(hosts):   # a host with several workers: what do they share?
        by_key: dict = {}       # a block's key: every worker that reads it, on either side
        for at, ref in made.items():
            if isinstance(ref, ZarrBlock):
                by_key.setdefault(ref.key(), set()).update(readers[at])
        # a shared block: how many workers of its busiest host read it
        shared = {key: max(Counter(hosts[w] for w in ws).values()) for key, ws in by_key.items()}
        for at, ref in made.items():
            if isinstance(ref, ZarrBlock) and shared.get(ref.key(), 1) > 1:
                made[at] = replace(ref, host_shared=True, host_readers=shared[ref.key()])

    def marked(i, j, s):
        k0, k1 = plan.segments[s]
        return [made["a", i, kk] for kk in range(k0, k1)], [made["b", kk, j] for kk in range(k0, k1)]
    return marked


def _host(address: str) -> str:
    """The host of a worker's address (dask's reading of it); an address dask cannot read is its own host."""
    try:
        return get_address_host(address)
    except ValueError:
        return address


# Blocks a GEMM task names for its worker to read ahead (the engine reads as many as a quarter of its
# panel cache holds): enough to keep a host's reader threads busy across the next products.  The window moves
# only as tasks start, so while the products wait for their inputs (a run's first steps) it must hold more
# than the readers take at once: at 32, 16 readers decoding zstd ran dry between steps, 8 of them idle for a
# third of a 32768² run (bench/NOTES.md, issue 28, fourteenth session).
READ_AHEAD = 64


def _read_ahead(mine, refs, plan: Plan, twin: bool = False):
    """``ahead(pos)``: the read-ahead list of the task at ``pos`` of a worker's ordered tasks ``mine``.

    The first :data:`READ_AHEAD` Zarr blocks, after the task's own, that
    this worker has not read before, in the order its next tasks read them,
    each as ``(ref, "a" or "b", m or n of its product)``.  Blocks of a row
    panel already read (kept in the device's cache) are skipped, so the list
    reaches the next row's new panel while the current row still runs.
    A ``twin`` product's block (see :func:`build`) is listed once, for both
    sides.  Only :class:`~dgemm.storage.blocks.ZarrBlock` references are listed:
    other references are graph keys, which would make dask fetch them as
    dependencies of this task.  None when nothing is left.
    """
    import bisect

    first_use, seen = [], set()
    for pos, (i, j, s) in enumerate(mine):
        a_refs, b_refs = refs(i, j, s)
        m, n = plan.rows[i][1] - plan.rows[i][0], plan.cols[j][1] - plan.cols[j][0]
        for a_r, b_r in zip(a_refs, b_refs):
            for ref, side, extent in ((a_r, "a", m), (b_r, "b", n)):
                if isinstance(ref, ZarrBlock) and (key := (None if twin else side, ref.key())) not in seen:
                    seen.add(key)
                    first_use.append((pos, (ref, side, extent)))
    positions = [p for p, _ in first_use]

    def ahead(pos):
        start = bisect.bisect_right(positions, pos)
        return [item for _, item in first_use[start:start + READ_AHEAD]] or None
    return ahead


def _blocks(plan: Plan, blocks) -> list[tuple[int, int]]:
    if blocks is None:
        return [(i, j) for i in range(len(plan.rows)) for j in range(len(plan.cols))]
    return sorted(blocks)


def _add_tree_reduction(graph: Graph, plan: Plan, gname: str, token: str, blocks=None, fan_in: int = 2) -> None:
    """Sum the k segments of every C block (of ``blocks``, default all) pairwise, level by level.

    Intermediate levels are ``dgemm-reduce-<token>-<level>``; the last is
    ``dgemm-reduce-<token>`` with keys ``(name, i, j)``, the C blocks.
    """
    grid = _blocks(plan, blocks)
    layer, keys = gname, {ij: [(gname, *ij, s) for s in range(len(plan.segments))] for ij in grid}
    level = 0
    while True:
        last = all(len(v) <= fan_in for v in keys.values())
        name = f"{names.REDUCE}-{token}" if last else f"{names.REDUCE}-{token}-{level}"
        dsk, nxt = {}, {}
        for ij, parts in keys.items():
            groups = [parts[x:x + fan_in] for x in range(0, len(parts), fan_in)]
            nxt[ij] = []
            for g, group in enumerate(groups):
                key = (name, *ij) if last else (name, *ij, g)
                dsk[key] = (reduce_blocks, group)
                nxt[ij].append(key)
        graph.layers[name] = MaterializedLayer(dsk)
        graph.dependencies[name] = {layer}
        layer, keys, level = name, nxt, level + 1
        if last:
            graph.result_name = name
            return


def add_store(graph: Graph, plan: Plan, array, drop: tuple, token: str, markers: BlockMarkers | None = None,
              blocks=None, fence: Fence | None = None, originals: Originals | None = None) -> str:
    """Add the store and done layers; return the key of the done task.

    ``blocks`` (default all) must be those :func:`build` computed; with
    ``markers`` each store task marks its block done after writing it (and
    skips a block already marked).  ``fence`` makes each store task check
    that its run still owns ``array``; ``originals`` (in place: ``array`` is
    C) keeps each original C block before it is overwritten.  See
    :func:`dgemm.worker.tasks.store`.

    Where the GEMM tasks feed the stores themselves (no k split, no
    mirror), each names its output block (:func:`~dgemm.worker.tasks.gemm_block`'s
    ``out``), so that its worker may encode the block's chunks on the device
    and hand the store task their frames (:mod:`dgemm.worker.encoding`).
    """
    sname, dname = f"{names.STORE}-{token}", f"{names.DONE}-{token}"
    if graph.result_name == f"{names.GEMM}-{token}":
        gemm = graph.layers[graph.result_name].mapping
        for i, j in _blocks(plan, blocks):
            task = gemm[(graph.result_name, i, j)]
            twin = task[15] if len(task) > 15 else False
            gemm[(graph.result_name, i, j)] = (*task[:15], twin, (array, plan.rows[i], plan.cols[j], drop))
    dsk = {(sname, i, j): (store, array, plan.rows[i], plan.cols[j], (graph.result_name, i, j), drop,
                           None if markers is None else (markers, i, j), fence, originals)
           for i, j in _blocks(plan, blocks)}
    graph.layers[sname] = MaterializedLayer(dsk)
    graph.dependencies[sname] = {graph.result_name}
    graph.layers[dname] = MaterializedLayer({dname: (done, list(dsk))})
    graph.dependencies[dname] = {sname}
    return dname

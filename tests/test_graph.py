"""The Dask graph: layers, annotations, task functions; run with dask's local scheduler.

Under the synchronous scheduler the GEMM tasks use the process-wide device
state (:func:`dgemm.worker.device_state`), so no cluster is needed here.
"""
from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from dask.delayed import Delayed

from _check import check_product, randn
from dgemm.client import graph as graph_mod
from dgemm.client.plan import make_plan
from dgemm.storage import Operand, ZarrBlock, check_output, create_output
from dgemm.worker.tasks import gemm_block, read_block, reduce_blocks

TILES = (32, 32, 16)


def build(a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, target=64, n_workers=1,
          out_chunks=None):
    A, B = Operand(a, "a"), Operand(b, "b")
    if trans_a:
        A.transpose()
    if trans_b:
        B.transpose()
    C = Operand(c, "c") if c is not None else None
    dtype = np.result_type(A.dtype, B.dtype, *([C.dtype] if C else []))
    (m, k), (_, n) = A.shape, B.shape
    plan = make_plan(m, n, k, dtype, TILES, a_chunks=A.chunks, b_chunks=B.chunks, target=target,
                     n_workers=n_workers, out_chunks=out_chunks)
    g = graph_mod.build(plan, A, B, C, alpha=alpha, beta=beta, token="test")
    return plan, g


def as_array(plan, g):
    return da.Array(g.hlg(), g.result_name, chunks=(tuple(b - a for a, b in plan.rows),
                                                   tuple(b - a for a, b in plan.cols)),
                    dtype=plan.dtype, meta=np.empty((0, 0), plan.dtype))


@pytest.fixture(scope="module", autouse=True)
def sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


def test_layers_and_annotations(tmp_path, rng):
    a = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(100, 80), chunks=(70, 33), dtype="f4")
    a[...] = randn(rng, (100, 80), "f4")
    b = randn(rng, (80, 90), "f4")
    plan, g = build(a, b, target=64)
    names = set(g.layers)
    gemm = [n for n in names if n.startswith("dgemm-gemm-")]
    assert len(gemm) == 1 and g.result_name == gemm[0]
    ann = g.layers[gemm[0]].annotations
    assert ann["resources"] == {"GPU": 1} and "workers" not in ann      # no workers given: no placement
    assert sorted(ann["priority"](k) for k in g.layers[gemm[0]]) == list(range(1, len(g.layers[gemm[0]]) + 1))
    assert any(n.startswith("dgemm-load-b") for n in names)        # numpy input: load tasks
    assert not any(n.startswith("dgemm-reduce-") for n in names)
    assert len(g.layers[gemm[0]]) == len(plan.rows) * len(plan.cols)
    # Zarr input: block references, not data, in the tasks
    layer = g.layers[gemm[0]]
    task = layer[next(iter(layer))]
    assert task[0] is gemm_block
    assert task[1] and all(isinstance(x, ZarrBlock) for x in task[1])
    arr = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(100, 90), chunks=plan.block_shape[:2],
                            dtype="f4")
    done = graph_mod.add_store(g, plan, arr, (), "test")
    assert done == "dgemm-done-test"
    assert g.dependencies["dgemm-store-test"] == {g.result_name}
    assert g.dependencies["dgemm-done-test"] == {"dgemm-store-test"}
    assert not g.layers["dgemm-store-test"].annotations             # only GEMM tasks need the device


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_graph_computes_the_product(rng, dtype, trans_a, trans_b):
    m, n, k = 75, 61, 99
    a = randn(rng, (k, m) if trans_a else (m, k), dtype)
    b = randn(rng, (n, k) if trans_b else (k, n), dtype)
    plan, g = build(da.from_array(a, chunks=(40, 27)), b, trans_a=trans_a, trans_b=trans_b, target=32)
    assert len(plan.rows) > 1 and len(plan.cols) > 1 and len(plan.ks) > 1
    check_product(as_array(plan, g).compute(), a, b, dtype=dtype, trans_a=trans_a, trans_b=trans_b)


def test_k_split_adds_reduce_layer(rng):
    a, b, c = randn(rng, (20, 300)), randn(rng, (300, 25)), randn(rng, (20, 25))
    plan, g = build(a, b, c, alpha=0.5, beta=2.0, target=64, n_workers=3)
    assert len(plan.segments) == 3 and len(plan.rows) * len(plan.cols) == 1
    assert g.result_name == "dgemm-reduce-test"
    assert g.dependencies["dgemm-reduce-test"] <= {n for n in g.layers if n.startswith("dgemm-")}
    gemm = g.layers["dgemm-gemm-test"]
    assert len(gemm) == 3
    # c (beta) goes to the first k segment only, or it would be added three times
    tasks = {key: gemm[key] for key in gemm}
    betas = sorted(t[7] for t in tasks.values())
    assert betas == [0.0, 0.0, 2.0]
    check_product(as_array(plan, g).compute(), a, b, alpha=0.5, beta=2.0, c=c, dtype="float64")


@pytest.mark.parametrize("segments", [2, 3, 5, 8])
def test_k_split_reduction_sums_every_segment(rng, segments):
    """However the segments are reduced (pairwise levels or at once), each is added exactly once."""
    a, b = randn(rng, (30, 16 * segments + 5)), randn(rng, (16 * segments + 5, 20))
    plan, g = build(a, b, target=16, n_workers=segments)
    assert len(plan.segments) == segments
    assert all(n.startswith(("dgemm-gemm-", "dgemm-reduce-", "dgemm-load-")) for n in g.layers)
    check_product(as_array(plan, g).compute(), a, b, dtype="float64")


def test_beta_zero_does_not_load_c(rng):
    a, b = randn(rng, (20, 30)), randn(rng, (30, 25))
    c = np.full((20, 25), np.nan)
    plan, g = build(a, b, c, beta=0.0)
    assert not any(n.startswith("dgemm-load-c") for n in g.layers)
    check_product(as_array(plan, g).compute(), a, b, dtype="float64")


def test_store_layer_writes_every_block(tmp_path, rng):
    a, b = randn(rng, (90, 70), "f4"), randn(rng, (70, 50), "f4")
    plan, g = build(a, b, out_chunks=(37, 20))
    spec = check_output(str(tmp_path / "c.zarr"), (90, 50), np.dtype("f4"), False)
    arr = create_output(spec, plan.block_shape[:2], {})
    arr[...] = np.nan
    done = graph_mod.add_store(g, plan, arr, (), "test")
    assert Delayed(done, g.hlg()).compute() == len(plan.rows) * len(plan.cols) == 9
    check_product(arr[...], a, b, dtype="float32")


def test_load_errors_name_the_block(tmp_path):
    arr = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(4, 4), chunks=(2, 2), dtype="f8",
                            compressors=None)
    arr[...] = 1.0
    (tmp_path / "a.zarr" / "c" / "0" / "0").write_bytes(b"not a chunk")
    with pytest.raises(OSError, match=r"dgemm could not read Zarr array .*a.zarr rows 0:2, columns 0:2"):
        read_block(ZarrBlock(arr, (0, 2), (0, 2)))
    assert read_block(ZarrBlock(arr, (2, 4), (2, 4))).tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_blocks_are_placed_in_rectangles_and_run_row_by_row(tmp_path, rng):
    """With workers given, each gets a rectangle of C blocks (loosely), in snake order, told what comes next."""
    a = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(256, 128), chunks=(64, 64), dtype="f4")
    b = zarr.create_array(store=str(tmp_path / "b.zarr"), shape=(128, 256), chunks=(64, 64), dtype="f4")
    a[...], b[...] = randn(rng, (256, 128), "f4"), randn(rng, (128, 256), "f4")
    workers = ["tcp://w0", "tcp://w1", "tcp://w2", "tcp://w3"]
    A, B = Operand(a, "a"), Operand(b, "b")
    plan = make_plan(256, 256, 128, "float32", (32, 32, 16), target=64, n_workers=4)
    g = graph_mod.build(plan, A, B, None, alpha=1.0, beta=0.0, token="t", workers=workers)
    layer = g.layers[g.result_name]
    ann = layer.annotations
    assert ann["allow_other_workers"] is True and ann["resources"] == {"GPU": 1}
    mine = {w: sorted((k for k in layer if ann["workers"](k) == [w]), key=lambda k: -ann["priority"](k))
            for w in workers}
    for w, keys in mine.items():
        ij = [k[1:] for k in keys]
        rows, cols = {i for i, _ in ij}, {j for _, j in ij}
        assert len(ij) == 4 and len(rows) == 2 and len(cols) == 2       # a 2 x 2 rectangle each
        assert ij[0][0] == ij[1][0] and ij[2][0] == ij[3][0] and ij[1][1] == ij[2][1]   # snake: row, then back
        check_read_ahead(layer, keys)
    check_product(as_array(plan, g).compute(), a[...], b[...], dtype="float32")


@pytest.mark.parametrize("workers", [
    ["tcp://10.0.0.1:4001", "tcp://10.0.0.1:4002", "tcp://10.0.0.2:4001", "tcp://10.0.0.2:4002"],  # 2 a host
    ["tcp://10.0.0.1:4001", "tcp://10.0.0.1:4002", "tcp://10.0.0.1:4003", "tcp://10.0.0.1:4004"],  # one host
    ["tcp://10.0.0.1:4001", "tcp://10.0.0.2:4001", "tcp://10.0.0.3:4001", "tcp://10.0.0.4:4001"],  # one each
])
def test_blocks_that_workers_of_one_host_both_read_are_marked_shared(tmp_path, rng, workers):
    """Exactly the Zarr blocks that two or more workers of one host read (in their own tasks and read-ahead
    lists) are marked ``host_shared``, the ones a host cache shares; the product is unchanged."""
    a = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(256, 128), chunks=(64, 64), dtype="f4")
    b = zarr.create_array(store=str(tmp_path / "b.zarr"), shape=(128, 256), chunks=(64, 64), dtype="f4")
    a[...], b[...] = randn(rng, (256, 128), "f4"), randn(rng, (128, 256), "f4")
    plan = make_plan(256, 256, 128, "float32", (32, 32, 16), target=64, n_workers=4)
    g = graph_mod.build(plan, Operand(a, "a"), Operand(b, "b"), None, alpha=1.0, beta=0.0, token="t",
                        workers=workers)
    layer = g.layers[g.result_name]
    host = {w: w.split("//")[1].split(":")[0] for w in workers}
    readers, seen = {}, []
    for key, task in layer.items():
        [w] = layer.annotations["workers"](key)
        refs = [*task[1], *task[2], *(r for r, _, _ in task[14] or ())]
        seen += refs
        for r in refs:
            readers.setdefault(r.key(), set()).add(w)
    shared = {k for k, ws in readers.items() if len({host[w] for w in ws}) < len(ws)}
    assert all(isinstance(r, ZarrBlock) and r.host_shared == (r.key() in shared) for r in seen)
    one = {}
    assert all(one.setdefault(r.key(), r) is r for r in seen)   # each block's reference made once, for every task
    hosts = len(set(host.values()))
    if hosts == len(workers):
        assert not shared                                  # a worker per host: nothing to share
    elif hosts == 1:
        assert shared == set(readers)                      # 2 x 2 rectangles: every panel has two readers
    else:
        assert shared and len(shared) < len(readers)       # a host's two share their A or their B panels
    check_product(as_array(plan, g).compute(), a[...], b[...], dtype="float32")


def gemm_dependencies(g) -> dict:
    """Each GEMM task's dependencies, as the schedulers (local and distributed) find them.

    Both convert the graph with ``convert_legacy_graph``, which finds keys
    anywhere in a task's arguments, nested lists and tuples too
    (``HighLevelGraph.get_all_dependencies`` misses those).
    """
    from dask._task_spec import convert_legacy_graph

    tasks = convert_legacy_graph(dict(g.hlg()))
    return {key: set(tasks[key].dependencies) for key in g.layers[g.result_name]}


@pytest.mark.parametrize("beta", [0.0, 2.0])
@pytest.mark.parametrize("kinds", [("numpy", "dask"), ("dask", "numpy"), ("zarr", "numpy")])
def test_gemm_tasks_depend_only_on_their_own_blocks(tmp_path, rng, kinds, beta):
    """Blocks held by dask are no prefetch hint: as graph keys they would become extra dependencies."""
    def operand(kind, name, data):
        if kind == "numpy":
            return data
        if kind == "dask":
            return da.from_array(data, chunks=32)
        arr = zarr.create_array(store=str(tmp_path / f"{name}.zarr"), shape=data.shape, chunks=(32, 32),
                                dtype=data.dtype)
        arr[...] = data
        return arr

    a, b, c = randn(rng, (96, 64)), randn(rng, (64, 96)), randn(rng, (96, 96))
    plan, g = build(operand(kinds[0], "a", a), operand(kinds[1], "b", b), c, beta=beta, target=32)
    nk = len(plan.ks)
    assert len(plan.rows) == len(plan.cols) == 3 and nk == 2
    layer = g.layers[g.result_name]
    for key, deps in gemm_dependencies(g).items():
        _, i, j = key
        task = layer[key]
        a_keys = [] if kinds[0] == "zarr" else task[1]
        want = {*a_keys, *task[2], *([task[3]] if beta else [])}
        assert deps == want and len(deps) == len(a_keys) + nk + (beta != 0), key
        assert [k[1:] for k in a_keys] == [(i, kk) for kk in range(len(a_keys))]     # its own A row
        assert [k[1:] for k in task[2]] == [(kk, j) for kk in range(nk)]            # its own B column
        assert not beta or task[3][1:] == (i, j)
        assert all(isinstance(r, ZarrBlock) and side == "a" for r, side, _ in task[-1] or ())   # Zarr only
    check_product(as_array(plan, g).compute(), a, b, beta=beta, c=c, dtype="float64")


def check_read_ahead(layer, order):
    """Each task's read-ahead list is the blocks its worker's later tasks read first, none read before, in order."""
    seen = set()
    for pos, key in enumerate(order):
        task = layer[key]
        for side, refs in (("a", task[1]), ("b", task[2])):
            seen |= {(side, r.key()) for r in refs}
        later = []
        for nxt in order[pos + 1:]:
            t = layer[nxt]
            for ra, rb in zip(t[1], t[2]):
                for side, r, extent in (("a", ra, t[4]), ("b", rb, t[5])):
                    if (side, r.key()) not in seen and (side, r.key(), extent) not in later:
                        later.append((side, r.key(), extent))
        ahead = [(side, r.key(), extent) for r, side, extent in task[-1] or ()]
        assert ahead == later[:graph_mod.READ_AHEAD], key
        assert task[-1] is None or all(isinstance(r, ZarrBlock) for r, _, _ in task[-1])


def test_zarr_operands_get_the_next_products_blocks_to_read_ahead(tmp_path, rng):
    a = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(96, 64), chunks=(32, 32), dtype="f8")
    b = zarr.create_array(store=str(tmp_path / "b.zarr"), shape=(64, 96), chunks=(32, 32), dtype="f8")
    a[...], b[...] = randn(rng, (96, 64)), randn(rng, (64, 96))
    plan, g = build(a, b, target=32)
    layer = g.layers[g.result_name]
    assert all(not deps for deps in gemm_dependencies(g).values())   # Zarr blocks are read by the task
    order = sorted(layer, key=lambda k: -layer.annotations["priority"](k))
    check_read_ahead(layer, order)
    assert layer[order[0]][-1] is not None and layer[order[-1]][-1] is None
    # the first row's last task already names the next row's A panel (B's panels are all read by then)
    row0 = [k for k in order if k[1] == order[0][1]]
    assert {side for _, side, _ in layer[row0[-1]][-1]} == {"a"}


def test_reduce_blocks_does_not_modify_its_inputs(rng):
    parts = [randn(rng, (3, 4)) for _ in range(3)]
    copies = [p.copy() for p in parts]
    out = reduce_blocks(parts)
    np.testing.assert_array_equal(out, copies[0] + copies[1] + copies[2])
    for p, q in zip(parts, copies):
        np.testing.assert_array_equal(p, q)


@pytest.mark.parametrize("n_workers", [1, 8])
def test_a_subset_of_blocks_is_computed_stored_and_marked(tmp_path, rng, n_workers):
    """What ``resume`` builds: only the given C blocks, with or without the k split, each marked once stored."""
    from dgemm.storage import BlockMarkers

    a, b = randn(rng, (40, 150), "f8"), randn(rng, (150, 50), "f8")
    A, B = Operand(a, "a"), Operand(b, "b")
    plan = make_plan(40, 50, 150, "f8", TILES, target=32, n_workers=n_workers)
    grid = [(i, j) for i in range(len(plan.rows)) for j in range(len(plan.cols))]
    assert len(grid) == 4 and (len(plan.segments) > 1) == (n_workers == 8)
    todo = [(0, 1), (1, 0)]
    g = graph_mod.build(plan, A, B, None, alpha=1.0, beta=0.0, token="sub", blocks=todo)
    assert {k[1:3] for k in g.layers[g.result_name]} == set(todo)
    spec = check_output(str(tmp_path / "c.zarr"), (40, 50), np.dtype("f8"), False)
    arr = create_output(spec, plan.block_shape[:2], {})
    arr[...] = np.nan
    marks = BlockMarkers(arr, "sub")
    done = graph_mod.add_store(g, plan, arr, (), "sub", marks, blocks=todo)
    assert Delayed(done, g.hlg()).compute() == 2
    assert marks.done() == set(todo)
    ref = a @ b
    for i, j in grid:
        sl = (slice(*plan.rows[i]), slice(*plan.cols[j]))
        if (i, j) in todo:
            np.testing.assert_allclose(arr[sl], ref[sl], rtol=1e-12, atol=1e-12)
        else:
            assert np.isnan(arr[sl]).all()

"""The shapes users bring (issue 27): a Gram matrix X^T X reads each chunk of X once and computes one triangle;
a projection X @ W with a small W streams X once.

The read counts are the workers' own (the engine's ``bytes_read`` and
``reads``), after real products on dgemm's local cluster (PoCL).  Kernel
tiles with TSM != TSN are given to the single-worker cluster through a user
tuning database: with equal tiles the two sides of a Gram block are staged
alike by chance, and a run that staged them apart would pass unseen.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

import dgemm
from _check import check_product, randn
from dgemm.storage import COMPLETE_ATTR, BlockMarkers

# Tiles of unequal TSM and TSN (both valid for the CPU kernel, GEMMK=1), for float32 and float64.
UNEQUAL = {"float64": {"TSM": 32, "TSN": 64, "TSK": 16, "WPTM": 2, "WPTN": 16, "VWN": 4, "WIDTH": 1, "VWM": 1,
                       "PADA": 0, "PADB": 0, "GROUPM": 0, "GEMMK": 1},
           "float32": {"TSM": 32, "TSN": 64, "TSK": 16, "WPTM": 2, "WPTN": 32, "VWN": 8, "WIDTH": 1, "VWM": 1,
                       "PADA": 0, "PADB": 0, "GROUPM": 0, "GEMMK": 1}}


def zarr_in(path, data, chunks, **kw):
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, **kw)
    arr[...] = data
    return arr


def triangle(n: int) -> int:
    return n * (n + 1) // 2


def gemm_tasks(lazy) -> list:
    """The ``(i, j)`` of the GEMM tasks of a lazy dgemm result."""
    return sorted(k[1:3] for k in dict(lazy.__dask_graph__()) if isinstance(k, tuple) and k[0].startswith("dgemm-gemm"))


# -- the engine: one cache entry for both sides ------------------------------------
class CountingBlock:
    """A block that reads itself (see :mod:`dgemm.opencl.engine`), counting its reads."""

    def __init__(self, data: np.ndarray, name: tuple):
        self.data, self.name, self.fills = data, name, 0
        self.shape, self.dtype, self.copies = data.shape, data.dtype, False

    def key(self):
        return self.name

    def fill_into(self, out):
        self.fills += 1
        out[...] = self.data


def _stream_a_gram(engine, x, rows, cols, dtype, twin=True) -> dict:
    """The blocks i <= j of X^T X streamed through ``engine`` (checked against numpy); each block's reads."""
    blocks = {(r, c): CountingBlock(np.ascontiguousarray(x[r[0]:r[1], c[0]:c[1]]), ("x", r, c))
              for r in rows for c in cols}
    cache, budget = engine.cache, engine.cache.budget
    cache.budget = 1 << 30
    reads = engine.stats.reads
    try:
        for i, ci in enumerate(cols):
            for cj in cols[i:]:
                got = engine.stream([blocks[r, ci] for r in rows], [blocks[r, cj] for r in rows],
                                    ci[1] - ci[0], cj[1] - cj[0], trans_a=True, scope=("gram", dtype), twin=twin)
                check_product(got, x[:, ci[0]:ci[1]], x[:, cj[0]:cj[1]], dtype=dtype, trans_a=True)
    finally:
        cache.drop()
        cache.budget = budget
    assert engine.stats.reads - reads == sum(b.fills for b in blocks.values())
    return {k: b.fills for k, b in blocks.items()}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_engine_stages_a_gram_block_once_for_both_sides(any_device, engines, rng, dtype):
    """The blocks i <= j of X^T X, streamed with ``twin``: each block of X is read once, though it is A for
    one product and B for another and TSM != TSN (edge blocks whose padding would differ by side)."""
    from dgemm.opencl.params import KernelParams

    engine = engines(any_device, dtype, KernelParams.from_dict(UNEQUAL[dtype]))
    x = randn(rng, (150, 90), dtype)
    rows, cols = [(0, 64), (64, 128), (128, 150)], [(0, 32), (32, 64), (64, 90)]   # widths 32 and 26: 32 != 64
    fills = _stream_a_gram(engine, x, rows, cols, dtype)
    assert fills == dict.fromkeys(fills, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_engine_stages_a_gram_block_once_on_the_gpu(gpu_device, engines, rng, dtype):
    """The same with the GPU's own kernels (float64: DMMA, 128 x 64 tiles on the H100; float32: wgmma)."""
    engine = engines(gpu_device, dtype)
    x = randn(rng, (1000, 600), dtype)
    rows, cols = [(0, 512), (512, 1000)], [(0, 256), (256, 512), (512, 600)]    # a column block of 88
    fills = _stream_a_gram(engine, x, rows, cols, dtype)
    print(f"{dtype}: tiles {engine.params.TSM} x {engine.params.TSN}, k_major {engine.params.k_major}")
    assert fills == dict.fromkeys(fills, 1)


# -- a real cluster: what the workers read -------------------------------------------
@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    """dgemm's local cluster of one ``cpu`` worker whose kernels have TSM != TSN (a user tuning database)."""
    from distributed import Client

    from dgemm.cluster import DeviceCluster
    from dgemm.opencl import database
    from dgemm.opencl.discovery import list_devices

    devices = [d for d in list_devices() if d.type == "CPU"]
    if not devices:
        pytest.skip("no OpenCL CPU device (pip install pocl-binary-distribution)")
    level, key = "device", database._keys(devices[0])["device"]
    db = tmp_path_factory.mktemp("tuning") / "tuning.json"
    db.write_text(json.dumps({level: {key: {dt: {"params": p, "tuned": False} for dt, p in UNEQUAL.items()}}}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DGEMM_TUNING_DB", str(db))   # the worker processes read it, and only they
        cluster = DeviceCluster("cpu", dashboard_address="127.0.0.1:0")
    try:
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=120)
            yield client
    finally:
        cluster.close()


def _counters(client) -> dict:
    """bytes_read, reads and block products, summed over the workers' engines."""
    def get(dask_worker):
        state = dask_worker.plugins["dgemm"].state
        totals = state.totals()
        return {"bytes_read": totals["bytes_read"], "blocks": totals["blocks"],
                "reads": sum(e.stats.reads for e in list(state._engines.values())),
                "tsm_tsn": sorted({(e.params.TSM, e.params.TSN) for e in list(state._engines.values())})}
    per_worker = client.run(get)
    out = {k: sum(w[k] for w in per_worker.values()) for k in ("bytes_read", "blocks", "reads")}
    out["tiles"] = [t for w in per_worker.values() for t in w["tsm_tsn"]]
    return out


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in ("bytes_read", "blocks", "reads")}


def test_gram_reads_each_chunk_of_x_once_and_computes_one_triangle(one_worker, tmp_path, rng):
    """X^T X from a zstd Zarr X on one worker: each block of X read and decoded once (counted by the worker),
    the blocks i <= j computed (6 of 9), the mirrored result right; the same from ``matmul(X.T, X)`` on
    ``da.from_zarr``, and X X^T."""
    import dask.array as da

    client = one_worker
    x_np = randn(rng, (200, 150))
    x = zarr_in(tmp_path / "x.zarr", x_np, (64, 64), compressors=ZstdCodec())
    n_blocks = math.ceil(200 / 64) * math.ceil(150 / 64)      # k blocks x column blocks: 4 x 3
    before = _counters(client)
    c = dgemm.gemm(x, x, trans_a=True, out=str(tmp_path / "c.zarr"), client=client, block=64)
    after = _counters(client)
    assert (32, 64) in after["tiles"], after["tiles"]          # the unequal tiles are the ones that ran
    check_product(c[...], x_np, x_np, dtype="float64", trans_a=True)
    assert _delta(after, before) == {"bytes_read": x_np.nbytes, "reads": n_blocks, "blocks": triangle(3)}

    lazy_t = dgemm.matmul(da.from_zarr(str(tmp_path / "x.zarr")).T, da.from_zarr(str(tmp_path / "x.zarr")),
                          client=client, block=64)
    assert gemm_tasks(lazy_t) == [(i, j) for i in range(3) for j in range(i, 3)]
    before = _counters(client)
    check_product(client.compute(lazy_t, sync=True), x_np, x_np, dtype="float64", trans_a=True)
    assert _delta(_counters(client), before) == {"bytes_read": x_np.nbytes, "reads": n_blocks,
                                                 "blocks": triangle(3)}

    before = _counters(client)
    d = dgemm.gemm(x, x, trans_b=True, out=str(tmp_path / "d.zarr"), client=client, block=64)
    check_product(d[...], x_np, x_np, dtype="float64", trans_b=True)
    assert _delta(_counters(client), before) == {"bytes_read": x_np.nbytes, "reads": n_blocks,
                                                 "blocks": triangle(4)}


def test_a_projection_with_a_small_w_streams_x_once(one_worker, tmp_path, rng):
    """X @ W, W small: every block of X read once, W's blocks once (kept on the device across X's rows)."""
    client = one_worker
    x_np, w_np = randn(rng, (200, 150)), randn(rng, (150, 8))
    x = zarr_in(tmp_path / "x.zarr", x_np, (64, 64), compressors=ZstdCodec())
    w = zarr_in(tmp_path / "w.zarr", w_np, (64, 8), compressors=ZstdCodec())
    before = _counters(client)
    c = dgemm.matmul(x, w, out=str(tmp_path / "c.zarr"), client=client, block=64)
    check_product(c[...], x_np, w_np, dtype="float64")
    assert _delta(_counters(client), before) == {"bytes_read": x_np.nbytes + w_np.nbytes, "reads": 4 * 3 + 3,
                                                 "blocks": 4}


def test_a_tall_x_in_tall_chunks_is_decoded_once(one_worker, tmp_path, rng):
    """X^T X where X's chunks are taller than a K block: the K blocks cover whole chunks, so each
    chunk is decoded once (K blocks of the CPU's 1024 decoded each 4096-row chunk four times)."""
    client = one_worker
    x_np = randn(rng, (16384, 40))
    x = zarr_in(tmp_path / "x.zarr", x_np, (4096, 40), compressors=ZstdCodec())

    def decoded(dask_worker):
        return dask_worker.plugins["dgemm"].state.totals()["host_decoded_bytes"]

    before = sum(client.run(decoded).values())
    c = dgemm.gemm(x, x, trans_a=True, out=str(tmp_path / "c.zarr"), client=client)
    check_product(c[...], x_np, x_np, dtype="float64", trans_a=True)
    assert sum(client.run(decoded).values()) - before == x_np.nbytes


# -- results on the shared two-worker cluster ----------------------------------------
@pytest.mark.parametrize("dtype,shape,trans,block", [
    ("float64", (130, 100), "a", 32),      # edge blocks: 100 = 3 x 32 + 4
    ("float32", (97, 75), "b", 32),        # X X^T, edges along both axes
    ("float64", (300, 40), "a", 64),       # C one block: k split into segments over the two workers
    ("float32", (257, 70), "a", (48, 48, 32)),
])
def test_gram_results_into_a_nan_prefilled_out(client, tmp_path, rng, dtype, shape, trans, block):
    """Every element of a Gram product written, right (against numpy float64), into an out prefilled with NaN;
    only the blocks i <= j computed."""
    x_np = randn(rng, shape, dtype)
    x = zarr_in(tmp_path / "x.zarr", x_np, (32, 32))
    n = shape[1] if trans == "a" else shape[0]
    bm = block if isinstance(block, int) else block[0]
    out = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(n, n), chunks=(bm, bm), dtype=dtype,
                            fill_value=np.nan)
    before = client.run(lambda dask_worker: dask_worker.plugins["dgemm"].state.totals()["blocks"])
    c = dgemm.gemm(x, x, trans_a=trans == "a", trans_b=trans == "b", out=out, client=client, block=block)
    ran = sum(client.run(lambda dask_worker: dask_worker.plugins["dgemm"].state.totals()["blocks"]).values())
    check_product(c[...], x_np, x_np, dtype=dtype, trans_a=trans == "a", trans_b=trans == "b")
    np.testing.assert_array_equal(c[...], c[...].T)     # one triangle, mirrored: exactly symmetric
    nb = math.ceil(n / bm)
    segments = 2 if nb == 1 else 1
    assert ran - sum(before.values()) == triangle(nb) * segments


def test_dask_and_numpy_grams_read_x_transposed_and_others_compute_everything(tmp_path, rng):
    """``matmul(X.T, X)`` on a dask X (not a plain Zarr read) and ``gemm(x, x, trans_a=True)`` on numpy: one
    operand read transposed (no transpose tasks), one triangle; results right under dask's own scheduler.
    Not Gram products (two arrays, beta != 0, X @ X) compute every block."""
    import dask.array as da

    x_np = randn(rng, (120, 70))
    x = da.from_array(x_np, chunks=(32, 32)) * 2.0
    lazy = dgemm.matmul(x.T, x, block=32)
    assert not [name for name in lazy.__dask_graph__().layers if name.startswith("transpose")]
    assert gemm_tasks(lazy) == [(i, j) for i in range(3) for j in range(i, 3)]
    check_product(lazy.compute(scheduler="threads"), 2 * x_np, 2 * x_np, dtype="float64", trans_a=True)
    lazy = dgemm.matmul(x, x.T, block=32)
    assert len(gemm_tasks(lazy)) == triangle(4)
    check_product(lazy.compute(scheduler="threads"), 2 * x_np, 2 * x_np, dtype="float64", trans_b=True)

    z = zarr_in(tmp_path / "x.zarr", x_np, (32, 32))
    other = zarr_in(tmp_path / "y.zarr", x_np, (32, 32))
    c_np = randn(rng, (70, 70))
    square = zarr_in(tmp_path / "s.zarr", randn(rng, (70, 70)), (32, 32))
    for full, nb in ((dgemm.gemm(z, other, trans_a=True, block=32), 3),      # same values, another array
                     (dgemm.gemm(z, z, c_np, beta=1.0, trans_a=True, block=32), 3),   # C added in
                     (dgemm.gemm(square, square, block=32), 3)):               # X @ X
        assert len(gemm_tasks(full)) == nb * nb
    assert len(gemm_tasks(dgemm.gemm(z, z, c_np, beta=0.0, trans_a=True, block=32))) == triangle(3)
    check_product(dgemm.gemm(z, z, c_np, beta=1.0, trans_a=True, block=32).compute(scheduler="threads"),
                  x_np, x_np, c=c_np, beta=1.0, dtype="float64", trans_a=True)


def test_numpy_grams_are_one_operand_read_transposed(no_client, rng):
    """numpy: the same object twice, or ``x.T`` and ``x``, is one operand read transposed (a Gram product);
    a copy of ``x`` is another array."""
    from dgemm.client.request import Request, is_gram

    x = randn(rng, (50, 20))
    for a, b, kw in ((x, x, {"trans_a": True}), (x.T, x, {}), (x, x.T, {}), (x, x, {"trans_b": True})):
        req = Request.check("gemm", a, b, client=no_client, **kw)
        assert is_gram(req.a, req.b, req.beta) and req.a.trans != req.b.trans
        np.testing.assert_array_equal(req.a.data.T if req.a.trans else req.a.data, (a.T if kw.get("trans_a") else a))
    for a, b, kw in ((x, x.copy(), {"trans_a": True}), (x.T, x.copy(), {}), (x[:, ::-1].T, x, {})):
        req = Request.check("gemm", a, b, client=no_client, **kw)
        assert not is_gram(req.a, req.b, req.beta)
    square = randn(rng, (20, 20))
    req = Request.check("gemm", square.T, square, trans_a=True, client=no_client)   # X @ X: left as given
    assert not is_gram(req.a, req.b, req.beta) and req.a.data is not square and req.a.trans


def test_a_mirrored_block_is_the_transpose_and_a_diagonal_one_its_upper_triangle_mirrored(rng):
    """The mirror tasks' arithmetic: below the diagonal, the transpose (C-contiguous, for the store); on it,
    the upper triangle kept and copied below (a device's diagonal block need not be exactly symmetric)."""
    from dgemm.worker.tasks import mirror

    for dtype in ("float32", "float64"):
        b = randn(rng, (5, 7), dtype)
        got = mirror(b)
        assert got.flags.c_contiguous and got.dtype == b.dtype
        np.testing.assert_array_equal(got, b.T)
        d = randn(rng, (6, 6), dtype)
        got = mirror(d, True)
        assert got.dtype == d.dtype
        np.testing.assert_array_equal(got, got.T)
        np.testing.assert_array_equal(np.triu(got), np.triu(d))


def test_a_gram_whose_rows_and_columns_are_cut_apart_computes_every_block(tmp_path, rng):
    """An out whose chunks differ along its two axes fixes C's blocks: rows and columns are not cut alike,
    so nothing is mirrored (every block computed)."""
    from dgemm.client.graph import build, mirrored
    from dgemm.client.plan import make_plan
    from dgemm.storage import Operand

    z = zarr_in(tmp_path / "x.zarr", randn(rng, (120, 70)), (32, 32))
    a, b = Operand(str(tmp_path / "x.zarr"), "a"), Operand(z, "b")
    a.transpose()
    square = make_plan(70, 70, 120, "float64", (1, 1, 1), out_chunks=(32, 32), target=32)
    apart = make_plan(70, 70, 120, "float64", (1, 1, 1), out_chunks=(32, 64), target=32)
    assert mirrored(square, a, b, 0.0) and not mirrored(apart, a, b, 0.0)
    g = build(apart, a, b, None, alpha=1.0, beta=0.0, token="t")
    assert len([k for k in g.layers["dgemm-gemm-t"]]) == 3 * 2


def test_a_gram_resumed_after_a_partial_run_rewrites_only_its_lost_blocks(client, tmp_path, rng, monkeypatch):
    """A run that lost a block above the diagonal and one below it (their markers gone, their chunks NaN) is
    resumed: both written again, from the two block products that hold them, and every element right."""
    from dgemm.client import steps

    x_np = randn(rng, (100, 90))
    x = zarr_in(tmp_path / "x.zarr", x_np, (32, 32))
    path = tmp_path / "c.zarr"
    real = steps._compute
    lost = [(0, 1), (2, 1)]          # (2, 1) is the mirror of (1, 2), which stays

    def compute_then_lose_blocks(*args, **kwargs):
        real(*args, **kwargs)
        arr = zarr.open_array(str(path), mode="r+")
        markers = BlockMarkers(arr, arr.attrs[COMPLETE_ATTR]["owner"])
        for i, j in lost:
            arr[32 * i:32 * (i + 1), 32 * j:32 * (j + 1)] = np.nan
            (path / markers.key(i, j)).unlink()

    monkeypatch.setattr(steps, "_compute", compute_then_lose_blocks)
    with pytest.raises(RuntimeError, match="no completion marker"):
        dgemm.gemm(x, x, trans_a=True, out=str(path), client=client, block=32)
    monkeypatch.setattr(steps, "_compute", real)
    before = sum(client.run(lambda dask_worker: dask_worker.plugins["dgemm"].state.totals()["blocks"]).values())
    result = dgemm.gemm(x, x, trans_a=True, out=str(path), client=client, block=32, resume=True)
    ran = sum(client.run(lambda dask_worker: dask_worker.plugins["dgemm"].state.totals()["blocks"]).values())
    assert result.attrs[COMPLETE_ATTR]["blocks_run"] == len(lost)
    assert ran - before == 2                          # (0, 1) and (1, 2)
    check_product(dgemm.open_result(str(path))[...], x_np, x_np, dtype="float64", trans_a=True)


def test_a_gram_split_along_k_mirrors_its_summed_blocks(tmp_path, rng):
    """Fewer C blocks than devices (2 x 2 for 8): k is split into segments, the blocks i <= j summed, and the
    block below the diagonal the transpose of the sum; computed here under dask's own scheduler."""
    import dask.array as da

    from dgemm.client.graph import build
    from dgemm.client.plan import make_plan
    from dgemm.storage import Operand

    x_np = randn(rng, (256, 60))
    zarr_in(tmp_path / "x.zarr", x_np, (32, 32))
    a, b = Operand(str(tmp_path / "x.zarr"), "a"), Operand(str(tmp_path / "x.zarr"), "b")
    a.transpose()
    plan = make_plan(60, 60, 256, "float64", (1, 1, 1), a_chunks=a.chunks, b_chunks=b.chunks, target=32,
                     n_workers=8)
    assert len(plan.rows) == 2 and len(plan.segments) > 1, plan.explain()
    g = build(plan, a, b, None, alpha=2.0, beta=0.0, token="t")
    assert sorted({k[1:3] for k in g.layers["dgemm-gemm-t"]}) == [(0, 0), (0, 1), (1, 1)]
    c = da.Array(g.hlg(), g.result_name, chunks=((32, 28), (32, 28)), dtype="float64")
    check_product(c.compute(scheduler="threads"), x_np, x_np, alpha=2.0, dtype="float64", trans_a=True)


def test_the_mirror_layer_makes_c_exactly_symmetric_whatever_the_devices_return(tmp_path, rng):
    """The blocks i <= j as a device returns them (here: random, a diagonal block not symmetric, as the tensor
    cores' are not exactly): C's upper triangle is theirs, its lower one their mirror image, to the bit."""
    import dask
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    from dgemm.client.graph import build
    from dgemm.client.plan import make_plan
    from dgemm.storage import Operand

    zarr_in(tmp_path / "x.zarr", randn(rng, (64, 70)), (32, 32))
    a, b = Operand(str(tmp_path / "x.zarr"), "a"), Operand(str(tmp_path / "x.zarr"), "b")
    a.transpose()
    plan = make_plan(70, 70, 64, "float32", (1, 1, 1), a_chunks=a.chunks, b_chunks=b.chunks, target=32)
    g = build(plan, a, b, None, alpha=1.0, beta=0.0, token="t")
    computed = {}
    for key in g.layers["dgemm-gemm-t"]:
        (r0, r1), (c0, c1) = plan.rows[key[1]], plan.cols[key[2]]
        computed[key] = randn(rng, (r1 - r0, c1 - c0), "float32")
    layers = {**g.layers, "dgemm-gemm-t": MaterializedLayer(computed)}
    hlg = HighLevelGraph(layers, {**g.dependencies, "dgemm-gemm-t": set()})
    n = len(plan.rows)
    blocks = dask.get(hlg, [[(g.result_name, i, j) for j in range(n)] for i in range(n)])
    c = np.block([list(row) for row in blocks])
    upper = np.zeros_like(c)
    for (_, i, j), block in computed.items():
        upper[plan.rows[i][0]:plan.rows[i][1], plan.cols[j][0]:plan.cols[j][1]] = block
    assert c.dtype == np.float32
    np.testing.assert_array_equal(c, c.T)
    np.testing.assert_array_equal(np.triu(c), np.triu(upper))

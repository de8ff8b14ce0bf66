"""The block engine and the OpenCL kernels behind it, once per OpenCL device.

Every test runs under :func:`dgemm.opencl.device.poisoned`: each buffer the
device hands out (staged and padded blocks, panel-cache entries, staging,
accumulators, downloads) starts as NaN, and :func:`poison` refills the
buffers an engine keeps from earlier products.  An element the kernels fail
to write, or padding they fail to zero, shows up as NaN.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _check import assert_nonfinite_like, check_product, randn, reference
from dgemm.accuracy import tf32
from dgemm.opencl.device import POISON_BYTE, poisoned
from dgemm.opencl.engine import BlockEngine
from dgemm.sizes import roundup
from dgemm.opencl.params import KernelParams

DTYPES = ["float32", "float64"]

# Parameter sets that pass KernelParams.problems(): rectangular tiles,
# non-power-of-2 register blocks, every global vector width (WIDTH) and
# local-memory vector width (VWM, VWN), padded local tiles and TSK of 8, 16
# and 32.
PARAM_SETS = {
    "pocl-default": KernelParams(TSM=32, TSN=32, TSK=16, WPTM=4, WPTN=4, WIDTH=4),
    "f64-shipped": KernelParams(TSM=64, TSN=64, TSK=8, WPTM=4, WPTN=4, WIDTH=2),
    "tsm96-wptm6-vw2x4": KernelParams(TSM=96, TSN=64, TSK=16, WPTM=6, WPTN=4, WIDTH=2, VWM=2, VWN=4),
    "width1-odd-pads-tsk32": KernelParams(TSM=16, TSN=32, TSK=32, WPTM=2, WPTN=4, WIDTH=1, PADA=1, PADB=3),
    "rect-tsk8-pada2": KernelParams(TSM=64, TSN=32, TSK=8, WPTM=8, WPTN=2, WIDTH=2, PADA=2),
    "width8-pad8": KernelParams(TSM=32, TSN=64, TSK=32, WPTM=2, WPTN=8, WIDTH=8, PADA=8, PADB=8),
    "wpt3x5": KernelParams(TSM=48, TSN=40, TSK=16, WPTM=3, WPTN=5, WIDTH=1),
    "vw8x2-pads": KernelParams(TSM=64, TSN=32, TSK=16, WPTM=8, WPTN=2, WIDTH=2, VWM=8, VWN=2, PADA=8, PADB=2),
}


def usable(device, params, dtype):
    """Skip (saying why) a set that is valid but beyond this device's limits."""
    itemsize = np.dtype(dtype).itemsize
    assert params.problems(itemsize) == [], "the test's parameter set itself is invalid"
    bad = params.problems(itemsize, device.info.max_work_group_size, device.info.local_mem)
    if bad:
        pytest.skip(f"{params} exceeds the limits of {device.info.name}: {'; '.join(bad)}")


@pytest.fixture(autouse=True)
def poisoned_memory():
    """Every buffer allocated during the test starts as NaN (see the module's text)."""
    with poisoned():
        yield


def poison(engine):
    """Fill the buffers ``engine`` kept from earlier products with NaN (new ones are NaN already)."""
    import pyopencl as cl

    for buf, nbytes in engine._buffers.values():
        cl.enqueue_fill_buffer(engine.device.queue, buf, np.uint8(POISON_BYTE), 0, nbytes)
    engine.device.queue.finish()


def k_blocks(a, b, m, n, k, splits, trans_a, trans_b):
    """Cut stored A and B into the k-blocks the engine takes, at ``splits``."""
    edges = [0, *splits, k]
    pairs = []
    for k0, k1 in zip(edges[:-1], edges[1:]):
        ab = a[k0:k1, :] if trans_a else a[:, k0:k1]
        bb = b[:, k0:k1] if trans_b else b[k0:k1, :]
        pairs.append((ab, bb))
    return pairs


def run(engine, rng, m, n, k, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, use_c=False,
        splits=(), in_dtype=None):
    """One poisoned product on fresh random data, checked against numpy."""
    dtype = engine.dtype
    in_dtype = in_dtype or dtype
    a = randn(rng, (k, m) if trans_a else (m, k), in_dtype)
    b = randn(rng, (n, k) if trans_b else (k, n), in_dtype)
    c = randn(rng, (m, n), in_dtype) if use_c else None
    poison(engine)
    got = engine.product(k_blocks(a, b, m, n, k, splits, trans_a, trans_b), m, n, alpha=alpha, beta=beta,
                         c=c, trans_a=trans_a, trans_b=trans_b)
    check_product(got, a, b, dtype=dtype, alpha=alpha, beta=beta, c=c, trans_a=trans_a, trans_b=trans_b,
                  what=f"{m}x{n}x{k} ta={trans_a} tb={trans_b} splits={list(splits)} {engine.params}")
    return got


# -- every valid parameter set is correct ------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(PARAM_SETS))
def test_param_set_correct(device, engines, rng, name, dtype):
    params = PARAM_SETS[name]
    usable(device, params, dtype)
    e = engines(device, dtype, params)
    assert e.params == params and e.dtype == np.dtype(dtype)
    tm, tn, tk = params.tiles
    shapes = [
        (1, 1, 1),
        (tm - 1, tn + 1, tk + 1),          # just below / above the tiles
        (tm + 1, tn - 1, tk - 1) if tk > 1 else (tm + 1, tn - 1, 1),
        (2 * tm, 2 * tn, 3 * tk),          # exact multiples: the unpadded upload path
    ]
    for m, n, k in shapes:
        for trans_a in (False, True):
            for trans_b in (False, True):
                run(e, rng, m, n, k, trans_a=trans_a, trans_b=trans_b)
    # primes, in one transpose combination per set (all four run with test_shapes' parameters)
    combo = list(PARAM_SETS).index(name) % 4
    run(e, rng, 127, 1021, 509, trans_a=bool(combo & 1), trans_b=bool(combo & 2))
    # several k-blocks of uneven sizes, accumulated with beta * C
    run(e, rng, 2 * tm + 3, tn + 5, 3 * tk + 7, splits=(tk - 1, 2 * tk + 2), alpha=-0.75, beta=1.5, use_c=True)


# -- shapes, with the parameters the device would choose ----------------------
SHAPES = {
    "1x1": (1, 1, 1),
    "K=1": (37, 53, 1),
    "tall-skinny": (1500, 3, 5),
    "short-wide": (2, 1300, 7),
    "long-k": (3, 4, 1999),
    "vector-like": (1, 200, 150),
    "below-tiles": (31, 31, 15),
    "above-tiles": (65, 65, 17),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_shapes(device, engines, rng, shape, dtype):
    run(engines(device, dtype), rng, *shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans_a", [False, True], ids=["A", "At"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["B", "Bt"])
def test_transposes_with_k_blocks(device, engines, rng, dtype, trans_a, trans_b):
    run(engines(device, dtype), rng, 70, 45, 100, trans_a=trans_a, trans_b=trans_b, splits=(33, 64))
    run(engines(device, dtype), rng, 127, 1021, 509, trans_a=trans_a, trans_b=trans_b)   # primes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (2.5, -0.5), (-1.0, 0.25), (0.0, 2.0)])
def test_alpha_beta_c(device, engines, rng, dtype, alpha, beta):
    run(engines(device, dtype), rng, 50, 77, 40, alpha=alpha, beta=beta, use_c=True, splits=(16,))


# The GPU kernel (kernels/gemm.cl, GEMMK=0) with small tiles: a CPU device's default is the CPU kernel, so
# without this the GPU kernel's epilogue would be tested on GPUs only.
GPU_KERNEL = KernelParams(TSM=32, TSN=32, TSK=16, WPTM=4, WPTN=4, WIDTH=4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha,beta", [(2.5, -0.5), (0.0, 2.0)])
def test_alpha_beta_c_gpu_kernel(device, rng, dtype, alpha, beta):
    from conftest import engine_for

    run(engine_for(device, dtype, GPU_KERNEL), rng, 50, 77, 40, alpha=alpha, beta=beta, use_c=True, splits=(16,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_beta_zero_does_not_read_c(device, engines, rng, dtype):
    e = engines(device, dtype)
    a, b = randn(rng, (20, 30), dtype), randn(rng, (30, 25), dtype)
    c = np.full((20, 25), np.nan, dtype=dtype)
    poison(e)
    got = e.product([(a, b)], 20, 25, alpha=2.0, beta=0.0, c=c)
    check_product(got, a, b, dtype=dtype, alpha=2.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_k_zero(device, engines, rng, dtype):
    e = engines(device, dtype)
    poison(e)
    got = e.product([], 5, 7)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, np.zeros((5, 7)))
    # k-blocks of zero width contribute nothing either
    got = e.product([(np.empty((5, 0), dtype), np.empty((0, 7), dtype))], 5, 7)
    np.testing.assert_array_equal(got, np.zeros((5, 7)))
    c = randn(rng, (5, 7), dtype)
    got = e.product([], 5, 7, alpha=3.0, beta=-2.0, c=c)
    np.testing.assert_array_equal(got, (-2.0 * c.astype(np.float64)).astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n", [(0, 5), (5, 0), (0, 0)])
def test_empty_c(device, engines, rng, dtype, m, n):
    e = engines(device, dtype)
    got = e.product([(randn(rng, (m, 3), dtype), randn(rng, (3, n), dtype))], m, n)
    assert got.shape == (m, n) and got.dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_inf_propagate_like_numpy(device, engines, rng, dtype):
    e = engines(device, dtype)
    m, n, k = 40, 50, 35
    a, b = randn(rng, (m, k), dtype), randn(rng, (k, n), dtype)
    a[3, 5] = np.nan
    a[10, 7] = np.inf
    a[11, 8] = -np.inf
    b[20, 30] = np.inf
    b[21, 30] = -np.inf       # +Inf and -Inf in one column of C: NaN where both meet
    b[2, 44] = np.nan
    poison(e)
    got = e.product(k_blocks(a, b, m, n, k, (17,), False, False), m, n)
    ref, _ = reference(a, b)
    assert np.isnan(ref).any() and np.isinf(ref).any()
    assert_nonfinite_like(got, ref)


def test_float32_blocks_into_float64_engine(device, engines, rng):
    """Mixed inputs are promoted: a float64 engine takes float32 blocks."""
    e = engines(device, "float64")
    a, b = randn(rng, (33, 20), "float32"), randn(rng, (20, 41), "float64")
    poison(e)
    got = e.product([(a, b)], 33, 41)
    check_product(got, a, b, dtype="float64")


def test_lazy_pairs_generator(device, engines, rng):
    """``pairs`` may be a generator, consumed once, block by block."""
    e = engines(device, "float32")
    a, b = randn(rng, (30, 90), "float32"), randn(rng, (90, 20), "float32")
    seen = []

    def gen():
        for k0 in range(0, 90, 25):
            seen.append(k0)
            yield a[:, k0:k0 + 25], b[k0:k0 + 25, :]

    poison(e)
    got = e.product(gen(), 30, 20)
    assert seen == [0, 25, 50, 75]
    check_product(got, a, b, dtype="float32")


def test_block_shape_mismatch(device, engines, rng):
    e = engines(device, "float32")
    a, b = randn(rng, (10, 5), "float32"), randn(rng, (6, 7), "float32")
    with pytest.raises(ValueError, match=r"block shapes do not fit: A \(10, 5\), B \(6, 7\)"):
        e.product([(a, b)], 10, 7)
    with pytest.raises(ValueError, match="block shapes do not fit"):
        e.product([(randn(rng, (10, 6), "float32"), b)], 11, 7)   # m disagrees
    with pytest.raises(ValueError, match=r"C block has shape \(3, 3\), expected \(10, 7\)"):
        e.product([(randn(rng, (10, 6), "float32"), b)], 10, 7, beta=1.0, c=np.ones((3, 3), "float32"))


def test_stats_count_the_work(device, engines, rng):
    e = engines(device, "float64")
    before = {k: v for k, v in vars(e.stats).items() if k != "extra"}
    m, n, k = 30, 20, 50
    run(e, rng, m, n, k, splits=(10, 40))
    s = e.stats
    assert s.flops - before["flops"] == 2.0 * m * n * k
    assert s.blocks - before["blocks"] == 1
    assert s.bytes_down - before["bytes_down"] == m * n * 8
    assert s.bytes_up - before["bytes_up"] == (m * k + k * n) * 8
    assert s.kernel_seconds > before["kernel_seconds"]
    assert s.busy_seconds > before["busy_seconds"]


def test_release_and_reuse(device, rng):
    """A released engine allocates afresh on its next product."""
    e = BlockEngine(device, "float32")   # own engine: the session ones keep their buffers
    run(e, rng, 40, 40, 40)
    assert e._buffers
    e.release()
    assert e._buffers == {}
    run(e, rng, 70, 10, 33, trans_b=True)
    e.release()


class _LockWatch(BlockEngine):
    """Notes, at each transfer command it is told of, whether the engine's lock was held."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held_at_transfer = []

    def _transferred(self, event):
        if event is not None:
            self.held_at_transfer.append(self._lock.locked())


def test_a_product_lets_the_next_one_in_before_its_download_ends(device, rng):
    """The download is waited for outside the engine's lock (the next product's GEMMs queue behind it)."""
    e = _LockWatch(device, "float32")
    run(e, rng, 40, 24, 56, splits=(20,))
    assert e.held_at_transfer[-1] is False, e.held_at_transfer   # the download: waited for, the lock free
    assert e.held_at_transfer[-2] is True, e.held_at_transfer    # the unpadding before it: in the lock
    assert not e._lock.locked()
    e.release()


def test_products_from_two_threads_at_once_are_each_right(device, rng):
    """Two threads share one engine (two GEMM tasks per device): each product, on its own data, is right
    although the next one's kernels are enqueued while the last one's result is still coming down."""
    import concurrent.futures

    e = BlockEngine(device, "float64")
    cases = [(37 + 3 * i, 29 + 5 * (i % 3), 41 + 7 * i) for i in range(12)]
    data = [(randn(rng, (m, k), "float64"), randn(rng, (k, n), "float64")) for m, n, k in cases]

    def one(i):
        (m, n, k), (a, b) = cases[i], data[i]
        return e.product(k_blocks(a, b, m, n, k, (k // 2,), False, False), m, n)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(one, range(len(cases))))
    for (m, n, k), (a, b), c in zip(cases, data, got):
        check_product(c, a, b, dtype="float64", what=f"{m}x{n}x{k} from two threads")
    e.release()


def test_a_result_still_coming_down_is_not_overwritten(device, rng):
    """Downloads go on their own queue, from two result buffers used in turn: a third product, which reuses
    the first one's buffer, must wait for that download.  The downloads are held back by an event until the
    third product is enqueued, so a buffer reused too early gives the first product the third one's values."""
    import threading
    import time

    import pyopencl as cl

    e = BlockEngine(device, "float32")
    gate = cl.UserEvent(device.context)
    cl.enqueue_marker(device.download_queue, wait_for=[gate])
    cases = [(40, 24, 56), (24, 40, 32), (40, 24, 48)]   # the first and third use the same result buffer
    data = [(randn(rng, (m, k), "float32"), randn(rng, (k, n), "float32")) for m, n, k in cases]
    got = [None] * 3

    def one(i):
        (m, n, k), (a, b) = cases[i], data[i]
        got[i] = e.product([(a, b)], m, n)

    def waiting(test, what):
        end = time.monotonic() + 60
        while not test():
            assert time.monotonic() < end, f"timed out waiting for {what}"
            time.sleep(0.005)

    threads = []
    try:
        for i in range(3):
            before = list(e._downloads)
            threads.append(threading.Thread(target=one, args=(i,), daemon=True))
            threads[-1].start()
            waiting(lambda: e._downloads[i % 2] is not None and e._downloads[i % 2] is not before[i % 2],
                    f"product {i}'s download to be enqueued")
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
        for t in threads:
            t.join(60)
    for (m, n, k), (a, b), c in zip(cases, data, got):
        check_product(c, a, b, dtype="float32", what=f"{m}x{n}x{k} behind a held download")
    e.release()


def test_a_finish_on_another_queue_reads_the_result_after_the_events_it_is_given(device, rng):
    """``finish``'s ``after``: a finish that reads the result buffer on a queue of its own (as the device encode
    does) and waits for those events alone finds the whole product there, not the buffer's poison."""
    import pyopencl as cl

    e = BlockEngine(device, "float32")
    m, n, k = 96, 80, 3000      # long enough a product that a read ahead of it finds the buffer unwritten
    a, b = randn(rng, (m, k), "float32"), randn(rng, (k, n), "float32")
    e.product([(a[:, :8], b[:8])], m, n)       # allocate the buffers, then poison them
    poison(e)
    seen = []

    def finish(dense, done, after):
        seen.append(list(after or ()))
        out = np.empty((m, n), np.float32)
        cl.enqueue_copy(device.download_queue, out, dense, wait_for=after).wait()
        return out, out.nbytes
    got = e.stream([a], [b], m, n, finish=finish)
    assert seen and seen[0], "finish was given no events to wait for"
    check_product(got, a, b, dtype="float32", what="read on another queue after the events given")
    e.release()


def test_a_product_lets_the_next_one_in_before_its_finish_and_its_buffer_waits_for_it(device, rng):
    """With ``finish`` (the device encode of C's chunks), the next product comes in once the unpadding is
    enqueued; a third product, which reuses the first one's result buffer, waits until the first finish has
    returned.  The first finish is held back until the second product has ended and the third has started,
    so a buffer reused too early gives the first product the third one's values."""
    import threading
    import time

    import pyopencl as cl

    e = BlockEngine(device, "float32")
    cases = [(40, 24, 56), (24, 40, 32), (40, 24, 48)]   # the first and third use the same result buffer
    data = [(randn(rng, (m, k), "float32"), randn(rng, (k, n), "float32")) for m, n, k in cases]
    got, ended = [None] * 3, [threading.Event() for _ in range(3)]
    entered, proceed = threading.Event(), threading.Event()

    def one(i):
        m, n, _ = cases[i]

        def finish(dense, done, after):
            if i == 0:
                entered.set()
                assert proceed.wait(60), "the first finish was never let go"
            out = np.empty((m, n), np.float32)
            cl.enqueue_copy(device.download_queue, out, dense, wait_for=after).wait()   # (on another queue)
            return out, out.nbytes
        a, b = data[i]
        got[i] = e.stream([a], [b], m, n, finish=finish)
        ended[i].set()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(3)]
    try:
        threads[0].start()
        assert entered.wait(60), "the first product never reached its finish"
        threads[1].start()
        assert ended[1].wait(30), "the second product did not come in while the first one's finish was held"
        assert e.release(wait=False) is False, "the engine's buffers released under a finish still running"
        threads[2].start()
        time.sleep(0.3)
        assert not ended[2].is_set(), "the third product reused the first one's buffer before its finish returned"
    finally:
        proceed.set()
        for t in threads:
            t.join(60)
    for (m, n, k), (a, b), c in zip(cases, data, got):
        check_product(c, a, b, dtype="float32", what=f"{m}x{n}x{k} behind a held finish")
    assert e.release()


def test_roundup():
    assert [roundup(x, 16) for x in (0, 1, 15, 16, 17, 32)] == [0, 16, 16, 16, 32, 32]


# -- property test: random shapes, k-splits, transposes, parameter sets -------
VALID = [p for p in PARAM_SETS.values()]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_products(device, engines, data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    params = data.draw(st.sampled_from(VALID), label="params")
    if params.problems(np.dtype(dtype).itemsize, device.info.max_work_group_size, device.info.local_mem):
        return   # beyond this device's limits (test_param_set_correct reports those as skips)
    if dtype == "float64" and not device.info.fp64:
        return
    m, n, k = (data.draw(st.integers(1, 150), label=x) for x in "mnk")
    splits = sorted(data.draw(st.sets(st.integers(1, k - 1), max_size=4), label="splits")) if k > 1 else []
    trans_a, trans_b = data.draw(st.booleans(), label="trans_a"), data.draw(st.booleans(), label="trans_b")
    use_c = data.draw(st.booleans(), label="use_c")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    run(engines(device, dtype, params), np.random.default_rng(seed), m, n, k, trans_a=trans_a,
        trans_b=trans_b, splits=splits, use_c=use_c, alpha=1.25, beta=-0.5 if use_c else 0.0)


# -- on a GPU (skipped elsewhere) ---------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_product_on_the_gpu(engines, rng, dtype):
    from dgemm.opencl.discovery import list_devices
    from conftest import get_device

    info = next(d for d in list_devices() if d.type == "GPU")
    e = engines(get_device(info), dtype)
    m, n, k = 3000, 2500, 4100
    run(e, rng, m, n, k, splits=(1024, 3000))
    run(e, rng, m, n, k, trans_a=True, trans_b=True, alpha=0.5, beta=2.0, use_c=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("groupm", [1, 3, 8])
def test_grouped_work_group_order_covers_every_tile(device, dtype, groupm, rng):
    """GROUPM only reorders work-groups: every tile of C must still be computed once (NaN-poisoned C)."""
    params = KernelParams(TSM=32, TSN=32, TSK=8, WPTM=4, WPTN=4, WIDTH=2, GROUPM=groupm)
    engine = BlockEngine(device, dtype, params)
    m, n, k = 32 * 7 + 5, 32 * 3 + 1, 40   # 8 x 4 tiles: bands of GROUPM rows, the last one partial
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    engine.product([(a, b)], m, n)           # allocate the buffers, then poison them
    poison(engine)
    out = engine.product([(a, b)], m, n)
    ref = a @ b
    assert np.all(np.isfinite(out))
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < (1e-5 if dtype == "float32" else 1e-13)


@pytest.mark.gpu
def test_tensor_core_paths_against_numpy_and_the_fma_kernel(gpu_device, rng):
    """On a GPU with tensor cores: DMMA is float64-exact class, 3xTF32 at least as accurate as the
    FMA kernel (normal and wide-range data), TF32 within TF32's bound; edge blocks, alpha/beta, transposes."""
    from dgemm.accuracy import tolerance
    dev = gpu_device
    if not dev.info.dmma:
        pytest.skip(f"{dev.info.name} has no tensor-core paths (needs NVIDIA compute capability >= 8.0)")
    m, n, ks = 1000, 700, (900, 333)

    def data(dtype, trans, wide=False):
        A = [rng.standard_normal((k, m) if trans[0] else (m, k)) for k in ks]
        B = [rng.standard_normal((n, k) if trans[1] else (k, n)) for k in ks]
        if wide:  # entries spread over 2^-16 .. 2^16
            A = [a * np.exp2(rng.uniform(-16, 16, a.shape)) for a in A]
            B = [b * np.exp2(rng.uniform(-16, 16, b.shape)) for b in B]
        C = rng.standard_normal((m, n))
        return [a.astype(dtype) for a in A], [b.astype(dtype) for b in B], C.astype(dtype)

    def err(dtype, precision, A, B, C, trans):
        engine = BlockEngine(dev, dtype, dev.choice(dtype, precision).params)
        params = engine.params   # what was built (the database's choice, or what stands in for it)
        out = engine.product(zip(A, B), m, n, alpha=1.5, beta=-0.5, c=C, trans_a=trans[0], trans_b=trans[1])
        f = [x.astype(np.float64) for x in (*A, *B)]
        A64, B64 = f[:len(A)], f[len(A):]
        ref = 1.5 * sum((a.T if trans[0] else a) @ (b.T if trans[1] else b) for a, b in zip(A64, B64)) \
            - 0.5 * C.astype(np.float64)
        return params, float(np.linalg.norm(out - ref) / np.linalg.norm(ref))

    trans = (True, False)
    p, e = err("float64", None, *data("float64", trans), trans)
    assert p.precision == "dmma" and e < 1e-13
    for wide in (False, True):
        A, B, C = data("float32", (False, False), wide)
        p_fma, e_fma = err("float32", "fma", A, B, C, (False, False))
        p3, e3 = err("float32", "3xtf32", A, B, C, (False, False))
        assert p_fma.precision == "fma" and p3.precision == "3xtf32"
        if dev.info.compute_capability == 90:   # Hopper: the wgmma 3xTF32 kernel ran
            assert p3.k_major and not dev.failed, dev.failed
        assert e3 <= e_fma * 1.05, (wide, e3, e_fma)   # the claim the README makes
    for trans in ((False, False), (False, True), (True, False), (True, True)):
        p, e = err("float32", "tf32", *data("float32", trans), trans)
        assert p.precision == "tf32" and e < tolerance("float32", sum(ks), "tf32"), (trans, p, e)
        if dev.info.compute_capability == 90:   # Hopper: the wgmma kernel (PTX route) ran, not its stand-in
            assert p.k_major and not dev.failed, dev.failed


# -- streaming from block references, with the device's panel cache ------------
@pytest.fixture
def cached(any_device):
    """The device with a panel cache of ``budget`` bytes (set by the test), emptied afterwards."""
    cache = any_device.cache
    saved = cache.budget
    cache.clear()
    yield any_device
    cache.budget = saved
    cache.clear()
    assert all(e.pins == 0 for e in cache._entries.values())


def zarr_refs(tmp_path, rng, name, shape, chunks, k_bounds, axis, fixed, dtype="float64"):
    """A random Zarr matrix and the references to its k blocks (``axis``: which axis k runs along)."""
    import zarr
    from dgemm.storage import ZarrBlock

    arr = zarr.create_array(store=str(tmp_path / name), shape=shape, chunks=chunks, dtype=dtype)
    arr[...] = randn(rng, shape, dtype)
    refs = [ZarrBlock(arr, kb, fixed) if axis == 0 else ZarrBlock(arr, fixed, kb) for kb in k_bounds]
    return arr[...], refs


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True)])
def test_stream_from_zarr_matches_numpy(cached, engines, tmp_path, rng, trans_a, trans_b):
    """Irregular k blocks read in the pool, staged in the cache, accumulated: poisoned accumulators stay unseen."""
    m, n, k = 45, 70, 100
    ks = ((0, 33), (33, 64), (64, 100))
    e = engines(cached, "float64")
    poison(e)
    cached.cache.budget = 1 << 30
    a, a_refs = zarr_refs(tmp_path, rng, "a.zarr", (k, m) if trans_a else (m, k), (17, 29), ks,
                          0 if trans_a else 1, (0, m))
    b, b_refs = zarr_refs(tmp_path, rng, "b.zarr", (n, k) if trans_b else (k, n), (31, 23), ks,
                          1 if trans_b else 0, (0, n))
    c = randn(rng, (m, n))
    got = e.stream(a_refs, b_refs, m, n, alpha=0.5, beta=2.0, c=c, trans_a=trans_a, trans_b=trans_b, scope="t")
    check_product(got, a, b, alpha=0.5, beta=2.0, c=c, dtype="float64", trans_a=trans_a, trans_b=trans_b)


def test_blocks_padded_on_the_device_reuse_the_source_buffers_once_free(cached, engines, tmp_path, rng):
    """Blocks uploaded to be padded or transposed go through source buffers that come back once the kernel
    reading them ran (dgemm.opencl.spares): a second product (another scope, every block read again) takes them
    again, poisoned first, and both products are right; the device's trim gives them back."""
    from dgemm.opencl import device as device_module

    m, n, k = 45, 70, 100
    ks = ((0, 25), (25, 50), (50, 75), (75, 100))   # (blocks of one size: each may take another's buffer)
    e = engines(cached, "float64")
    cached.cache.budget = 1 << 30
    a, a_refs = zarr_refs(tmp_path, rng, "a.zarr", (k, m), (25, 45), ks, 0, (0, m))          # A stored transposed
    b, b_refs = zarr_refs(tmp_path, rng, "b.zarr", (k, n), (25, 70), ks, 0, (0, n))
    e.release()
    cached.trim(keep_pinned=True)
    before = cached.live_buffers()
    with device_module.poisoned():
        first = e.stream(a_refs, b_refs, m, n, trans_a=True, scope="first")
        reused = cached.spares.reused
        assert cached.spares.held() > 0, "no source buffer came back"
        second = e.stream(a_refs, b_refs, m, n, trans_a=True, scope="second")
    check_product(first, a, b, dtype="float64", trans_a=True)
    check_product(second, a, b, dtype="float64", trans_a=True, what="with the buffers taken again")
    assert cached.spares.reused > reused
    e.release()
    cached.trim(keep_pinned=True)
    assert cached.spares.held() == 0 and cached.live_buffers()["buffers"] == before["buffers"]


@pytest.mark.parametrize("inline", [False, True], ids=["own-queue", "inline"])
def test_feeding_kernels_go_where_queue_priority_says(cached, engines, tmp_path, rng, monkeypatch, inline):
    """``queue-priority: inline`` puts the padding and transposing kernels into the GEMM kernels' queue (else
    the transfer queue their uploads went to); the product is right either way, accumulators poisoned."""
    m, n, k = 45, 70, 100
    ks = ((0, 33), (33, 64), (64, 100))
    e = engines(cached, "float64")
    poison(e)
    cached.cache.budget = 1 << 30
    monkeypatch.setattr(cached, "inline_feeding", inline)
    queues = []
    for name in ("pad_zeros", "transpose_pad"):
        def spy(q, *args, _kernel=getattr(e.k, name), **kw):
            queues.append(q)
            return _kernel(q, *args, **kw)
        monkeypatch.setattr(e.k, name, spy)
    a, a_refs = zarr_refs(tmp_path, rng, "a.zarr", (k, m), (17, 29), ks, 0, (0, m))          # A stored transposed
    b, b_refs = zarr_refs(tmp_path, rng, "b.zarr", (k, n), (31, 23), ks, 0, (0, n))
    got = e.stream(a_refs, b_refs, m, n, trans_a=True, scope=("inline", inline))
    check_product(got, a, b, dtype="float64", trans_a=True)
    assert len(queues) == 2 * len(ks)                          # every block padded or transposed on the device
    assert all(q is (cached.queue if inline else cached.transfer_queue) for q in queues)


def test_stream_reads_each_block_once_per_scope(cached, tmp_path, rng):
    """A second product in the same scope is served from the device; another scope reads again."""
    m, n, k = 40, 30, 60
    ks = ((0, 20), (20, 40), (40, 60))
    e = BlockEngine(cached, "float32")
    cached.cache.budget = 1 << 30
    a, a_refs = zarr_refs(tmp_path, rng, "a.zarr", (m, k), (20, 20), ks, 1, (0, m), "float32")
    b, b_refs = zarr_refs(tmp_path, rng, "b.zarr", (k, n), (20, 30), ks, 0, (0, n), "float32")
    first = e.stream(a_refs, b_refs, m, n, scope="run1")
    read = e.stats.bytes_read
    assert read == (m * k + k * n) * 4
    hits = cached.cache.hits
    again = e.stream(a_refs, b_refs, m, n, scope="run1")
    assert e.stats.bytes_read == read and cached.cache.hits == hits + 6
    np.testing.assert_array_equal(again, first)
    e.stream(a_refs, b_refs, m, n, scope="run2")     # a new run never trusts blocks of an old one
    assert e.stats.bytes_read == 2 * read
    check_product(first, a, b, dtype="float32")


def test_stream_stays_within_the_cache_budget(cached, tmp_path, rng):
    """With room for two staged blocks, older blocks are evicted and the result is still right."""
    m = n = 32
    ks = tuple((s, s + 16) for s in range(0, 128, 16))
    e = BlockEngine(cached, "float32")
    p = e.params
    staged = roundup(16, p.TSK) * max(roundup(m, p.TSM), roundup(n, p.TSN)) * 4
    cached.cache.budget = 2 * staged
    a, a_refs = zarr_refs(tmp_path, rng, "a.zarr", (m, 128), (32, 16), ks, 1, (0, m), "float32")
    b, b_refs = zarr_refs(tmp_path, rng, "b.zarr", (128, n), (16, 32), ks, 0, (0, n), "float32")
    got = e.stream(a_refs, b_refs, m, n, scope="s", prefetch=1)
    assert cached.cache.bytes <= 2 * staged and cached.cache.evictions >= len(ks) * 2 - 2
    check_product(got, a, b, dtype="float32")


def test_stream_reads_the_prefetch_setting_when_it_starts(cached, tmp_path, rng, monkeypatch):
    """Without ``prefetch=``, each product reads the ``prefetch`` setting then: a later change counts."""
    import dask

    import dgemm.opencl.engine as engine_mod

    monkeypatch.delenv("DGEMM_PREFETCH", raising=False)
    seen = []
    monkeypatch.setattr(engine_mod, "default_prefetch",
                        lambda real=engine_mod.default_prefetch: seen.append(real()) or seen[-1])
    m = n = 16
    ks = ((0, 16), (16, 32))
    e = BlockEngine(cached, "float32")
    cached.cache.budget = 1 << 30
    a, a_refs = zarr_refs(tmp_path, rng, "a.zarr", (m, 32), (16, 16), ks, 1, (0, m), "float32")
    b, b_refs = zarr_refs(tmp_path, rng, "b.zarr", (32, n), (16, 16), ks, 0, (0, n), "float32")
    for steps in (1, 3):
        with dask.config.set({"dgemm.prefetch": steps}):
            got = e.stream(a_refs, b_refs, m, n, scope=f"p{steps}")
        check_product(got, a, b, dtype="float32")
    assert seen == [1, 3]


def test_stream_read_error_names_the_block_and_is_not_kept(cached, tmp_path, rng):
    """A damaged chunk fails the product with its array and region, and leaves nothing pinned or cached."""
    m, n, k = 16, 16, 32
    ks = ((0, 16), (16, 32))
    e = BlockEngine(cached, "float32")
    cached.cache.budget = 1 << 30
    a, a_refs = zarr_refs(tmp_path, rng, "a.zarr", (m, k), (16, 16), ks, 1, (0, m), "float32")
    b, b_refs = zarr_refs(tmp_path, rng, "b.zarr", (k, n), (16, 16), ks, 0, (0, n), "float32")
    chunk = tmp_path / "b.zarr" / "c" / "1" / "0"
    assert chunk.exists()
    chunk.write_bytes(b"not a chunk")
    with pytest.raises(OSError, match=r"b\.zarr.*rows 16:32"):
        e.stream(a_refs, b_refs, m, n, scope="bad")
    assert not any(key[1] == b_refs[1].key() for key in cached.cache.keys())


def test_stream_reads_the_next_product_ahead(cached, tmp_path, rng):
    """``ahead`` puts the next product's first blocks in the cache; running it then reads only the rest."""
    m, n, k = 32, 32, 64
    ks = ((0, 16), (16, 32), (32, 48), (48, 64))
    e = BlockEngine(cached, "float32")
    cached.cache.budget = 1 << 30
    a, a_refs = zarr_refs(tmp_path, rng, "a.zarr", (m, k), (32, 16), ks, 1, (0, m), "float32")
    b, b_refs = zarr_refs(tmp_path, rng, "b.zarr", (k, 2 * n), (16, 32), ks, 0, (0, n), "float32")
    b2_refs = [type(r)(r.array, r.rows, (n, 2 * n)) for r in b_refs]      # the next C block: B's next columns
    e.stream(a_refs, b_refs, m, n, scope="p", ahead=[(r, "b", n) for r in b2_refs[:2]], prefetch=2)
    for f in [en.future for en in cached.cache._entries.values()]:
        f.result()
    read = e.stats.bytes_read
    got = e.stream(a_refs, b2_refs, m, n, scope="p", prefetch=2)
    assert e.stats.bytes_read - read == 2 * 16 * n * 4          # B blocks 3 and 4 only; A is cached
    check_product(got, a, b[:, n:], dtype="float32")


def test_stream_reads_chunks_without_zarr(cached, tmp_path, rng, monkeypatch):
    """Raw and zstd chunks, edge blocks included, go file -> (decoded into) page-locked memory -> device."""
    import zarr

    m, n, k = 40, 24, 50                      # k: chunks of 16, the last cut short (an edge block)
    ks = ((0, 16), (16, 32), (32, 48), (48, 50))
    e = BlockEngine(cached, "float32")
    cached.cache.budget = 1 << 30
    a, a_refs = zarr_refs(tmp_path, rng, "a.zarr", (m, k), (40, 16), ks, 1, (0, m), "float32")
    b, b_refs = zarr_refs(tmp_path, rng, "b.zarr", (k, n), (16, 24), ks, 0, (0, n), "float32")
    for name in ("a.zarr", "b.zarr"):     # make them raw: no compressor (zarr_refs used the default)
        arr = zarr.open_array(str(tmp_path / name))
        raw = zarr.create_array(store=str(tmp_path / ("raw-" + name)), shape=arr.shape, chunks=arr.chunks,
                                dtype=arr.dtype, compressors=None)
        raw[...] = arr[...]
    a_raw = [type(r)(zarr.open_array(str(tmp_path / "raw-a.zarr")), r.rows, r.cols) for r in a_refs]
    b_raw = [type(r)(zarr.open_array(str(tmp_path / "raw-b.zarr")), r.rows, r.cols) for r in b_refs]
    through_zarr = []
    for owner, name in ((zarr.Array, "__getitem__"), (zarr.AsyncArray, "getitem")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *args, real=real, **kw: through_zarr.append(args) or real(*args, **kw))
    got = e.stream(a_raw, b_raw, m, n, scope="raw")
    check_product(got, a, b, dtype="float32")
    check_product(e.stream(a_refs, b_refs, m, n, scope="zstd"), a, b, dtype="float32")
    assert through_zarr == []


class SelfReading:
    """A block that reads itself, as the engine knows one (no storage): it fills what it is given."""

    def __init__(self, data, dtype=None, fail=None):
        self.data, self.fail, self.filled = data, fail, []
        self.shape, self.dtype, self.copies = data.shape, np.dtype(dtype or data.dtype), False

    def key(self):
        return ("self-reading", id(self))

    def fill_into(self, out):
        self.filled.append((out, bool(np.isnan(out).all())))   # poisoned: the device lent it (staging)
        if self.fail is not None:
            raise self.fail
        out[...] = self.data
        return None


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blocks_that_read_themselves_fill_staging_memory(cached, rng, dtype):
    """The engine reads a block by its one call, ``fill_into``, into this thread's page-locked staging
    buffer where the dtypes agree (a host array where they do not); the block's error is the product's."""
    m, n, k = 24, 20, 16
    e = BlockEngine(cached, dtype)
    cached.cache.budget = 1 << 30
    a, b = randn(rng, (m, k), "float32"), randn(rng, (k, n), dtype)
    ra, rb = SelfReading(a), SelfReading(b)
    check_product(e.stream([ra], [rb], m, n, scope="self"), a, b, dtype=dtype)
    assert e.stats.bytes_read == a.nbytes + b.nbytes and e.stats.extra.get("host_cache_misses", 0) == 0
    [(out_a, staged_a)], [(out_b, staged_b)] = ra.filled, rb.filled
    assert staged_b and out_b.dtype == np.dtype(dtype) and out_b.shape == (k, n)
    assert staged_a == (dtype == "float32") and out_a.dtype == np.float32   # into float64: converted on upload
    bad = SelfReading(b, fail=OSError("dgemm could not read the test's block"))
    with pytest.raises(OSError, match="^dgemm could not read the test's block$"):
        e.stream([SelfReading(a)], [bad], m, n, scope="self")
    assert not any(key[1] == bad.key() for key in cached.cache.keys())


def test_blocks_are_staged_in_the_layout_the_kernel_takes():
    """A^T (k x m) and B (k x n) for the kernels of gemm.cl and gemm_dmma.cl; A (m x k) and B^T (n x k),
    K-major, for the wgmma kernel: what each block's transpose is, given how it is stored."""
    from types import SimpleNamespace

    fma = SimpleNamespace(params=KernelParams(TSK=16))
    wg = SimpleNamespace(params=KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=5))
    layout = BlockEngine._layout
    # side, stored transposed?, k, padded extent -> (transpose on upload, rows, cols)
    assert layout(fma, "a", False, 100, 128) == (True, 112, 128)     # A stored m x k -> A^T
    assert layout(fma, "a", True, 100, 128) == (False, 112, 128)     # stored k x m already
    assert layout(fma, "b", False, 100, 64) == (False, 112, 64)
    assert layout(fma, "b", True, 100, 64) == (True, 112, 64)
    assert layout(wg, "a", False, 100, 128) == (False, 128, 128)     # A as stored, K padded to 32
    assert layout(wg, "a", True, 100, 256) == (True, 256, 128)
    assert layout(wg, "b", False, 100, 384) == (True, 384, 128)      # B stored k x n -> B^T
    assert layout(wg, "b", True, 100, 384) == (False, 384, 128)


def test_a_product_asked_of_the_wgmma_kernel_where_it_cannot_run_is_right(any_device, rng):
    """Off Hopper the wgmma parameters are replaced by the kernels that stand in for them, and the engine
    stages the blocks for those (its layout follows what was built, not what was asked)."""
    from dgemm.opencl.device import Device

    dev = Device(any_device.info)
    wg = KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=5, GROUPM=8)
    engine = BlockEngine(dev, np.float32, wg)
    if engine.params.k_major and wg not in dev.failed:     # (DGEMM_TEST_ANY_DEVICE=gpu on a Hopper GPU)
        pytest.skip(f"{dev.info.name} runs the wgmma kernel: nothing stands in for it")
    assert not engine.params.k_major and wg in dev.failed
    a, b = randn(rng, (70, 45), np.float32), randn(rng, (45, 33), np.float32)
    check_product(engine.product([(a, b)], 70, 33), a, b, dtype="float32")


@pytest.mark.gpu
def test_the_wgmma_engine_rounds_its_operands_to_tf32_and_leaves_c_alone(gpu_device, rng):
    """The wgmma kernel's operands are rounded to TF32 (to nearest) where they are staged; C, added
    with beta, keeps float32: a product of tiny operands onto a large C is float32-accurate on C."""
    import pyopencl as cl

    dev = gpu_device
    engine = BlockEngine(dev, np.float32, dev.choice(np.float32, "tf32").params)
    if not engine.params.k_major:
        pytest.skip(f"{dev.info.name}: no wgmma kernel here ({dev.failed or 'not sm_90'})")
    x = rng.standard_normal((256, 96)).astype(np.float32)
    buf, ev = engine.upload(x, False, 256, 128)
    if ev is not None:
        ev.wait()
    got = np.empty((256, 128), np.float32)
    cl.enqueue_copy(dev.transfer_queue, got, buf, is_blocking=True)
    want = tf32(x)   # to nearest, half away from zero
    np.testing.assert_array_equal(got[:, :96], want)
    assert not got[:, 96:].any()
    a, b = 1e-6 * randn(rng, (300, 200), np.float32), 1e-6 * randn(rng, (200, 250), np.float32)
    c = randn(rng, (300, 250), np.float32)
    out = engine.product([(a, b)], 300, 250, beta=3.0, c=c)
    ref = a.astype(np.float64) @ b + 3.0 * c.astype(np.float64)
    assert np.abs(out - ref).max() <= 4 * np.finfo(np.float32).eps * np.abs(ref).max()

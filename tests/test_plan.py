"""Planning: block sizes, coverage of C and of the k range, k splitting."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgemm.client.plan import block_size, bounds, make_plan
from dgemm.sizes import working_set


def assert_partition(pieces, extent):
    """``pieces`` cover ``range(extent)`` exactly, in order, without overlap."""
    if extent == 0:
        assert pieces == ()
        return
    assert pieces[0][0] == 0 and pieces[-1][1] == extent
    for (a0, a1), (b0, b1) in zip(pieces, pieces[1:]):
        assert a1 == b0
    assert all(a < b for a, b in pieces)


@pytest.mark.parametrize("extent,size", [(10, 4), (8, 4), (1, 4), (4, 1), (0, 3), (7, 100)])
def test_bounds(extent, size):
    b = bounds(extent, size)
    assert_partition(b, extent)
    assert all(hi - lo == size for lo, hi in b[:-1])


def test_block_size_rules():
    assert block_size(10000, 4096, 64) == 4096
    assert block_size(10000, 4000, 64) == 3968                  # rounded down to the tile
    assert block_size(10000, 4096, 96) == 4032
    assert block_size(10000, 4096, 64, chunk=1000) == 8000      # lcm 8000 <= 2 x target: whole chunks
    assert block_size(10000, 4096, 64, chunk=9000) == 4096      # lcm 72000 too big: tile only
    assert block_size(32768, 4096, 256, chunk=8192) == 8192     # never cut a chunk into quarters
    assert block_size(10000, 4096, 64, chunk=1536) == 3072      # lcm(64, 1536) = 1536
    assert block_size(10000, 4096, 64, chunk=33) == 2112        # lcm 2112 <= 4096 ...
    assert block_size(10000, 4300, 64, chunk=33) == 4224        # ... whole multiples of 2112
    assert block_size(300, 4096, 64) == 300                     # the whole extent when smaller
    assert block_size(0, 4096, 64) == 1
    assert block_size(1000, 10, 64) == 64                       # never below one tile


@settings(max_examples=200, deadline=None)
@given(extent=st.integers(1, 10**6), target=st.integers(1, 8192), tile=st.sampled_from([8, 16, 32, 48, 64, 96]),
       chunk=st.one_of(st.none(), st.integers(1, 5000)))
def test_block_size_properties(extent, target, tile, chunk):
    b = block_size(extent, target, tile, chunk)
    if b == extent:
        assert extent <= max(target, tile, math.lcm(tile, chunk) if chunk else tile)
    else:
        assert b % tile == 0 and b < extent
        whole_chunks = chunk and math.lcm(tile, chunk) <= 2 * max(target, tile)
        assert b <= max(target, tile, math.lcm(tile, chunk) if whole_chunks else tile)
        if whole_chunks:
            assert b % chunk == 0


@settings(max_examples=200, deadline=None)
@given(m=st.integers(0, 3000), n=st.integers(0, 3000), k=st.integers(0, 3000),
       tiles=st.sampled_from([(32, 32, 16), (64, 64, 8), (96, 64, 16)]),
       target=st.one_of(st.integers(16, 1024), st.tuples(*[st.integers(16, 1024)] * 3)),
       a_chunks=st.tuples(st.one_of(st.none(), st.integers(1, 500)), st.one_of(st.none(), st.integers(1, 500))),
       b_chunks=st.tuples(st.one_of(st.none(), st.integers(1, 500)), st.one_of(st.none(), st.integers(1, 500))),
       n_workers=st.integers(1, 8))
def test_plan_covers_everything(m, n, k, tiles, target, a_chunks, b_chunks, n_workers):
    p = make_plan(m, n, k, "float32", tiles, a_chunks=a_chunks, b_chunks=b_chunks, target=target,
                  n_workers=n_workers)
    assert (p.m, p.n, p.k, p.dtype, p.tiles) == (m, n, k, np.dtype("float32"), tiles)
    assert_partition(p.rows, m)
    assert_partition(p.cols, n)
    assert_partition(p.ks, k)
    # segments partition the k-blocks (one empty segment when there are none)
    if p.ks:
        assert_partition(p.segments, len(p.ks))
    else:
        assert p.segments == ((0, 0),)
    n_c = len(p.rows) * len(p.cols)
    if len(p.segments) > 1:
        assert n_c < n_workers and len(p.segments) <= len(p.ks)
    if 0 < n_c < n_workers and len(p.ks) > 1:
        # enough segments for every worker to have a C block or a k segment, each non-empty
        assert len(p.segments) == min(len(p.ks), -(-n_workers // n_c))
        assert all(s1 > s0 for s0, s1 in p.segments)
        sizes = [s1 - s0 for s0, s1 in p.segments]
        assert max(sizes) - min(sizes) <= 1
    assert p.n_tasks == n_c * len(p.segments)
    assert p.flops == 2.0 * m * n * k


def test_k_split_when_fewer_c_blocks_than_workers():
    p = make_plan(100, 100, 1000, "float32", (64, 64, 16), target=256, n_workers=2)
    assert len(p.rows) == len(p.cols) == 1
    assert p.segments == ((0, 2), (2, 4)) and p.n_tasks == 2
    p = make_plan(100, 100, 1000, "float32", (64, 64, 16), target=256, n_workers=8)
    assert len(p.segments) == 4                       # no more segments than k-blocks
    p = make_plan(100, 100, 1000, "float32", (64, 64, 16), target=256, n_workers=3)
    assert p.segments == ((0, 1), (1, 2), (2, 4))     # three workers: three segments
    p = make_plan(100, 100, 1000, "float32", (64, 64, 16), target=256, n_workers=1)
    assert p.segments == ((0, 4),)
    p = make_plan(100, 100, 100, "float32", (64, 64, 16), target=256, n_workers=4)
    assert p.segments == ((0, 1),)                    # one k-block: nothing to split


def test_blocks_follow_storage_chunks_and_tiles():
    p = make_plan(1000, 1000, 1000, "float64", (32, 32, 16), a_chunks=(96, 200), b_chunks=(200, 64),
                  target=400)
    assert p.block_shape == (384, 384, 400)
    p = make_plan(1000, 1000, 1000, "float64", (32, 32, 16), a_chunks=(96, 200), b_chunks=(200, 64),
                  target=300)
    assert p.block_shape == (288, 256, 400)     # lcm(16, 200) = 400 <= 2 x 300: whole k chunks
    p = make_plan(1000, 1000, 1000, "float64", (32, 32, 16), a_chunks=(96, 200), b_chunks=(200, 64),
                  target=150, exact=True)
    assert p.block_shape == (96, 128, 144)      # the user's block size: 400 > 150, the k tile only
    p = make_plan(1000, 1000, 1000, "float64", (32, 32, 16), a_chunks=(96, 200), b_chunks=(200, 64),
                  target=150)
    # 400 > 2 x 150, but its panels, 400 x (96 + 128), are within 4 x the target block's: whole k chunks
    assert p.block_shape == (96, 128, 400)
    p = make_plan(1000, 1000, 1000, "float64", (32, 32, 16), a_chunks=(192, 800), b_chunks=(800, 192),
                  target=150)
    assert p.block_shape == (192, 192, 144)     # 800 x 384 > 4 x 300 x 150: the chunks along k are cut
    # different k-chunkings of A and B: blocks follow their common multiple when that is small
    p = make_plan(500, 500, 1000, "float32", (32, 32, 16), a_chunks=(None, 48), b_chunks=(80, None), target=300)
    assert p.block_shape[2] == 240


def test_out_chunks_fix_c_blocks():
    p = make_plan(300, 200, 100, "float32", (64, 64, 16), out_chunks=(37, 50), target=1024)
    assert p.block_shape[:2] == (37, 50)
    assert len(p.rows) == 9 and len(p.cols) == 4


def test_empty_and_degenerate():
    p = make_plan(0, 10, 10, "float32", (32, 32, 16))
    assert p.rows == () and p.n_tasks == 0 and p.block_shape[0] == 0
    p = make_plan(10, 10, 0, "float32", (32, 32, 16))
    assert p.ks == () and p.segments == ((0, 0),) and p.n_tasks == 1
    p = make_plan(1, 1, 1, "float64", (32, 32, 16))
    assert p.rows == p.cols == p.ks == ((0, 1),)


def test_explain_and_bytes():
    p = make_plan(1000, 600, 700, "float32", (64, 64, 16), target=256, n_workers=2)
    assert p.bytes_read() == 4 * (1000 * 700 * len(p.cols) + 700 * 600 * len(p.rows))
    text = p.explain()
    assert "C[1000 x 600] = A[1000 x 700] @ B[700 x 600]  (float32)" in text
    assert "grid: 4 x 3 C blocks, 3 k-blocks" in text and "12 GEMM tasks" in text
    assert f"{p.flops / 1e9:.3f} GFLOP" in text


# -- limits: 32-bit indexing and device memory ----------------------------------
def test_huge_dimensions_are_split_within_32_bit_indexing():
    """Whatever the size asked for, every padded block buffer stays below 2**31 elements."""
    from dgemm.sizes import index_overflow
    from dgemm.sizes import INT32_MAX

    p = make_plan(10**6, 10**6, 10**6, "float32", (64, 64, 16), target=10**6)
    bm, bn, bk = p.block_shape
    assert index_overflow(bm, bn, bk, (64, 64, 16)) is None
    assert bm * bn <= INT32_MAX and bm * bk <= INT32_MAX and bk * bn <= INT32_MAX
    assert len(p.rows) > 1 and len(p.cols) > 1 and "blocks shrunk: a C block of" in p.explain()
    # a long thin product: only the long axis needs splitting
    p = make_plan(3 * 10**9, 2, 3, "float64", (64, 64, 16), target=(10**10, 64, 64))
    assert p.block_shape[0] * 64 <= INT32_MAX and len(p.rows) > 1


@settings(max_examples=150, deadline=None)
@given(m=st.integers(1, 10**7), n=st.integers(1, 10**7), k=st.integers(1, 10**7),
       tiles=st.sampled_from([(32, 32, 16), (64, 64, 8), (96, 64, 16), (128, 128, 32)]),
       target=st.tuples(*[st.integers(16, 10**6)] * 3),
       memory=st.one_of(st.none(), st.integers(2**20, 2**36)),
       dtype=st.sampled_from(["float32", "float64"]))
def test_blocks_respect_every_limit(m, n, k, tiles, target, memory, dtype):
    from dgemm.errors import PlanError
    from dgemm.sizes import MEMORY_FRACTION, index_overflow, working_set

    try:
        p = make_plan(m, n, k, dtype, tiles, target=target, device_memory=memory)
    except PlanError as e:
        # only when even one tile does not fit
        assert memory is not None and "no blocking" in str(e)
        assert working_set(min(m, tiles[0]), min(n, tiles[1]), min(k, tiles[2]), tiles,
                           np.dtype(dtype).itemsize)[0] > MEMORY_FRACTION * memory
        return
    bm, bn, bk = p.block_shape
    assert index_overflow(bm, bn, bk, tiles) is None
    if memory is not None:
        assert p.device_bytes() <= MEMORY_FRACTION * memory
    assert_partition(p.rows, m)
    assert_partition(p.cols, n)
    assert_partition(p.ks, k)


def test_small_device_memory_shrinks_blocks():
    from dgemm.sizes import working_set

    tiles = (64, 64, 16)
    big = make_plan(5000, 5000, 5000, "float64", tiles, target=4096)
    assert big.block_shape == (4096, 4096, 4096) and big.note == ""
    p = make_plan(5000, 5000, 5000, "float64", tiles, target=4096, device_memory=64 * 2**20)
    bm, bn, bk = p.block_shape
    assert working_set(bm, bn, bk, tiles, 8)[0] <= 0.8 * 64 * 2**20
    assert bm % 64 == 0 and bn % 64 == 0 and bk % 16 == 0
    assert "blocks shrunk: a block product of 4096 x 4096 x 4096 needs 768.00 MiB of device memory; " \
           "80% of the smallest device's 64.00 MiB is 51.20 MiB" in p.explain()
    # the largest single buffer is capped too (CL_DEVICE_MAX_MEM_ALLOC_SIZE)
    p = make_plan(5000, 5000, 5000, "float64", tiles, target=4096, max_alloc=2**20)
    assert working_set(*p.block_shape, tiles, 8)[1] <= 2**20
    assert "the device allows 1.00 MiB in one buffer" in p.note


def test_device_memory_too_small_for_one_tile():
    from dgemm.errors import PlanError
    with pytest.raises(PlanError, match=r"no blocking of C\[500 x 500\] = A @ B\[500\] \(float64\) fits: a block "
                                        r"product of 64 x 64 x 16 needs"):
        make_plan(500, 500, 500, "float64", (64, 64, 16), device_memory=50_000)


def test_fixed_output_chunks_shrink_only_k():
    from dgemm.errors import PlanError
    p = make_plan(1000, 1000, 5000, "float32", (32, 32, 16), out_chunks=(500, 500), target=4096,
                  device_memory=8 * 2**20)
    assert p.block_shape[:2] == (500, 500) and p.block_shape[2] < 4096
    with pytest.raises(PlanError, match=r"C blocks are fixed to the output's chunks \(1000, 1000\)"):
        make_plan(1000, 1000, 5000, "float32", (32, 32, 16), out_chunks=(1000, 1000), device_memory=8 * 2**20)
    with pytest.raises(PlanError, match="a C block of 50016 x 50016 padded elements exceeds 2\\*\\*31 - 1"):
        make_plan(60000, 60000, 8, "float32", (32, 32, 16), out_chunks=(50000, 50000))


# -- planning at any size (issue 14, case 10) ------------------------------------
@pytest.mark.parametrize("m, n, k, target", [(1, 1, 1, 64), (300, 999, 64, 100), (1300, 64, 500, 64),
                                             (1000, 1000, 0, 100), (50, 300, 500, 64), (1300, 999, 1, 100)])
@pytest.mark.parametrize("n_workers", [1, 2, 3, 4, 5, 6, 8, 12, 16])
def test_loads_sum_what_assign_places(m, n, k, target, n_workers):
    """loads() (O(workers), from block sizes) is exactly the sum over the tasks assign() gives each worker."""
    from dgemm.client.plan import _load, assign, loads

    p = make_plan(m, n, k, "float64", (32, 32, 16), target=target, n_workers=n_workers)
    assert loads(p, n_workers) == [_load(p, part) for part in assign(p.tasks(), n_workers, p)]


def test_huge_plans_are_made_and_estimated_without_listing_blocks():
    """10**7 x 10**7 has 10**8 C blocks and 2**62 x 2**62 has 10**31: neither is ever listed."""
    from dgemm.errors import PlanError

    p = make_plan(10**7, 10**7, 10**7, "float64", (32, 32, 16), target=1024, n_workers=4)
    assert p.rows.count == p.cols.count == 9766 and p.rows[-1] == (9999360, 10**7)
    assert p.n_tasks == 9766**2 * len(p.segments)
    e = p.estimate(4)
    assert sum(w["tasks"] for w in e["workers"]) == p.n_tasks
    assert e["bytes_written"] == 10**14 * 8
    p = make_plan(2**62, 2**62, 2**62, "float32", (32, 32, 16), target=1024, n_workers=3)
    assert p.rows.count == 2**52 and "time floor" in p.explain_estimate(3)
    with pytest.raises(PlanError, match=r"beyond 2\*\*63 - 1"):
        make_plan(10**31, 3 * 10**31, 10**31, "float64", (32, 32, 16))


def test_empty_product_has_no_placement():
    p = make_plan(0, 10, 10, "float32", (32, 32, 16), n_workers=2)
    assert p.explain_estimate(2) == "placement: no GEMM tasks (C is empty)"


def test_a_gpu_plan_by_default_multiplies_8192_wide_blocks_over_4096_deep_steps():
    """The GPU default (sizes.GPU_TARGET): 4096-cube products left the device idle between them (bench/NOTES.md,
    issue 28, seventeenth session); chunks of 4096 are grouped two by two along M and N, never cut along K."""
    from dgemm.sizes import default_target

    gpu = default_target(["GPU"])
    for chunk, shape in ((4096, (8192, 8192, 4096)), (8192, (8192, 8192, 8192)), (2048, (8192, 8192, 4096))):
        p = make_plan(32768, 32768, 32768, "float32", (128, 128, 32), a_chunks=(chunk, chunk), b_chunks=(chunk, chunk),
                      target=gpu, n_workers=2, device_memory=80 << 30)
        assert p.block_shape == shape, (chunk, p.block_shape)
    # a small device's memory still shrinks them
    small = make_plan(32768, 32768, 32768, "float32", (128, 128, 32), a_chunks=(4096, 4096),
                      b_chunks=(4096, 4096), target=gpu, n_workers=1, device_memory=1 << 30)
    assert small.block_shape[0] * small.block_shape[1] < 8192 * 8192
    assert default_target(["CPU"]) == 1024
    # a GPU with less than 24 GiB a worker keeps 4096-cube blocks (what a worker holds beside them grows too)
    assert default_target(["GPU"], memory=16 << 30) == 4096 and default_target(["GPU"], memory=80 << 30) == gpu


@pytest.mark.timeout(30)
@pytest.mark.parametrize("target", [4096, (8192, 8192, 4096)])
def test_blocks_that_whole_chunks_would_not_let_fit_cut_the_chunks(target):
    """A device too small for one chunk-sized block product (a low device-memory-limit): the plan cuts the chunks
    (each block sharing one then reads it again) instead of halving a target the chunks hold up forever."""
    p = make_plan(32768, 32768, 32768, "float32", (128, 128, 32), a_chunks=(4096, 4096), b_chunks=(4096, 4096),
                  target=target, n_workers=1, device_memory=256 << 20)
    assert min(p.block_shape) < 4096 and "shrunk" in p.note
    total, _ = working_set(*p.block_shape, (128, 128, 32), 4)
    assert total <= 0.8 * (256 << 20)

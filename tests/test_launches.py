"""A k step's GEMM cut into launches over parts of C's tiles (dgemm.opencl.launches, the ``gemm-launches`` setting).

The kernels find their part from the launch's global offset: every test runs
the real kernels under :func:`dgemm.opencl.device.poisoned` (each new buffer
NaN), so a tile no launch covers, or one two launches cover with different
origins, shows up against numpy in float64.
"""
from __future__ import annotations

import numpy as np
import pytest

from _check import check_product, randn
from dgemm.opencl import launches
from dgemm.opencl.device import poisoned
from dgemm.opencl.engine import BlockEngine
from dgemm.opencl.params import KernelParams


@pytest.fixture(autouse=True)
def poisoned_memory():
    with poisoned():
        yield


def _covered(params, mp, np_, parts):
    """Tile rows (or wgmma tiles) each cut of ``cuts`` starts at and covers, as (first, count)."""
    out = []
    for (gx, gy), (lx, ly), offset in launches.cuts(params, mp, np_, parts):
        if params.k_major:
            out.append(((offset or (0, 0))[0] // lx, gx // lx))
        else:
            out.append(((offset or (0, 0))[1] // ly, gy // ly))
    return out


@pytest.mark.parametrize("groupm", [0, 1, 3, 8])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7, 16])
def test_cuts_cover_each_tile_row_once_in_whole_bands(groupm, parts):
    params = KernelParams(TSM=32, TSN=32, TSK=8, WPTM=4, WPTN=4, WIDTH=2, GROUPM=groupm)
    rows = 11
    got = _covered(params, 32 * rows, 64, parts)
    assert [f for f, _ in got] == sorted(f for f, _ in got)
    assert sum(c for _, c in got) == rows and all(c > 0 for _, c in got)
    assert all(a + c == b for (a, c), (b, _) in zip(got, got[1:]))     # contiguous, no overlap
    assert all(f % max(groupm, 1) == 0 for f, _ in got)               # a band is never split
    assert len(got) == min(parts, -(-rows // max(groupm, 1)))


def test_wgmma_cuts_are_runs_of_its_tiles():
    params = KernelParams(MMA=7, TSM=128, TSN=256, TSK=32, WARPSM=2, GROUPM=8, STAGES=4)
    got = _covered(params, 128 * 5, 256 * 3, 4)      # 15 tiles
    assert got == [(0, 3), (3, 4), (7, 4), (11, 4)]
    (gsize, lsize, offset), = launches.cuts(params, 128 * 5, 256 * 3, 1)
    assert offset is None and gsize == (15 * lsize[0], 1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("groupm", [0, 3])
@pytest.mark.parametrize("parts", [2, 3, 5])
def test_a_product_cut_into_launches_is_right(device, monkeypatch, rng, dtype, groupm, parts):
    """Several k steps, edge tiles, alpha and beta with C: each step's launches together write C once."""
    monkeypatch.setenv("DGEMM_GEMM_LAUNCHES", str(parts))
    assert launches.default() == parts
    params = KernelParams(TSM=32, TSN=32, TSK=8, WPTM=4, WPTN=4, WIDTH=2, GROUPM=groupm)
    engine = BlockEngine(device, dtype, params)
    m, n, ks = 32 * 7 + 5, 32 * 3 + 1, (40, 24)       # 8 x 4 tiles, bands of 3 rows: the last one partial
    a_parts = [randn(rng, (m, k), dtype) for k in ks]
    b_parts = [randn(rng, (k, n), dtype) for k in ks]
    c = randn(rng, (m, n), dtype)
    got = engine.product(zip(a_parts, b_parts), m, n, alpha=1.5, beta=-0.5, c=c)
    check_product(got, np.concatenate(a_parts, axis=1), np.concatenate(b_parts), dtype=dtype, alpha=1.5, beta=-0.5,
                  c=c, what=f"{parts} launches a step, GROUPM {groupm}")


def test_the_engine_launches_each_step_in_its_cuts(any_device, monkeypatch, rng):
    """The setting is read when a product starts: 3 launches for each of its 2 k steps."""
    seen = []

    class Counting(BlockEngine):
        def _launched(self, event, flops):
            seen.append(flops)

    engine = Counting(any_device, "float64", KernelParams(TSM=32, TSN=32, TSK=8, WPTM=4, WPTN=4, WIDTH=2))
    a, b = rng.standard_normal((100, 50)), rng.standard_normal((50, 70))
    for parts in (3, 1):
        monkeypatch.setenv("DGEMM_GEMM_LAUNCHES", str(parts))
        seen.clear()
        got = engine.product([(a[:, :20], b[:20]), (a[:, 20:], b[20:])], 100, 70)
        check_product(got, a, b, dtype="float64", what=f"{parts} launches a step")
        assert len(seen) == 2 * parts and sum(seen) == pytest.approx(2.0 * 100 * 70 * 50)


@pytest.mark.gpu
def test_tensor_core_kernels_cut_into_launches_are_right(gpu_device, monkeypatch, rng):
    """On a GPU: the wgmma kernels (TF32, 3xTF32; their tiles from the launch's offset) and DMMA, cut into 3."""
    from dgemm.accuracy import tolerance

    dev = gpu_device
    if not dev.info.dmma:
        pytest.skip(f"{dev.info.name} has no tensor-core paths (needs NVIDIA compute capability >= 8.0)")
    monkeypatch.setenv("DGEMM_GEMM_LAUNCHES", "3")
    m, n, ks = 1000, 700, (900, 333)
    for dtype, precision in (("float64", None), ("float32", "tf32"), ("float32", "3xtf32")):
        engine = BlockEngine(dev, dtype, dev.choice(dtype, precision).params)
        A = [randn(rng, (m, k), dtype) for k in ks]
        B = [randn(rng, (k, n), dtype) for k in ks]
        c = randn(rng, (m, n), dtype)
        out = engine.product(zip(A, B), m, n, alpha=1.5, beta=-0.5, c=c)
        ref = 1.5 * sum(a.astype(np.float64) @ b.astype(np.float64) for a, b in zip(A, B)) - 0.5 * c
        err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        assert np.all(np.isfinite(out)), (dtype, precision)
        assert err < (1e-13 if dtype == "float64" else tolerance("float32", sum(ks), precision)), (precision, err)
        if dev.info.compute_capability == 90 and dtype == "float32":   # Hopper: the wgmma kernel ran, cut in 3
            assert engine.params.k_major and not dev.failed, dev.failed

"""The panel cache: reuse, eviction order, pins, failures; end to end, its entries never outlive a run."""
from __future__ import annotations

from concurrent.futures import Future

import pytest

from dgemm.opencl.panels import PanelCache


def ready(x):
    f = Future()
    f.set_result(x)
    return f


def test_least_recently_used_goes_first():
    cache = PanelCache(budget=30)
    for key in "abc":
        cache.release(cache.acquire(key, 10, lambda k=key: ready(k))[0])
    cache.release(cache.acquire("a", 10, lambda: ready("again"))[0])       # a is now the most recent
    cache.release(cache.acquire("d", 10, lambda: ready("d"))[0])
    assert cache.keys() == ["c", "a", "d"] and cache.evictions == 1 and cache.bytes == 30


def test_pinned_entries_stay_even_over_budget():
    cache = PanelCache(budget=10)
    a, _ = cache.acquire("a", 10, lambda: ready("a"))
    b, _ = cache.acquire("b", 10, lambda: ready("b"))          # a is in use: both kept, over budget
    assert cache.keys() == ["a", "b"] and cache.bytes == 20 and cache.peak == 20
    cache.release(a)
    assert cache.keys() == ["b"] and cache.bytes == 10        # released over budget: evicted at once
    cache.release(b)
    assert cache.stats()["cache_entries"] == 1


def test_a_failed_read_is_forgotten_so_the_next_asker_retries():
    cache = PanelCache(budget=100)
    f = Future()
    e, hit = cache.acquire("x", 10, lambda: f)
    f.set_exception(OSError("disk"))
    with pytest.raises(OSError):
        e.future.result()
    cache.release(e)
    assert cache.keys() == [] and cache.bytes == 0
    e2, hit = cache.acquire("x", 10, lambda: ready("ok"))
    assert not hit and e2.future.result() == "ok"
    cache.release(e2)


def test_unkeyed_entries_are_never_stored():
    cache = PanelCache(budget=100)
    e, hit = cache.acquire(None, 10, lambda: ready(1))
    assert not hit and e.future.result() == 1 and cache.keys() == [] and cache.bytes == 0
    cache.release(e)


def test_a_failing_maker_leaves_nothing_behind():
    cache = PanelCache(budget=100)

    def boom():
        raise RuntimeError("pool shut down")
    with pytest.raises(RuntimeError):
        cache.acquire("y", 10, boom)
    assert cache.keys() == [] and cache.bytes == 0


def test_an_input_rewritten_between_two_runs_is_read_again(client, tmp_path, rng):
    """End to end on the session's cluster: A is rewritten in place (same path, shape and chunks, new
    values) between two Zarr -> Zarr products; the second is the product of the new A, not of the blocks
    the workers' panel caches kept from the first run (cache entries are shared only within a run)."""
    import zarr

    import dgemm
    from _check import check_product, randn

    m, k, n = 96, 96, 64

    def stored(name, x):
        arr = zarr.create_array(store=str(tmp_path / name), shape=x.shape, chunks=(32, 32), dtype=x.dtype)
        arr[...] = x
        return str(tmp_path / name)

    a1, b = randn(rng, (m, k)), randn(rng, (k, n))
    a, b_path = stored("a.zarr", a1), stored("b.zarr", b)
    first = dgemm.matmul(a, b_path, out=str(tmp_path / "c1.zarr"), client=client, block=32)
    check_product(first[...], a1, b, dtype="float64", what="first run")

    a2 = randn(rng, (m, k))
    zarr.open_array(a, mode="r+")[...] = a2
    second = dgemm.matmul(a, b_path, out=str(tmp_path / "c2.zarr"), client=client, block=32)
    check_product(second[...], a2, b, dtype="float64", what="second run, after A was rewritten")


class _Block:
    """A block that reads itself (what the engine caches), its values changeable between reads."""

    def __init__(self, values):
        self.values = values
        self.shape, self.dtype, self.copies = values.shape, values.dtype, False

    def key(self):
        return ("the same array", (0, 8), (0, 8))

    def fill_into(self, out):
        out[...] = self.values


def test_two_runs_never_share_a_cache_entry(device, rng):
    """Two runs (scopes) asking for the same block get entries of their own, both cached at once: the run is
    part of the key, whatever else (``PanelCache.enter``, the worker's release at a run's end) drops entries."""
    from conftest import engine_for

    engine = engine_for(device, "float64")
    block = _Block(rng.standard_normal((8, 8)))
    layout = engine._layout("a", False, 8, engine._padded(8, 8)[0])
    first = engine._staged(block, *layout, "run-1")      # still in use (pinned) when the next run asks
    second = None
    try:
        first.future.result()
        block.values = block.values + 1.0                # the input rewritten between the runs
        second = engine._staged(block, *layout, "run-2")
        second.future.result()
        assert second is not first, "the second run was served the first run's entry of the block"
    finally:
        for e in (first, second):
            if e is not None:
                engine.cache.release(e)
        engine.cache.drop(lambda s: s in ("run-1", "run-2"))

"""Block placement: the scheduler plugin's re-offer rule, and placed runs on the cluster.

The rule is tested on stand-ins of the scheduler's state (what distributed
hands the plugin); the death of every worker during a placed run is
``tests/test_faults.py::test_matmul_survives_killed_workers``.
"""
from __future__ import annotations

import asyncio

from types import SimpleNamespace

import pytest
import zarr

import dgemm
from _check import check_product, randn
from dgemm.names import PLACEMENT_PLUGIN
from dgemm.scheduler.placement import PlacementPlugin, ensure


def worker(address, name, gpu=1):
    return SimpleNamespace(address=address, name=name, resources={"GPU": gpu} if gpu else {})


class Task(SimpleNamespace):
    __hash__ = object.__hash__     # the scheduler keys its parked tasks by TaskState


def task(where, loose=True, resources=None):
    return Task(worker_restrictions=set(where), loose_restrictions=loose,
                           resource_restrictions=resources if resources is not None else {"GPU": 1})


def scheduler(workers, parked):
    return SimpleNamespace(workers={w.address: w for w in workers}, unrunnable={t: 0.0 for t in parked})


def joined(plugin, sched, ws):
    sched.workers[ws.address] = ws
    plugin.add_worker(scheduler=sched, worker=ws.address)


def test_a_restarted_worker_takes_back_its_own_blocks():
    old0, old1 = worker("tcp://h:1", "gpu-0"), worker("tcp://h:2", "gpu-1")
    plugin = PlacementPlugin()
    sched = scheduler([old0, old1], [])
    asyncio.run(plugin.start(sched))
    mine, theirs = task([old0.address]), task([old1.address])
    sched.workers.clear()                       # every worker died; the tasks were parked
    sched.unrunnable.update({mine: 0.0, theirs: 0.0})
    new0 = worker("tcp://h:3", "gpu-0")
    joined(plugin, sched, new0)
    assert mine.worker_restrictions == {old0.address, new0.address}
    # gpu-1 may never come back, and no live worker of gpu-1's blocks is left: the first one back takes
    # them too (work stealing spreads them again once the others return)
    assert theirs.worker_restrictions == {old1.address, new0.address}


def test_blocks_whose_worker_lives_are_left_alone():
    alive = worker("tcp://h:1", "gpu-0")
    plugin = PlacementPlugin()
    sched = scheduler([alive], [])
    asyncio.run(plugin.start(sched))
    t = task([alive.address])
    sched.unrunnable[t] = 0.0
    joined(plugin, sched, worker("tcp://h:2", "gpu-1"))
    assert t.worker_restrictions == {alive.address}


def test_strict_placement_and_workers_without_the_resource_are_left_alone():
    plugin = PlacementPlugin()
    sched = scheduler([], [])
    asyncio.run(plugin.start(sched))
    strict = task(["tcp://h:1"], loose=False)
    loose = task(["tcp://h:1"])
    sched.unrunnable.update({strict: 0.0, loose: 0.0})
    joined(plugin, sched, worker("tcp://h:2", "cpu", gpu=0))   # no GPU slot: cannot run a GEMM task
    assert strict.worker_restrictions == {"tcp://h:1"}
    assert loose.worker_restrictions == {"tcp://h:1"}
    gpu = worker("tcp://h:3", "gpu-0")
    joined(plugin, sched, gpu)
    assert strict.worker_restrictions == {"tcp://h:1"}            # the user's hard restriction stands
    assert loose.worker_restrictions == {"tcp://h:1", gpu.address}


def test_the_plugin_is_registered_once(client):
    assert ensure(client) and ensure(client)
    n = client.run_on_scheduler(lambda dask_scheduler: sum(isinstance(p, PlacementPlugin)
                                                           for p in dask_scheduler.plugins.values()))
    assert n == 1
    assert client.run_on_scheduler(lambda dask_scheduler: PLACEMENT_PLUGIN in dask_scheduler.plugins)


def test_a_scheduler_without_the_plugin_means_no_placement():
    class Refusing:
        def register_plugin(self, *a, **k):
            raise ModuleNotFoundError("No module named 'dgemm'")
    assert ensure(Refusing()) is False


def test_placed_blocks_run_on_their_workers(client, tmp_path, rng):
    """Each worker computes a rectangle of C: together they touch far fewer A rows + B columns.

    Without placement, blocks go to whichever worker is free, and on two
    workers each one touches every row and column of the 8 x 8 grid (16 panels
    each, 32 in all: measured); placed, each touches one half of one side
    (8 + 4 = 12 each, 24 in all), give or take a block stolen at the end.
    """
    from distributed import get_task_stream

    workers = client.scheduler_info()["workers"]
    if len(workers) < 2:
        pytest.skip("needs a cluster of two workers")
    A, B = randn(rng, (256, 64), "float32"), randn(rng, (64, 256), "float32")
    a = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=A.shape, chunks=(32, 64), dtype="f4")
    b = zarr.create_array(store=str(tmp_path / "b.zarr"), shape=B.shape, chunks=(64, 32), dtype="f4")
    a[...], b[...] = A, B
    with get_task_stream(client) as stream:
        out = dgemm.matmul(a, b, out=str(tmp_path / "c.zarr"), client=client, block=(32, 32, 64))
    check_product(out[...], A, B, dtype="float32")
    where: dict[str, set] = {}
    for t in stream.data:
        key = t["key"]
        if isinstance(key, tuple) and str(key[0]).startswith("dgemm-gemm-"):
            where.setdefault(t["worker"], set()).add(key[1:3])
    assert sum(len(v) for v in where.values()) == 64
    touched = sum(len({i for i, _ in v}) + len({j for _, j in v}) for v in where.values())
    assert touched <= 28, f"{touched} panels touched: the blocks did not stay on their workers ({where})"

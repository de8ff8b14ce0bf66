"""Block placement that survives the death of every worker at once.

:func:`dgemm.matmul` places each C block on one device worker
(:func:`dgemm.client.plan.assign`: a rectangle of blocks per worker, so that each
worker reads only its share of A and B).  The placement is *loose*
(``allow_other_workers``): when a worker dies, its blocks go to the others.

One case needs help.  When every worker is gone at once, distributed (2026.8)
parks the tasks in "no-worker"; when a worker joins it offers that worker only
the parked tasks whose restrictions name it
(``Scheduler.bulk_schedule_unrunnable_after_adding_worker`` ignores
``loose_restrictions``).  A restarted worker has a new address, so a run
would wait forever.  :class:`PlacementPlugin`, a scheduler plugin, closes the
gap: when a worker joins, each parked, loosely placed task whose workers are
all gone is placed on it too, first by worker name (a nanny restarts its
worker under the same name, so the blocks return to the device that had
them), else because no live worker can run it.
"""

from __future__ import annotations

import logging

from distributed.diagnostics.plugin import SchedulerPlugin

from dgemm.names import PLACEMENT_PLUGIN

logger = logging.getLogger(__name__)


def _holds(ws, ts) -> bool:
    """``ws`` has every resource ``ts`` needs (the GPU slot of a GEMM task)."""
    return all(ws.resources.get(r, 0) >= need for r, need in (ts.resource_restrictions or {}).items())


class PlacementPlugin(SchedulerPlugin):
    """Re-offer parked, loosely placed tasks to the workers that join.

    Examples
    --------
    >>> PlacementPlugin().idempotent
    True
    """

    idempotent = True   # one per scheduler, whichever client registers it first
    name = PLACEMENT_PLUGIN

    def __init__(self):
        self.names: dict[str, object] = {}   # every address seen -> worker name

    async def start(self, scheduler) -> None:   # the scheduler awaits its plugins' start
        self.names.update({addr: ws.name for addr, ws in scheduler.workers.items()})

    def add_worker(self, scheduler=None, worker=None) -> None:
        ws = scheduler.workers.get(worker)
        if ws is None:
            return
        self.names[worker] = ws.name
        moved = self.reoffer(scheduler, ws)
        if moved:
            logger.info("dgemm: %d parked block task(s) placed on %s (%s), their workers being gone",
                        moved, worker, ws.name)

    def reoffer(self, scheduler, ws) -> int:
        """Add ``ws`` to the restrictions of each parked task it should take; return how many.

        Runs before the scheduler offers ``ws`` the parked tasks, so they are
        offered in the same step.
        """
        moved = 0
        for ts in list(scheduler.unrunnable):
            where = ts.worker_restrictions
            if not (ts.loose_restrictions and where) or ws.address in where or not _holds(ws, ts):
                continue
            live = [scheduler.workers[a] for a in where if a in scheduler.workers]
            same_name = any(self.names.get(a) == ws.name for a in where if a not in scheduler.workers)
            if same_name or not any(_holds(w, ts) for w in live):
                where.add(ws.address)
                moved += 1
        return moved


def ensure(client) -> bool:
    """Register :class:`PlacementPlugin` on ``client``'s scheduler (once); say whether it is there.

    A scheduler that cannot load the plugin (no dgemm installed beside it, a
    stand-in client in tests) gets no placement: blocks then go to whichever
    worker is free, which is correct, only with more reading.
    """
    try:
        client.register_plugin(PlacementPlugin(), name=PLACEMENT_PLUGIN)
    except Exception as e:   # noqa: BLE001 - any failure means: run without placement
        logger.warning("dgemm: block placement off (the scheduler did not take its plugin: %s: %s)",
                       type(e).__name__, e)
        return False
    return True

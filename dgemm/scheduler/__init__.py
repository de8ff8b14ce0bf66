"""Code that runs in the scheduler process: the dashboard page and block placement.

``dask scheduler --preload dgemm.scheduler`` installs both plugins from the
start (workers with the dgemm plugin add the dashboard themselves, and
:func:`dgemm.matmul` adds placement, so the preload is optional).
"""
from __future__ import annotations

from dgemm.names import DASHBOARD_PLUGIN, PLACEMENT_PLUGIN


def dask_setup(scheduler):
    """Preload hook: the dgemm dashboard page and the placement plugin on this scheduler."""
    from dgemm.scheduler.dashboard import DgemmDashboard
    from dgemm.scheduler.placement import PlacementPlugin

    scheduler.add_plugin(DgemmDashboard(), name=DASHBOARD_PLUGIN, idempotent=True)
    scheduler.add_plugin(PlacementPlugin(), name=PLACEMENT_PLUGIN, idempotent=True)

"""The scheduler preload's earlier name: ``--preload dgemm.dashboard`` (now :mod:`dgemm.scheduler`)."""
from dgemm.scheduler import dask_setup

__all__ = ["dask_setup"]

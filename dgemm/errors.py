"""Every error dgemm raises of its own, under one base class, :class:`DgemmError`.

Each also keeps the builtin base it always had, so code written against
those (``except ValueError``, ``except RuntimeError``) goes on working, as
zarr's ``errors`` module does.  ``except dgemm.DgemmError`` catches them all.

>>> import dgemm
>>> issubclass(dgemm.PlanError, dgemm.DgemmError) and issubclass(dgemm.PlanError, ValueError)
True

A leaf: it imports nothing, so every layer may raise these.
"""
from __future__ import annotations

__all__ = ["DgemmError", "PlanError", "DeviceError", "DeviceMemoryError", "NoDeviceWorkerError", "IncompleteResultError",
           "OutputBusyError", "OutputTakenOverError", "SubmissionError", "PtxEditError"]


class DgemmError(Exception):
    """The base of every error dgemm raises of its own."""


class PlanError(DgemmError, ValueError):
    """No blocking of the product fits the devices' limits (raised before any work)."""


class DeviceError(DgemmError, RuntimeError):
    """The device cannot do what was asked (no fp64, too little memory...)."""


class DeviceMemoryError(DeviceError):
    """The device ran out of memory for what was asked (the message says what, and how much)."""


class NoDeviceWorkerError(DgemmError, RuntimeError):
    """No worker of the cluster can run dgemm's GEMM tasks; names each worker's reason."""


class IncompleteResultError(DgemmError, RuntimeError):
    """The output exists but its run did not finish."""


class OutputBusyError(DgemmError, RuntimeError):
    """Another live run writes this output; raised before any work."""


class OutputTakenOverError(DgemmError, RuntimeError):
    """The output was taken over by another run (or this run was cancelled); its tasks write nothing more."""


class SubmissionError(DgemmError, RuntimeError):
    """The batch system refused a job: its submission command (``sbatch``, ``qsub``) failed; says what it said."""


class PtxEditError(DgemmError, ValueError):
    """The PTX does not have the sites, or the shape, an edit expects."""

"""dgemm: matrix products of Zarr arrays on Dask clusters of OpenCL devices.

>>> import dgemm
>>> sorted(n for n in dgemm.__all__ if not n[0].isupper())
['gemm', 'list_devices', 'make_plan', 'matmul', 'open_result']

Importing the package imports none of its dependencies (Dask, distributed,
Zarr, pyopencl...): each public name is imported where it is first used
(:pep:`562`), so a script's ``import dgemm`` costs milliseconds, and so does
each worker process of a local cluster, which imports the user's script
again.  ``dgemm.<submodule>`` is imported on first use too.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Each public name, and the module that holds it.
_PUBLIC = {
    "matmul": "dgemm.api", "gemm": "dgemm.api", "open_result": "dgemm.client.results",
    "list_devices": "dgemm.opencl.discovery", "make_plan": "dgemm.client.plan", "DeviceCluster": "dgemm.cluster",
    "DgemmPlugin": "dgemm.worker",
    **{name: "dgemm.errors" for name in (
        "DgemmError", "PlanError", "DeviceError", "DeviceMemoryError", "NoDeviceWorkerError", "IncompleteResultError", "OutputBusyError",
        "OutputTakenOverError", "SubmissionError", "PtxEditError")},
}

__all__ = list(_PUBLIC)


def __getattr__(name: str):
    """A public name, or a submodule, imported on first use (then kept as a plain attribute)."""
    module = _PUBLIC.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif name.startswith("__"):   # dunder look-ups (copy, pickle, doctest...) are no submodules
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":   # the submodule exists but one of its imports is missing
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})

"""dgemm: matrix products of Zarr arrays on Dask clusters of OpenCL devices.

>>> import dgemm
>>> sorted(n for n in dgemm.__all__ if not n[0].isupper())
['gemm', 'list_devices', 'make_plan', 'matmul', 'open_result']
"""
from dgemm.api import gemm, matmul
from dgemm.cluster import DeviceCluster, NoDeviceWorkerError
from dgemm.opencl.device import DeviceError
from dgemm.opencl.discovery import list_devices
from dgemm.plan import make_plan
from dgemm.results import IncompleteResultError, open_result
from dgemm.storage.lease import OutputBusyError, OutputTakenOverError
from dgemm.worker import DgemmPlugin

__version__ = "0.1.0"

__all__ = ["matmul", "gemm", "open_result", "list_devices", "make_plan", "DeviceCluster", "DgemmPlugin",
           "DeviceError", "NoDeviceWorkerError", "IncompleteResultError", "OutputBusyError", "OutputTakenOverError"]

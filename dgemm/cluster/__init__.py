"""Finding or starting a cluster, and preparing its workers for dgemm.

* :mod:`dgemm.cluster.local`: :class:`DeviceCluster` (a local cluster, one
  worker process per OpenCL device) and the process-wide local client;
* :mod:`dgemm.cluster.readiness`: :func:`prepare` (any cluster's workers
  made dgemm-ready) and what a plan may assume of them;
* :mod:`dgemm.cluster.spec`: what each device worker of a host gets, under
  a :class:`DeviceCluster` as under ``dgemm worker``;
* :mod:`dgemm.cluster.launch`: the device workers ``dgemm worker`` and
  ``dgemm cluster`` start.
"""
from dgemm.cluster.local import DeviceCluster, check_client, get_client, local_client
from dgemm.cluster.readiness import (NoDeviceWorkerError, check_worker_access, describe_for_plan, device_limits,
                                     prepare, tiles_of)

__all__ = ["DeviceCluster", "NoDeviceWorkerError", "check_client", "check_worker_access", "describe_for_plan",
           "device_limits", "get_client", "local_client", "prepare", "tiles_of"]

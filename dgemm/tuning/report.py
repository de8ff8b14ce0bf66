"""What ``dgemm devices`` reports: every OpenCL device and the kernel parameters it would use."""
from __future__ import annotations

import dataclasses

from dgemm.dtypes import DTYPES, PRECISIONS
from dgemm.tuning.database import lookup


def device_report() -> dict:
    """Every OpenCL device with the kernel parameters it would use, as plain data.

    Returns
    -------
    dict
        ``devices``: one dict per device (its :class:`~dgemm.opencl.discovery.DeviceInfo`
        fields, ``id`` and, per dtype it supports, the chosen ``params`` and
        where they came from); ``local_cluster``: ids of the devices a local
        cluster would use, or ``local_cluster_error`` explaining why none.
    """
    from dgemm.opencl import discovery

    devices = discovery.list_devices()
    out = []
    for info in devices:
        d = {"id": info.id, **dataclasses.asdict(info), "params": {}}
        for dt in DTYPES:
            if dt == "float64" and not info.fp64:
                continue
            choice = lookup(info, dt)
            d["params"][dt] = {"params": choice.params.as_dict(), "source": choice.describe(),
                               "level": choice.level, "key": choice.key, "database": choice.database,
                               "tuned": choice.tuned, "kernel": choice.params.precision,
                               # precision= values this device runs natively (others fall back to FMA)
                               "paths": [p for p in PRECISIONS[dt]
                                         if not lookup(info, dt, precision=p).note]}
        out.append(d)
    report = {"devices": out, "local_cluster": [], "local_cluster_error": None}
    if devices:
        try:
            report["local_cluster"] = [d.id for d in discovery.select_devices(None, devices)]
        except LookupError as e:  # a $DGEMM_DEVICES that matches nothing
            report["local_cluster_error"] = str(e)
    return report

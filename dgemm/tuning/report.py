"""What ``dgemm devices`` reports: every OpenCL device and the kernel parameters it would use."""
from __future__ import annotations

import dataclasses

from dgemm.dtypes import DTYPES, PRECISIONS
from dgemm.opencl.database import lookup


def device_report(build: bool = False) -> dict:
    """Every OpenCL device with the kernel parameters it would use, as plain data.

    Parameters
    ----------
    build : bool
        Also build each dtype's kernels on each device (default and every
        native path): ``built`` then says, per path, which kernel the device
        runs and, where the chosen one could not be built (the wgmma kernel's
        PTX route), ``fell_back`` says why.  Takes seconds per device.

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
        if build:
            _build(info, d["params"])
        out.append(d)
    report = {"devices": out, "local_cluster": [], "local_cluster_error": None}
    if devices:
        try:
            report["local_cluster"] = [d.id for d in discovery.select_devices(None, devices)]
        except LookupError as e:  # a $DGEMM_DEVICES that matches nothing
            report["local_cluster_error"] = str(e)
    return report


def _build(info, params: dict) -> None:
    """Build what ``params`` (``device_report``'s per-dtype entries) name on ``info``'s device, in place."""
    from dgemm.opencl.device import Device

    try:
        device = Device(info)
    except Exception as e:   # no context here: every path says so
        for entry in params.values():
            entry["built"] = {"error": f"{type(e).__name__}: {e}"}
        return
    for dt, entry in params.items():
        entry["built"] = {}
        for precision in [None] + [p for p in entry["paths"] if p != entry["kernel"]]:
            asked = lookup(info, dt, precision=precision).params
            try:
                got = device.kernels(dt, asked).params
            except Exception as e:   # neither the kernel nor its stand-in builds
                row = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
            else:
                name = got.precision if got.kind.instruction == got.precision else \
                    f"{got.precision} ({got.kind.instruction})"
                row = {"kernel": name, "as_chosen": got == asked}
            if asked in device.failed:
                row["fell_back"] = device.failed[asked]
            entry["built"][precision or "default"] = row

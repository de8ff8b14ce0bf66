"""``dgemm devices``: the OpenCL devices and the kernel parameters each would use."""
from __future__ import annotations

import json
import os

import click

from dgemm.cli.common import fmt_bytes, fmt_params, cli
from dgemm.dtypes import DTYPES


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
    import dataclasses

    from dgemm.opencl import discovery
    from dgemm.tuning import database as tuning

    devices = discovery.list_devices()
    out = []
    for info in devices:
        d = {"id": info.id, **dataclasses.asdict(info), "params": {}}
        for dt in DTYPES:
            if dt == "float64" and not info.fp64:
                continue
            choice = tuning.lookup(info, dt)
            d["params"][dt] = {"params": choice.params.as_dict(), "source": choice.describe(),
                               "level": choice.level, "key": choice.key, "database": choice.database,
                               "tuned": choice.tuned, "kernel": choice.params.precision,
                               # precision= values this device runs natively (others fall back to FMA)
                               "paths": [p for p in tuning.PRECISIONS[dt]
                                         if not tuning.lookup(info, dt, precision=p).note]}
        out.append(d)
    report = {"devices": out, "local_cluster": [], "local_cluster_error": None}
    if devices:
        try:
            report["local_cluster"] = [d.id for d in discovery.select_devices(None, devices)]
        except LookupError as e:  # a $DGEMM_DEVICES that matches nothing
            report["local_cluster_error"] = str(e)
    return report


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def devices(as_json):
    """List OpenCL devices and the GEMM kernel parameters each would use."""
    from dgemm.opencl import discovery

    report = device_report()
    if not report["devices"]:
        click.echo("No OpenCL device found. " + discovery.icd_hint(), err=True)
        raise click.exceptions.Exit(1)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for d in report["devices"]:
        click.echo(f"{d['id']}  {d['name']}  ({d['type']}; {d['platform']}; {d['vendor']}; driver {d['driver']})")
        click.echo(f"      memory {fmt_bytes(d['global_mem'])} global, {fmt_bytes(d['local_mem'])} local; "
                   f"{d['compute_units']} compute units; max work-group {d['max_work_group_size']}")
        click.echo(f"      fp64: {'yes' if d['fp64'] else 'no'}; architecture: {d['architecture'] or 'unknown'}")
        for dt in DTYPES:
            p = d["params"].get(dt)
            if p is None:
                click.echo(f"      {dt}: not supported (no cl_khr_fp64)")
                continue
            click.echo(f"      {dt}: {fmt_params(p['params'])}")
            click.echo(f"      {' ' * len(dt)}  from the {p['source']}")
            click.echo(f"      {' ' * len(dt)}  paths (precision=): " + ", ".join(
                f"{x} (default)" if x == p["kernel"] else x for x in p["paths"]))
    env = os.environ.get(discovery.ENV_DEVICES)
    why = f"{discovery.ENV_DEVICES}={env}" if env else f"{discovery.ENV_DEVICES} unset"
    if report["local_cluster_error"]:
        click.echo(f"A local cluster ({why}) would fail: {report['local_cluster_error']}")
    else:
        names = {d["id"]: d["name"] for d in report["devices"]}
        chosen = ", ".join(f"{i} {names[i]}" for i in report["local_cluster"])
        click.echo(f"A local cluster ({why}) would use: {chosen}")
    problem = discovery.nvidia_icd_problem()
    if problem:  # GPUs missing from the list above, though the driver is installed
        click.echo("Note: " + problem, err=True)

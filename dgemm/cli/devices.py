"""``dgemm devices``: the OpenCL devices and the kernel parameters each would use."""
from __future__ import annotations

import json
import os

import click
from dask.utils import format_bytes

from dgemm import config
from dgemm.cli.common import cli, fmt_params
from dgemm.dtypes import DTYPES


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--build", is_flag=True,
              help="Also build each device's kernels and say which run, and why where one fell back.")
def devices(as_json, build):
    """List OpenCL devices and the GEMM kernel parameters each would use."""
    from dgemm.opencl import discovery
    from dgemm.tuning.report import device_report

    report = device_report(build=build)
    if not report["devices"]:
        click.echo("No OpenCL device found. " + discovery.icd_hint(), err=True)
        raise click.exceptions.Exit(1)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for d in report["devices"]:
        click.echo(f"{d['id']}  {d['name']}  ({d['type']}; {d['platform']}; {d['vendor']}; driver {d['driver']})")
        click.echo(f"      memory {format_bytes(d['global_mem'])} global, {format_bytes(d['local_mem'])} local; "
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
            for path, b in p.get("built", {}).items():
                what = b.get("kernel") or f"does not build: {b.get('error')}"
                why = f" (fell back: {b['fell_back']})" if "fell_back" in b else ""
                click.echo(f"      {' ' * len(dt)}  built, {path}: {what}{why}")
    var, spec = config.environment("devices"), config.get("devices")
    if spec is None:
        why = f"{var} unset"
    else:   # say where the value came from: the variable, or Dask's configuration
        why = f"{var}={spec}" if (os.environ.get(var) or "").strip() else f"dgemm.devices={spec}"
    if report["local_cluster_error"]:
        click.echo(f"A local cluster ({why}) would fail: {report['local_cluster_error']}")
    else:
        names = {d["id"]: d["name"] for d in report["devices"]}
        chosen = ", ".join(f"{i} {names[i]}" for i in report["local_cluster"])
        click.echo(f"A local cluster ({why}) would use: {chosen}")
    problem = discovery.nvidia_icd_problem()
    if problem:  # GPUs missing from the list above, though the driver is installed
        click.echo("Note: " + problem, err=True)

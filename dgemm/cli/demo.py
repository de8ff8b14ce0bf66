"""``dgemm demo``: the self-checking demonstration."""
from __future__ import annotations

import click

from dgemm.cli.common import cli, user_errors
from dgemm.dtypes import DTYPES


@cli.command()
@click.option("--size", type=click.IntRange(min=1), default=None,
              help="Matrix side (default: 1024 on CPU devices, 16384 with a GPU).")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--devices", metavar="SPEC", help="Devices of the local cluster (as for matmul).")
@click.option("--keep", type=click.Path(file_okay=False), default=None,
              help="Write a.zarr, b.zarr and c.zarr into this folder and keep them.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the figures to this JSON file (e.g. bench/results/<date>-<device>-demo.json).")
@click.pass_context
def demo(ctx, size, dtype, devices, keep, seed, json_path):
    """Multiply two random Zarr matrices on the local devices and check the result against numpy."""
    from dgemm.benchmarks.demo import run_demo
    from dgemm.benchmarks.records import write_json

    with user_errors(ctx):
        r = run_demo(size=size, dtype=dtype, devices=devices, keep=keep, seed=seed, log=click.echo)
    n = r["size"]
    click.echo(f"device(s): {r['device']} ({r['workers']} worker{'s' if r['workers'] != 1 else ''})")
    click.echo(f"C[{n} x {n}] = A[{n} x {n}] @ B[{n} x {n}]  ({r['dtype']})")
    click.echo(f"time: {r['seconds']:.3f} s   TFLOPS: {r['tflops']:.4g}")
    verdict = "OK" if r["passed"] else "FAILED"
    click.echo(f"max relative error: {r['max_rel_err']:.3g} over {r['entries_checked']} sampled entries "
               f"(tolerance {r['tolerance']:.3g}): {verdict}")
    click.echo(f"dashboard: {r['dashboard']} (the cluster has closed now)")
    if r["folder"]:
        click.echo(f"kept: {r['folder']}")
    if json_path:
        write_json(json_path, r)   # a non-finite error is recorded as null (and "passed": false)
        click.echo(f"figures written to {json_path}")
    if not r["passed"]:
        raise click.ClickException(f"the result does not match numpy: max relative error "
                                   f"{r['max_rel_err']:.3g} > {r['tolerance']:.3g}")

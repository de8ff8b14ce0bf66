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
    click.echo(f"end to end, Zarr in and Zarr out, on the started cluster: {r['seconds']:.3f} s   "
               f"TFLOPS: {r['tflops']:.4g}")
    for line in engine_lines(r.get("engine")):
        click.echo(line)
    if r.get("startup_seconds") is not None:
        click.echo(f"before it: {r['startup_seconds']:.2f} s to start the cluster, build the kernels and run a "
                   "small product (what a script's first call adds)")
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


def engine_lines(engine: dict | None) -> list[str]:
    """The devices' figures for the product (:func:`dgemm.benchmarks.demo.engine_figures`), as printed.

    >>> engine_lines({"kernel_seconds": 0.19, "kernel_tflops": 46.3, "busy_seconds": 4.0, "busy_kernel_seconds": 0.2,
    ...               "busy_transfer_seconds": 0.8, "busy_read_seconds": 2.9, "busy_other_seconds": 0.1,
    ...               "store_seconds": 9.0})[0]
    "the devices' GEMM kernels: 0.190 s   TFLOPS: 46.3 (per device, while its kernels run)"
    """
    if not engine or not engine.get("kernel_seconds"):
        return []
    busy = engine.get("busy_seconds") or 0.0
    parts = [("waiting for reads", "busy_read_seconds"), ("transfers", "busy_transfer_seconds"),
             ("kernels", "busy_kernel_seconds"), ("other", "busy_other_seconds")]
    split = ", ".join(f"{label} {engine.get(key, 0.0):.2f} s" for label, key in parts)
    return [f"the devices' GEMM kernels: {engine['kernel_seconds']:.3f} s   TFLOPS: {engine['kernel_tflops']:.3g} "
            "(per device, while its kernels run)",
            f"the GEMM tasks were busy {busy:.2f} s (summed over devices): {split}; "
            f"writing C took {engine.get('store_seconds', 0.0):.2f} worker-seconds"]

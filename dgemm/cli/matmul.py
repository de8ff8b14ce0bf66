"""``dgemm matmul``: the product of two Zarr arrays on a cluster."""
from __future__ import annotations

import contextlib
import os
import time

import click
import numpy as np

from dgemm.cli.common import (BlockParam, InputError, announcing_local_clusters, cli, connect, one_line,
                              storage_option, user_errors)
from dgemm.dtypes import ALL_PRECISIONS, DTYPES


def _operand(path: str, dtype: str | None, storage_options: dict | None = None):
    """``path`` itself, or a lazily cast dask array when ``dtype`` differs from the stored one.

    Passing the path lets workers read Zarr blocks directly; only a cast
    needs dask in between.  Returns ``(operand, shape or None)``.
    """
    import zarr

    from dgemm.storage import is_url
    try:
        z = zarr.open_array(path, mode="r", storage_options=storage_options if is_url(path) else None)
    except Exception:  # dgemm itself reports what is wrong with the path
        return path, None
    if dtype is None or z.dtype == np.dtype(dtype):
        return path, tuple(z.shape)
    import dask.array as da
    return da.from_zarr(z).astype(dtype), tuple(z.shape)


def _flops(sa, sb) -> float | None:
    if sa is None or sb is None:
        return None
    m = sa[0] if len(sa) == 2 else 1
    n = sb[1] if len(sb) == 2 else 1
    return 2.0 * m * n * sa[-1]


@cli.command()
@click.argument("a")
@click.argument("b")
@click.argument("out")
@click.option("--scheduler", metavar="ADDR",
              help="Address of a running Dask scheduler (default: a local cluster, one worker per device).")
@click.option("--dtype", type=click.Choice(DTYPES), default=None,
              help="Cast the inputs (lazily, block by block) to this dtype first.")
@click.option("--overwrite", is_flag=True, help="Replace an existing OUT.")
@click.option("--resume", is_flag=True,
              help="Finish an interrupted run into OUT: only the blocks it has not stored are computed.")
@click.option("--precision", type=click.Choice(ALL_PRECISIONS), default=None,
              help="Kernel path (default: never loses accuracy; see `dgemm devices` for a device's paths).")
@click.option("--block", type=BlockParam(), default=None, help="Preferred block size N, or M,N,K.")
@click.option("--devices", metavar="SPEC",
              help="Devices of the local cluster: gpu, cpu, all, ids like 0:1, or name parts, comma-separated.")
@storage_option("URL inputs and OUT", "dgemm.matmul")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@click.option("--report", "report", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write Dask's HTML performance report of the run (task stream, profiles, "
                   "bandwidths) to FILE, self-contained (Bokeh inlined: it opens without internet).")
@click.pass_context
def matmul(ctx, a, b, out, scheduler, dtype, overwrite, resume, precision, block, devices, storage_options, progress,
           report):
    """Compute OUT = A @ B for Zarr arrays A and B, writing OUT as a Zarr array."""
    import dgemm

    from dgemm.cluster.local import closing_new_local_clusters
    from dgemm.storage import COMPLETE_ATTR
    from dgemm.storage.locations import same

    if scheduler and devices:
        raise InputError("--devices chooses devices for a local cluster; the workers of --scheduler "
                         "have their own (set DGEMM_DEVICE in each worker's environment)")
    if report:
        folder = os.path.dirname(os.path.abspath(report))
        if not os.path.isdir(folder):
            raise InputError(f"--report {report}: the folder {folder} does not exist")
    for name, path in (("A", a), ("B", b)):
        if same(out, path):   # however spelt: relative, file://, a symlink, a URL
            # With --overwrite the output would be recreated (zeroed) before the
            # input is read, and the zeros marked complete.
            raise InputError(f"OUT is the same array as {name} ({path}); write the product elsewhere")
    t0 = time.perf_counter()
    with user_errors(ctx), contextlib.ExitStack() as stack:
        (xa, sa), (xb, sb) = _operand(a, dtype, storage_options), _operand(b, dtype, storage_options)
        client = connect(stack, scheduler)
        if client is not None:
            # Credentials of this process (its environment, ~/.aws) pass the library's checks but do not reach
            # the workers of a scheduler elsewhere, whose tasks then failed one by one: they are checked first.
            from dgemm.cluster import check_worker_access
            check_worker_access(client, {"a": a, "b": b, "out": out}, storage_options,
                                options_hint="--storage-option key=... --storage-option secret=...")
        if not scheduler:
            stack.enter_context(closing_new_local_clusters())
            stack.enter_context(announcing_local_clusters())
            if report:  # the report needs the client before the product starts
                from dgemm.cluster import get_client
                client = get_client(None, devices)
                stack.enter_context(client.as_current())   # dgemm's own cluster is no default client
        if report:
            from distributed import performance_report
            # Bokeh's JavaScript inlined: by default the report loads it from a CDN, and is a blank page on a
            # machine without internet (a cluster's login node, an air-gapped site).
            stack.enter_context(performance_report(filename=report, mode="inline"))
        from distributed import span
        stack.enter_context(span("dgemm-matmul"))  # groups the product's tasks in Fine Performance Metrics
        try:
            result = dgemm.matmul(xa, xb, out=out, client=client, overwrite=overwrite, block=block,
                                  devices=devices, progress=progress, resume=resume, precision=precision,
                                  storage_options=storage_options)
        except TypeError as e:
            if "float32 and float64 only" not in str(e):
                raise
            raise InputError(f"{one_line(e)}; or let --dtype cast the inputs") from None
    wall = time.perf_counter() - t0
    seconds = result.attrs.get(COMPLETE_ATTR, {}).get("seconds") or wall
    flops = _flops(sa, sb)
    if progress:
        click.echo()  # the progress bar leaves the cursor at the end of its line
    click.echo(f"shape: {' x '.join(map(str, result.shape))} {result.dtype}")
    click.echo(f"time: {seconds:.3f} s ({wall:.3f} s in all, with cluster start and checks)")
    if flops:
        click.echo(f"TFLOPS: {flops / seconds / 1e12:.4g}" if seconds else "TFLOPS: n/a")
    click.echo(f"written to: {out}")
    if report:
        click.echo(f"performance report: {report}")

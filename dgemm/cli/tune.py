"""``dgemm tune``: search kernel parameters for a device and store the best."""
from __future__ import annotations

import os
import time

import click

from dgemm.cli.common import cli, fmt_params, one_device, one_line, user_errors
from dgemm.dtypes import ALL_PRECISIONS, DTYPES


@cli.command(name="tune")
@click.option("--device", "device_spec", metavar="SPEC",
              help="The device: gpu, cpu, an id like 0:1, or part of its name "
                   "(default: the first device a local cluster would use).")
@click.option("--dtype", type=click.Choice((*DTYPES, "both")), default="both", show_default=True,
              help="Tune for this dtype; both: one search each (float64 only where the device has it).")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds of each search (the candidate under way when it runs out finishes).")
@click.option("--size", type=click.IntRange(min=1), default=None,
              help="Side of the timed product (default: 4096 on a GPU, 1024 on a CPU device).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the search order and inputs.")
@click.option("--max-candidates", type=click.IntRange(min=1), default=None,
              help="Try at most this many candidates per search (default: as many as the budget allows).")
@click.option("--database", type=click.Path(dir_okay=False), default=None,
              help="Store into this tuning database (default: the user database, $DGEMM_TUNING_DB "
                   "or the user cache folder).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the search's results to this JSON file.")
@click.option("--precision", type=click.Choice(ALL_PRECISIONS), multiple=True,
              help="Tune a tensor-core path (dmma: float64; 3xtf32, tf32: float32) instead of the FMA kernel; "
                   "give it several times to tune several paths in one call (the entries each sets: above).")
@click.option("--around", "around_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="An earlier --json report: its fastest sets and their variants are tried first.")
@click.pass_context
def tune_cmd(ctx, device_spec, dtype, budget, size, seed, max_candidates, database, json_path, precision,
             around_path):
    """Search GEMM kernel parameters for a device and store the fastest correct set.

    Every candidate is checked against numpy; only correct ones count.  The
    best becomes the device's entry in the user tuning database (or
    --database), which dgemm then uses on that device.

    \b
    Entries, by path (DTYPE:PATH, e.g. float32:tf32):
      no --precision  the FMA kernel, as DTYPE; as DTYPE:fma where the dtype's
                      default is a tensor-core kernel (float32 on Hopper, float64
                      with DMMA), which it leaves alone
      fma             DTYPE:fma, and DTYPE where the default is an FMA kernel
      dmma            float64:dmma, and float64's default
      tf32, 3xtf32    on Hopper (sm_90) the wgmma and the mma.sync kernels in one
                      search, the best of each: wgmma as DTYPE:PATH, mma.sync as
                      DTYPE:PATH/mma.sync (the stand-in where wgmma cannot build);
                      3xtf32 on wgmma is also float32's default there; elsewhere
                      the mma.sync kernel as DTYPE:PATH
    """
    import json

    from dgemm.benchmarks.records import write_json
    from dgemm.errors import DeviceError
    from dgemm.opencl import database as tuning
    from dgemm.opencl.device import Device
    from dgemm.tuning.search import (databases, default_size, earlier_winners, plan_runs, report_header, tune,
                                     tune_key, tuned_path)

    with user_errors(ctx):
        info = one_device(device_spec)
        wanted = list(DTYPES) if dtype == "both" else [dtype]
        runs = plan_runs(wanted, precision)
    if not info.fp64 and any(dt == "float64" for dt, _ in runs):
        if dtype == "float64" or all(dt == "float64" for dt, _ in runs):
            raise click.ClickException(f"device {info.name!r} has no double precision (cl_khr_fp64)")
        runs = [(dt, p) for dt, p in runs if dt != "float64"]
        click.echo(f"{info.name} has no double precision (cl_khr_fp64): tuning float32 only")
    earlier = None
    if around_path:
        with open(around_path) as f:
            earlier = json.load(f)
    size = size or default_size(info)
    db_path = os.path.abspath(database) if database else str(tuning.user_path())
    click.echo(f"tuning {info.id} {info.name} ({info.type}; driver {info.driver}) at {size} x {size} x {size}, "
               f"{budget:g} s per search; database {db_path}")
    try:
        dev = Device(info)
    except DeviceError as e:
        raise click.ClickException(one_line(e)) from None
    report = report_header(info, size=size, budget=budget, seed=seed, database=db_path)
    nothing = []
    for dt, asked in runs:
        prec = tuned_path(info, dt, asked, database)
        name = tune_key(dt, prec)
        if prec != asked:
            default = tuning.lookup(info, dt, databases(database)).params
            click.echo(f"{dt}'s default on {info.name} is the {default.precision} kernel "
                       f"({default.kind.instruction}): tuning the FMA kernel as {name}, the default is left "
                       f"alone (--precision {default.precision} tunes it)")
        t0 = time.monotonic()
        count = {"failed": 0}

        def progress(i, n, t, best, msg, name=name, t0=t0, count=count):
            head = f"  {name} [{i + 1:>{len(str(n))}}/{n} {time.monotonic() - t0:4.0f}s]"
            if t is None:
                count["failed"] += 1
                click.echo(f"{head} ERROR {msg}")
                return
            if not t.ok:
                count["failed"] += 1
            verdict = (f"{t.tflops:8.4g} TFLOPS" if t.ok and t.seconds > 0
                       else f"FAILED (rel_err {t.rel_err:.2g})" if not t.ok else "    n/a TFLOPS")
            best_s = f"{best.tflops:.4g}" if best is not None and best.seconds > 0 else "-"
            click.echo(f"{head} {verdict}  {fmt_params(t.params.as_dict())}  | best {best_s} TFLOPS, "
                       f"{count['failed']} failed")

        with user_errors(ctx):
            out = tune(dev, dt, size=size, budget=budget, seed=seed, max_candidates=max_candidates,
                       database=database, report=progress, precision=prec,
                       around=earlier_winners(earlier, dt, prec) if earlier else None)
        entry = report["dtypes"][name] = out.as_dict()
        if out.best is None:
            nothing.append(name)
            click.echo(f"{name}: no correct candidate among {entry['tried']} tried ({out.failed} failed); "
                       "nothing stored")
            continue
        b = out.best
        click.echo(f"{name}: best {b.tflops:.4g} TFLOPS (rel_err {b.rel_err:.2g}) with "
                   f"{fmt_params(b.params.as_dict())}; {entry['tried']} candidates tried in {out.seconds:.0f} s, "
                   f"{out.failed} failed")
        click.echo(f"{name}: stored in {out.stored} as")
        for key, t in out.entries.items():
            click.echo(f"  {key}: {t.tflops:.4g} TFLOPS with {fmt_params(t.params.as_dict())}")
        click.echo(f"{name} on {info.name} now uses {fmt_params(out.choice.params.as_dict())}")
        click.echo(f"{' ' * len(name)}  from the {out.choice.describe()}")
    if database and db_path != os.path.abspath(tuning.user_path()):
        click.echo(f"note: dgemm reads this database only with DGEMM_TUNING_DB={db_path}; "
                   f"otherwise it reads {tuning.user_path()}")
    if json_path:
        write_json(json_path, report)
        click.echo(f"results written to {json_path}")
    if nothing:
        raise click.ClickException(f"no correct kernel parameters found for {' and '.join(nothing)}; "
                                   "the database is unchanged for it")

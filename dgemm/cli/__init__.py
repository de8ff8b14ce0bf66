"""The ``dgemm`` command line (also ``dask dgemm``).

Commands: ``devices`` (what OpenCL devices there are and which kernel
parameters each would use), ``random`` (write a random Zarr matrix),
``plan`` (how a product would be cut into blocks), ``matmul`` (multiply two
Zarr arrays on a cluster), ``worker`` (one Dask worker per OpenCL device of
this host, for an existing scheduler), ``cluster`` (a one-host cluster with
the dashboard), ``demo`` (a self-checking run on the local devices),
``tune`` (search kernel parameters for a device and store the best in the
tuning database) and ``bench kernel`` (time the kernel against cuBLAS and
numpy, writing a JSON record).

Mistakes in what the user asked for end the command with a one-line
``Error: ...`` and exit status 2; a missing device or an unusable cluster
with status 1.  ``dgemm --debug ...`` shows the full traceback instead.
"""
from __future__ import annotations

import contextlib
import json
import os
import time

import click
import numpy as np

from dgemm import __version__

DTYPES = ("float32", "float64")

# The user's mistakes (exit 2) and the environment's (exit 1); anything else
# is a bug and keeps its traceback.
INPUT_ERRORS = (ValueError, TypeError, FileExistsError, LookupError)


class InputError(click.ClickException):
    """A one-line error about the command's arguments (exit status 2, like click's usage errors)."""

    exit_code = 2


def _environment_errors() -> tuple:
    from dgemm.cluster import NoDeviceWorkerError
    return (PermissionError, NoDeviceWorkerError)


@contextlib.contextmanager
def user_errors(ctx: click.Context | None = None):
    """Turn dgemm's documented errors into one-line click errors (unless ``--debug``)."""
    # find_object, not the root's obj: under ``dask dgemm`` the root context is dask's.
    opts = ctx.find_object(dict) if ctx is not None else None
    debug = bool(opts and opts.get("debug"))
    try:
        yield
    except click.ClickException:
        raise
    except _environment_errors() as e:
        if debug:
            raise
        raise click.ClickException(_one_line(e)) from None
    except INPUT_ERRORS as e:
        if debug:
            raise
        msg = _one_line(e)
        if isinstance(e, FileExistsError):  # the library names its keyword; here it is an option
            msg = msg.replace("overwrite=True", "--overwrite")
        raise InputError(msg) from None


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    # str(KeyError) and friends quote their argument; the others read fine as they are.
    return msg[1:-1] if isinstance(e, LookupError) and msg[:1] == msg[-1:] == "'" else msg


class BlockParam(click.ParamType):
    """``N`` or ``M,N,K``: preferred block sizes, as :func:`dgemm.matmul` takes them."""

    name = "N|M,N,K"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, tuple)):
            return value
        parts = str(value).replace("x", ",").split(",")
        try:
            vals = tuple(int(p) for p in parts)
        except ValueError:
            self.fail(f"{value!r} is not an integer or three integers M,N,K", param, ctx)
        if len(vals) not in (1, 3) or min(vals) < 1:
            self.fail(f"{value!r} must be one positive integer or three (M,N,K)", param, ctx)
        return vals[0] if len(vals) == 1 else vals


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024


def _fmt_params(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


@click.group(name="dgemm", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dgemm")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx, debug):
    """Matrix products of Zarr arrays on Dask clusters of OpenCL devices."""
    ctx.ensure_object(dict)["debug"] = debug


# -- devices ------------------------------------------------------------------
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
        click.echo(f"      memory {_fmt_bytes(d['global_mem'])} global, {_fmt_bytes(d['local_mem'])} local; "
                   f"{d['compute_units']} compute units; max work-group {d['max_work_group_size']}")
        click.echo(f"      fp64: {'yes' if d['fp64'] else 'no'}; architecture: {d['architecture'] or 'unknown'}")
        for dt in DTYPES:
            p = d["params"].get(dt)
            if p is None:
                click.echo(f"      {dt}: not supported (no cl_khr_fp64)")
                continue
            click.echo(f"      {dt}: {_fmt_params(p['params'])}")
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


# -- random -------------------------------------------------------------------
@cli.command()
@click.argument("path")
@click.option("--shape", nargs=2, type=click.IntRange(min=0), required=True, metavar="M N",
              help="Rows and columns.")
@click.option("--chunks", nargs=2, type=click.IntRange(min=1), required=True, metavar="R C",
              help="Zarr chunk shape.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float64", show_default=True)
@click.option("--seed", type=int, default=None, help="Random seed (default: fresh entropy).")
@click.option("--overwrite", is_flag=True, help="Replace an existing array at PATH.")
@click.pass_context
def random(ctx, path, shape, chunks, dtype, seed, overwrite):
    """Write a random standard-normal matrix to the Zarr array PATH, one chunk row at a time."""
    from dgemm.benchmarks.demo import random_zarr

    t0 = time.perf_counter()
    with user_errors(ctx):
        arr = random_zarr(path, shape, chunks, dtype, seed=seed, overwrite=overwrite)
    seconds = time.perf_counter() - t0
    nbytes = arr.size * arr.dtype.itemsize
    click.echo(f"wrote {path}: {arr.shape[0]} x {arr.shape[1]} {arr.dtype}, chunks {arr.chunks[0]} x "
               f"{arr.chunks[1]}, {_fmt_bytes(nbytes)} in {seconds:.2f} s")


# -- plan ---------------------------------------------------------------------
def _default_target(selection) -> int:
    # The same rule dgemm.matmul applies once it sees the workers.
    return 1024 if selection and all(d.type == "CPU" for d in selection) else 4096


@cli.command()
@click.argument("a")
@click.argument("b")
@click.option("--block", type=BlockParam(), default=None,
              help="Preferred block size N, or M,N,K (default: 1024 on CPU devices, 4096 otherwise).")
@click.option("--dtype", type=click.Choice(DTYPES), default=None,
              help="Plan for this dtype (default: the inputs' common dtype).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Devices to plan for (default: those a local cluster would use).")
@click.option("--read-gbps", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              help="Store read rate per worker assumed by the time floor (GB/s).")
@click.option("--write-gbps", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="Store write rate per worker (GB/s).")
@click.option("--pcie-gbps", type=click.FloatRange(min=0, min_open=True), default=20.0, show_default=True,
              help="Host-device copy rate per device (GB/s).")
@click.option("--tflops", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Kernel rate per device (default: the tuning database's figure for the device, if any).")
@click.pass_context
def plan(ctx, a, b, block, dtype, workers, read_gbps, write_gbps, pcie_gbps, tflops):
    """Show how A @ B (two Zarr arrays) would be cut into blocks, the bytes moved and the time floor.

    Needs no cluster.  Uses the first local device's kernel tiles, memory and
    recorded kernel rate when there is one (else the default tiles); a real
    run uses those of its workers' devices, which may differ.
    """
    from dgemm.opencl import discovery
    from dgemm.tuning.params import KernelParams
    from dgemm.plan import MEMORY_FRACTION, Rates, make_plan
    from dgemm.storage import Operand, check_dtype
    from dgemm.tuning.database import lookup

    try:
        selection = discovery.select_devices(None)
    except LookupError:  # planning needs no device; fall back to GPU-sized blocks
        selection = []
    with user_errors(ctx):
        A, B = Operand(a, "a"), Operand(b, "b")
        if A.ndim == 1:
            A.promote(0)
        if B.ndim == 1:
            B.promote(1)
        (m, k), (kb, n) = A.shape, B.shape
        if k != kb:
            raise ValueError(f"shapes do not match: a has shape {A.stored_shape} and b has shape "
                             f"{B.stored_shape}; the contracted dimensions differ ({k} != {kb})")
        dt = check_dtype(dtype or np.result_type(A.dtype, B.dtype), "the result")
        target = block if block is not None else _default_target(selection)
        tiles, memory, rate = KernelParams().tiles, None, None
        if selection:
            choice = lookup(selection[0], dt.name)
            tiles, memory, rate = choice.params.tiles, selection[0].global_mem, choice.tflops
        n_workers = workers or max(len(selection), 1)
        p = make_plan(m, n, k, dt, tiles, a_chunks=A.chunks, b_chunks=B.chunks, target=target,
                      n_workers=n_workers, device_memory=memory, exact=block is not None)
        rates = Rates(read=read_gbps * 1e9, write=write_gbps * 1e9, pcie=pcie_gbps * 1e9,
                      flops=(tflops or rate or 0) * 1e12 or None)
        cache = None if memory is None else max(0.0, MEMORY_FRACTION * memory - 2 * p.device_bytes())
    click.echo(p.explain())
    click.echo(p.explain_estimate(n_workers, rates, cache))


# -- matmul -------------------------------------------------------------------
def _connect(stack: contextlib.ExitStack, scheduler: str | None):
    """A client of ``scheduler`` closed with ``stack``, or None without one; a clear error if unreachable."""
    if not scheduler:
        return None
    from distributed import Client
    try:
        return stack.enter_context(Client(scheduler, timeout="10s"))
    except (OSError, TimeoutError) as e:
        raise click.ClickException(f"cannot connect to the scheduler at {scheduler}: {e}") from None


def _operand(path: str, dtype: str | None):
    """``path`` itself, or a lazily cast dask array when ``dtype`` differs from the stored one.

    Passing the path lets workers read Zarr blocks directly; only a cast
    needs dask in between.  Returns ``(operand, shape or None)``.
    """
    import zarr
    try:
        z = zarr.open_array(path, mode="r")
    except Exception:  # dgemm itself reports what is wrong with the path
        return path, None
    if dtype is None or z.dtype == np.dtype(dtype):
        return path, tuple(z.shape)
    import dask.array as da
    return da.from_zarr(z).astype(dtype), tuple(z.shape)


def _same_local_path(x: str, y: str) -> bool:
    if "://" in x or "://" in y:
        return x.rstrip("/") == y.rstrip("/")
    return os.path.realpath(x) == os.path.realpath(y)


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
@click.option("--precision", type=click.Choice(("fma", "dmma", "3xtf32", "tf32")), default=None,
              help="Kernel path (default: never loses accuracy; see `dgemm devices` for a device's paths).")
@click.option("--block", type=BlockParam(), default=None, help="Preferred block size N, or M,N,K.")
@click.option("--devices", metavar="SPEC",
              help="Devices of the local cluster: gpu, cpu, all, ids like 0:1, or name parts, comma-separated.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@click.option("--report", "report", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write Dask's HTML performance report of the run (task stream, profiles, "
                   "bandwidths) to FILE.")
@click.pass_context
def matmul(ctx, a, b, out, scheduler, dtype, overwrite, resume, precision, block, devices, progress, report):
    """Compute OUT = A @ B for Zarr arrays A and B, writing OUT as a Zarr array."""
    import dgemm

    from dgemm.benchmarks.demo import closing_new_local_clusters
    from dgemm.storage import COMPLETE_ATTR

    if scheduler and devices:
        raise InputError("--devices chooses devices for a local cluster; the workers of --scheduler "
                         "have their own (set DGEMM_DEVICE in each worker's environment)")
    if report:
        folder = os.path.dirname(os.path.abspath(report))
        if not os.path.isdir(folder):
            raise InputError(f"--report {report}: the folder {folder} does not exist")
    for name, path in (("A", a), ("B", b)):
        if _same_local_path(out, path):
            # With --overwrite the output would be recreated (zeroed) before the
            # input is read, and the zeros marked complete.
            raise InputError(f"OUT is the same array as {name} ({path}); write the product elsewhere")
    t0 = time.perf_counter()
    with user_errors(ctx), contextlib.ExitStack() as stack:
        (xa, sa), (xb, sb) = _operand(a, dtype), _operand(b, dtype)
        client = _connect(stack, scheduler)
        if not scheduler:
            stack.enter_context(closing_new_local_clusters())
            if report:  # the report needs the client before the product starts
                from dgemm.cluster import get_client
                client = get_client(None, devices)
        if report:
            from distributed import performance_report
            stack.enter_context(performance_report(filename=report))
        from distributed import span
        stack.enter_context(span("dgemm-matmul"))  # groups the product's tasks in Fine Performance Metrics
        try:
            result = dgemm.matmul(xa, xb, out=out, client=client, overwrite=overwrite, block=block,
                                  devices=devices, progress=progress, resume=resume, precision=precision)
        except TypeError as e:
            if "float32 and float64 only" not in str(e):
                raise
            raise InputError(f"{_one_line(e)}; or let --dtype cast the inputs") from None
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


# -- worker and cluster ---------------------------------------------------------
def _security(tls_ca_file, tls_cert, tls_key):
    """TLS from the command line, else None (the Dask configuration's, e.g. deploy/tls/)."""
    if not (tls_ca_file or tls_cert or tls_key):
        return None
    from distributed.security import Security
    return Security(tls_ca_file=tls_ca_file, tls_worker_cert=tls_cert, tls_worker_key=tls_key,
                    require_encryption=True)


def _echo_workers(specs, scheduler):
    for spec in specs:
        d = spec["device"]
        name = spec["name"] if spec["name"] not in (None, "") else "(unnamed)"
        click.echo(f"worker {name}: device {d.id} {d.name} ({d.type}), {spec['nthreads']} threads, "
                   f"resources {spec['resources']} -> {scheduler}")


def _worker_options(f):
    """Options ``dgemm worker`` and ``dgemm cluster`` share."""
    for opt in reversed([
        click.option("--devices", metavar="SPEC",
                     help="Devices to start workers on: gpu, cpu, all, ids like 0:1, or name parts, "
                          "comma-separated; a device named twice gets two workers "
                          "(default: $DGEMM_DEVICES, else every GPU, else a CPU device)."),
        click.option("--nthreads", type=click.IntRange(min=1), default=None,
                     help="Threads per worker (default: the cores shared among the workers, at least 2)."),
        click.option("--memory-limit", default="auto", show_default=True,
                     help="Memory limit per worker: bytes (16GB), a fraction of this host's memory, 0 for "
                          "none, or auto (this host's memory shared among the workers)."),
    ]):
        f = opt(f)
    return f


@cli.command(name="worker")
@click.argument("scheduler", required=False, envvar="DASK_SCHEDULER_ADDRESS")
@_worker_options
@click.option("--scheduler-file", type=click.Path(dir_okay=False), default=None,
              help="Read the scheduler's address from this file (as dask worker).")
@click.option("--name", default=None,
              help="Worker name; with several devices, worker i is NAME-i (as dask worker --nworkers).")
@click.option("--resources", default=None, metavar="'NAME=N ...'",
              help="More resources per worker; GPU=1 is always there.")
@click.option("--host", default=None, help="Host (address) the workers listen on.")
@click.option("--interface", default=None, help="Network interface the workers listen on, e.g. ib0.")
@click.option("--protocol", default=None, help="Protocol: tcp, tls, ucx...")
@click.option("--dashboard-address", default=":0", show_default=True,
              help="Each worker's HTTP server (its /metrics); a fixed port P becomes P+i for worker i.")
@click.option("--dashboard/--no-dashboard", default=True, show_default=True,
              help="Run the workers' HTTP servers.")
@click.option("--death-timeout", default=None, help="Seconds a worker waits for the scheduler before exiting.")
@click.option("--local-directory", type=click.Path(file_okay=False), default=None,
              help="Workers' scratch folder.")
@click.option("--lifetime", default=None, help="Close the workers after this long, e.g. 1 hour.")
@click.option("--lifetime-stagger", default="0 seconds", show_default=True,
              help="Random variation of --lifetime between workers.")
@click.option("--lifetime-restart/--no-lifetime-restart", default=False, show_default=True,
              help="Restart the workers after --lifetime.")
@click.option("--tls-ca-file", default=None, help="CA certificate (TLS).")
@click.option("--tls-cert", default=None, help="Worker certificate (TLS).")
@click.option("--tls-key", default=None, help="Worker private key (TLS).")
@click.pass_context
def worker_cmd(ctx, scheduler, devices, nthreads, memory_limit, scheduler_file, name, resources, host, interface,
               protocol, dashboard_address, dashboard, death_timeout, local_directory, lifetime,
               lifetime_stagger, lifetime_restart, tls_ca_file, tls_cert, tls_key):
    """Start one Dask worker per OpenCL device of this host, connected to SCHEDULER.

    Each worker runs under its own nanny, is pinned to its device
    (DGEMM_DEVICE), advertises the resource GPU=1 and carries the dgemm
    worker plugin, as `dask cuda worker` does for CUDA devices.  SCHEDULER
    defaults to $DASK_SCHEDULER_ADDRESS.  The workers run until Ctrl-C
    (SIGINT) or SIGTERM.  Accepts the flags dask-jobqueue passes to its
    worker command (--name, --nthreads, --memory-limit, --death-timeout,
    --local-directory, --interface, --protocol, --tls-*).
    """
    import asyncio

    from dgemm.cluster.launch import parse_resources, run_workers, worker_specs

    if not scheduler and not scheduler_file:
        raise InputError("give the scheduler's address (SCHEDULER, $DASK_SCHEDULER_ADDRESS) or --scheduler-file")
    with user_errors(ctx):
        specs = worker_specs(devices, name=name, nthreads=nthreads, memory_limit=memory_limit,
                             resources=parse_resources(resources),
                             dashboard_address=dashboard_address if dashboard else None)
    common = {"scheduler_file": scheduler_file, "host": host, "interface": interface, "protocol": protocol,
              "security": _security(tls_ca_file, tls_cert, tls_key), "death_timeout": death_timeout,
              "local_directory": local_directory, "lifetime": lifetime, "lifetime_stagger": lifetime_stagger,
              "lifetime_restart": lifetime_restart}
    _echo_workers(specs, scheduler or f"the scheduler in {scheduler_file}")
    status = asyncio.run(run_workers(scheduler, specs, log=lambda m: click.echo(m, err=True),
                                     **{k: v for k, v in common.items() if v is not None}))
    if status:
        raise click.ClickException("the workers could not start (see the log above)")


@cli.command(name="cluster")
@_worker_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address the scheduler and workers listen on (0.0.0.0 or a host name to accept "
                   "dgemm worker processes from other hosts).")
@click.option("--port", type=click.IntRange(min=0), default=8786, show_default=True,
              help="Scheduler port (0: any free port).")
@click.option("--dashboard-address", default=None,
              help="Dashboard address (default: HOST:8787, or a free port if that is taken).")
@click.option("--scheduler-file", type=click.Path(dir_okay=False), default=None,
              help="Also write the scheduler's address to this file (for dgemm worker --scheduler-file).")
@click.pass_context
def cluster_cmd(ctx, devices, nthreads, memory_limit, host, port, dashboard_address, scheduler_file):
    """Run a one-host cluster: a scheduler with the dashboard and one worker per device.

    Prints the scheduler's address (for Client(...), dgemm matmul
    --scheduler and more dgemm worker processes) and the dashboard's dgemm
    page, then runs until Ctrl-C (SIGINT) or SIGTERM.
    """
    import asyncio

    from dgemm.cluster.launch import run_workers, worker_specs

    local = host not in ("0.0.0.0", "", "::")
    with user_errors(ctx):
        specs = worker_specs(devices, nthreads=nthreads, memory_limit=memory_limit,
                             dashboard_address=f"{host}:0" if local else ":0")
    dashboard_address = dashboard_address or f"{host}:8787"

    async def run():
        from distributed import Scheduler
        from distributed.utils import format_dashboard_link

        from dgemm.scheduler.dashboard import DgemmDashboard, PLUGIN_NAME, ROUTE

        async with Scheduler(host=host, port=port, dashboard_address=dashboard_address,
                             scheduler_file=scheduler_file, plugins=[DgemmDashboard()]) as s:
            assert PLUGIN_NAME in s.plugins
            link = format_dashboard_link(s.ip if host in ("0.0.0.0", "") else host, s.http_server.port)
            click.echo(f"scheduler: {s.address}")
            click.echo(f"dashboard: {link}")
            click.echo(f"dgemm page: {link.rsplit('/', 1)[0]}{ROUTE}")
            _echo_workers(specs, s.address)
            click.echo("press Ctrl-C to stop")
            return await run_workers(s.address, specs, log=lambda m: click.echo(m, err=True),
                                     **({"host": host} if local else {}))

    status = asyncio.run(run())
    if status:
        raise click.ClickException("the workers could not start (see the log above)")


# -- demo ---------------------------------------------------------------------
@cli.command()
@click.option("--size", type=click.IntRange(min=1), default=None,
              help="Matrix side (default: 1024 on CPU devices, 16384 with a GPU).")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--devices", metavar="SPEC", help="Devices of the local cluster (as for matmul).")
@click.option("--keep", type=click.Path(file_okay=False), default=None,
              help="Write a.zarr, b.zarr and c.zarr into this folder and keep them.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the figures to this JSON file (e.g. bench/results/<host>.json).")
@click.pass_context
def demo(ctx, size, dtype, devices, keep, seed, json_path):
    """Multiply two random Zarr matrices on the local devices and check the result against numpy."""
    from dgemm.benchmarks.demo import run_demo

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
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            # NaN is not JSON: a non-finite error is recorded as null (and "passed": false).
            json.dump({k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}, f, indent=2)
            f.write("\n")
        click.echo(f"figures written to {json_path}")
    if not r["passed"]:
        raise click.ClickException(f"the result does not match numpy: max relative error "
                                   f"{r['max_rel_err']:.3g} > {r['tolerance']:.3g}")


# -- tune ---------------------------------------------------------------------
def _one_device(spec: str | None):
    """The first device ``spec`` selects (as ``select_devices``); exit 1 when there is none at all."""
    from dgemm.opencl import discovery

    if not discovery.list_devices():
        raise click.ClickException("no OpenCL device found. " + discovery.icd_hint())
    return discovery.select_devices(spec)[0]


def _timing_dict(t) -> dict:
    return {"params": t.params.as_dict(), "tflops": t.tflops if t.seconds > 0 else None,
            "seconds": t.seconds, "rel_err": t.rel_err, "ok": t.ok}


@cli.command(name="tune")
@click.option("--device", "device_spec", metavar="SPEC",
              help="The device: gpu, cpu, an id like 0:1, or part of its name "
                   "(default: the first device a local cluster would use).")
@click.option("--dtype", type=click.Choice((*DTYPES, "both")), default="both", show_default=True,
              help="Tune for this dtype; both: one search each (float64 only where the device has it).")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds of search per dtype (the candidate under way when it runs out finishes).")
@click.option("--size", type=click.IntRange(min=1), default=None,
              help="Side of the timed product (default: 4096 on a GPU, 256 on a CPU device).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the search order and inputs.")
@click.option("--max-candidates", type=click.IntRange(min=1), default=None,
              help="Try at most this many candidates per dtype (default: as many as the budget allows).")
@click.option("--database", type=click.Path(dir_okay=False), default=None,
              help="Store into this tuning database (default: the user database, $DGEMM_TUNING_DB "
                   "or the user cache folder).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the search's results to this JSON file.")
@click.option("--precision", type=click.Choice(("fma", "dmma", "3xtf32", "tf32")), default=None,
              help="Tune a tensor-core path (dmma: float64; 3xtf32, tf32: float32) instead of the FMA kernel.")
@click.pass_context
def tune_cmd(ctx, device_spec, dtype, budget, size, seed, max_candidates, database, json_path, precision):
    """Search GEMM kernel parameters for a device and store the fastest correct set.

    Every candidate is checked against numpy; only correct ones count.  The
    best becomes the device's entry in the user tuning database (or
    --database), which dgemm then uses on that device.
    """
    from dgemm.tuning import database as tuning
    from dgemm.benchmarks import command_line, git_commit, utc_now, write_json
    from dgemm.opencl.device import Device, DeviceError
    from dgemm.tuning.search import default_size, tune

    with user_errors(ctx):
        info = _one_device(device_spec)
    wanted = list(DTYPES) if dtype == "both" else [dtype]
    if precision is not None:  # a precision belongs to one dtype; "both" means that one
        wanted = [dt for dt in wanted if precision in tuning.PRECISIONS[dt]]
        if not wanted:
            raise InputError(f"--precision {precision} is not available for --dtype {dtype}")
    if not info.fp64 and "float64" in wanted:
        if dtype == "float64":
            raise click.ClickException(f"device {info.name!r} has no double precision (cl_khr_fp64)")
        wanted.remove("float64")
        click.echo(f"{info.name} has no double precision (cl_khr_fp64): tuning float32 only")
    size = size or default_size(info)
    db_path = os.path.abspath(database) if database else str(tuning.user_path())
    click.echo(f"tuning {info.id} {info.name} ({info.type}; driver {info.driver}) at {size} x {size} x {size}, "
               f"{budget:g} s per dtype; database {db_path}")
    try:
        dev = Device(info)
    except DeviceError as e:
        raise click.ClickException(_one_line(e)) from None
    report = {"device": info.name, "device_id": info.id, "driver": info.driver, "architecture": info.architecture,
              "date": utc_now(), "commit": git_commit()[0], "command": command_line(),
              "dgemm_version": __version__, "size": size, "budget": budget, "seed": seed,
              "database": db_path, "dtypes": {}}
    nothing = []
    for dt in wanted:
        t0 = time.monotonic()
        count = {"failed": 0}

        def progress(i, n, t, best, msg, dt=dt, t0=t0, count=count):
            head = f"  {dt} [{i + 1:>{len(str(n))}}/{n} {time.monotonic() - t0:4.0f}s]"
            if t is None:
                count["failed"] += 1
                click.echo(f"{head} ERROR {msg}")
                return
            if not t.ok:
                count["failed"] += 1
            verdict = (f"{t.tflops:8.4g} TFLOPS" if t.ok and t.seconds > 0
                       else f"FAILED (rel_err {t.rel_err:.2g})" if not t.ok else "    n/a TFLOPS")
            best_s = f"{best.tflops:.4g}" if best is not None and best.seconds > 0 else "-"
            click.echo(f"{head} {verdict}  {_fmt_params(t.params.as_dict())}  | best {best_s} TFLOPS, "
                       f"{count['failed']} failed")

        with user_errors(ctx):
            out = tune(dev, dt, size=size, budget=budget, seed=seed, max_candidates=max_candidates,
                       database=database, report=progress, precision=precision)
        tried = len(out.results) + len(out.errors)
        ranked = sorted((t for t in out.results if t.ok), key=lambda t: t.seconds)
        report["dtypes"][dt] = {
            "tried": tried, "failed": out.failed, "seconds": out.seconds,
            "best": _timing_dict(out.best) if out.best else None,
            "top": [_timing_dict(t) for t in ranked[:10]],
            "incorrect": [_timing_dict(t) for t in out.incorrect[:10]], "errors": out.errors[:10],
            "stored": str(out.stored) if out.stored else None,
            "now_used": {"params": out.choice.params.as_dict(), "source": out.choice.describe(),
                         "level": out.choice.level, "tuned": out.choice.tuned}}
        if out.best is None:
            nothing.append(dt)
            click.echo(f"{dt}: no correct candidate among {tried} tried ({out.failed} failed); nothing stored")
            continue
        b = out.best
        click.echo(f"{dt}: best {b.tflops:.4g} TFLOPS (rel_err {b.rel_err:.2g}) with {_fmt_params(b.params.as_dict())}; "
                   f"{tried} candidates tried in {out.seconds:.0f} s, {out.failed} failed")
        click.echo(f"{dt}: stored in {out.stored}")
        click.echo(f"{dt} on {info.name} now uses {_fmt_params(out.choice.params.as_dict())}")
        click.echo(f"{' ' * len(dt)}  from the {out.choice.describe()}")
    if database and db_path != os.path.abspath(tuning.user_path()):
        click.echo(f"note: dgemm reads this database only with DGEMM_TUNING_DB={db_path}; "
                   f"otherwise it reads {tuning.user_path()}")
    if json_path:
        write_json(json_path, report)
        click.echo(f"results written to {json_path}")
    if nothing:
        raise click.ClickException(f"no correct kernel parameters found for {' and '.join(nothing)}; "
                                   "the database is unchanged for it")


# -- bench --------------------------------------------------------------------
def _csv(value: str, what: str, convert):
    items = [v.strip() for v in str(value).split(",") if v.strip()]
    if not items:
        raise InputError(f"--{what} needs at least one value")
    try:
        return [convert(v) for v in items]
    except ValueError as e:
        raise InputError(f"--{what} {value!r}: {_one_line(e)}") from None


def _dtype_name(v: str) -> str:
    if v not in DTYPES:
        raise ValueError(f"{v!r} is not float32 or float64")
    return v


def _size(v: str) -> int:
    n = int(v)
    if n < 1:
        raise ValueError(f"{n} is not a positive size")
    return n


@cli.group()
def bench():
    """Benchmarks that write JSON records (by default into bench/results/)."""


@bench.command(name="kernel")
@click.option("--device", "device_spec", metavar="SPEC",
              help="The device (as for tune; default: the first device a local cluster would use).")
@click.option("--dtypes", default="float32,float64", show_default=True,
              help="Comma-separated dtypes (float64 is skipped on devices without it).")
@click.option("--sizes", default=None,
              help="Comma-separated square sizes, timed in this order (default: 1024,2048,4096,8192,16384,10000; "
                   "256,512,1024 on a CPU device).")
@click.option("--reps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed repetitions per size (the median counts).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench/results", show_default=True,
              help="Folder of the JSON record kernel-<device>-<date>.json.")
@click.option("--no-peers", is_flag=True, help="Time dgemm's kernel only, not cuBLAS and numpy.")
@click.pass_context
def bench_kernel(ctx, device_spec, dtypes, sizes, reps, out_dir, no_peers):
    """Time the GEMM kernel alone, with the parameters the tuning database chooses.

    Runs on device-resident inputs; every run is checked against numpy and
    one that fails is reported as FAILED (its time does not count).  Peers
    in the same run: cuBLAS (through torch, TF32 off, or cupy) where CUDA is
    available, and numpy in the same dtype for sizes up to 4096.
    """
    from dgemm.benchmarks import format_table, kernel_bench

    dts = _csv(dtypes, "dtypes", _dtype_name)
    size_list = _csv(sizes, "sizes", _size) if sizes is not None else None
    with user_errors(ctx):
        info = _one_device(device_spec)
        record, path = kernel_bench(info, dtypes=dts, sizes=size_list, reps=reps, out_dir=out_dir,
                                    peers=not no_peers, log=click.echo)
    click.echo()
    click.echo(format_table(record))
    click.echo(f"record written to {path}")
    if record["failures"]:
        raise click.ClickException(f"{record['failures']} run(s) FAILED (see {path})")


@bench.command(name="e2e")
@click.option("--size", type=click.IntRange(min=1), default=None,
              help="Square product M = N = K (default: 32768 with a GPU, 1024 on CPU devices).")
@click.option("--shape", default=None, metavar="M,N,K", help="A non-square product instead of --size.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--chunks", type=click.IntRange(min=1), default=8192, show_default=True,
              help="Zarr chunk side of the inputs (capped to the matrix).")
@click.option("--devices", metavar="SPEC",
              help="Devices of dgemm's local cluster, one worker each: gpu, 0,1, cpu,cpu... (as for matmul).")
@click.option("--scheduler", metavar="ADDR",
              help="Time dgemm on the running cluster at ADDR instead of a local one.")
@click.option("--gpus", default=None, metavar="1,2,...",
              help="Also a scaling table: dgemm on the first 1, 2... devices of --devices, each its own cluster.")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Folder for the Zarr files, e.g. /dev/shm or a local disk (a dgemm-e2e-* folder is made "
                   "in it; default: the temporary folder).")
@click.option("--keep", is_flag=True, help="Keep the Zarr files (inputs and outputs).")
@click.option("--no-peers", is_flag=True, help="Time dgemm only, not dask.array + cupy, cuBLAS, dask.array + numpy.")
@click.option("--numpy-size", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Side cap of the dask.array + numpy comparison (dgemm runs at that size too).")
@click.option("--kernel-size", type=click.IntRange(min=1), default=None,
              help="Side of the in-memory kernel timing (default: the full size when its buffers fit "
                   "32-bit indexing, else sides capped at 32768).")
@click.option("--reps", type=click.IntRange(min=1), default=1, show_default=True,
              help="Timed repetitions of each end-to-end run (the median counts).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench/results", show_default=True,
              help="Folder of the JSON record e2e-<device>-<date>.json.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--uncompressed", is_flag=True,
              help="Store C without compression (dgemm and the peers); default: Zarr's default codec.")
@click.pass_context
def bench_e2e(ctx, size, shape, dtype, chunks, devices, scheduler, gpus, store, keep, no_peers, numpy_size,
              kernel_size, reps, out_dir, seed, uncompressed):
    """Time dgemm from Zarr to Zarr against dask.array + cupy, cuBLAS and dask.array + numpy.

    Writes random A and B as uncompressed Zarr arrays, then on those inputs
    times dgemm.matmul (kernels built first) with the workers' counters,
    peak memory and a sampled correctness check, dgemm's kernel in device
    memory, and the peers that can run here.  A wrong dgemm result makes
    the command fail.
    """
    from dgemm.benchmarks.e2e import e2e_bench, format_table

    if size is not None and shape is not None:
        raise InputError("give --size or --shape, not both")
    mnk = _csv(shape, "shape", _size) if shape is not None else None
    if mnk is not None and len(mnk) != 3:
        raise InputError(f"--shape {shape!r}: give three sizes M,N,K")
    gpu_counts = _csv(gpus, "gpus", _size) if gpus is not None else None
    if scheduler and (devices or gpu_counts):
        raise InputError("--devices and --gpus start local clusters; the workers of --scheduler have their own "
                         "devices")
    with user_errors(ctx), contextlib.ExitStack() as stack:
        client = _connect(stack, scheduler)
        record, path = e2e_bench(size, shape=mnk, dtype=dtype, chunks=chunks, devices=devices, gpus=gpu_counts,
                                 store=store, keep=keep, peers=not no_peers, numpy_size=numpy_size,
                                 kernel_size=kernel_size, reps=reps, out_dir=out_dir, client=client, seed=seed,
                                 compressors=None if uncompressed else "auto", log=click.echo)
    click.echo()
    click.echo(format_table(record))
    if keep:
        click.echo(f"Zarr files kept in {record['store']}")
    click.echo(f"record written to {path}")
    if record["failures"]:
        raise click.ClickException(f"{record['failures']} dgemm run(s) FAILED (see {path})")


@bench.command(name="plot")
@click.argument("records", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True, help="The PNG to write.")
@click.pass_context
def bench_plot(ctx, records, out_path):
    """Plot TFLOPS and parallel efficiency against GPU count from e2e records made with --gpus."""
    with user_errors(ctx):
        try:
            from dgemm.benchmarks.plots import load_records, scaling_plot
            import matplotlib  # noqa: F401
        except ImportError:
            raise InputError("dgemm bench plot needs matplotlib: pip install 'dgemm[plot]'") from None
        path = scaling_plot(load_records(records), out_path)
    click.echo(f"plot written to {path}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dgemm`` console script."""
    cli.main(args=argv, prog_name="dgemm")


if __name__ == "__main__":
    main()

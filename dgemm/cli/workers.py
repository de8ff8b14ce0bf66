"""``dgemm worker`` (one Dask worker per device of this host) and ``dgemm cluster`` (a one-host cluster)."""
from __future__ import annotations

import errno
import os
import warnings

import click

from dgemm.cli.common import InputError, cli, one_line, user_errors


def _security(tls_ca_file, tls_cert, tls_key, scheduler=False):
    """TLS from the command line, else None (the Dask configuration's, e.g. deploy/tls/).

    The one certificate serves the workers and, for ``dgemm cluster`` (``scheduler``),
    its scheduler too, as one node certificate does in deploy/tls/.
    """
    if not (tls_ca_file or tls_cert or tls_key):
        return None
    if not (tls_ca_file and tls_cert):
        raise InputError("TLS needs --tls-ca-file and --tls-cert (and --tls-key unless the key is in the "
                         "certificate's file)")
    from distributed.security import Security
    both = {"tls_scheduler_cert": tls_cert, "tls_scheduler_key": tls_key} if scheduler else {}
    return Security(tls_ca_file=tls_ca_file, tls_worker_cert=tls_cert, tls_worker_key=tls_key,
                    require_encryption=True, **both)


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
        click.option("--device-memory-limit", default=None, metavar="BYTES|FRACTION",
                     help="Caps the device memory each worker plans for, e.g. 4GiB, or 0.8 of its device's "
                          "(a device shared with other jobs); sets DGEMM_DEVICE_MEMORY_LIMIT in each worker "
                          "(default: the worker's own setting)."),
        click.option("--preload", multiple=True, metavar="MODULE",
                     help="Module (foo.bar) or file (/path/to/foo.py) each worker process loads, as dask "
                          "worker --preload; repeatable."),
        click.option("--tls-ca-file", default=None, type=click.Path(exists=True, dir_okay=False),
                     help="CA certificate (TLS); with --tls-cert and --tls-key, every connection is TLS."),
        click.option("--tls-cert", default=None, type=click.Path(exists=True, dir_okay=False),
                     help="Node certificate (TLS) of the workers (and of dgemm cluster's scheduler)."),
        click.option("--tls-key", default=None, type=click.Path(exists=True, dir_okay=False),
                     help="Private key of --tls-cert (TLS)."),
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
@click.option("--dashboard-prefix", default=None, metavar="PREFIX",
              help="Path prefix of each worker's HTTP server, e.g. behind a proxy (/metrics becomes "
                   "/PREFIX/metrics).")
@click.option("--pid-file", type=click.Path(dir_okay=False), default=None,
              help="Write this process's id to this file while it runs (as dask worker).")
@click.pass_context
def worker_cmd(ctx, scheduler, devices, nthreads, memory_limit, device_memory_limit, preload, tls_ca_file, tls_cert,
               tls_key, scheduler_file, name, resources, host, interface, protocol, dashboard_address, dashboard,
               death_timeout, local_directory, lifetime, lifetime_stagger, lifetime_restart, dashboard_prefix,
               pid_file):
    """Start one Dask worker per OpenCL device of this host, connected to SCHEDULER.

    Each worker runs under its own nanny, is pinned to its device
    (DGEMM_DEVICE), advertises the resource GPU=1 and carries the dgemm
    worker plugin, as `dask cuda worker` does for CUDA devices.  SCHEDULER
    defaults to $DASK_SCHEDULER_ADDRESS.  The workers run until Ctrl-C
    (SIGINT) or SIGTERM.  Accepts the flags dask-jobqueue passes to its
    worker command (--name, --nthreads, --memory-limit, --death-timeout,
    --local-directory, --interface, --protocol, --tls-*) and what `dask
    worker` and `dask cuda worker` users pass (--preload, --resources,
    --device-memory-limit, --pid-file, --dashboard-prefix, --scheduler-file).
    """
    import asyncio

    from dgemm.cluster.launch import parse_resources, run_workers, worker_specs

    if not scheduler and not scheduler_file:
        raise InputError("give the scheduler's address (SCHEDULER, $DASK_SCHEDULER_ADDRESS) or --scheduler-file")
    security = _security(tls_ca_file, tls_cert, tls_key)
    with user_errors(ctx):
        specs = worker_specs(devices, name=name, nthreads=nthreads, memory_limit=memory_limit,
                             resources=parse_resources(resources),
                             dashboard_address=dashboard_address if dashboard else None,
                             device_memory_limit=device_memory_limit, preload=preload,
                             dashboard_prefix=dashboard_prefix)
    if security is not None and protocol is None:
        protocol = "tls"           # the workers listen on TLS too, not only connect with it
    common = {"scheduler_file": scheduler_file, "host": host, "interface": interface, "protocol": protocol,
              "security": security, "death_timeout": death_timeout,
              "local_directory": local_directory, "lifetime": lifetime, "lifetime_stagger": lifetime_stagger,
              "lifetime_restart": lifetime_restart}
    _echo_workers(specs, scheduler or f"the scheduler in {scheduler_file}")
    if pid_file:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
    try:
        status = asyncio.run(run_workers(scheduler, specs, log=lambda m: click.echo(m, err=True),
                                         **{k: v for k, v in common.items() if v is not None}))
    finally:
        if pid_file and os.path.exists(pid_file):
            os.remove(pid_file)
    if status:
        raise click.ClickException("the workers could not start (see the log above)")


DEFAULT_DASHBOARD_PORT = 8787


def _refuse_taken_ports(host: str, port: int, dashboard_address: str | None) -> None:
    """Refuse, in one line (exit 1), a scheduler port or a dashboard port given by the user that cannot be
    listened on (another process holds it), before anything starts.

    Unchecked, a taken scheduler port ends in distributed's traceback and a
    taken dashboard port is quietly moved to another one, which the user who
    named it (a proxy, a tunnel, a firewall rule) did not ask for.  The
    default dashboard port (``dashboard_address`` None) may move: its help says so.
    """
    from distributed.utils import clean_dashboard_address

    from dgemm.cluster.launch import bind_error

    def refuse(what, option, h, p, error):
        taken = getattr(error, "errno", None) == errno.EADDRINUSE
        why = "another process listens there (a dgemm cluster already running?)" if taken else one_line(error)
        raise click.ClickException(f"{what} cannot listen on {h}:{p}: {why}; choose another with {option}")

    if port:
        error = bind_error(host, port)
        if error is not None:
            refuse("the scheduler", "--port (0: any free port)", host, port, error)
    if dashboard_address is None:
        return
    try:
        addresses = clean_dashboard_address(dashboard_address)
    except (ValueError, TypeError):
        raise InputError(f"--dashboard-address {dashboard_address!r}: expected HOST:PORT, :PORT or PORT") from None
    for a in addresses:
        # distributed listens on every interface for an address without a host
        h = a["address"] or "0.0.0.0"
        error = bind_error(h, a["port"]) if a["port"] else None
        if error is not None:
            refuse("the dashboard", "--dashboard-address (HOST:0: any free port)", h, a["port"], error)


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
def cluster_cmd(ctx, devices, nthreads, memory_limit, device_memory_limit, preload, tls_ca_file, tls_cert, tls_key,
                host, port, dashboard_address, scheduler_file):
    """Run a one-host cluster: a scheduler with the dashboard and one worker per device.

    Prints the scheduler's address (for Client(...), dgemm matmul
    --scheduler and more dgemm worker processes) and the dashboard's dgemm
    page, then runs until Ctrl-C (SIGINT) or SIGTERM.  With --tls-ca-file,
    --tls-cert and --tls-key the scheduler and the workers speak TLS only
    (tls:// addresses; clients need certificates from that authority).
    """
    import asyncio

    from dgemm.cluster.launch import run_workers, worker_specs

    local = host not in ("0.0.0.0", "", "::")
    security = _security(tls_ca_file, tls_cert, tls_key, scheduler=True)
    tls = {"security": security, "protocol": "tls"} if security is not None else {}
    with user_errors(ctx):
        specs = worker_specs(devices, nthreads=nthreads, memory_limit=memory_limit,
                             dashboard_address=f"{host}:0" if local else ":0",
                             device_memory_limit=device_memory_limit, preload=preload)
    given = dashboard_address is not None
    dashboard_address = dashboard_address or f"{host}:8787"
    _refuse_taken_ports(host, port, dashboard_address if given else None)

    async def run():
        from distributed import Scheduler
        from distributed.utils import format_dashboard_link

        from dgemm.names import DASHBOARD_PLUGIN
        from dgemm.scheduler.dashboard import ROUTE, DgemmDashboard

        with warnings.catch_warnings():
            # The default dashboard port, taken, moves to a free one (said in one line below) instead of
            # distributed's three-line warning (the dashboard starts in Scheduler()).
            if not given:   # a port the user named and lost since the check above: distributed's warning stays
                warnings.filterwarnings("ignore", message="Port .* is already in use")
            try:
                scheduler = Scheduler(host=host, port=port, dashboard_address=dashboard_address,
                                      scheduler_file=scheduler_file, plugins=[DgemmDashboard()], **tls)
                await scheduler
            except Exception as e:   # a port taken since the check above: its OSError, not a traceback
                cause = e.__cause__ if isinstance(e.__cause__, OSError) else e
                raise click.ClickException(f"the scheduler could not start on {host}:{port}: {one_line(cause)}") \
                    from None
        async with scheduler as s:
            assert DASHBOARD_PLUGIN in s.plugins
            link = format_dashboard_link(s.ip if host in ("0.0.0.0", "") else host, s.http_server.port)
            click.echo(f"scheduler: {s.address}")
            if not given and s.http_server.port != DEFAULT_DASHBOARD_PORT:
                click.echo(f"dashboard: port {DEFAULT_DASHBOARD_PORT} is taken (another cluster?); "
                           f"serving on {s.http_server.port} instead", err=True)
            click.echo(f"dashboard: {link}")
            click.echo(f"dgemm page: {link.rsplit('/', 1)[0]}{ROUTE}")
            _echo_workers(specs, s.address)
            click.echo("press Ctrl-C to stop")
            return await run_workers(s.address, specs, log=lambda m: click.echo(m, err=True),
                                     **({"host": host} if local else {}), **tls)

    status = asyncio.run(run())
    if status:
        raise click.ClickException("the workers could not start (see the log above)")

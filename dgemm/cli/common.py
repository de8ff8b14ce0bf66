"""The ``dgemm`` click group, its error handling and what the commands share.

The user's mistakes (bad options, arguments or inputs) end a command with a
one-line ``Error: ...`` and exit status 2; the environment's (no device, an
unusable cluster, a chunk a worker cannot read, a worker lost) with status 1,
as does anything unexpected.  ``dgemm -v``/``--verbose`` (or ``--debug``)
keeps the traceback instead.
"""
from __future__ import annotations

import contextlib

import click

from dgemm import __version__

# The user's mistakes (exit 2) and the environment's (exit 1).  Anything else is
# unexpected: one line too (a worker's traceback runs to a hundred lines), named
# by its type, with the way to see the traceback.
INPUT_ERRORS = (ValueError, TypeError, FileExistsError, LookupError)
VERBOSE_HINT = "dgemm --verbose shows the traceback"


class InputError(click.ClickException):
    """A one-line error about the command's arguments (exit status 2, like click's usage errors)."""

    exit_code = 2


def _environment_errors() -> tuple:
    """Errors of the machines, not of the request: I/O (a worker's unreadable chunk is an OSError naming
    the array and chunk), no usable device, workers lost, a run cancelled, memory."""
    from concurrent.futures import CancelledError

    from distributed.scheduler import KilledWorker

    from dgemm.errors import NoDeviceWorkerError, OutputBusyError, OutputTakenOverError
    return (OSError, NoDeviceWorkerError, KilledWorker, CancelledError, MemoryError, OutputBusyError,
            OutputTakenOverError)


# The library's keywords, as the command line spells them.
_OPTIONS = (("overwrite=True", "--overwrite"), ("resume=True", "--resume"), ("storage_options=", "--storage-option"))


def _as_options(msg: str) -> str:
    """A library message with its keywords spelt as options.

    >>> _as_options("pass overwrite=True, or resume=True")
    'pass --overwrite, or --resume'
    """
    for keyword, option in _OPTIONS:
        msg = msg.replace(keyword, option)
    return msg


@contextlib.contextmanager
def user_errors(ctx: click.Context | None = None):
    """Turn every error into a one-line click error (unless ``--verbose``): exit 2 for the user's, 1 for others."""
    # find_object, not the root's obj: under ``dask dgemm`` the root context is dask's.
    opts = ctx.find_object(dict) if ctx is not None else None
    debug = bool(opts and opts.get("debug"))
    try:
        yield
    except click.ClickException:
        raise
    except Exception as e:
        if debug:
            raise
        msg = _as_options(one_line(e))
        if isinstance(e, FileExistsError):  # an OSError, but the user's
            raise InputError(msg) from None
        if isinstance(e, _environment_errors()):
            raise click.ClickException(msg) from None
        if isinstance(e, INPUT_ERRORS):
            raise InputError(msg) from None
        raise click.ClickException(f"{type(e).__name__}: {msg} ({VERBOSE_HINT})") from None


def one_line(e: BaseException) -> str:
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


def _storage_options(ctx, param, pairs) -> dict | None:
    """``--storage-option KEY=VALUE`` pairs as one dict: VALUEs read as YAML scalars, dotted KEYs nested.

    >>> _storage_options(None, None, ("anon=true", "client_kwargs.region_name=eu-west-1", "key=AK/x+1"))
    {'anon': True, 'client_kwargs': {'region_name': 'eu-west-1'}, 'key': 'AK/x+1'}
    """
    import yaml

    out: dict = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", ctx, param)
        try:  # true, 3, null as YAML reads them; anything else (a secret, a URL) stays the text given
            value = yaml.safe_load(text) if text.strip() else text
        except yaml.YAMLError:
            value = text
        if value is not None and not isinstance(value, (str, bool, int, float)):
            value = text  # YAML's lists, mappings and dates: the text given
        node = out
        for name in parts[:-1]:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise click.BadParameter(f"{pair!r}: {name} is already given a value", ctx, param)
        if parts[-1] in node:
            raise click.BadParameter(f"{pair!r}: {key.strip()} is given twice", ctx, param)
        node[parts[-1]] = value
    return out or None


def storage_option(what: str, api: str):
    """The ``--storage-option KEY=VALUE`` option (repeatable) of a command whose ``what`` may be URLs.

    Its value reaches the command as ``storage_options``: one dict, or None.
    """
    return click.option(
        "--storage-option", "storage_options", multiple=True, callback=_storage_options, metavar="KEY=VALUE",
        help=f"An option of the filesystem behind {what} (s3fs: key, secret, endpoint_url, anon=true, "
             f"client_kwargs.region_name=...), as storage_options= of {api}; repeat it for each.  VALUE is "
             "read as YAML (true, 3); quote it to keep it text.")


def fmt_params(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


@click.group(name="dgemm", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dgemm")
@click.option("-v", "--verbose", is_flag=True, help="Show full tracebacks (a worker's too) instead of one-line errors.")
@click.option("--debug", is_flag=True, hidden=True, help="The same as --verbose (its former name).")
@click.pass_context
def cli(ctx, verbose, debug):
    """Matrix products of Zarr arrays on Dask clusters of OpenCL devices."""
    ctx.ensure_object(dict)["debug"] = verbose or debug


def connect(stack: contextlib.ExitStack, scheduler: str | None):
    """A client of ``scheduler`` closed with ``stack``, or None without one; a clear error if unreachable."""
    if not scheduler:
        return None
    from distributed import Client
    try:
        return stack.enter_context(Client(scheduler, timeout="10s"))
    except (OSError, TimeoutError) as e:
        raise click.ClickException(f"cannot connect to the scheduler at {scheduler}: {e}") from None


@contextlib.contextmanager
def announcing_local_clusters():
    """Print the line :func:`dgemm.cluster.local.local_client` logs when it starts a cluster (its dashboard
    link, on whichever port it took) while the block runs."""
    import logging

    class Echo(logging.Handler):
        def emit(self, record):
            click.echo(record.getMessage())

    log = logging.getLogger("dgemm.cluster.local")
    handler, level = Echo(logging.INFO), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def one_device(spec: str | None):
    """The first device ``spec`` selects (as ``select_devices``); exit 1 when there is none at all."""
    from dgemm.opencl import discovery

    if not discovery.list_devices():
        raise click.ClickException("no OpenCL device found. " + discovery.icd_hint())
    return discovery.select_devices(spec)[0]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dgemm`` console script."""
    cli.main(args=argv, prog_name="dgemm")


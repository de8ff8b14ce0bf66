"""The ``dgemm`` click group, its error handling and what the commands share.

The user's mistakes (bad options, arguments or inputs) end a command with a
one-line ``Error: ...`` and exit status 2; the environment's (no device, an
unusable cluster) with status 1.  ``dgemm --debug ...`` keeps the traceback.
"""
from __future__ import annotations

import contextlib

import click

from dgemm import __version__


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
        raise click.ClickException(one_line(e)) from None
    except INPUT_ERRORS as e:
        if debug:
            raise
        msg = one_line(e)
        if isinstance(e, FileExistsError):  # the library names its keyword; here it is an option
            msg = msg.replace("overwrite=True", "--overwrite")
        raise InputError(msg) from None


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


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024


def fmt_params(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


@click.group(name="dgemm", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dgemm")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx, debug):
    """Matrix products of Zarr arrays on Dask clusters of OpenCL devices."""
    ctx.ensure_object(dict)["debug"] = debug


def connect(stack: contextlib.ExitStack, scheduler: str | None):
    """A client of ``scheduler`` closed with ``stack``, or None without one; a clear error if unreachable."""
    if not scheduler:
        return None
    from distributed import Client
    try:
        return stack.enter_context(Client(scheduler, timeout="10s"))
    except (OSError, TimeoutError) as e:
        raise click.ClickException(f"cannot connect to the scheduler at {scheduler}: {e}") from None


def one_device(spec: str | None):
    """The first device ``spec`` selects (as ``select_devices``); exit 1 when there is none at all."""
    from dgemm.opencl import discovery

    if not discovery.list_devices():
        raise click.ClickException("no OpenCL device found. " + discovery.icd_hint())
    return discovery.select_devices(spec)[0]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dgemm`` console script."""
    cli.main(args=argv, prog_name="dgemm")


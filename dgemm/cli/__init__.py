"""The ``dgemm`` command line (also ``dask dgemm`` and ``python -m dgemm``).

One module per command group; the group itself, its error handling and
the option types the commands share are in :mod:`dgemm.cli.common`.
Mistakes in what the user asked for end the command with a one-line
``Error: ...`` and exit status 2; a missing device or an unusable cluster
with status 1, as do a worker's errors (one line: the worker's message) and
anything unexpected.  ``dgemm -v``/``--verbose ...`` (or ``--debug``) shows the full traceback instead.
"""
from dgemm.cli import bench, data, demo, devices, jobqueue, matmul, tune, workers  # noqa: F401 (importing adds the commands)
from dgemm.cli.common import cli, main

__all__ = ["cli", "main"]

"""Where a measurement comes from: the commit, the command line and the time (benchmark records, the
tuner's reports).  A leaf above :mod:`dgemm.config` only, so any layer may stamp what it writes."""
from __future__ import annotations

import datetime
import os
import shlex
import subprocess
import sys

from dgemm import config

__all__ = ["git_commit", "command_line", "utc_now"]


def git_commit() -> tuple[str, bool | None]:
    """``(short commit, dirty)`` of the checkout dgemm runs from.

    The ``commit`` setting (:mod:`dgemm.config`, ``$DGEMM_COMMIT``), when set,
    names the commit: a copy of the tree (the GPU machine's) may carry a
    stale ``.git``, or none.  Else git is asked; else ``"unknown"``.
    ``dirty`` (tracked files modified) is ``None`` when git was not asked.
    """
    named = config.get("commit")
    if named:
        return named, None
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                           text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            s = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
            return r.stdout.strip(), (bool(s.stdout.strip()) if s.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown", None


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: ``sys.argv`` with the console script's path shortened to its name.

    >>> command_line(["/x/.venv/bin/dgemm", "bench", "kernel", "--out", "a b"])
    "dgemm bench kernel --out 'a b'"
    """
    argv = list(sys.argv if argv is None else argv)
    if argv:
        base = os.path.basename(argv[0])
        if base in ("dgemm", "dask"):
            argv[0] = base
        elif argv[0].endswith(os.path.join("dgemm", "__main__.py")):
            argv[0:1] = ["python", "-m", "dgemm"]
    return shlex.join(argv)


def utc_now() -> str:
    """The time now, UTC, as ISO 8601 to the second (what records' ``date`` holds)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

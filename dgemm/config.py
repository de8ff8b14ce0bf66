"""dgemm's settings: one place, read through :mod:`dask.config`.

Every setting lives in the ``dgemm`` namespace of Dask's configuration, with
its default in ``dgemm/dgemm.yaml`` (shipped with the package).  As for any
Dask setting, a value comes from, lowest priority first: the shipped
default, a user's YAML (``~/.config/dask/*.yaml``), a ``DASK_DGEMM__*``
environment variable (``DASK_DGEMM__READ_THREADS=4``), ``dask.config.set``
(``dask.config.set({"dgemm.read-threads": 4})``).  The ``DGEMM_*``
variables documented before this module existed keep working and, where
set, win over all of these: they are how a launcher pins each worker
process (``DGEMM_DEVICE``), and a variable set for one command should
not be overridden by a YAML file.

A local cluster's workers inherit the client's configuration (distributed
sends it to the processes it spawns) and environment; workers started
elsewhere read their own.

>>> get("worker-timeout") > 0
True
>>> import dask
>>> with dask.config.set({"dgemm.read-threads": 3}):
...     get("read-threads")
3
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import dask.config
import yaml

_YAML = Path(__file__).with_name("dgemm.yaml")
with open(_YAML) as _f:
    DEFAULTS = yaml.safe_load(_f)
dask.config.update_defaults(DEFAULTS)


def _text(value, name) -> str | None:
    value = None if value is None else str(value).strip()
    return value or None


def _bytes(value, name) -> int | None:
    from dask.utils import parse_bytes

    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        n = int(parse_bytes(value.strip()) if isinstance(value, str) else value)
    except (ValueError, TypeError):
        n = -1
    if n < 0 or isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a size in bytes (like 1000, 512MiB or 2GB)")
    return n


def _positive_int(value, name) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        n = int(value)
    except (ValueError, TypeError):
        n = 0
    if n < 1 or isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return n


def _seconds(value, name) -> float | None:
    from dask.utils import parse_timedelta

    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        s = float(parse_timedelta(value, default="seconds"))
    except (ValueError, TypeError, KeyError):
        s = -1.0
    if s <= 0:
        raise ValueError(f"{name}={value!r} is not a duration (like 60, 90s or 2 minutes)")
    return s


@dataclass(frozen=True)
class Setting:
    """One setting: its key in the ``dgemm`` namespace, its ``DGEMM_*`` variable, parser and meaning."""

    key: str
    env: str | None
    parse: Callable[[Any, str], Any]
    doc: str


SETTINGS = {s.key: s for s in (
    Setting("devices", "DGEMM_DEVICES", _text,
            "Devices of a local cluster: gpu, cpu, all, platform:device ids, name parts (comma-separated; "
            "a device named twice gets two workers). Unset: every GPU, else a CPU device."),
    Setting("device", "DGEMM_DEVICE", _text,
            "The one device a worker process opens (set per worker by `dgemm worker` and the local cluster). "
            "Unset: the first GPU, else a CPU device."),
    Setting("device-memory-limit", "DGEMM_DEVICE_MEMORY_LIMIT", _bytes,
            "Caps the device memory dgemm plans for on a worker (bytes or 4GiB); read where the worker runs."),
    Setting("worker-timeout", "DGEMM_WORKER_TIMEOUT", _seconds,
            "Seconds a call waits for the cluster's first worker (and for its device) before giving up."),
    Setting("read-threads", "DGEMM_READ_THREADS", _positive_int,
            "Threads per device worker that read and upload blocks. Unset: the host's cores shared among "
            "its device workers, 2 to 8."),
    Setting("prefetch", "DGEMM_PREFETCH", _positive_int,
            "k steps a block product reads ahead. Unset: one per reader thread, at least 4."),
    Setting("pinned-bytes", "DGEMM_PINNED_BYTES", _bytes,
            "Page-locked memory a device may hold for downloaded C blocks (beyond it: ordinary memory)."),
    Setting("tuning-db", "DGEMM_TUNING_DB", _text,
            "The user tuning database (a JSON file). Unset: tuning.json in the user cache folder."),
    Setting("commit", "DGEMM_COMMIT", _text,
            "The commit benchmark records name (a copy of the tree may carry a stale .git, or none)."),
)}


def get(key: str):
    """The parsed value of setting ``key`` (see :data:`SETTINGS`), None when unset.

    Raises
    ------
    ValueError
        The value cannot be parsed; the message names the variable or key it came from.
    KeyError
        ``key`` is not a dgemm setting.
    """
    s = SETTINGS[key]
    raw = os.environ.get(s.env) if s.env else None
    if raw is not None and raw.strip():
        return s.parse(raw, s.env)
    return s.parse(dask.config.get(f"dgemm.{key}", default=None), f"dgemm.{key}")


def environment(key: str) -> str | None:
    """The ``DGEMM_*`` variable of ``key``: how a launcher sets it in a worker process's environment."""
    return SETTINGS[key].env

"""What every benchmark record carries, and where it goes.

A record is one JSON file with its provenance (date, commit, command line)
beside the measurements.  Records are named

    ``<YYYY-MM-DD>-<device>-<benchmark>[-<detail>].json``

(:func:`result_path`): ``<device>`` is the device's name as a file-name part
(:func:`device_slug`), ``-xN`` added when N devices ran it; ``<detail>`` says
what distinguishes runs of one benchmark (``32768-float64``).  A name already
taken gets ``-2``, ``-3``...: no record is overwritten.  Sorted by name,
``bench/results/`` reads by date, then device.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from dgemm.provenance import command_line, git_commit, utc_now  # noqa: F401  (what every record carries)

DEFAULT_OUT = os.path.join("bench", "results")


def device_slug(name: str) -> str:
    """A device name as a file-name part.

    >>> device_slug("NVIDIA H100 80GB HBM3")
    'nvidia-h100-80gb-hbm3'
    >>> device_slug("pthread-AMD EPYC")
    'pthread-amd-epyc'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def result_stem(date: str, devices, benchmark: str, detail: str | None = None) -> str:
    """The record name's stem, without ``.json`` (other files of one run share it).

    ``devices``: one device name, or the name of each device that ran it.

    >>> result_stem("2026-11-22T10:00:00+00:00", ["NVIDIA H100", "NVIDIA H100"], "e2e", "32768-float64")
    '2026-11-22-nvidia-h100-x2-e2e-32768-float64'
    >>> result_stem("2026-11-22", "pthread-AMD EPYC", "overhead")
    '2026-11-22-pthread-amd-epyc-overhead'
    """
    devices = [devices] if isinstance(devices, str) else list(devices)
    slug = "-".join(device_slug(x) for x in dict.fromkeys(devices)) or "device"
    if len(devices) > 1:
        slug += f"-x{len(devices)}"
    return "-".join(x for x in (date[:10], slug, benchmark, detail) if x)


def result_path(out_dir, date: str, devices, benchmark: str, detail: str | None = None) -> Path:
    """``<out_dir>/<result_stem>.json``, or ``-2.json``, ``-3``... so that no record is overwritten."""
    return unique_path(out_dir, result_stem(date, devices, benchmark, detail))


def unique_path(out_dir, stem: str) -> Path:
    """``<out_dir>/<stem>.json``, or ``<stem>-2.json``, ``-3``... so no record is overwritten."""
    out_dir = Path(out_dir)
    path = out_dir / f"{stem}.json"
    i = 2
    while path.exists():
        path = out_dir / f"{stem}-{i}.json"
        i += 1
    return path


def _finite(x):
    """JSON has no NaN or infinity: such values are written as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_json(path, record: dict) -> None:
    """Write ``record`` to ``path`` (folders made, NaN and infinities as null), replacing it in one step."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(record), indent=1) + "\n")
    tmp.replace(path)

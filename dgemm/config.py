"""dgemm's settings: one place, read through :mod:`dask.config`.

Every setting lives in the ``dgemm`` namespace of Dask's configuration, with
its default in ``dgemm/dgemm.yaml`` (shipped with the package).  As for any
Dask setting, a value comes from, lowest priority first: the shipped
default, a user's YAML (``~/.config/dask/*.yaml``) or a ``DASK_DGEMM__*``
environment variable (``DASK_DGEMM__READ_THREADS=4``), then
``dask.config.set`` (``dask.config.set({"dgemm.read-threads": 4})``).  The
``DGEMM_*`` variables documented before this module existed keep working
and, where set (and not empty), win over all of these: they are how a
launcher pins each worker process (``DGEMM_DEVICE``), and a variable set
for one command should not be overridden by a YAML file.  A value of
``null`` (None) anywhere means the shipped default.

A local cluster's workers inherit the client's configuration (distributed's
nanny sends it to the process it spawns) and environment; workers started
elsewhere read their own.  Each setting is read where it acts: the
client's for ``devices``, ``worker-timeout``, ``lease-interval`` and ``gemm-tasks``, the worker's for the
rest.

>>> get("worker-timeout") > 0
True
>>> import dask
>>> with dask.config.set({"dgemm.read-threads": 3}):
...     get("read-threads")
3
>>> with dask.config.set({"dgemm.read-threads": "many"}):
...     get("read-threads")
Traceback (most recent call last):
...
ValueError: dgemm.read-threads='many' must be a positive integer
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import dask.config
import yaml

with open(Path(__file__).with_name("dgemm.yaml")) as _f:
    DEFAULTS = yaml.safe_load(_f)
dask.config.update_defaults(DEFAULTS)


def _blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _text(value, name) -> str | None:
    return None if _blank(value) else str(value).strip()


def _size(value, name) -> int:
    from dask.utils import parse_bytes

    try:
        n = int(parse_bytes(value.strip()) if isinstance(value, str) else value)
    except (ValueError, TypeError):
        n = -1
    if n < 0 or isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a size in bytes (like 1000, 512MiB or 2GB)")
    return n


def _bytes(value, name) -> int | None:
    return None if _blank(value) else _size(value, name)


def _positive_bytes(value, name) -> int | None:
    n = _bytes(value, name)
    if n == 0:
        raise ValueError(f"{name}={value!r} must be more than 0 bytes")
    return n


def _memory_limit(value, name) -> int | float | None:
    """Bytes (as :func:`_positive_bytes`), or a fraction in (0, 1] of the device's memory (a float).

    A fraction is written with a decimal point (``0.8``, ``1.0``), as
    dask-cuda's ``--device-memory-limit`` takes it; the worker, which knows
    its device, resolves it (:func:`dgemm.worker.state.device_memory`).

    >>> _memory_limit("0.8", "x"), _memory_limit(1.0, "x"), _memory_limit("4GiB", "x"), _memory_limit(1000, "x")
    (0.8, 1.0, 4294967296, 1000)
    """
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, float) or (isinstance(text, str) and re.fullmatch(r"\d*\.\d*", text) and text != "."):
        f = float(text)
        if 0 < f <= 1:
            return f
        if f <= 0:   # nothing of the device; above 1, bytes as before
            raise ValueError(f"{name}={value!r} must be a fraction in (0, 1] of the device's memory, or a size "
                             "in bytes (like 1000, 512MiB or 2GB)")
    return _positive_bytes(value, name)


def _positive_int(value, name) -> int | None:
    if _blank(value):
        return None
    try:
        n = int(value.strip() if isinstance(value, str) else value)
    except (ValueError, TypeError):
        n = 0
    if n < 1 or isinstance(value, bool) or (isinstance(value, float) and n != value):
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return n


def _gemm_tasks(value, name) -> int | None:
    """1 to 8: a GEMM task asks for ``1/n`` of ``GPU=1``, and n such shares add up to 1 exactly in floats.

    >>> _gemm_tasks("2", "x")
    2
    >>> _gemm_tasks(9, "x")
    Traceback (most recent call last):
    ...
    ValueError: x=9 must be 1 to 8 (GEMM tasks at once per device)
    """
    n = _positive_int(value, name)
    if n is not None and n > 8:
        raise ValueError(f"{name}={value!r} must be 1 to 8 (GEMM tasks at once per device)")
    return n


def _seconds(value, name) -> float | None:
    from dask.utils import parse_timedelta

    if _blank(value):
        return None
    try:
        s = float(parse_timedelta(value.strip() if isinstance(value, str) else value, default="seconds"))
    except (ValueError, TypeError, KeyError):
        s = -1.0
    if s <= 0 or isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a duration (like 60, 90s or 2 minutes)")
    return s


def _count(value, name) -> float | None:
    if _blank(value):
        return None
    try:
        n = float(value.strip() if isinstance(value, str) else value)
    except (ValueError, TypeError):
        n = -1.0
    if not n >= 0 or isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be a number >= 0 (like 0, 1e10)")
    return n


_WORDS = {"on": "on", "true": "on", "yes": "on", "1": "on", "off": "off", "false": "off", "no": "off", "0": "off"}


def _switch_or_folder(value, name, words: dict) -> str | None:
    """One of ``words`` (YAML's booleans too: on, off) or an absolute folder; None when blank."""
    if _blank(value):
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    text = str(value).strip()
    word = words.get(text.lower())
    if word is not None:
        return word
    folder = os.path.expanduser(text)
    if not os.path.isabs(folder):
        raise ValueError(f"{name}={value!r} must be {', '.join(dict.fromkeys(words.values()))} or an absolute folder")
    return folder


def _host_cache(value, name) -> str | None:
    """``auto``, ``on``, ``off`` (YAML's booleans and 1/0 too) or an absolute folder: ``on``, there."""
    return _switch_or_folder(value, name, {"auto": "auto", **_WORDS})


def _device_codecs(value, name) -> str | None:
    """``auto``, ``on``, ``off`` (YAML's booleans and 1/0 too), ``encode`` or ``share``; None when blank.

    >>> _device_codecs(" ON ", "x"), _device_codecs(False, "x"), _device_codecs("auto", "x"), _device_codecs("Encode", "x")
    ('on', 'off', 'auto', 'encode')
    >>> _device_codecs("share", "x")
    'share'
    """
    if _blank(value):
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    word = {"auto": "auto", "encode": "encode", "share": "share", **_WORDS}.get(str(value).strip().lower())
    if word is None:
        raise ValueError(f"{name}={value!r} must be auto, on, off, encode or share")
    return word


def _worker_process(value, name) -> str | None:
    """``device`` or ``host``; None when blank.

    >>> _worker_process(" Host ", "x"), _worker_process("device", "x")
    ('host', 'device')
    """
    if _blank(value):
        return None
    word = str(value).strip().lower()
    if word not in ("device", "host"):
        raise ValueError(f"{name}={value!r} must be device or host")
    return word


def _queue_priority(value, name) -> str | None:
    """``on``, ``off`` (YAML's booleans and 1/0 too) or ``inline``; None when blank.

    >>> _queue_priority(" Inline ", "x"), _queue_priority(True, "x")
    ('inline', 'on')
    """
    if isinstance(value, str) and value.strip().lower() == "inline":
        return "inline"
    try:
        return _switch(value, name)
    except ValueError:
        raise ValueError(f"{name}={value!r} must be on, off or inline") from None


def _switch(value, name) -> str | None:
    """``on`` or ``off`` (YAML's booleans and 1/0 too); None when blank.

    >>> _switch(" Yes ", "x"), _switch(False, "x")
    ('on', 'off')
    """
    if _blank(value):
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    word = _WORDS.get(str(value).strip().lower())
    if word is None:
        raise ValueError(f"{name}={value!r} must be on or off")
    return word


def _cache_folder(value, name) -> str | None:
    """``on``, ``off`` (YAML's booleans and 1/0 too) or an absolute folder (the cache there)."""
    return _switch_or_folder(value, name, _WORDS)


@dataclass(frozen=True)
class Setting:
    """One setting: its key in the ``dgemm`` namespace, its ``DGEMM_*`` variable, parser and meaning.

    ``parse(value, name)`` turns a raw value (a string from the environment,
    anything from YAML or ``dask.config.set``) into the setting's value, None
    when unset, and raises :class:`ValueError` naming ``name`` (the variable
    or key the value came from) when it cannot.
    """

    key: str
    env: str
    parse: Callable[[Any, str], Any]
    doc: str

    @property
    def dask_env(self) -> str:
        """The ``DASK_DGEMM__*`` variable Dask reads this setting from."""
        return "DASK_DGEMM__" + self.key.upper().replace("-", "_")

    @property
    def default(self):
        """The shipped default (``dgemm/dgemm.yaml``), None when decided at run time."""
        return DEFAULTS["dgemm"].get(self.key)


SETTINGS = {s.key: s for s in (
    Setting("devices", "DGEMM_DEVICES", _text,
            "Devices of a local cluster: `gpu`, `cpu`, `all`, `platform:device` ids, parts of names "
            "(comma-separated; a device named twice gets two workers; `cpu` is the first CPU device alone: any other "
            "CPU device is the same cores). Unset: every GPU, else a CPU device."),
    Setting("device", "DGEMM_DEVICE", _text,
            "The one device a worker process opens (set per worker by `dgemm worker`, `dgemm cluster` and "
            "the local cluster). Unset: the first GPU, else a CPU device."),
    Setting("device-memory-limit", "DGEMM_DEVICE_MEMORY_LIMIT", _memory_limit,
            "Caps the device memory dgemm plans for on a worker (bytes or `4GiB`, or a fraction like `0.8` "
            "of the device's memory): a device shared with other jobs. Read where the worker runs."),
    Setting("worker-timeout", "DGEMM_WORKER_TIMEOUT", _seconds,
            "Seconds a call waits for the cluster's first worker (and for its device) before giving up."),
    Setting("lease-interval", "DGEMM_LEASE_INTERVAL", _seconds,
            "Seconds between renewals of the lease a run holds on its `out` while it computes; a lease not "
            "renewed for 3 intervals is stale (its writer died) and another run may take the output over."),
    Setting("read-threads", "DGEMM_READ_THREADS", _positive_int,
            "Threads per device worker that read and upload blocks. Unset: three quarters of the host's cores "
            "shared among its device workers, 2 to 32 (raw chunks are copied by at most 8 of them at once), the "
            "rest left to the worker's other threads. On an H200 host's 16 cores, a 32768² zstd product under "
            "`device-codecs: share` took 8 % less with 12 than with 16, and 18 % more with 24 (bench/NOTES.md, "
            "issue 28)."),
    Setting("prefetch", "DGEMM_PREFETCH", _positive_int,
            "k steps a block product reads ahead of the device. Unset: one per reader thread, at least 4."),
    Setting("gemm-tasks", "DGEMM_GEMM_TASKS", _gemm_tasks,
            "GEMM tasks a device worker runs at once (1 to 8; read on the client, which gives each task "
            "1/n of the worker's `GPU=1`). The device still multiplies one block at a time; with 2, the "
            "next task sets up while the device runs the current one and its GEMMs start while the current "
            "result downloads, so the device does not wait out Dask's turnaround between tasks. Default 1: in a local cluster 2 "
            "measured no faster (one H100, 32768² float32, raw chunks: 1.31-1.54 s against 1.35-1.53 s; zstd: "
            "2.31-2.56 against 2.21-2.31; two H200s, 49152² raw: 2.03-2.29 against 2.24-2.30), though the engine "
            "alone runs 11 % faster with two (bench/NOTES.md, issue 27)."),
    Setting("worker-process", "DGEMM_WORKER_PROCESS", _worker_process,
            "How a launcher (a local cluster, `dgemm worker`, `dgemm cluster`) lays out a host's device workers: "
            "`device` (the default), a process each; `host`, one process for all of them, a Dask worker per "
            "device in it (the first under a nanny, the others started by its plugin), so that an input block "
            "several of them read is read and decoded once, in memory, with no copy between processes "
            "(`dgemm.storage.sharing`). Read where the workers are launched. `host` decodes each input byte "
            "once but is slower where measured: two H200s (32 cores), 49152² float32, zstd in and out: "
            "4.65-4.72 s against 3.67-3.78 s (decoded 1.00x the inputs against 1.50x); raw chunks, where "
            "nothing is shared: 3.40-3.45 s against 2.50-2.61 s: one interpreter serves both devices' tasks, "
            "readers and stores (bench/NOTES.md, issue 27)."),
    Setting("host-cache", "DGEMM_HOST_CACHE", _host_cache,
            "Decoded input blocks shared by the device workers of a host, in `/dev/shm` (or the absolute "
            "folder given here): a block that several workers of the host read (the placement marks it) is "
            "read and decoded once per host, and the others wait for it; a block one worker reads is read "
            "there as without the cache. `off` (the default: on two H200s with 32 cores it makes a 49152² zstd "
            "product slower, shared blocks alone as well, 5.4-6.0 s against 3.5 s: its copies through tmpfs do "
            "not scale over the host's cores, bench/NOTES.md); `auto`: on where a launcher starts several device "
            "workers on the host (it sets `on` in their environment); `on`."),
    Setting("host-cache-bytes", "DGEMM_HOST_CACHE_BYTES", _positive_bytes,
            "Size of the host cache (least recently used blocks go first). Unset: a quarter of the host's "
            "memory, at most half of what its folder's filesystem holds."),
    Setting("device-codecs", "DGEMM_DEVICE_CODECS", _device_codecs,
            "Chunks decoded and encoded on the device (`dgemm.opencl.codecs`). Inputs: where a chunk is one "
            "Blosc frame with LZ4 (Zarr v2's default compressor, zarr v3's `BloscCodec(cname=\"lz4\")`) or one "
            "zstd frame without a checksum (zarr v3's default `ZstdCodec`, numcodecs' `Zstd`), the worker reads "
            "it compressed, uploads it and OpenCL kernels decode it into the block's staging buffer; other codecs "
            "are decoded on the host as before; not used for inputs where the host cache is on (it shares decoded "
            "blocks). Outputs: where C's codecs are exactly one zstd compressor without a checksum, unsharded, C "
            "order, native byte order, the C block stays on the device after the GEMM, its chunks are encoded "
            "there (literal-only zstd blocks, within 0.01 % of libzstd level 3's size) and only the frames come "
            "down, written as the chunk objects. `auto` (the default): `on` on GPUs for zstd inputs (their Blosc "
            "inputs decoded on the host's cores), C's zstd chunks encoded there; off on other devices: measured "
            "faster than `off` on GPUs, and, since the decode slots' buffers are made at once as large as they "
            "grew before, than `share` (32768² and 49152² zstd in and out on one H200, 49152² on two; even on one "
            "GPU of a 32-core host: \"How it works\" below), not yet with Blosc inputs; `on`; `off`; `encode`: C's "
            "chunks on the device, the inputs decoded on the host's cores: faster where the host's cores bind and slower where the device does (32768² zstd on one H100, 16 "
            "cores: 2.17-2.26 s against 2.29-2.42 s off; 49152² on two H200s, 32 cores: 3.41-3.46 s against "
            "3.52-3.77, on one of them 4.66-4.68 against 4.21-4.23); `share`: as `on`, but a reader that finds "
            "every decode slot of its device busy (each slot's last call still in flight; under `share` a block's "
            "chunks are read from the store within its slot) decodes its block on the host's cores instead of "
            "waiting, so that the device's decoders and the host's take the inputs' chunks between them: faster "
            "than both `off` and `on`, before the zstd frames were planned on the device, on one H100 (32768² zstd "
            "in and out, 16 cores: 2.35-2.43 s against 2.44-2.62 off and 2.59-2.81 on, 5 alternations in one "
            "cluster; the device decoded 36-39 % of the bytes; `encode` not in those runs). Read where the worker "
            "runs; a bad value stops a call before any work."),
    Setting("queue-priority", "DGEMM_QUEUE_PRIORITY", _queue_priority,
            "`on` (the default): the queues whose kernels feed the GEMM kernels (the uploads' padding, "
            "transposes and wgmma preparation, the device decoders') ask the driver for high priority where it "
            "offers `cl_khr_priority_hints`, so that their short kernels start between the work-groups of a "
            "running GEMM rather than after it (NVIDIA's OpenCL driver lists no such extension in the clinfo "
            "reports found, CUDA 11.0 to 13.0, nor does PoCL: there `on` is `off`); `off`: every queue alike; "
            "`inline`: those kernels go into the GEMM kernels' own queue once their uploads are done (a device "
            "decode's kernels with its uploads), in order between two GEMMs, instead of each waiting for a "
            "GEMM on a queue of their own (not yet measured on a GPU). Read where the worker runs, when its "
            "device opens."),
    Setting("switch-interval", "DGEMM_SWITCH_INTERVAL", _seconds,
            "Python's switch interval in a device worker's process (`sys.setswitchinterval`, seconds): how long "
            "a thread that runs Python holds the interpreter's lock while another waits for it. Every step of "
            "a device decode, an encode or a product that calls out (numpy, OpenCL) gives the lock up and "
            "waits for it again behind the worker's other threads, up to one interval a time. Unset: Python's "
            "own (5 ms): 0.5 and 0.2 ms measured no faster (one H200, 32768² zstd in and out, share and on, "
            "an A/B in one call; bench/NOTES.md, issue 28, seventeenth session). Read when the worker's device opens."),
    Setting("pinned-bytes", "DGEMM_PINNED_BYTES", _bytes,
            "Page-locked memory a device may hold for downloaded C blocks (beyond it: ordinary memory)."),
    Setting("tuning-db", "DGEMM_TUNING_DB", _text,
            "The user tuning database (a JSON file). Unset: `tuning.json` in the user cache folder."),
    Setting("small-flops", "DGEMM_SMALL_FLOPS", _count,
            "In-memory (numpy) products with no `out` below this many flops (2·m·n·k) are computed by numpy "
            "in the calling process, without a cluster; 0: always on the devices."),
    Setting("program-cache", "DGEMM_PROGRAM_CACHE", _cache_folder,
            "Programs dgemm finishes itself (the wgmma kernel, built through its PTX) kept on disk, per "
            "source, options, device and driver: `on` (the default: `programs` in the user cache folder), "
            "`off`, or an absolute folder. pyopencl caches the programs built from source itself."),
    Setting("commit", "DGEMM_COMMIT", _text,
            "The commit benchmark records name (a copy of the tree may carry a stale `.git`, or none)."),
)}


def _setting(key: str) -> Setting:
    try:
        return SETTINGS[key]
    except KeyError:
        raise KeyError(f"{key!r} is not a dgemm setting; settings: {', '.join(SETTINGS)}") from None


def get(key: str):
    """The parsed value of setting ``key`` (see :data:`SETTINGS`), None when unset.

    Raises
    ------
    ValueError
        The value cannot be parsed; the message names the variable or key it came from.
    KeyError
        ``key`` is not a dgemm setting.
    """
    s = _setting(key)
    raw = os.environ.get(s.env)
    if not _blank(raw):
        return s.parse(raw, s.env)
    value = dask.config.get(f"dgemm.{key}", default=None)
    if value is None:
        value = s.default
    return s.parse(value, f"dgemm.{key}")


def environment(key: str) -> str:
    """The ``DGEMM_*`` variable of ``key``: how a launcher sets it in a worker process's environment.

    >>> environment("device")
    'DGEMM_DEVICE'
    """
    return _setting(key).env


def settings_table() -> str:
    """Every setting as a Markdown table (the README's "Settings" section).

    >>> print(settings_table().splitlines()[2][:61])
    | `devices` | `DGEMM_DEVICES` | `DASK_DGEMM__DEVICES` | unset
    """
    rows = ["| Key (`dgemm.`) | Variable | Dask variable | Default | Meaning |",
            "|---|---|---|---|---|"]
    for s in SETTINGS.values():
        default = "unset" if s.default is None else f"`{s.default}`"
        rows.append(f"| `{s.key}` | `{s.env}` | `{s.dask_env}` | {default} | {s.doc} |")
    return "\n".join(rows) + "\n"

"""The local cluster's worker processes, begun before a call's checks (issue 27: the first call).

A call with no cluster starts a local one (:func:`dgemm.cluster.local_client`),
and only once the call is checked: a call whose input is refused starts no
cluster.  Most of a worker process's start is its imports (Dask's
``distributed``, pyopencl, Zarr, dgemm's worker: seconds), which read and
write nothing of the user's.  So :func:`start`, at the top of a call that may
start a local cluster, starts multiprocessing's *fork server* with those
modules imported (preloaded), while this process imports and checks; the
cluster, once the call is checked, forks its workers from it
(:func:`start_method`, ``distributed.worker.multiprocessing-method``
``forkserver``) instead of spawning interpreters that import everything
anew.  A refused call leaves the fork server idle (it ends with this
process) and starts no worker, scheduler or device.

Nothing of OpenCL is touched in the fork server: a process that has opened
a device must not fork, so each worker opens its own device and builds (or
loads) its kernels after the fork, as before.  A script still needs its
``if __name__ == "__main__":`` guard: each forked worker imports the main
module again, as a spawned one does.

The fork server forks nothing until its preload is imported (:data:`PRELOAD`),
so it is started before this process imports Dask (a quarter of a second
and more on two cores): the environment
the server's workers inherit is what the nanny would set
(``distributed.nanny.pre-spawn-environ``) as distributed's own defaults say,
read from its ``distributed.yaml``; :func:`start_method` checks it against
the configuration once Dask is imported, and spawns the workers where the
two differ.
"""
from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import sys
import threading

__all__ = ["PRELOAD", "devices", "start", "start_method"]

logger = logging.getLogger("dgemm")

# What a device worker imports on its way up and for its first tasks (the nanny's process entry, which imports
# distributed's worker; dgemm's plugin, which opens the device with pyopencl; the tasks' functions; Zarr and the
# codecs, which the first task's arguments need), in the fork server, once.  Zarr and the codecs stay although a
# worker registers without them: imported after the fork they would be on the first task's path all the same,
# and a worker cannot import them in the background (a task's unpickling importing zarr.core.array meanwhile
# fails on zarr's circular imports: "partially initialized module").
PRELOAD = ("distributed.nanny", "dgemm.worker.plugin", "dgemm.worker.tasks", "pyopencl", "zarr", "numcodecs")
# The helper process that lists this host's OpenCL devices while this process imports and checks (devices):
# the OpenCL platforms' start (a quarter of a second on NVIDIA's) and pyopencl's import leave the call's path.
# It then holds the platforms open until this process ends (its stdin closes), as this process would have
# after listing them: a driver that no process holds starts again, slower, in each worker.
DISCOVER = ("import dataclasses, json, sys\n"
            "from dgemm.opencl.discovery import list_devices\n"
            "print(json.dumps([dataclasses.asdict(d) for d in list_devices()]), flush=True)\n"
            "sys.stdin.read()\n")
DISCOVER_TIMEOUT = 60.0   # seconds the call waits for it at most (then lists the devices itself)
_discovery = None         # the helper's Popen, then its answer (a list of DeviceInfo) or None
_helper = None            # the helper, once it has answered (it ends with this process)
# The configuration keys the fork server's start assumes, checked once Dask is imported (start_method).
METHOD_KEY = "distributed.worker.multiprocessing-method"
ENVIRON_KEY = "distributed.nanny.pre-spawn-environ"

_lock = threading.Lock()
_started = False
# This process's environment when the fork server started (less what a nanny sets before each worker start):
# its forked workers have that one, not the environment a later change gave this process.
_environment_at_start: dict | None = None
_pre_spawn: dict = {}


def start(client=None, out=None) -> bool:
    """Start the fork server of the local cluster's workers now, if this call may start a local cluster.

    Cheap here (one process started; it imports :data:`PRELOAD` on its
    own): the call goes on with its imports and checks meanwhile.  Nothing
    is started for a call without ``out`` (a lazy result starts no cluster;
    a numpy product large enough for the devices spawns its workers as
    before), or when ``client`` is given, a client is current, a local
    cluster of dgemm's runs already, the environment says the workers
    start otherwise (``DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD``
    not ``spawn``, the default, or ``forkserver``; Dask's configuration
    files are read when the cluster starts: :func:`start_method`), or the
    platform is not Linux.  Never raises: on any failure the cluster spawns
    its workers as before.

    Returns
    -------
    bool
        Whether the fork server runs for this process's local clusters.
    """
    global _started, _environment_at_start, _pre_spawn
    if out is None or client is not None or _has_cluster():
        return _started
    with _lock:
        if _started:
            return True
        # Linux only: on macOS a process that has loaded system frameworks (OpenCL's, by pyopencl's
        # import) must not fork
        if not sys.platform.startswith("linux"):
            return False
        try:
            # Dask's configuration is not read here (its import would delay the server): a method set in the
            # environment counts now, one set in a file when the cluster starts (start_method)
            if os.environ.get("DASK_" + METHOD_KEY.upper().replace(".", "__").replace("-", "_"),
                              "spawn") not in ("spawn", "forkserver"):
                return False
            from multiprocessing import forkserver

            multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
            pre_spawn = _pre_spawn_environment(_distributed_defaults())
            with _environment(pre_spawn):
                forkserver.ensure_running()
            _pre_spawn = pre_spawn
            _environment_at_start = _own_environment()
            _start_discovery()
        except Exception as e:   # the workers are spawned as before
            logger.info("dgemm: could not start the workers' fork server early: %s: %s", type(e).__name__, e)
            return False
        _started = True
        return True


def start_method() -> str | None:
    """How a local cluster started now should start its workers: ``"forkserver"`` after :func:`start`, else None.

    None too when this process's environment has changed since the fork
    server started (a variable set or removed between two calls): workers
    forked from it would not see the change, spawned ones do, as the
    README promises (a local cluster's workers inherit the client's
    environment).  And None where Dask's configuration (read here, once
    imported) asks for another method than ``spawn`` or ``forkserver``, or
    for other variables before a worker starts
    (``distributed.nanny.pre-spawn-environ``) than those the server started
    with.
    """
    if not _started:
        return None
    if _own_environment() != _environment_at_start:
        logger.debug("dgemm: the environment changed since the workers' fork server started; spawning them")
        return None
    import dask.config
    import distributed  # noqa: F401  (its defaults join Dask's configuration on import)

    if dask.config.get(METHOD_KEY, "spawn") not in ("spawn", "forkserver"):
        return None
    if _pre_spawn_environment(dask.config.get(ENVIRON_KEY, {})) != _pre_spawn:
        logger.debug("dgemm: %s differs from distributed's defaults the fork server started with; spawning "
                     "the workers", ENVIRON_KEY)
        return None
    return "forkserver"


def devices() -> list | None:
    """This host's OpenCL devices (:class:`dgemm.opencl.discovery.DeviceInfo`), as the helper :func:`start` began listed them.

    For the local cluster this call starts, in place of
    :func:`dgemm.opencl.discovery.list_devices` in this process.  None
    (the cluster lists them itself) without a helper, when this process's
    environment changed since (:func:`start_method` says None), or when the
    helper failed or took longer than :data:`DISCOVER_TIMEOUT`.
    """
    global _discovery, _helper
    with _lock:
        proc = _discovery
        if proc is None or isinstance(proc, list):
            return proc if start_method() is not None else None
        _discovery = None
        try:
            import select

            if not select.select([proc.stdout], [], [], DISCOVER_TIMEOUT)[0]:
                raise TimeoutError(f"no answer in {DISCOVER_TIMEOUT:g} s")
            line = proc.stdout.readline()   # its one line (empty: it ended without one)
            from dgemm.opencl.discovery import DeviceInfo

            _discovery = [DeviceInfo(**d) for d in json.loads(line)]
            _helper = proc
        except Exception as e:   # the cluster lists them itself
            with contextlib.suppress(Exception):
                proc.kill()
                proc.communicate(timeout=5)
            logger.info("dgemm: the devices could not be listed beforehand: %s: %s", type(e).__name__, e)
            return None
    return _discovery if start_method() is not None else None


def _start_discovery() -> None:
    """Begin listing the devices in a helper process (see :func:`devices`); nothing on failure."""
    global _discovery
    import subprocess

    try:
        _discovery = subprocess.Popen([sys.executable, "-c", DISCOVER], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, stdin=subprocess.PIPE, text=True)
    except Exception as e:
        logger.info("dgemm: could not begin listing the devices: %s: %s", type(e).__name__, e)


def _own_environment() -> dict:
    """This process's environment, less the variables a nanny sets in it before it starts a worker."""
    return {k: v for k, v in os.environ.items() if k not in _pre_spawn}


def _has_cluster() -> bool:
    """Whether a client is current, or a local cluster of dgemm's runs (asked only of modules already imported:
    no module is imported for this)."""
    if "distributed" in sys.modules:
        try:
            from distributed import default_client
            default_client()
            return True
        except ValueError:
            pass
    local = sys.modules.get("dgemm.cluster.local")
    started = getattr(local, "_started", None) or {}
    return any(getattr(entry[1], "status", None) == "running" for entry in list(started.values()))


def _distributed_defaults() -> dict:
    """``distributed.nanny.pre-spawn-environ`` as distributed's own ``distributed.yaml`` says, read without
    importing distributed or Dask (its package is only found)."""
    import importlib.util

    import yaml

    spec = importlib.util.find_spec("distributed")
    folder = next(iter(spec.submodule_search_locations or ()))
    with open(os.path.join(folder, "distributed.yaml"), encoding="utf-8") as f:
        defaults = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return defaults["distributed"]["nanny"]["pre-spawn-environ"] or {}


def _pre_spawn_environment(environ: dict) -> dict:
    """The variables a nanny sets before it spawns a worker, of ``environ`` (``distributed.nanny.pre-spawn-environ``):
    the fork server's own, since its forked workers inherit its environment (``MALLOC_TRIM_THRESHOLD_``
    counts at a process's start, the ``*_NUM_THREADS`` at numpy's import, here).

    >>> _pre_spawn_environment({"OMP_NUM_THREADS": 1, "UNSET": None})
    {'OMP_NUM_THREADS': '1', 'PYTHONHASHSEED': '6640'}
    """
    env = {k: str(v) for k, v in (environ or {}).items() if v is not None}
    if env.get("PYTHONHASHSEED") in (None, "0"):   # as the nanny: one hash seed for every worker
        env["PYTHONHASHSEED"] = "6640"
    return env


@contextlib.contextmanager
def _environment(env: dict):
    """``env`` in this process's environment while the fork server starts (it copies it), then as before."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

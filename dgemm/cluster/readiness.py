"""Making a cluster's workers dgemm-ready, and what a plan may assume of them.

Given any client, :func:`prepare` registers the worker plugin and checks
that some worker can run GEMM tasks; :func:`device_limits` and
:func:`tiles_of` turn the usable workers' descriptions into the limits a
plan must fit.
"""
from __future__ import annotations

from distributed import Client

from dgemm import config
from dgemm.errors import NoDeviceWorkerError
from dgemm.names import WORKER_PLUGIN
from dgemm.opencl.params import KernelParams, lcm_tiles
from dgemm.worker import DgemmPlugin, describe_worker
from dgemm.worker.plugin import warm_worker
from dgemm.worker.tasks import codecs_for_plan
from dgemm.worker.state import device_memory


def describe_for_plan(dask_worker=None) -> dict | None:
    """Run on a worker: :func:`dgemm.worker.describe_worker` plus what the planner needs.

    Adds ``memory`` (bytes dgemm may assume the device has: its global
    memory, capped by the worker's ``device-memory-limit`` setting,
    ``DGEMM_DEVICE_MEMORY_LIMIT``), ``max_alloc`` (the largest single
    buffer), ``host`` (to tell which workers share a device) and ``codecs``
    (:func:`dgemm.worker.tasks.codecs_for_plan`: the device memory its codecs keep).
    """
    d = describe_worker(dask_worker)
    if d is None or not d.get("ok"):
        return d
    plugin = dask_worker.plugins.get(WORKER_PLUGIN)
    try:
        limit, memory = config.get("device-memory-limit"), device_memory(d["device"])
        config.get("device-codecs")   # read by the GEMM tasks: a bad value stops the call here, before any work
        codecs = codecs_for_plan(plugin.state) if plugin is not None else None     # (the host cache's settings)
    except ValueError as e:
        return {**d, "ok": False, "error": str(e)}
    max_alloc = None
    try:
        max_alloc = int(dask_worker.plugins[WORKER_PLUGIN].state.device.cl_device.max_mem_alloc_size)
    except Exception:
        pass
    import socket
    return {**d, "memory": memory, "memory_limit": limit, "max_alloc": max_alloc, "host": socket.gethostname(),
            "codecs": codecs}


def device_limits(workers: dict) -> tuple[int | None, int | None]:
    """``(memory, max_alloc)`` a plan must fit: the smallest per-worker share over usable workers.

    Workers on one device (the same device id on the same host) share its memory.
    """
    share: dict = {}
    for d in workers.values():
        key = (d.get("host"), d["device"].id)
        share[key] = share.get(key, 0) + 1
    memory = max_alloc = None
    for d in workers.values():
        mem = d.get("memory")
        if mem is not None:
            mem //= share[(d.get("host"), d["device"].id)]
            memory = mem if memory is None else min(memory, mem)
        ma = d.get("max_alloc")
        if ma is not None:
            max_alloc = ma if max_alloc is None else min(max_alloc, ma)
    return memory, max_alloc


def prepare(client: Client, dtype, timeout: float | None = None) -> dict:
    """Make every worker dgemm-ready; return ``{address: description}`` of usable ones.

    Also has each worker start preparing its device for ``dtype`` in the
    background (kernels, staging buffers: :meth:`dgemm.worker.DgemmPlugin.warm`),
    while this client plans and submits the product.

    Raises
    ------
    NoDeviceWorkerError
        When no worker (within ``timeout`` seconds, default the
        ``worker-timeout`` setting, ``$DGEMM_WORKER_TIMEOUT``) has a working
        device for ``dtype``.
    """
    import numpy as np

    timeout = config.get("worker-timeout") if timeout is None else timeout
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        raise NoDeviceWorkerError(f"the cluster at {client.scheduler.address} has no workers "
                                  f"(waited {timeout:g} s)") from None
    dtype = np.dtype(dtype)
    infos = _describe_all(client)
    if any(v is None for v in infos.values()):
        if not _plugin_registered(client):
            # with this call's dtype: each worker starts building its kernels as soon as its device is open
            client.register_plugin(DgemmPlugin(warm=(dtype,)), name=WORKER_PLUGIN)
        else:
            # Registered already: these workers are (re)starting and set it up
            # themselves.  Registering again would tear down every worker's
            # device under the tasks of runs in flight.
            _wait_for_plugin(client, infos, timeout)
        infos = _describe_all(client)
    _warm(client, dtype)
    usable, reasons = {}, []
    for addr, d in infos.items():
        if isinstance(d, BaseException):
            reasons.append(f"{addr}: did not answer ({type(d).__name__}: {d})")
        elif d is None or not d["ok"]:
            reasons.append(f"{addr}: {d['error'] if d else 'plugin missing'}")
        elif dtype == np.float64 and not d["device"].fp64:
            reasons.append(f"{addr}: {d['device'].name} has no double precision (cl_khr_fp64)")
        elif not d["resources"].get("GPU"):
            reasons.append(f"{addr}: no GPU resource")
        else:
            usable[addr] = d
    if not usable:
        raise NoDeviceWorkerError("no worker of the cluster can run dgemm's GEMM tasks for "
                                  f"{dtype}: " + "; ".join(reasons))
    return usable


def check_worker_access(client: Client, targets: dict, storage_options: dict | None, *,
                        options_hint: str = "storage_options= (s3fs: key, secret)") -> None:
    """Refuse, before any work, URLs that the workers cannot open with the options the run sends them.

    The client's own checks open each URL with ``storage_options`` *and*
    whatever else this process finds: an ``s3fs`` filesystem takes
    credentials from the environment (``AWS_ACCESS_KEY_ID``), ``~/.aws`` or
    a profile when the options give none.  Those do not travel: the workers
    get the options alone (inside the opened arrays) and, without
    credentials of their own, each task failed with ``NoCredentialsError``
    after the run had started.  Every worker opens each input URL
    (``zarr.open_array``) and reaches the output's place
    (:func:`dgemm.storage.options.check_remote_parent`) with exactly
    ``storage_options``; local paths are not checked (workers see them or
    say so when they read), nor URLs this process cannot open either
    (dgemm's own checks refuse those, in their words).

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.
    targets : dict
        ``{name: what the user gave}`` (``"a"``, ``"b"``, ``"c"``, ``"out"``);
        only URLs are checked, ``"out"`` as an output (its place), the
        others as arrays to read.
    storage_options : dict or None
        The options the run sends.
    options_hint : str
        How the message tells to give credentials (the command line's
        ``--storage-option``).

    Raises
    ------
    ValueError
        Naming the first URL a worker cannot open, the worker, its error
        (``NoCredentialsError: Unable to locate credentials``) and what to do.
    """
    from dgemm.storage.options import is_url

    urls = {name: str(x) for name, x in targets.items() if x is not None and is_url(x)}
    # What this process cannot open either, dgemm's own checks refuse, with their words (a wrong secret is
    # not a credential that stayed behind).
    for name in open_urls(urls, storage_options):
        del urls[name]
    if not urls:
        return
    answers = client.run(open_urls, urls, storage_options, on_error="return")
    failed = []
    for addr, got in sorted(answers.items()):
        if isinstance(got, BaseException):   # the worker could not run the check at all
            got = {name: f"{type(got).__name__}: {got}" for name in urls}
        failed += [(name, addr, why) for name, why in got.items()]
    if not failed:
        return
    name, addr, why = min(failed, key=lambda f: list(urls).index(f[0]))
    workers = {a for n, a, _ in failed if n == name}
    others = f" (and {len(workers) - 1} more of the {len(answers)} workers)" if len(workers) > 1 else ""
    if "Credential" in why or "PermissionError" in why or "AccessDenied" in why or "Forbidden" in why:
        fix = (f"the credentials this process found of its own (its environment, ~/.aws, a profile) do not "
               f"travel: give them with {options_hint}, or to the workers' environment")
    else:
        fix = "the workers must reach the store themselves: check the endpoint and their network"
    raise ValueError(f"the workers cannot open {name} ({urls[name]}) with the storage options this run sends them: "
                     f"{addr}{others}: {why}; {fix}")


def open_urls(urls: dict, storage_options: dict | None) -> dict:
    """Run on a worker: ``{name: "Error: message"}`` for each URL it cannot open with ``storage_options``.

    ``"out"`` is an output (its place must be reachable:
    :func:`dgemm.storage.options.check_remote_parent`); the others arrays
    to read (their metadata is read).
    """
    import zarr

    from dgemm.storage.options import check_remote_parent

    failed = {}
    for name, url in urls.items():
        try:
            if name == "out":
                check_remote_parent(url, storage_options, name)
            else:
                zarr.open_array(url, mode="r", storage_options=storage_options)
        except Exception as e:
            failed[name] = f"{type(e).__name__}: {' '.join(str(e).split())}"
    return failed


def _warm(client, dtype) -> None:
    """Have every worker start preparing its device for ``dtype`` (returns at once; a no-op where done)."""
    try:
        client.run(warm_worker, dtype.name, on_error="ignore")
    except Exception:   # a stand-in client, or a worker going away: the product builds what it needs
        pass


def _plugin_registered(client) -> bool:
    try:
        return bool(client.run_on_scheduler(_scheduler_has_plugin))
    except Exception:  # an old scheduler, or a stand-in client
        return False


def _scheduler_has_plugin(dask_scheduler=None) -> bool:
    return WORKER_PLUGIN in getattr(dask_scheduler, "worker_plugins", {})


def _wait_for_plugin(client, infos: dict, timeout: float) -> None:
    """Give workers that have not set up the plugin yet a moment (at most ``timeout``, 10 s)."""
    import time
    deadline = time.monotonic() + min(timeout, 10.0)
    while any(v is None for v in infos.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        infos = _describe_all(client)


def _describe_all(client) -> dict:
    """Every worker's :func:`describe_for_plan`; a worker that cannot answer (dying) gives its error."""
    return client.run(describe_for_plan, on_error="return")


def tiles_of(workers: dict, dtype, precision: str | None = None) -> tuple[int, int, int]:
    """Tile sizes every usable worker's kernel (for ``precision``) divides."""
    import numpy as np
    name = np.dtype(dtype).name if precision is None else f"{np.dtype(dtype).name}:{precision}"
    return lcm_tiles([KernelParams.from_dict(d["params"][name]["params"]) for d in workers.values()])

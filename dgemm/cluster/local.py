"""Local clusters: one worker process per OpenCL device of this host, and the process-wide one.

Without a client, dgemm uses the current distributed client, else starts
(and reuses) a :class:`DeviceCluster`: a local cluster with one worker
process per OpenCL device, each pinned to its device by its environment and
advertising ``GPU=1``.
"""
from __future__ import annotations

import ast
import contextlib
import copy
import logging
import os
import sys
import threading
import warnings

from distributed import Client, LocalCluster

from dgemm import config
from dgemm.cluster.spec import device_worker, host_worker
from dgemm.names import WORKER_PLUGIN
from dgemm.opencl.discovery import select_devices

logger = logging.getLogger(__name__)

# The local clusters started by local_client, by their devices: {key: (cluster, client)}.
_started: dict = {}
_started_lock = threading.Lock()

# Worker deaths a task of a DeviceCluster may see (see DeviceCluster).
ALLOWED_FAILURES = 10


def unguarded_main() -> tuple[str, int] | None:
    """Where the script being run reaches this call from its top level, outside ``if __name__ == "__main__":``.

    Returns ``(file, line)``, or None when the call is guarded or cannot be
    re-run (an interactive session, ``python -c``, a package's
    ``__main__.py``, fork-started workers).  A local cluster's worker
    processes are spawned: each imports the main module again, as
    ``__mp_main__``, running its top-level code; an unguarded call there
    starts the same work in every worker, which then never becomes ready.
    The rule is multiprocessing's own (:mod:`multiprocessing.spawn` decides
    what a child re-runs); the guard is read from the script's source.
    """
    import dask

    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return None
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        if name == "__main__" or name.endswith(".__main__"):
            return None   # run as ``python -m package``: spawn does not re-run it
    elif not getattr(main, "__file__", None) or os.path.splitext(os.path.basename(main.__file__))[0] == "ipython":
        return None       # interactive, ``-c``, IPython: nothing is re-run
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is getattr(main, "__dict__", None)
                                     and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    path, line = frame.f_code.co_filename, frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None       # no source to read: cannot tell
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            guarded = node.body if isinstance(node.test.ops[0], ast.Eq) else node.orelse
            if guarded and guarded[0].lineno <= line <= guarded[-1].end_lineno:
                return None
    return path, line


def _is_main_test(test) -> bool:
    """``__name__ == "__main__"`` (either way round; ``!=`` too)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq))):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
            and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides))


def check_main_guard() -> None:
    """Refuse to start a local cluster from a script's unguarded top level (see :func:`unguarded_main`)."""
    where = unguarded_main()
    if where is not None:
        path, line = where
        raise RuntimeError(
            f"dgemm starts a local cluster whose worker processes import your script again; {path}, line {line} "
            "reaches this call from the script's top level, so every worker would start the same work and "
            'none would become ready. Put the call under if __name__ == "__main__": (the rule of Python\'s '
            "multiprocessing), or pass client= a running cluster (dgemm cluster)")


class DeviceCluster(LocalCluster):
    """A local cluster with one worker process per OpenCL device.

    Each worker gets what :func:`dgemm.cluster.spec.device_worker` gives a
    device worker (its device, its share of the host's cores and memory),
    as under ``dgemm worker``; its name is its index.  Under the
    ``worker-process: host`` setting, one process runs a worker per device
    (:func:`dgemm.cluster.spec.host_worker`; its first worker, named 0,
    starts the others, :mod:`dgemm.worker.siblings`).

    Parameters
    ----------
    devices : str, optional
        Which devices (see :func:`dgemm.opencl.discovery.select_devices`; default
        the ``devices`` setting, ``$DGEMM_DEVICES``, else all GPUs, else a CPU
        device).  Naming a device twice starts two workers on it.
    threads_per_worker : int, optional
        Threads per worker (default: the host's cores shared among the
        workers, at least 2): GEMM tasks run one at a time per device (they
        ask for ``GPU=1``), the others (reduce, store) use the rest.
    warm : sequence of str, optional
        Dtypes of the products to come: each worker builds their kernels in
        the background as soon as its device is open, while the cluster
        finishes starting and the client plans (see
        :meth:`dgemm.worker.DgemmPlugin.warm`).
    start_method : str, optional
        How the workers' processes start: ``"forkserver"`` forks them from
        multiprocessing's fork server (one started early, with their modules
        imported: :mod:`dgemm.client.prestart`); default: as
        ``distributed.worker.multiprocessing-method`` says (``spawn``).  A
        worker the nanny restarts later starts the default way.
    device_infos : list of DeviceInfo, optional
        This host's devices, listed already (:mod:`dgemm.client.prestart`
        lists them in a helper process); default: listed here.
    wait_for_dashboard : bool
        Return once the dashboard serves its pages (the default), or as soon
        as the workers run, the dashboard's import (Bokeh's: most of a
        second, longer than a worker's start from the fork server) going on
        in a background thread (:meth:`dashboard_ready` says when it is
        done).  A script's first call starts its cluster the second way: its
        product needs no dashboard to start.
    allowed_failures : int
        Worker deaths a task may see before the run fails with
        ``KilledWorker`` (the scheduler's ``allowed-failures``; dask's default
        is 3).  A dying worker counts against *every* task assigned to it,
        and GEMM tasks (resource-restricted, so never queued) are all assigned
        up front, so with dask's default a run survives only three worker
        deaths.  dgemm's default is :data:`ALLOWED_FAILURES`; a task that kills
        every worker it runs on still fails after that many restarts.
    **kwargs
        Passed to :class:`distributed.LocalCluster`.  The scheduler and the
        dashboard listen on localhost unless ``host``/``dashboard_address``
        say otherwise; ``memory_limit`` (per worker; default or ``"auto"``)
        is the host's memory shared among the workers.  Worker ``plugins``
        are added to dgemm's own.

    Each worker is given dgemm's worker plugin at start (as ``dgemm worker``
    gives it): its device opens while it starts, before it joins the
    cluster, and a worker the nanny restarts gets it again.

    Raises
    ------
    RuntimeError
        Started from a script's top level outside ``if __name__ ==
        "__main__":`` (its spawned workers would run the script again; see
        :func:`unguarded_main`), before anything starts.
    """

    def __init__(self, devices: str | None = None, *, threads_per_worker: int | None = None,
                 allowed_failures: int | None = None, warm=(), start_method: str | None = None,
                 device_infos=None, wait_for_dashboard: bool = True, **kwargs):
        import dask

        from dgemm.worker.plugin import DgemmPlugin

        check_main_guard()   # before anything starts: spawned workers would re-run an unguarded script
        self.device_ids = [d.id for d in select_devices(devices, device_infos)]
        plugins = set(kwargs.get("plugins") or ())
        if not any(getattr(p, "name", None) == WORKER_PLUGIN for p in plugins):   # else the caller's own
            plugins.add(DgemmPlugin(warm=warm))
        kwargs["plugins"] = plugins
        kwargs.setdefault("host", "127.0.0.1")
        kwargs.setdefault("dashboard_address", "127.0.0.1:8787")
        kwargs.setdefault("resources", {"GPU": 1})
        kwargs.setdefault("silence_logs", logging.ERROR)
        # LocalCluster's "auto" gives each worker memory in proportion to its threads, which with
        # few threads per device is the whole host's memory each (or a sliver of it): share it.
        self.host_process = config.get("worker-process") == "host" and len(self.device_ids) > 1
        sizes = {"nthreads": threads_per_worker, "memory_limit": kwargs.pop("memory_limit", "auto")}
        first = (host_worker(self.device_ids, **sizes) if self.host_process
                 else device_worker(0, self.device_ids, **sizes))
        self._first_env = first.env
        allowed = ALLOWED_FAILURES if allowed_failures is None else int(allowed_failures)
        # The scheduler's Bokeh dashboard: its import (most of a second) is made while the workers start,
        # not before (see _connect_dashboard); its address is taken at once all the same.
        scheduler_kwargs = dict(kwargs.pop("scheduler_kwargs", None) or {})
        later = kwargs.get("dashboard_address") is not None and "dashboard" not in scheduler_kwargs
        if later:
            scheduler_kwargs["dashboard"] = False
        kwargs["scheduler_kwargs"] = scheduler_kwargs
        with dask.config.set({"distributed.scheduler.allowed-failures": allowed}), warnings.catch_warnings():
            # (allowed-failures is read by the Scheduler.)  A dashboard port in use, another cluster's:
            # distributed takes another and says so with a raw UserWarning; local_client logs the link instead
            if not _made_an_error(PORT_IN_USE):   # where a user or a test suite made it an error, it stays one
                warnings.filterwarnings("ignore", r"Port \d+ is already in use", UserWarning)
            super().__init__(n_workers=0, threads_per_worker=first.nthreads, memory_limit=first.memory_limit,
                             processes=True, **kwargs)
        self._dashboard = threading.Event()
        if not later:
            self._dashboard.set()
        else:
            from dgemm.scheduler.dashboard import DASHBOARD_PENDING
            setattr(self.scheduler, DASHBOARD_PENDING, True)   # before any worker registers dgemm's page
        prefix = scheduler_kwargs.get("http_prefix") or "/"
        with _start_method(start_method):   # read by each nanny as it starts its worker
            # the event loop starts the workers from here on (under worker-process: host, the one process,
            # whose worker starts the others)
            self.scale(1 if self.host_process else len(self.device_ids))
            if later and wait_for_dashboard:
                _import_dashboard()            # this thread, meanwhile
            self.sync(self._correct_state)
        if later and wait_for_dashboard:
            self._serve_dashboard(prefix)
        elif later:
            threading.Thread(target=self._serve_dashboard, args=(prefix, True), daemon=True,
                             name="dgemm-dashboard").start()

    def dashboard_ready(self, timeout: float | None = None) -> bool:
        """Whether the dashboard serves its pages (or failed to start, which the log says), after waiting
        up to ``timeout`` seconds (None: until it does): see ``wait_for_dashboard``."""
        return self._dashboard.wait(timeout)

    def _serve_dashboard(self, prefix: str, imported_here: bool = False) -> None:
        try:
            if imported_here:
                _import_dashboard()
            if self.status.name in ("created", "starting", "running"):   # not for a cluster closed meanwhile
                self.sync(self._connect_dashboard, prefix)
        except Exception as e:   # a background start: the cluster works without its dashboard
            logger.warning("dgemm: the local cluster's dashboard could not start: %s: %s", type(e).__name__, e)
        finally:
            self._dashboard.set()

    async def _connect_dashboard(self, prefix: str) -> None:
        """Serve the Bokeh dashboard (and dgemm's pages) from the scheduler's HTTP server, started without it.

        What ``Scheduler(dashboard=True)`` does in its constructor, done once
        the workers have started: the import it needs then went on while
        they started (their processes open their devices meanwhile) instead
        of before.  A failure leaves the dashboard out, not the cluster.
        """
        from dgemm.names import DASHBOARD_PLUGIN
        from dgemm.scheduler.dashboard import DASHBOARD_PENDING, add_navigation_link, add_routes

        s = self.scheduler
        try:
            from distributed.dashboard.scheduler import connect

            connect(s.http_application, s.http_server, s, prefix=prefix)
        except Exception as e:
            logger.warning("dgemm: the local cluster's dashboard could not start: %s: %s", type(e).__name__, e)
        finally:
            setattr(s, DASHBOARD_PENDING, False)
            if DASHBOARD_PLUGIN in getattr(s, "plugins", {}):   # registered by a worker meanwhile: its pages now
                add_routes(s)
                add_navigation_link(s)

    def new_worker_spec(self):
        free = sorted(set(range(1 if self.host_process else len(self.device_ids))) - set(self.worker_spec))
        if not free:
            one = " in one process (worker-process: host)" if self.host_process else ""
            raise ValueError(f"this cluster has {len(self.device_ids)} devices{one}; it cannot have more workers")
        i = free[0]
        spec = copy.deepcopy(self.new_spec)
        # nthreads and memory_limit (the same for every worker) are in new_spec since __init__
        mine = self._first_env if self.host_process else device_worker(i, self.device_ids).env
        env = {**(spec["options"].get("env") or {}), **mine}
        spec["options"].update(env=env, name=i)
        return {i: spec}


def _import_dashboard() -> None:
    """Import the scheduler's Bokeh dashboard (and dgemm's pages), as the scheduler would have."""
    try:
        import distributed.dashboard.scheduler  # noqa: F401

        import dgemm.scheduler.page  # noqa: F401
    except ImportError as e:   # no Bokeh: _connect_dashboard says so
        logger.debug("dgemm: no Bokeh dashboard: %s", e)


@contextlib.contextmanager
def _start_method(method: str | None):
    """Nanny processes started within start their workers by ``method`` (None: as configured)."""
    import dask

    if method is None:
        yield
        return
    if method == "forkserver":
        # distributed's first forkserver start would import its own preload list (pandas among them) here,
        # in the client, for a fork server already running with dgemm's (dgemm.client.prestart)
        with contextlib.suppress(Exception):
            import distributed.utils
            distributed.utils._forkserver_preload_set = True
    with dask.config.set({"distributed.worker.multiprocessing-method": method}):
        yield


PORT_IN_USE = "Port 8787 is already in use"


def _made_an_error(message: str) -> bool:
    """Whether the warning filters in force turn the UserWarning ``message`` into an error.

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.filterwarnings("error", r"Port \\d+ is already in use", UserWarning)
    ...     _made_an_error(PORT_IN_USE)
    True
    """
    for action, msg, category, _module, _line in warnings.filters:
        if issubclass(UserWarning, category) and (msg is None or msg.match(message)):
            return action == "error"
    return False


def local_client(devices: str | None = None, dtype=None, start_method: str | None = None,
                 device_infos=None) -> Client:
    """The process-wide local :class:`DeviceCluster` client (one per ``devices``), started on first use.

    ``dtype``, that of the product about to run, has a cluster started here
    build its kernels while it starts (:class:`DeviceCluster`'s ``warm``);
    ``start_method`` is how it starts its workers and ``device_infos`` the
    host's devices listed already (:class:`DeviceCluster`).
    """
    key = devices or config.get("devices") or ""
    with _started_lock:
        entry = _started.get(key)
        if entry is not None and entry[1].status == "running":
            return entry[1]
        more = {"start_method": start_method} if start_method else {}   # (callers and stand-ins without one)
        if device_infos is not None:
            more["device_infos"] = device_infos
        # the dashboard comes up in the background: the call's product does not wait for Bokeh's import
        cluster = DeviceCluster(devices, warm=() if dtype is None else (dtype,), wait_for_dashboard=False, **more)
        client = Client(cluster, set_as_default=False)   # dgemm's own: the user's other dask work stays where it was
        _started[key] = (cluster, client)
        n = len(cluster.device_ids)
        logger.info("local cluster of %d worker%s; dashboard: %s", n, "" if n == 1 else "s", client.dashboard_link)
        return client


def check_client(client, what: str = "client=") -> None:
    """Refuse a client dgemm cannot work through, before any work: closed, or asynchronous on its loop.

    dgemm's calls block (``wait_for_workers``, ``run``, ``compute(sync=True)``).
    An asynchronous client used from its own event loop returns coroutines
    instead, which failed far inside dgemm (``'coroutine' object has no
    attribute 'values'``); a closed one failed on its missing scheduler
    connection (``'NoneType' object has no attribute 'broadcast'``).

    Parameters
    ----------
    client : distributed.Client
        The client given (or found).
    what : str
        How the message names it (``client=``, ``the current client``).

    Raises
    ------
    ValueError
        ``client`` is closed (or closing), or asynchronous and this call
        runs on its event loop.
    """
    status = getattr(client, "status", None)
    if status in ("closing", "closed"):
        raise ValueError(f"{what} is a closed Client ({_address(client)}); dgemm needs a running one: pass an open "
                         "Client, or none to use the current one or a local cluster")
    # True only on the client's own event loop: from another thread its calls block, and work.
    if getattr(client, "asynchronous", False):
        raise ValueError(f"dgemm.matmul and dgemm.gemm need a synchronous Client; {what} was made with "
                         "asynchronous=True and this call runs on its event loop, where dgemm's blocking calls "
                         f"cannot wait. Pass a synchronous Client({_address(client)!r}), or call dgemm from a thread "
                         "(loop.run_in_executor)")


def _address(client) -> str:
    """The scheduler's address of ``client``, or what can be told of it."""
    try:
        return str(client.scheduler.address)
    except Exception:
        return str(getattr(getattr(client, "cluster", None), "scheduler_address", "scheduler unknown"))


def get_client(client: Client | None = None, devices: str | None = None, dtype=None,
               start_method: str | None = None, device_infos=None) -> Client:
    """``client``, else the current distributed client, else the local device cluster.

    ``dtype`` (of the product about to run), ``start_method`` and ``device_infos`` go to :func:`local_client`.

    Raises
    ------
    ValueError
        ``client`` (or the current client) is closed, or asynchronous on
        this thread's event loop (:func:`check_client`).
    """
    if client is not None:
        check_client(client)
        return client
    try:
        from distributed import default_client
        current = default_client()
    except ValueError:
        more = {"start_method": start_method} if start_method else {}
        if device_infos is not None:
            more["device_infos"] = device_infos
        return local_client(devices, dtype=dtype, **more)
    check_client(current, "the current client")
    return current


@contextlib.contextmanager
def closing_new_local_clusters():
    """Close the local dgemm clusters started inside the block (by :func:`local_client`), and only those.

    Clusters the caller (a notebook, a test session) started before and
    still uses stay open.
    """
    before = {id(entry[0]) for entry in _started.values()}
    try:
        yield
    finally:
        with _started_lock:
            new = {key: entry for key, entry in _started.items() if id(entry[0]) not in before}
            for key in new:
                del _started[key]
        for cluster, client in new.values():
            with contextlib.suppress(Exception):
                client.close()
            with contextlib.suppress(Exception):
                cluster.close()

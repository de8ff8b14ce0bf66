"""The dgemm pages of the Dask dashboard, and the scheduler plugin that gathers their figures.

:class:`DgemmDashboard` is a scheduler plugin.  It

* samples, every second, the ``dgemm`` metric each worker's
  :class:`~dgemm.worker.DgemmPlugin` sends with its heartbeats (device,
  flops, bytes up and down, blocks, its busy time split into exclusive parts
  (:mod:`dgemm.busy`), the overlapping kernel/transfer/read-wait totals,
  store seconds, how far its running block product is) and keeps a few
  minutes of history per worker;
* follows the progress of every matmul (its ``dgemm-gemm-<token>`` and
  ``dgemm-store-<token>`` tasks, done / total) from the scheduler's
  transitions, and within the running blocks from the workers' reports (the
  share of the matmul's flops done); it names each matmul by its output
  (the Zarr array its store tasks write) or its operands, and a short token;
* adds the Bokeh pages of :mod:`dgemm.scheduler.page` to the dashboard
  (``/dgemm`` and the ``/individual-dgemm-*`` plots, which
  ``/individual-plots.json`` lists for JupyterLab's Dask extension), serves
  ``/dgemm/data.json`` (the figures as JSON) and adds a "Dgemm" link to the
  dashboard's navigation bar.

Workers with the dgemm plugin register it on their scheduler themselves
(once); ``dask scheduler --preload dgemm.scheduler`` and ``dgemm cluster``
install it from the start.  The scheduler process needs dgemm installed.
"""
from __future__ import annotations

import json
import logging
import math
import time
import weakref

from distributed.core import Status
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.http.utils import RequestHandler
from tornado.ioloop import PeriodicCallback

from dgemm import busy, metrics
from dgemm.names import DASHBOARD_PLUGIN, KINDS, WORKER_METRIC

logger = logging.getLogger(__name__)

ROUTE = "/dgemm"
# Set on a scheduler whose Bokeh dashboard a DeviceCluster connects only once its workers have started
# (dgemm.cluster.local): the pages are added then, not when the first worker registers this plugin.
DASHBOARD_PENDING = "_dgemm_dashboard_pending"

_LIVE: weakref.WeakSet = weakref.WeakSet()


def live_dashboards() -> list:
    """The dashboards of running schedulers in this process."""
    return [d for d in list(_LIVE)
            if d.scheduler is not None and d.scheduler.status in (Status.running, Status.init)]


def metric_rows() -> tuple[list, list] | None:
    """What a running dashboard of this process knows, for :mod:`dgemm.metrics` (a scheduler source).

    ``([(address, name, snapshot, tflops), ...], matmuls)`` of the first
    running dashboard, or None where there is none.
    """
    dashes = live_dashboards()
    if not dashes:
        return None
    d = dashes[0]
    rows = [(addr, w["name"], w["snapshot"], d.recent_tflops(addr)) for addr, w in d.workers().items() if w["alive"]]
    return rows, d.matmuls()


def parse_key(key):
    """``(kind, token)`` of a dgemm task key, else None.

    >>> parse_key(("dgemm-gemm-0123456789ab", 0, 1))
    ('gemm', '0123456789ab')
    >>> parse_key(("dgemm-reduce-0123456789ab-2", 0, 1, 0))
    ('reduce', '0123456789ab')
    >>> parse_key("dgemm-done-0123456789ab")
    ('done', '0123456789ab')
    >>> parse_key(("dgemm-gemm-getitem-c734e3e927abd5a3bd6ed5d85c345e56", 0, 0))  # fused by dask
    ('gemm', 'c734e3e927abd5a3bd6ed5d85c345e56')
    >>> parse_key(("dgemm-load-a-ffff", 0, 0)) is None, parse_key(("sum-ab", 0)) is None
    (True, True)
    """
    name = key[0] if type(key) is tuple and key else key
    if type(name) is not str or not name.startswith("dgemm-"):
        return None
    for kind in KINDS:
        p = f"dgemm-{kind}-"
        if name.startswith(p):
            parts = name[len(p):].split("-")
            return kind, next((x for x in parts if len(x) >= 12 and all(c in _HEX for c in x)), parts[0])
    return None


_HEX = frozenset("0123456789abcdef")


class MatmulProgress:
    """Tasks of one matmul (one graph token), by kind: submitted, done, erred, forgotten.

    Also the flops of its finished block products, by GEMM task key (as the
    workers report them), which weigh each block in :meth:`work_done`.
    """

    def __init__(self, token: str, client: str | None, now: float):
        self.token, self.client, self.started = token, client, now
        self.output: str | None = None    # where its store tasks write C
        self.operands: tuple | None = None   # the Zarr inputs its GEMM tasks read (() where none), once looked at
        self.finished: float | None = None
        self.state = "running"
        self.total = {k: set() for k in KINDS}
        self.done = {k: set() for k in KINDS}
        self.erred: set = set()
        self.forgotten: set = set()
        self.flops: dict = {}

    def count(self, kind: str, which: str = "total") -> int:
        return len((self.total if which == "total" else self.done)[kind])

    def update(self, now: float) -> None:
        if self.finished is not None:
            return
        total = {k: len(v) for k, v in self.total.items()}
        done = {k: len(v) for k, v in self.done.items()}
        if self.erred:
            self.state = "erred"
        elif total["gemm"] and all(done[k] >= total[k] for k in KINDS):
            self.state = "done"
        elif self.forgotten and len(self.forgotten) >= sum(total.values()):
            self.state = "cancelled"
        else:
            return
        self.finished = now

    def work_done(self, running: dict | None = None) -> float:
        """The share of this matmul's flops done: its finished blocks and the finished k steps of running ones.

        ``running`` is ``{gemm key: (flops done, flops of the block)}`` of
        the block products in flight.  A block weighs its flops where a
        worker reported them (finished, or running with a known plan), else
        the mean of those reported: exact once every block has started, and
        for blocks of one size (all but edge blocks) from the first report.
        Without any report, the share of blocks done.

        >>> m = MatmulProgress("t", None, 0.0)
        >>> m.total["gemm"] = {("g", i) for i in range(4)}
        >>> m.work_done({("g", 0): (3.0, 8.0)})       # 3 of 4 x 8 flops
        0.09375
        >>> m.done["gemm"].add(("g", 1)); m.flops[("g", 1)] = 8.0
        >>> m.work_done({("g", 0): (4.0, 8.0), ("g", 1): (2.0, 8.0)})   # a stale report of a finished block
        0.375
        """
        keys, done = self.total["gemm"], self.done["gemm"]
        if not keys:
            return 0.0
        if self.state == "done":
            return 1.0
        running = {k: v for k, v in (running or {}).items() if k in keys and k not in done}
        known = dict(self.flops)
        for k, (_, total) in running.items():
            if total:
                known.setdefault(k, total)
        if not known:
            return len(done) / len(keys)
        mean = sum(known.values()) / len(known)
        total = sum(known.get(k, mean) for k in keys)
        if total <= 0:
            return len(done) / len(keys)
        finished = sum(known.get(k, mean) for k in done) + sum(d for d, t in running.values() if t)
        return min(1.0, finished / total)

    @property
    def name(self) -> str:
        """A readable name: the output's (else the operands') last path part, and the token's start.

        >>> m = MatmulProgress("e7c510083e35", None, 0.0)
        >>> m.name
        'matmul e7c510'
        >>> m.operands = ("s3://bucket/a.zarr", "/data/b.zarr"); m.name
        'a.zarr @ b.zarr e7c510'
        >>> m.output = "file:///tmp/x/c.zarr/"; m.name
        'c.zarr e7c510'
        """
        def short(path):
            return str(path).rstrip("/").rsplit("/", 1)[-1] or str(path)
        what = short(self.output) if self.output else " @ ".join(map(short, self.operands or ())) or "matmul"
        return f"{what} {self.token[:6]}"

    def as_dict(self, now: float, running: dict | None = None) -> dict:
        end = self.finished if self.finished is not None else now
        running = {k: v for k, v in (running or {}).items() if k not in self.done["gemm"]}
        return {"id": self.token, "name": self.name, "output": self.output, "operands": list(self.operands or ()),
                "client": self.client, "state": self.state, "started": self.started,
                "finished": self.finished, "seconds": end - self.started,
                "blocks_done": self.count("gemm", "done"), "blocks_total": self.count("gemm"),
                "blocks_running": len(running), "work_done": self.work_done(running),
                "reduce_done": self.count("reduce", "done"), "reduce_total": self.count("reduce"),
                "stores_done": self.count("store", "done"), "stores_total": self.count("store"),
                "erred": len(self.erred)}


class DgemmDashboard(SchedulerPlugin):
    """Scheduler plugin behind the dashboard page (see the module doc).

    Parameters
    ----------
    interval : float
        Seconds between samples of the workers' figures.
    history : float
        Seconds of history kept per worker (and how long a departed worker
        stays on the page).
    keep : int
        Finished matmuls kept on the page.
    """

    name = DASHBOARD_PLUGIN

    def __init__(self, interval: float = 1.0, history: float = 900.0, keep: int = 20):
        self.interval, self.history, self.keep = interval, history, keep
        self.scheduler = None
        self._workers: dict = {}
        self._matmuls: dict = {}
        self._pc = None

    def __getstate__(self):
        return {"interval": self.interval, "history": self.history, "keep": self.keep}

    def __setstate__(self, state):
        self.__init__(**state)

    # -- plugin hooks ---------------------------------------------------------
    async def start(self, scheduler) -> None:
        # No await in here: two workers may register the plugin at once, and
        # the scheduler checks for an existing one just before calling this.
        self.scheduler = scheduler
        if not getattr(scheduler, DASHBOARD_PENDING, False):   # else the cluster adds them once its dashboard is up
            add_routes(scheduler)
            add_navigation_link(scheduler)
        self._pc = PeriodicCallback(self.sample, self.interval * 1000)
        self._pc.start()
        _LIVE.add(self)
        metrics.add_scheduler_source(metric_rows)

    async def close(self) -> None:
        if self._pc is not None:
            self._pc.stop()
        _LIVE.discard(self)

    def update_graph(self, scheduler, *, tasks=(), client=None, **kwargs) -> None:
        now = time.time()
        for key in tasks or ():
            p = parse_key(key)
            if p is None:
                continue
            kind, token = p
            m = self._matmuls.get(token)
            if m is None:
                m = self._matmuls[token] = MatmulProgress(token, client, now)
                self._trim()
            m.total[kind].add(key)
            if scheduler is not None and ((kind == "store" and m.output is None) or (kind == "gemm" and m.operands is None)):
                _name_from_graph(scheduler, m, kind, key)

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        p = parse_key(key)
        if p is None:
            return
        m = self._matmuls.get(p[1])
        if m is None:
            return
        if finish == "memory" and start == "processing":
            m.done[p[0]].add(key)
        elif finish == "erred":
            m.erred.add(key)
        elif finish == "forgotten":
            m.forgotten.add(key)
        else:
            return
        m.update(time.time())

    def _trim(self) -> None:
        finished = [t for t, m in self._matmuls.items() if m.finished is not None]
        for t in finished[:max(0, len(finished) - self.keep)]:
            del self._matmuls[t]

    # -- sampling -------------------------------------------------------------
    def sample(self) -> None:
        """Record each worker's latest ``dgemm`` metric (called every ``interval`` seconds).

        The block products a worker reports (start, end, flops, bytes) are
        spread over one-second buckets: the rate of a bucket is what the
        device achieved in that second.
        """
        s = self.scheduler
        if s is None:
            return
        now = time.time()
        for addr, ws in list(s.workers.items()):
            snap = (ws.metrics or {}).get(WORKER_METRIC)
            if not snap:
                continue
            w = self._workers.get(addr)
            if w is None or w["started"] != snap.get("started"):
                # a new worker, or its plugin was set up again: sequence numbers start over
                w = self._workers[addr] = {"name": str(ws.name), "buckets": w["buckets"] if w else {},
                                           "last_seq": 0, "started": snap.get("started")}
            w.update(name=str(ws.name), alive=True, seen=now, snapshot=snap)
            for seq, start, end, flops, nbytes, *key in snap.get("events") or ():
                if seq > w["last_seq"]:
                    _spread(w["buckets"], start, end, flops, nbytes)
                    w["last_seq"] = seq
                    if key:
                        self._finished_product(_key(key[0]), flops)
            old = [b for b in w["buckets"] if b < now - self.history]
            for b in old:
                del w["buckets"][b]
        for addr, w in list(self._workers.items()):
            if addr not in s.workers:
                w["alive"] = False
                if w["seen"] < now - self.history:
                    del self._workers[addr]

    def _finished_product(self, key, flops: float) -> None:
        p = parse_key(key)
        m = self._matmuls.get(p[1]) if p is not None and p[0] == "gemm" else None
        if m is not None:
            m.flops[key] = flops

    def running(self) -> dict:
        """``{gemm task key: (flops done, flops of the block)}`` of the block products the live workers run now."""
        out = {}
        for w in self._workers.values():
            if not w.get("alive"):
                continue
            for p in (w.get("snapshot") or {}).get("in_flight") or ():
                if p.get("key") is not None:
                    out[_key(p["key"])] = (float(p.get("flops_done") or 0.0), p.get("flops_total"))
        return out

    def workers(self) -> dict:
        """``{address: {"name", "alive", "snapshot", "buckets", ...}}``, sampled now."""
        self.sample()
        return dict(self._workers)

    def recent_tflops(self, addr: str, window: float = 5.0) -> float:
        """TFLOPS a worker's device achieved over the last ``window`` seconds."""
        buckets = self._workers.get(addr, {}).get("buckets") or {}
        now = time.time()
        first = math.floor(now - window)
        return sum(v[0] for b, v in buckets.items() if b >= first) / (now - first) / 1e12

    def matmuls(self) -> list[dict]:
        """The recent matmuls, newest first (:meth:`MatmulProgress.as_dict`), with their running blocks."""
        now = time.time()
        running: dict = {}
        for key, v in self.running().items():
            p = parse_key(key)
            if p is not None and p[1] in self._matmuls:
                running.setdefault(p[1], {})[key] = v
        return [m.as_dict(now, running.get(t)) for t, m in reversed(self._matmuls.items())]

    def data(self) -> dict:
        """Everything the page shows, as plain data (``/dgemm/data.json``)."""
        now = time.time()
        workers = []
        for addr, w in sorted(self.workers().items(), key=lambda kv: kv[1]["name"]):
            snap = {k: v for k, v in w["snapshot"].items() if k != "events"}
            flops, busy, kernel = snap.get("flops", 0), snap.get("busy_seconds", 0), snap.get("kernel_seconds", 0)
            buckets = w["buckets"]
            series = []
            if buckets:
                for b in range(min(buckets), math.floor(now) + 1):
                    f, nb = buckets.get(b, (0.0, 0.0))
                    series.append({"t": b + 1.0, "flops": f, "bytes": nb, "tflops": f / 1e12, "gbps": nb / 1e9})
            # FLOP/s (flops_*), the pages pick the unit; tflops_* are the same in TFLOPS
            rates = {"now": self.recent_tflops(addr) * 1e12,
                     "peak": max((x["flops"] for x in series), default=0.0),
                     "busy": flops / busy if busy else 0.0, "kernel": flops / kernel if kernel else 0.0}
            workers.append({
                "address": addr, "name": w["name"], "alive": w["alive"], **snap,
                "in_flight": [_progress(p) for p in snap.get("in_flight") or ()],
                **{f"flops_{k}": v for k, v in rates.items()}, **{f"tflops_{k}": v / 1e12 for k, v in rates.items()},
                "series": series,
            })
        return {"time": now, "scheduler": self.scheduler.address if self.scheduler else None,
                "workers": workers, "total": totals(workers), "matmuls": self.matmuls()}


# What the page's "all workers" row adds up (the busy parts add up to the busy time there too).
TOTALS = ("blocks", "flops", "bytes_up", "bytes_down", "busy_seconds", *busy.KEYS.values(), "kernel_seconds",
          "transfer_seconds", "read_wait_seconds", "read_seconds", "store_seconds")


def totals(workers: list) -> dict:
    """The figures of :data:`TOTALS` summed over ``workers`` (the page's rows, gone ones too).

    >>> totals([{"busy_seconds": 2.0, "busy_kernel_seconds": 1.5}, {"busy_seconds": 1.0}])["busy_seconds"]
    3.0
    """
    return {k: sum(float(w.get(k) or 0.0) for w in workers) for k in TOTALS}


def _store_path(obj) -> str | None:
    """The path of a Zarr array (its store's URL and the array's path), else None."""
    path = getattr(obj, "store_path", None)
    return None if path is None else str(path)


def _name_from_graph(scheduler, m: MatmulProgress, kind: str, key) -> None:
    """Learn where matmul ``m`` writes (a store task's first argument) or what it reads (its GEMM task's inputs).

    The scheduler holds the graph the client sent: a store task's first argument
    is the output Zarr array; a GEMM task's dependencies load its A and B blocks,
    from Zarr arrays where the operands are stored.  Best effort: a name only.
    """
    try:
        ts = scheduler.tasks.get(key)
        if ts is None:
            return
        if kind == "store":
            m.output = _store_path(next(iter(getattr(ts.run_spec, "args", ()) or ()), None))
            return
        m.operands, found = (), []
        for dep in sorted(ts.dependencies, key=lambda d: str(d.key)):
            name = dep.key[0] if type(dep.key) is tuple else dep.key
            if isinstance(name, str) and name.startswith("dgemm-load-"):
                for arg in getattr(dep.run_spec, "args", ()) or ():
                    path = _store_path(arg)
                    if path is not None and path not in found:
                        found.append(path)
        m.operands = tuple(found[:2])
    except Exception as e:   # a graph of another shape: the matmul keeps its token
        logger.debug("dgemm: no name for matmul %s: %s", m.token, e)


def _key(key):
    """A task key as it left the worker: msgpack turns its tuples into lists."""
    return tuple(_key(k) for k in key) if isinstance(key, list) else key


def _progress(p: dict) -> dict:
    """A running block product's report, with ``fraction``: its share of flops done (of k steps without a plan)."""
    if p.get("flops_total"):
        frac = p["flops_done"] / p["flops_total"]
    elif p.get("steps_total"):
        frac = p["steps_done"] / p["steps_total"]
    else:
        frac = None
    return {**p, "fraction": frac}


def _spread(buckets: dict, start: float, end: float, flops: float, nbytes: float) -> None:
    """Add one block product to one-second buckets, in proportion to its time in each.

    >>> b = {}
    >>> _spread(b, 10.5, 12.0, 300.0, 3.0)
    >>> b
    {10: [100.0, 1.0], 11: [200.0, 2.0]}
    """
    if end <= start:
        acc = buckets.setdefault(math.floor(end), [0.0, 0.0])
        acc[0] += flops
        acc[1] += nbytes
        return
    t = start
    while t < end:
        b = math.floor(t)
        e = min(end, b + 1.0)
        frac = (e - t) / (end - start)
        acc = buckets.setdefault(b, [0.0, 0.0])
        acc[0] += flops * frac
        acc[1] += nbytes * frac
        t = e


# -- HTTP ---------------------------------------------------------------------
class _Base(RequestHandler):
    def plugin(self):
        p = self.server.plugins.get(DASHBOARD_PLUGIN) if self.server is not None else None
        if p is None:
            self.set_status(503)
            self.write("the dgemm dashboard plugin is not running on this scheduler")
        return p


class NoBokehHandler(_Base):
    """``/dgemm`` on a scheduler without the Bokeh dashboard: where the figures are instead."""

    def get(self):
        if self.plugin() is not None:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.write('<!DOCTYPE html><html><head><meta charset="utf-8"><title>dgemm</title></head><body>'
                       "<p>This scheduler runs without the Bokeh dashboard, so the dgemm plots are off; "
                       '<a href="dgemm/data.json">dgemm/data.json</a> has their figures.</p></body></html>')


class DataHandler(_Base):
    def get(self):
        p = self.plugin()
        if p is not None:
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(p.data(), default=str))


def add_routes(scheduler) -> bool:
    """Serve the pages from the scheduler's HTTP server (once per server); False without one.

    The Bokeh pages join the dashboard's Bokeh server (:func:`dgemm.scheduler.page.add_pages`);
    without one (no Bokeh, or ``dashboard=False``) ``/dgemm`` says where the figures are.
    """
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return False
    if not getattr(app, "_dgemm_routes", False):
        kw = {"dask_server": scheduler}
        routes = [(ROUTE + "/data.json", DataHandler, kw)]
        try:
            from dgemm.scheduler.page import add_pages
            bokeh = add_pages(scheduler)
        except ImportError as e:
            logger.debug("dgemm: no Bokeh pages: %s", e)
            bokeh = False
        if not bokeh:
            routes.append((ROUTE, NoBokehHandler, kw))
        app.add_handlers(r".*", routes)
        app._dgemm_routes = True
    return True


def add_navigation_link(scheduler) -> bool:
    """Add "Dgemm" to the Bokeh dashboard's navigation bar and its "More..." menu."""
    try:
        from distributed.dashboard.scheduler import template_variables
        tv = template_variables(scheduler)  # memoized: the dict the dashboard pages render with
        if "dgemm" not in tv["pages"]:
            tv["pages"].append("dgemm")
        if not any(p.get("url") == "dgemm" for p in tv["plots"]):
            tv["plots"].append({"url": "dgemm", "name": "dgemm"})
        return True
    except Exception as e:  # no Bokeh, or the dashboard changed: the page is still at /dgemm
        logger.debug("dgemm: no navigation link on the dashboard: %s", e)
        return False

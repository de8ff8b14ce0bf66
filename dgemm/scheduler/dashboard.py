"""The dgemm page of the Dask dashboard: ``/dgemm`` on the scheduler's HTTP server.

:class:`DgemmDashboard` is a scheduler plugin.  It

* samples, every second, the ``dgemm`` metric each worker's
  :class:`~dgemm.worker.DgemmPlugin` sends with its heartbeats (device,
  flops, bytes up and down, kernel/transfer/read-wait/store seconds, blocks)
  and keeps a few minutes of history per worker;
* follows the progress of every matmul (its ``dgemm-gemm-<token>`` and
  ``dgemm-store-<token>`` tasks, done / total) from the scheduler's
  transitions;
* serves ``/dgemm`` (an HTML page that refreshes itself every two seconds
  and reads fine without JavaScript too), ``/dgemm/fragment`` (the page's
  body) and ``/dgemm/data.json`` (the same figures as JSON), and adds a
  "Dgemm" link to the dashboard's navigation bar.

Workers with the dgemm plugin register it on their scheduler themselves
(once); ``dask scheduler --preload dgemm.scheduler`` and ``dgemm cluster``
install it from the start.  The scheduler process needs dgemm installed.
"""
from __future__ import annotations

import html
import json
import logging
import math
import time
import weakref

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.http.utils import RequestHandler

logger = logging.getLogger(__name__)

PLUGIN_NAME = "dgemm-dashboard"
ROUTE = "/dgemm"
KINDS = ("gemm", "reduce", "store", "done")
# Worker colours (Bokeh's Category10, as the rest of the dashboard).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
SPLIT = (("kernel_seconds", "kernel", "#2ca02c"), ("transfer_seconds", "transfer", "#1f77b4"),
         ("read_wait_seconds", "read wait", "#ff7f0e"), ("store_seconds", "store", "#9467bd"))

_LIVE: weakref.WeakSet = weakref.WeakSet()


def live_dashboards() -> list:
    """The dashboards of running schedulers in this process (for the Prometheus collector)."""
    from distributed.core import Status
    return [d for d in list(_LIVE)
            if d.scheduler is not None and d.scheduler.status in (Status.running, Status.init)]


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
    """Tasks of one matmul (one graph token), by kind: submitted, done, erred, forgotten."""

    def __init__(self, token: str, client: str | None, now: float):
        self.token, self.client, self.started = token, client, now
        self.finished: float | None = None
        self.state = "running"
        self.total = {k: set() for k in KINDS}
        self.done = {k: set() for k in KINDS}
        self.erred: set = set()
        self.forgotten: set = set()

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

    def as_dict(self, now: float) -> dict:
        end = self.finished if self.finished is not None else now
        return {"id": self.token, "client": self.client, "state": self.state, "started": self.started,
                "finished": self.finished, "seconds": end - self.started,
                "blocks_done": self.count("gemm", "done"), "blocks_total": self.count("gemm"),
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

    name = PLUGIN_NAME

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
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        add_routes(scheduler)
        add_navigation_link(scheduler)
        self._pc = PeriodicCallback(self.sample, self.interval * 1000)
        self._pc.start()
        _LIVE.add(self)
        from dgemm import metrics
        metrics.register()

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
        from dgemm.worker import METRIC_NAME

        s = self.scheduler
        if s is None:
            return
        now = time.time()
        for addr, ws in list(s.workers.items()):
            snap = (ws.metrics or {}).get(METRIC_NAME)
            if not snap:
                continue
            w = self._workers.get(addr)
            if w is None or w["started"] != snap.get("started"):
                # a new worker, or its plugin was set up again: sequence numbers start over
                w = self._workers[addr] = {"name": str(ws.name), "buckets": w["buckets"] if w else {},
                                           "last_seq": 0, "started": snap.get("started")}
            w.update(name=str(ws.name), alive=True, seen=now, snapshot=snap)
            for seq, start, end, flops, nbytes in snap.get("events") or ():
                if seq > w["last_seq"]:
                    _spread(w["buckets"], start, end, flops, nbytes)
                    w["last_seq"] = seq
            old = [b for b in w["buckets"] if b < now - self.history]
            for b in old:
                del w["buckets"][b]
        for addr, w in list(self._workers.items()):
            if addr not in s.workers:
                w["alive"] = False
                if w["seen"] < now - self.history:
                    del self._workers[addr]

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
        now = time.time()
        return [m.as_dict(now) for m in reversed(self._matmuls.values())]

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
                    series.append({"t": b + 1.0, "tflops": f / 1e12, "gbps": nb / 1e9})
            workers.append({
                "address": addr, "name": w["name"], "alive": w["alive"], **snap,
                "tflops_now": self.recent_tflops(addr),
                "tflops_peak": max((x["tflops"] for x in series), default=0.0),
                "tflops_busy": flops / busy / 1e12 if busy else 0.0,
                "tflops_kernel": flops / kernel / 1e12 if kernel else 0.0,
                "series": series,
            })
        return {"time": now, "scheduler": self.scheduler.address if self.scheduler else None,
                "workers": workers, "matmuls": self.matmuls()}


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
        p = self.server.plugins.get(PLUGIN_NAME) if self.server is not None else None
        if p is None:
            self.set_status(503)
            self.write("the dgemm dashboard plugin is not running on this scheduler")
        return p


class PageHandler(_Base):
    def get(self):
        p = self.plugin()
        if p is not None:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.write(render_page(p.data()))


class FragmentHandler(_Base):
    def get(self):
        p = self.plugin()
        if p is not None:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.write(render_body(p.data()))


class DataHandler(_Base):
    def get(self):
        p = self.plugin()
        if p is not None:
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(p.data(), default=str))


def add_routes(scheduler) -> bool:
    """Serve the page from the scheduler's HTTP server (once per server); False without one."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return False
    if not getattr(app, "_dgemm_routes", False):
        kw = {"dask_server": scheduler}
        app.add_handlers(r".*", [(ROUTE, PageHandler, kw), (ROUTE + "/fragment", FragmentHandler, kw),
                                 (ROUTE + "/data.json", DataHandler, kw)])
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


# -- rendering ----------------------------------------------------------------
def fmt_si(x: float, unit: str = "") -> str:
    """A number with an SI prefix, three significant digits.

    >>> fmt_si(0), fmt_si(1234.5, "B"), fmt_si(2.5e12, "FLOP"), fmt_si(0.00421, "s")
    ('0', '1.23 kB', '2.5 TFLOP', '4.21 ms')
    """
    if not x:
        return "0" + (f" {unit}" if unit else "")
    prefixes = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""), (1e-3, "m"), (1e-6, "µ"))
    for scale, p in prefixes:
        if abs(x) >= scale:
            break
    return f"{x / scale:.3g} {p}{unit}".rstrip()


def fmt_num(x: float) -> str:
    """Three significant digits, plain.

    >>> fmt_num(0), fmt_num(0.0123456), fmt_num(19.87)
    ('0', '0.0123', '19.9')
    """
    return "0" if not x else f"{x:.3g}"


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _nice_max(v: float) -> float:
    if v <= 0 or not math.isfinite(v):
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * e:
            return m * e
    return 10 * e


def line_chart(lines: list, *, now: float, title: str, unit: str, width: int = 900, height: int = 200) -> str:
    """An inline SVG line chart: ``lines`` = [(label, colour, [(t, value), ...]), ...]."""
    pts = [p for _, _, series in lines for p in series]
    if not pts:
        return f'<p class="empty">{_esc(title)}: no samples yet.</p>'
    left, right, top, bottom = 76, 10, 10, 28
    t0 = min(p[0] for p in pts) - 1.0  # values hold over the second before their time
    span = max(now - t0, 10.0)
    ymax = _nice_max(max(p[1] for p in pts))
    pw, ph = width - left - right, height - top - bottom

    def x(t):
        return left + pw * (t - (now - span)) / span

    def y(v):
        return top + ph * (1 - v / ymax)

    out = [f'<svg class="chart" width="{width}" height="{height}" role="img" aria-label="{_esc(title)}">']
    for i in range(5):
        v = ymax * i / 4
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{fmt_num(v)}</text>')
    for i in range(5):
        t = now - span + span * i / 4
        out.append(f'<text x="{x(t):.1f}" y="{height - 8}" text-anchor="middle">-{now - t:.0f} s</text>')
    out.append(f'<text x="14" y="{top + ph / 2:.0f}" transform="rotate(-90 14 {top + ph / 2:.0f})" '
               f'text-anchor="middle">{_esc(unit)}</text>')
    for label, colour, series in lines:
        if not series:
            continue
        # a step line: each value holds over the second that ends at its time
        d = [f"M{x(max(series[0][0] - 1, now - span)):.1f},{y(series[0][1]):.1f}"]
        for t, v in series:
            d.append(f"L{x(max(t - 1, now - span)):.1f},{y(v):.1f}L{x(t):.1f},{y(v):.1f}")
        out.append(f'<path d="{"".join(d)}" stroke="{colour}" class="line"><title>{_esc(label)}</title></path>')
    out.append("</svg>")
    legend = "".join(f'<span class="key"><i style="background:{c}"></i>{_esc(lbl)}</span>' for lbl, c, _ in lines)
    return f'<div class="legend">{legend}</div>{"".join(out)}'


def split_bar(w: dict, width: int = 220) -> str:
    """Where a worker's time went: kernel, transfer, read wait, store (a stacked SVG bar)."""
    parts = [(label, colour, float(w.get(key) or 0)) for key, label, colour in SPLIT]
    total = sum(v for _, _, v in parts)
    if total <= 0:
        return '<span class="empty">-</span>'
    out, x0 = [f'<svg class="split" width="{width}" height="14">'], 0.0
    for label, colour, v in parts:
        wd = width * v / total
        out.append(f'<rect x="{x0:.1f}" y="0" width="{wd:.1f}" height="14" fill="{colour}">'
                   f'<title>{label}: {fmt_si(v, "s")} ({100 * v / total:.0f}%)</title></rect>')
        x0 += wd
    out.append("</svg>")
    return "".join(out)


def render_body(data: dict) -> str:
    """The page's content (also what ``/dgemm/fragment`` returns)."""
    now = data["time"]
    workers, matmuls = data["workers"], data["matmuls"]
    alive = [w for w in workers if w["alive"]]
    total_now = sum(w["tflops_now"] for w in alive)
    out = [f'<p class="summary">{len(alive)} dgemm worker{"s" if len(alive) != 1 else ""} on scheduler '
           f'{_esc(data["scheduler"])}; now {fmt_num(total_now)} TFLOPS in all; '
           f'{sum(w["blocks"] for w in workers)} block products, '
           f'{fmt_si(sum(w["flops"] for w in workers), "FLOP")} done. '
           f'Updated {time.strftime("%H:%M:%S", time.localtime(now))}.</p>']

    out.append("<h2>Matmuls</h2>")
    if not matmuls:
        out.append('<p class="empty">No matmul yet.</p>')
    else:
        out.append('<table id="matmuls"><tr><th>matmul</th><th>state</th><th>blocks done / total</th>'
                   '<th>progress</th><th>C blocks stored</th><th>started</th><th>time</th></tr>')
        for m in matmuls:
            frac = m["blocks_done"] / m["blocks_total"] if m["blocks_total"] else 0.0
            stores = f'{m["stores_done"]} / {m["stores_total"]}' if m["stores_total"] else "(lazy: not stored)"
            out.append(
                f'<tr class="{_esc(m["state"])}"><td class="mono">{_esc(m["id"])}</td><td>{_esc(m["state"])}</td>'
                f'<td class="num">{m["blocks_done"]} / {m["blocks_total"]}</td>'
                f'<td><div class="bar"><div style="width:{100 * frac:.1f}%"></div></div></td>'
                f'<td class="num">{stores}</td>'
                f'<td>{time.strftime("%H:%M:%S", time.localtime(m["started"]))}</td>'
                f'<td class="num">{m["seconds"]:.1f} s</td></tr>')
        out.append("</table>")

    out.append("<h2>Workers</h2>")
    if not workers:
        out.append('<p class="empty">No worker has reported dgemm figures yet.</p>')
    else:
        out.append('<table id="workers"><tr><th>worker</th><th>device</th><th>blocks</th><th>running</th>'
                   '<th>TFLOPS now</th><th>peak</th><th>while busy</th><th>kernel only</th><th>FLOP</th>'
                   '<th>uploaded</th><th>downloaded</th><th>kernel</th><th>transfer</th><th>read wait</th>'
                   '<th>store</th><th>time split</th></tr>')
        for i, w in enumerate(workers):
            colour = PALETTE[i % len(PALETTE)]
            dev = (f'{_esc(w["device"])} <span class="dim">({_esc(w["device_type"])} {_esc(w["device_id"])})</span>'
                   if w.get("ok") else f'<span class="error">no device: {_esc(w.get("error"))}</span>')
            gone = "" if w["alive"] else ' <span class="dim">(gone)</span>'
            out.append(
                f'<tr><td><i class="swatch" style="background:{colour}"></i>{_esc(w["name"])}{gone}'
                f'<div class="dim mono">{_esc(w["address"])}</div></td><td>{dev}</td>'
                f'<td class="num">{w["blocks"]}</td><td class="num">{w.get("gemm_running", 0)}</td>'
                f'<td class="num">{fmt_num(w["tflops_now"])}</td><td class="num">{fmt_num(w["tflops_peak"])}</td>'
                f'<td class="num">{fmt_num(w["tflops_busy"])}</td><td class="num">{fmt_num(w["tflops_kernel"])}</td>'
                f'<td class="num">{fmt_si(w["flops"])}</td>'
                f'<td class="num">{fmt_si(w["bytes_up"], "B")}</td><td class="num">{fmt_si(w["bytes_down"], "B")}</td>'
                + "".join(f'<td class="num">{fmt_si(w.get(k) or 0, "s")}</td>' for k, _, _ in SPLIT)
                + f'<td>{split_bar(w)}</td></tr>')
        out.append("</table>")
        out.append('<p class="legend">' + "".join(f'<span class="key"><i style="background:{c}"></i>{lbl}</span>'
                                                   for _, lbl, c in SPLIT)
                   + ' <span class="dim">TFLOPS: now = last 5 s; while busy = FLOP / seconds in block '
                     'products; kernel only = FLOP / GEMM kernel seconds.</span></p>')

    out.append("<h2>Achieved TFLOPS over time</h2>")
    out.append(line_chart([(w["name"], PALETTE[i % len(PALETTE)], [(s["t"], s["tflops"]) for s in w["series"]])
                           for i, w in enumerate(workers)], now=now, title="TFLOPS", unit="TFLOPS"))
    out.append("<h2>Host ↔ device transfers over time</h2>")
    out.append(line_chart([(w["name"], PALETTE[i % len(PALETTE)], [(s["t"], s["gbps"]) for s in w["series"]])
                           for i, w in enumerate(workers)], now=now, title="transfers", unit="GB/s"))
    return "\n".join(out)


STYLE = """
body { font-family: -apple-system, BlinkMacSystemFont, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0;
       color: #222; }
nav { background: #eeeeee; padding: 8px 16px; border-bottom: 1px solid #ccc; }
nav a { margin-right: 14px; color: #222; text-decoration: none; }
nav a.here { font-weight: bold; }
main { padding: 8px 16px 24px; }
h1 { font-size: 20px; margin: 8px 0; } h2 { font-size: 16px; margin: 18px 0 6px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f5f5f5; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.mono { font-family: monospace; } .dim { color: #777; font-size: 11px; } .error { color: #b00; }
.empty { color: #777; font-style: italic; }
.bar { width: 200px; height: 12px; background: #eee; border: 1px solid #ccc; }
.bar div { height: 100%; background: #2ca02c; }
tr.erred .bar div { background: #d62728; } tr.cancelled .bar div { background: #aaa; }
.swatch, .key i { display: inline-block; width: 10px; height: 10px; margin-right: 5px; }
.key { margin-right: 14px; font-size: 12px; }
svg.chart text { font-size: 11px; fill: #555; }
svg.chart .grid { stroke: #e5e5e5; } svg.chart .line { fill: none; stroke-width: 2; }
"""

SCRIPT = """
(function () {
  var url = window.location.pathname.replace(/\\/+$/, "") + "/fragment" + window.location.search;
  function tick() {
    if (document.hidden) return;
    fetch(url).then(function (r) { return r.ok ? r.text() : null; })
      .then(function (t) {
        if (!t) return;
        document.getElementById("dgemm").innerHTML = t;
        document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
      })
      .catch(function () {});
  }
  setInterval(tick, 2000);
})();
"""


def render_page(data: dict) -> str:
    """The whole ``/dgemm`` page."""
    links = "".join(f'<a href="{p}">{p.title()}</a>' for p in ("status", "workers", "tasks", "system", "profile",
                                                               "graph", "groups", "info"))
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>dgemm - Dask</title>'
            f'<style>{STYLE}</style></head><body>'
            f'<nav>{links}<a class="here" href="dgemm">Dgemm</a></nav>'
            f'<main><h1>dgemm: OpenCL GEMM on the workers\' devices</h1>'
            f'<div id="dgemm">{render_body(data)}</div></main>'
            f'<script>{SCRIPT}</script></body></html>')

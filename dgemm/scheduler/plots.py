"""The Bokeh plots of the dashboard's dgemm pages, built as distributed builds its own.

Each plot is a :class:`distributed.dashboard.components.DashboardComponent`
(a ``root`` model, a ``ColumnDataSource``, an ``update``) fed by the figures
:meth:`dgemm.scheduler.dashboard.DgemmDashboard.data` gathers.  They take
``(scheduler, **figure options)`` as distributed's do, so that
``distributed.dashboard.components.scheduler.individual_doc`` makes each one
a page of its own; :mod:`dgemm.scheduler.page` registers those pages and the
``/dgemm`` page, which shows them all.

Units follow the size: a rate is shown in the SI unit that makes its figure
readable (GFLOPS for a CPU device, TFLOPS for a GPU), bytes through
:func:`dask.utils.format_bytes`, seconds through :func:`dask.utils.format_time`.
Workers and the parts of the busy time never share a colour.
"""
from __future__ import annotations

import math
import time

from bokeh.models import (
    ColumnDataSource,
    DataTable,
    Div,
    FactorRange,
    HoverTool,
    NumeralTickFormatter,
    TableColumn,
)
from bokeh.plotting import figure
from dask.utils import format_bytes, format_time
from distributed.dashboard.components import DashboardComponent
from distributed.utils import log_errors

from dgemm import busy
from dgemm.names import DASHBOARD_PLUGIN

# Workers' colours: Bokeh's Category10 and Category20 without the hues the parts of the busy time use.
WORKER_COLOURS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
                  "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")
# The exclusive parts of a worker's busy time (dgemm.busy), as the bars stack them: they add up to it.
SPLIT_COLOURS = {"kernel": "#2ca02c", "transfer": "#1f77b4", "read": "#ff7f0e", "other": "#7f7f7f"}
# Totals that overlap each other and the parts above: shown apart, never as parts of the busy time.
OVERLAPPED = (("kernel_seconds", "GEMM kernels"), ("transfer_seconds", "transfers (overlapped)"),
              ("read_wait_seconds", "read wait (overlapped)"), ("read_seconds", "reading (thread-seconds)"),
              ("store_seconds", "store tasks"))
STATE_COLOURS = {"running": "#1f77b4", "done": "#2ca02c", "erred": "#d62728", "cancelled": "#aaaaaa"}
_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))


def worker_colour(i: int) -> str:
    """The colour of the ``i``-th worker (in the order of the page's rows)."""
    return WORKER_COLOURS[i % len(WORKER_COLOURS)]


def rate_unit(peak: float) -> tuple[float, str]:
    """``(scale, unit)`` in which a rate of up to ``peak`` FLOP/s reads best.

    >>> rate_unit(8.3e9), rate_unit(45e12), rate_unit(0.0)
    ((1000000000.0, 'GFLOPS'), (1000000000000.0, 'TFLOPS'), (1000000000.0, 'GFLOPS'))
    """
    if not peak or not math.isfinite(peak):
        return 1e9, "GFLOPS"
    for scale, p in _PREFIXES:
        if abs(peak) >= scale:
            return scale, f"{p}FLOPS"
    return 1.0, "FLOPS"


def format_rate(x: float, unit: str = "FLOPS") -> str:
    """A rate with the SI prefix that suits its size, three significant digits.

    >>> format_rate(8.33e9), format_rate(4.51e13), format_rate(0), format_rate(2.5e12, "FLOP")
    ('8.33 GFLOPS', '45.1 TFLOPS', '0 FLOPS', '2.5 TFLOP')
    """
    if not x or not math.isfinite(x):
        return f"0 {unit}"
    scale, p = next(((s, p) for s, p in _PREFIXES if abs(x) >= s), (1.0, ""))
    return f"{x / scale:.3g} {p}{unit}"


def format_seconds(x: float) -> str:
    """Seconds as :func:`dask.utils.format_time` writes them ("0 s" for none)."""
    return format_time(x) if x else "0 s"


def percent(frac) -> str:
    """A share as a whole percentage, never rounded up to 100 % before it is all done.

    >>> percent(0.374), percent(0.999), percent(1.0), percent(None)
    ('37 %', '99 %', '100 %', '-')
    """
    if frac is None:
        return "-"
    return f"{math.floor(100 * frac) if frac < 1 else 100} %"


def decoded(w: dict) -> str:
    """The bytes a worker's chunks decoded to on its device and on its host (:data:`dgemm.names.CODEC_COUNTERS`).

    >>> decoded({"device_decoded_bytes": 3 * 2**30, "host_decoded_bytes": 0})
    '3.00 GiB · 0 B'
    """
    return " · ".join(format_bytes(int(w.get(k) or 0)) for k in ("device_decoded_bytes", "host_decoded_bytes"))


def _figures(scheduler) -> dict:
    """What the dgemm dashboard plugin of ``scheduler`` knows now (empty figures without it)."""
    p = scheduler.plugins.get(DASHBOARD_PLUGIN) if scheduler is not None else None
    if p is None:
        return {"time": time.time(), "scheduler": None, "workers": [], "matmuls": [], "total": {}}
    return p.data()


def _height(kwargs: dict, height: int) -> None:
    """A fixed height, unless the plot fills its page (an individual page: ``stretch_both``)."""
    if kwargs.get("sizing_mode") != "stretch_both":
        kwargs.setdefault("height", height)


class DgemmComponent(DashboardComponent):
    """A plot of the dgemm figures: ``update(data)`` (the plugin's :meth:`data`, fetched when not given)."""

    def __init__(self, scheduler, **kwargs):
        super().__init__()
        self.scheduler = scheduler

    @log_errors
    def update(self, data: dict | None = None) -> None:
        self.show(_figures(self.scheduler) if data is None else data)

    def show(self, data: dict) -> None:  # pragma: no cover - each component has its own
        raise NotImplementedError


class Matmuls(DgemmComponent):
    """Progress of each recent matmul: the share of its flops done, coloured by state, newest on top."""

    COLUMNS = ("name", "output", "state", "colour", "done", "left", "label", "blocks", "stored", "started",
               "seconds")

    def __init__(self, scheduler, **kwargs):
        super().__init__(scheduler)
        self.source = ColumnDataSource({k: [] for k in self.COLUMNS})
        self.fixed = kwargs.get("sizing_mode") != "stretch_both"   # then the height follows the matmuls
        _height(kwargs, 100)
        self.root = figure(title="dgemm: progress of each matmul (share of its flops done)",
                           y_range=FactorRange(), x_range=(0, 1), tools="", toolbar_location=None, **kwargs)
        self.root.hbar(y="name", left=0, right="done", height=0.7, color="colour", source=self.source)
        self.root.hbar(y="name", left="done", right=1, height=0.7, color="#eeeeee", source=self.source)
        self.root.text(x=0.01, y="name", text="label", text_baseline="middle", text_font_size="11px",
                       source=self.source)
        self.root.xaxis.formatter = NumeralTickFormatter(format="0 %")
        self.root.add_tools(HoverTool(tooltips=[
            ("matmul", "@name"), ("output", "@output"), ("state", "@state"), ("flops done", "@label"),
            ("blocks done / total", "@blocks"), ("C blocks stored", "@stored"), ("started", "@started"),
            ("time", "@seconds")]))

    def show(self, data: dict) -> None:
        rows = {k: [] for k in self.COLUMNS}
        for m in reversed(data["matmuls"]):    # newest first in the data: on top of the chart
            frac = m.get("work_done") or 0.0
            running = f', {m["blocks_running"]} running' if m.get("blocks_running") else ""
            for k, v in (("name", m["name"]), ("output", m.get("output") or "(lazy: not stored)"),
                         ("state", m["state"]), ("colour", STATE_COLOURS.get(m["state"], "#aaaaaa")),
                         ("done", frac), ("left", 1 - frac),
                         ("label", f'{m["name"]}: {percent(frac)} ({m["state"]})'),
                         ("blocks", f'{m["blocks_done"]} / {m["blocks_total"]}{running}'),
                         ("stored", f'{m["stores_done"]} / {m["stores_total"]}' if m["stores_total"]
                          else "(lazy: not stored)"),
                         ("started", time.strftime("%H:%M:%S", time.localtime(m["started"]))),
                         ("seconds", format_seconds(m["seconds"]))):
                rows[k].append(v)
        self.root.y_range.factors = rows["name"]
        if self.fixed:
            self.root.height = 70 + 28 * min(max(len(rows["name"]), 1), 12)
        self.source.data = rows


class TimeSplit(DgemmComponent):
    """Where each worker's busy time went: its exclusive parts, stacked (they add up to it), and all workers'."""

    def __init__(self, scheduler, **kwargs):
        super().__init__(scheduler)
        self.parts = busy.PARTS
        cols = ["worker", "busy", *self.parts, *(f"{p}_text" for p in self.parts)]
        self.source = ColumnDataSource({k: [] for k in cols})
        _height(kwargs, 200)
        self.root = figure(title="dgemm: busy time split (seconds inside block products)", y_range=FactorRange(),
                           tools="", toolbar_location="above", **kwargs)
        bars = self.root.hbar_stack(list(self.parts), y="worker", height=0.7, source=self.source,
                                    color=[SPLIT_COLOURS[p] for p in self.parts],
                                    legend_label=[busy.LABELS[p] for p in self.parts])
        for p, r in zip(self.parts, bars):
            self.root.add_tools(HoverTool(renderers=[r], tooltips=[
                ("worker", "@worker"), (busy.LABELS[p], f"@{p}_text"), ("busy", "@busy")]))
        legend = self.root.legend[0]    # below the bars rather than over them
        legend.orientation = "horizontal"
        self.root.center.remove(legend)
        self.root.add_layout(legend, "below")
        self.root.xaxis.axis_label = "seconds"

    def show(self, data: dict) -> None:
        rows: dict = {k: [] for k in self.source.data}
        named = [(w["name"] + ("" if w["alive"] else " (gone)"), w) for w in data["workers"]]
        if data.get("total") and data["workers"]:
            named.append(("all workers", data["total"]))
        for name, w in reversed(named):
            total = float(w.get("busy_seconds") or 0.0)
            rows["worker"].append(name)
            rows["busy"].append(format_seconds(total))
            for p in self.parts:
                v = float(w.get(busy.KEYS[p]) or 0.0)
                rows[p].append(v)
                rows[f"{p}_text"].append(format_seconds(v) + (f" ({100 * v / total:.0f} %)" if total else ""))
        self.root.y_range.factors = rows["worker"]
        self.source.data = rows


class WorkerTable(DgemmComponent):
    """Each worker's device, blocks, rates (in units that suit it), bytes moved and busy time."""

    COLUMNS = (("worker", "worker"), ("address", "address"), ("device", "device"), ("blocks", "blocks"),
               ("running", "running"), ("rate_now", "now (5 s)"), ("rate_peak", "peak"),
               ("rate_busy", "while busy"), ("rate_kernel", "kernel only"), ("flop", "FLOP"),
               ("uploaded", "uploaded"), ("downloaded", "downloaded"), ("decoded", "decoded: device · host"),
               ("busy", "busy"),
               *((busy.KEYS[p], busy.LABELS[p]) for p in busy.PARTS))

    def __init__(self, scheduler, **kwargs):
        super().__init__(scheduler)
        self.source = ColumnDataSource({k: [] for k, _ in self.COLUMNS})
        _height(kwargs, 160)
        wide = {"worker": 80, "address": 130, "device": 200, "blocks": 50, "running": 60, "busy": 75, "decoded": 150,
                **{k: 100 for k in ("rate_now", "rate_peak", "rate_busy", "rate_kernel")},
                **{busy.KEYS[p]: 115 for p in busy.PARTS}}
        self.root = DataTable(source=self.source, index_position=None, **kwargs,
                              columns=[TableColumn(field=k, title=t, width=wide.get(k, 90)) for k, t in self.COLUMNS])

    def show(self, data: dict) -> None:
        rows: dict = {k: [] for k, _ in self.COLUMNS}
        alive = [w for w in data["workers"] if w["alive"]]
        for w in data["workers"]:
            total = float(w.get("busy_seconds") or 0.0)
            dev = (f'{w["device"]} ({w["device_type"]} {w["device_id"]})' if w.get("ok")
                   else f'no device: {w.get("error")}')
            flight = [percent(p.get("fraction")) for p in w.get("in_flight") or ()]
            vals = {"worker": w["name"] + ("" if w["alive"] else " (gone)"), "address": w["address"],
                    "device": dev, "blocks": str(w.get("blocks", 0)),
                    "running": " · ".join([str(w.get("gemm_running", 0)), *flight]),
                    "rate_now": format_rate(w["flops_now"]), "rate_peak": format_rate(w["flops_peak"]),
                    "rate_busy": format_rate(w["flops_busy"]), "rate_kernel": format_rate(w["flops_kernel"]),
                    "flop": format_rate(w.get("flops", 0), "FLOP"), "uploaded": format_bytes(w.get("bytes_up", 0)),
                    "downloaded": format_bytes(w.get("bytes_down", 0)), "decoded": decoded(w),
                    "busy": format_seconds(total)}
            for p in busy.PARTS:
                v = float(w.get(busy.KEYS[p]) or 0.0)
                vals[busy.KEYS[p]] = format_seconds(v) + (f" ({100 * v / total:.0f} %)" if total else "")
            for k, _ in self.COLUMNS:
                rows[k].append(vals[k])
        t = data.get("total")
        if t and data["workers"]:
            vals = {k: "" for k, _ in self.COLUMNS}
            vals.update(worker="all workers", blocks=str(int(t["blocks"])),
                        running=str(sum(w.get("gemm_running", 0) for w in alive)),
                        rate_now=format_rate(sum(w["flops_now"] for w in alive)),
                        flop=format_rate(t["flops"], "FLOP"), uploaded=format_bytes(int(t["bytes_up"])),
                        downloaded=format_bytes(int(t["bytes_down"])), busy=format_seconds(t["busy_seconds"]),
                        decoded=decoded({k: sum(float(w.get(k) or 0) for w in data["workers"])
                                         for k in ("device_decoded_bytes", "host_decoded_bytes")}))
            for p in busy.PARTS:
                vals[busy.KEYS[p]] = format_seconds(t[busy.KEYS[p]])
            for k, _ in self.COLUMNS:
                rows[k].append(vals[k])
        self.source.data = rows


class Overlapped(DgemmComponent):
    """Totals that overlap each other and the busy time (not parts of it), per worker."""

    def __init__(self, scheduler, **kwargs):
        super().__init__(scheduler)
        cols = [("worker", "worker"), *OVERLAPPED]
        self.source = ColumnDataSource({k: [] for k, _ in cols})
        _height(kwargs, 120)
        self.root = DataTable(source=self.source, columns=[TableColumn(field=k, title=t) for k, t in cols],
                              index_position=None, **kwargs)

    def show(self, data: dict) -> None:
        rows: dict = {k: [] for k in self.source.data}
        for w in data["workers"]:
            rows["worker"].append(w["name"])
            for k, _ in OVERLAPPED:
                rows[k].append(format_seconds(float(w.get(k) or 0.0)))
        self.source.data = rows


class _Series(DgemmComponent):
    """Per worker, a step line of one figure over time (one-second buckets) and hover points."""

    field = ""
    title = ""

    def __init__(self, scheduler, **kwargs):
        super().__init__(scheduler)
        self.lines = ColumnDataSource({"xs": [], "ys": [], "colour": [], "worker": []})
        self.source = ColumnDataSource({"time": [], "y": [], "colour": [], "worker": [], "value": []})
        _height(kwargs, 240)
        self.root = figure(title=self.title, x_axis_type="datetime", tools="xpan,xwheel_zoom,reset",
                           toolbar_location="above", **kwargs)
        self.root.multi_line(xs="xs", ys="ys", line_color="colour", line_width=2, source=self.lines)
        dots = self.root.scatter(x="time", y="y", color="colour", size=5, source=self.source)
        self.root.add_tools(HoverTool(renderers=[dots], tooltips=[
            ("worker", "@worker"), ("second ending", "@time{%H:%M:%S}"), (self.field, "@value")],
            formatters={"@time": "datetime"}))
        self.root.y_range.start = 0

    def unit(self, peak: float) -> tuple[float, str]:
        raise NotImplementedError

    def text(self, v: float) -> str:
        raise NotImplementedError

    def show(self, data: dict) -> None:
        peak = max((s[self.field] for w in data["workers"] for s in w["series"]), default=0.0)
        scale, unit = self.unit(peak)
        lines: dict = {k: [] for k in self.lines.data}
        dots: dict = {k: [] for k in self.source.data}
        for i, w in enumerate(data["workers"]):
            if not w["series"]:
                continue
            xs, ys = [], []
            for s in w["series"]:    # each value holds over the second that ends at its time
                xs += [(s["t"] - 1) * 1000, s["t"] * 1000]
                ys += [s[self.field] / scale] * 2
                dots["time"].append(s["t"] * 1000)
                dots["y"].append(s[self.field] / scale)
                dots["colour"].append(worker_colour(i))
                dots["worker"].append(w["name"])
                dots["value"].append(self.text(s[self.field]))
            for k, v in (("xs", xs), ("ys", ys), ("colour", worker_colour(i)), ("worker", w["name"])):
                lines[k].append(v)
        self.root.yaxis.axis_label = unit
        self.lines.data = lines
        self.source.data = dots


class Rates(_Series):
    """The rate each worker's device achieved, second by second, in the unit that suits the fastest."""

    field = "flops"
    title = "dgemm: achieved rate per worker"

    def unit(self, peak):
        return rate_unit(peak)

    def text(self, v):
        return format_rate(v)


class Transfers(_Series):
    """Host-device bytes each worker moved per second (uploads and downloads)."""

    field = "bytes"
    title = "dgemm: host <-> device transfers per worker"

    def unit(self, peak):
        for scale, unit in ((2 ** 40, "TiB/s"), (2 ** 30, "GiB/s"), (2 ** 20, "MiB/s"), (2 ** 10, "kiB/s")):
            if peak >= scale:
                return scale, unit
        return 1.0, "B/s"

    def text(self, v):
        return format_bytes(int(v)) + "/s"


class Summary(DgemmComponent):
    """One line: workers, the rate now in all, block products and FLOP done; and the busy parts explained."""

    def __init__(self, scheduler, **kwargs):
        super().__init__(scheduler)
        self.root = Div(text="", **kwargs)

    def show(self, data: dict) -> None:
        alive = [w for w in data["workers"] if w["alive"]]
        now = sum(w["flops_now"] for w in alive)
        keys = "".join(f'<span style="margin-right:12px"><span style="display:inline-block;width:10px;'
                       f'height:10px;background:{SPLIT_COLOURS[p]}"></span> {busy.LABELS[p]}</span>'
                       for p in busy.PARTS)
        self.root.text = (
            f'<p><b>{len(alive)} dgemm worker{"s" if len(alive) != 1 else ""}</b> on scheduler '
            f'{data.get("scheduler")}; now {format_rate(now)} in all; '
            f'{sum(w["blocks"] for w in data["workers"])} block products, '
            f'{format_rate(sum(w["flops"] for w in data["workers"]), "FLOP")} done.</p>'
            f'<p style="font-size:11px;color:#666">{keys}<br>busy = seconds in block products, split into parts '
            'that add up to it: kernel running (transfers and reads meanwhile are hidden under it), waiting for '
            'transfers (no kernel; an upload, padding or download in flight), waiting for reads (neither; the '
            'product waits for its A/B blocks), other (launching, setup, Python). Rates: now = last 5 s; while '
            'busy = FLOP / busy seconds; kernel only = FLOP / GEMM kernel seconds. The overlapping totals '
            '(kernels, transfers, read wait, reading, store tasks) overlap each other and the busy time.</p>')

"""The HTML of the dashboard's dgemm page: tables, inline SVG charts, the style and the refresh script.

Plain functions of the figures :meth:`dgemm.scheduler.dashboard.DgemmDashboard.data`
gathers; :mod:`dgemm.scheduler.dashboard` serves what they render.
"""
from __future__ import annotations

import html
import math
import time

from dgemm import busy

# Worker colours (Bokeh's Category10, as the rest of the dashboard).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
# The exclusive parts of a worker's busy time (dgemm.busy), as the bar stacks them: they add up to it.
SPLIT = tuple((busy.KEYS[p], busy.LABELS[p], c) for p, c in zip(busy.PARTS, ("#2ca02c", "#1f77b4", "#ff7f0e",
                                                                            "#c7c7c7")))
# Totals that overlap each other and the parts above: shown apart, never as parts of the busy time.
OVERLAPPED = (("kernel_seconds", "GEMM kernels"), ("transfer_seconds", "transfers (overlapped)"),
              ("read_wait_seconds", "read wait (overlapped)"), ("read_seconds", "reading (thread-seconds)"),
              ("store_seconds", "store tasks"))


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
    """Where a worker's busy time went: its exclusive parts (a stacked SVG bar)."""
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


def _percent(frac) -> str:
    """A share as a whole percentage, never rounded up to 100 % before it is all done.

    >>> _percent(0.374), _percent(0.999), _percent(1.0), _percent(None)
    ('37 %', '99 %', '100 %', '-')
    """
    if frac is None:
        return "-"
    return f"{math.floor(100 * frac) if frac < 1 else 100} %"


def _running(w: dict) -> str:
    """GEMM tasks a worker runs, and how far each block product in flight is."""
    parts = [str(w.get("gemm_running", 0))]
    parts += [_percent(p.get("fraction")) for p in w.get("in_flight") or ()]
    return " · ".join(parts)


def _busy_cells(w: dict) -> str:
    """The busy seconds, their parts (with each one's share) and the bar, as table cells."""
    total = float(w.get("busy_seconds") or 0)
    cells = [f'<td class="num">{fmt_si(total, "s")}</td>']
    for key, _, _ in SPLIT:
        v = float(w.get(key) or 0)
        share = f' <span class="dim">{100 * v / total:.0f}%</span>' if total > 0 else ""
        cells.append(f'<td class="num">{fmt_si(v, "s")}{share}</td>')
    cells.append(f"<td>{split_bar(w)}</td>")
    return "".join(cells)


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
            frac = m.get("work_done")
            if frac is None:
                frac = m["blocks_done"] / m["blocks_total"] if m["blocks_total"] else 0.0
            stores = f'{m["stores_done"]} / {m["stores_total"]}' if m["stores_total"] else "(lazy: not stored)"
            out.append(
                f'<tr class="{_esc(m["state"])}"><td class="mono">{_esc(m["id"])}</td><td>{_esc(m["state"])}</td>'
                f'<td class="num">{m["blocks_done"]} / {m["blocks_total"]}</td>'
                f'<td><div class="bar"><div style="width:{100 * frac:.1f}%"></div></div>'
                f'<span class="dim">blocks {m["blocks_done"]}/{m["blocks_total"]} · {_percent(frac)} of flops'
                f'</span></td>'
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
                   '<th>uploaded</th><th>downloaded</th><th>busy</th>'
                   + "".join(f"<th>{lbl}</th>" for _, lbl, _ in SPLIT) + '<th>time split</th></tr>')
        for i, w in enumerate(workers):
            colour = PALETTE[i % len(PALETTE)]
            dev = (f'{_esc(w["device"])} <span class="dim">({_esc(w["device_type"])} {_esc(w["device_id"])})</span>'
                   if w.get("ok") else f'<span class="error">no device: {_esc(w.get("error"))}</span>')
            gone = "" if w["alive"] else ' <span class="dim">(gone)</span>'
            out.append(
                f'<tr><td><i class="swatch" style="background:{colour}"></i>{_esc(w["name"])}{gone}'
                f'<div class="dim mono">{_esc(w["address"])}</div></td><td>{dev}</td>'
                f'<td class="num">{w["blocks"]}</td><td class="num">{_running(w)}</td>'
                f'<td class="num">{fmt_num(w["tflops_now"])}</td><td class="num">{fmt_num(w["tflops_peak"])}</td>'
                f'<td class="num">{fmt_num(w["tflops_busy"])}</td><td class="num">{fmt_num(w["tflops_kernel"])}</td>'
                f'<td class="num">{fmt_si(w["flops"])}</td>'
                f'<td class="num">{fmt_si(w["bytes_up"], "B")}</td><td class="num">{fmt_si(w["bytes_down"], "B")}</td>'
                + _busy_cells(w) + "</tr>")
        t = data.get("total")
        if t is not None:
            out.append(
                f'<tr class="total"><td>all workers</td><td></td><td class="num">{int(t["blocks"])}</td>'
                f'<td class="num">{sum(w.get("gemm_running", 0) for w in alive)}</td>'
                f'<td class="num">{fmt_num(total_now)}</td><td></td><td></td><td></td>'
                f'<td class="num">{fmt_si(t["flops"])}</td><td class="num">{fmt_si(t["bytes_up"], "B")}</td>'
                f'<td class="num">{fmt_si(t["bytes_down"], "B")}</td>' + _busy_cells(t) + "</tr>")
        out.append("</table>")
        out.append('<p class="legend">' + "".join(f'<span class="key"><i style="background:{c}"></i>{lbl}</span>'
                                                   for _, lbl, c in SPLIT)
                   + ' <span class="dim">busy = seconds in block products, split into parts that add up to it: '
                     'kernel running (transfers and reads meanwhile are hidden under it), waiting for transfers '
                     '(no kernel; an upload, padding or download in flight), waiting for reads (neither; the '
                     'product waits for its A/B blocks), other (launching, setup, Python). Running: GEMM tasks '
                     'and the flops done of the block in flight. TFLOPS: now = last 5 s; while busy = FLOP / busy '
                     'seconds; kernel only = FLOP / GEMM kernel seconds.</span></p>')
        out.append('<h3>Overlapping totals <span class="dim">(they overlap each other and the busy time: '
                   'not parts of it)</span></h3>')
        out.append('<table id="overlapped"><tr><th>worker</th>' + "".join(f"<th>{lbl}</th>" for _, lbl in OVERLAPPED)
                   + "</tr>")
        for w in workers:
            out.append(f'<tr><td>{_esc(w["name"])}</td>'
                       + "".join(f'<td class="num">{fmt_si(w.get(k) or 0, "s")}</td>' for k, _ in OVERLAPPED)
                       + "</tr>")
        out.append('</table><p class="dim">GEMM kernels: their device seconds; transfers: uploads, padding and '
                   'downloads, summed over the threads doing them; read wait: the product waiting for its inputs '
                   'while earlier kernels may still run; reading: thread-seconds reading blocks; store tasks: '
                   'writing C blocks (dgemm-store tasks, beside the block products).</p>')

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
h3 { font-size: 14px; margin: 14px 0 6px; } tr.total td { font-weight: bold; border-top: 2px solid #ccc; }
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

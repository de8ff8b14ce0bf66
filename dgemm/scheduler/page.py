"""The dgemm pages of the dashboard's Bokeh server: ``/dgemm`` and the ``/individual-dgemm-*`` plots.

``/dgemm`` shows every plot of :mod:`dgemm.scheduler.plots` in the
dashboard's own template (its navigation bar, its theme); each plot is also a
page of its own (:data:`INDIVIDUAL`), made by distributed's ``individual_doc``
as its ``/individual-*`` pages are, so that ``/individual-plots.json`` lists
them and JupyterLab's Dask extension opens them as panels.

distributed builds its Bokeh server once, from the applications it knows,
when the scheduler starts; the dgemm plugin starts later (a preload's
``dask_setup``, or the first dgemm worker).  :func:`add_pages` therefore builds
the dgemm applications with distributed's own ``BokehApplication`` (same
prefix, settings and template variables) and adds their routes and
application contexts to the running server.
"""
from __future__ import annotations

import logging

from bokeh.layouts import column
from distributed.dashboard.components import add_periodic_callback
from distributed.dashboard.components.scheduler import BOKEH_THEME, env, individual_doc
from distributed.utils import log_errors

from dgemm.scheduler import plots

logger = logging.getLogger(__name__)

# Milliseconds between updates: the plugin samples the workers' heartbeats once a second.
INTERVAL = 1000

# The individual pages: route -> (component, what the "More..." menu calls it).
INDIVIDUAL = {
    "/individual-dgemm-progress": (plots.Matmuls, "Dgemm Progress"),
    "/individual-dgemm-rates": (plots.Rates, "Dgemm Rates"),
    "/individual-dgemm-transfers": (plots.Transfers, "Dgemm Transfers"),
    "/individual-dgemm-time-split": (plots.TimeSplit, "Dgemm Time Split"),
    "/individual-dgemm-workers": (plots.WorkerTable, "Dgemm Workers"),
    "/individual-dgemm-overlapped": (plots.Overlapped, "Dgemm Overlapped Totals"),
}


class Everything:
    """All the plots of ``/dgemm``, updated together from one read of the plugin's figures."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.parts = [plots.Summary(scheduler, sizing_mode="stretch_width"),
                      plots.Matmuls(scheduler, sizing_mode="stretch_width"),
                      plots.TimeSplit(scheduler, sizing_mode="stretch_width"),
                      plots.WorkerTable(scheduler, sizing_mode="stretch_width"),
                      plots.Overlapped(scheduler, sizing_mode="stretch_width"),
                      plots.Rates(scheduler, sizing_mode="stretch_width"),
                      plots.Transfers(scheduler, sizing_mode="stretch_width")]
        self.root = column(*(p.root for p in self.parts), sizing_mode="stretch_width")

    @log_errors
    def update(self) -> None:
        data = plots._figures(self.scheduler)
        for p in self.parts:
            p.show(data)


@log_errors
def dgemm_doc(scheduler, extra, doc) -> None:
    """The ``/dgemm`` page: every dgemm plot, in the dashboard's template."""
    page = Everything(scheduler)
    page.update()
    add_periodic_callback(doc, page, INTERVAL)
    doc.title = "Dask: dgemm"
    doc.add_root(page.root)
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME


def applications() -> dict:
    """``{route: document function}`` of the dgemm pages, as ``distributed.dashboard.scheduler.applications``."""
    return {"/dgemm": dgemm_doc,
            **{route: individual_doc(cls, INTERVAL) for route, (cls, _) in INDIVIDUAL.items()}}


def add_pages(scheduler) -> bool:
    """Add the dgemm pages to ``scheduler``'s running Bokeh dashboard; False where it has none.

    Idempotent: routes the server already has are left alone.
    """
    from bokeh.server.tornado import BokehTornado
    from distributed.dashboard.core import BokehApplication
    from distributed.dashboard.scheduler import template_variables

    http = getattr(scheduler, "http_application", None)
    server = next((a for a in getattr(http, "applications", ()) if isinstance(a, BokehTornado)), None)
    if server is None:
        return False
    new = {k: v for k, v in applications().items() if k not in server.app_paths}
    tv = template_variables(scheduler)   # memoized: the dict every dashboard page renders with
    for route, (_, name) in INDIVIDUAL.items():
        if not any(p.get("url") == route.strip("/") for p in tv["plots"]):
            tv["plots"].append({"url": route.strip("/"), "name": name})
    if not new:
        return True
    ours = BokehApplication(new, scheduler, prefix=server.prefix, template_variables=tv)
    # only our applications' routes: ``ours`` also has the favicon and static files the server serves already
    mine = tuple(server.prefix + k for k in new)
    routes = [(r.matcher.regex.pattern, r.target, r.target_kwargs) for r in ours.wildcard_router.rules
              if getattr(r.matcher, "regex", None) is not None and r.matcher.regex.pattern.startswith(mine)]
    server.add_handlers(r".*", routes)
    for route, context in ours.applications.items():
        context._loop = server.io_loop
        server._applications[route] = context   # app_paths: what /individual-plots.json lists
        server.io_loop.add_callback(context.run_load_hook)
    return True

"""The progress bar of a run (``progress=True``, ``dgemm matmul``): the share of its flops done.

distributed's own bar counts tasks: a product of a few large blocks sat at
0 % for most of its run, then jumped a block's share at a time.  This one
shows what the dashboard's dgemm page shows
(:meth:`dgemm.scheduler.dashboard.MatmulProgress.work_done`): the flops of
the finished blocks and the finished k steps of the running ones, asked of
the scheduler's dashboard plugin twice a second.  Where the scheduler has no
such plugin (or no dgemm to ask it with), distributed's bar is shown instead.
"""
from __future__ import annotations

import sys
import time

from dgemm.names import DASHBOARD_PLUGIN

WIDTH = 40
NO_PLUGIN = "no-plugin"


def work_done(token: str, dask_scheduler=None):
    """Run on the scheduler: the share of the run ``token``'s flops done (0 to 1), None while the
    scheduler has not seen its tasks, or :data:`NO_PLUGIN`."""
    plugin = dask_scheduler.plugins.get(DASHBOARD_PLUGIN)
    if plugin is None:
        return NO_PLUGIN
    for m in plugin.matmuls():
        if m["id"] == token:
            return 1.0 if m["state"] == "done" else float(m["work_done"])
    return None


def bar(fraction: float, seconds: float, width: int = WIDTH) -> str:
    """One drawing of the bar (distributed's layout, the share of flops in place of tasks).

    >>> bar(0.375, 4.0, width=8)
    '\\r[###     ] | 37% of the flops | 4.0s'
    """
    fraction = min(max(fraction, 0.0), 1.0)
    return f"\r[{'#' * int(width * fraction):<{width}}] | {int(100 * fraction)}% of the flops | {seconds:.1f}s"


def show_progress(client, future, token: str, interval: float = 0.5, out=None) -> None:
    """Draw the bar of the run ``token`` on ``out`` (default stdout) until ``future`` is done.

    The bar never goes back (a worker's report of a block can come after
    the block is counted finished); it ends at 100 % when the run did, with
    the cursor left at the end of its line.  The scheduler unreachable, it
    stops drawing and waits.
    """
    out = out or sys.stdout
    t0 = time.monotonic()
    shown = 0.0
    asking, asked = True, False
    while True:
        finished = future.done()
        if asking:
            try:
                got = client.run_on_scheduler(work_done, token)
            except Exception:   # no dgemm there (first time), or a lost scheduler: future.result() says so
                got, asking = (None if asked else NO_PLUGIN), False
            asked = True
            if got == NO_PLUGIN:
                from distributed import progress
                progress(future, scheduler=client.scheduler.address)
                return
            if got is not None:
                shown = max(shown, got)
        if finished and future.status == "finished":
            shown = 1.0
        _draw(out, bar(shown, time.monotonic() - t0))
        if finished:
            return
        deadline = time.monotonic() + interval
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.02)


def _draw(out, text: str) -> None:
    try:
        out.write(text)
        out.flush()
    except ValueError:   # a closed stream (an interpreter shutting down)
        pass

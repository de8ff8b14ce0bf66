"""dgemm's first call from a fresh script, timed from the process's start (``dgemm bench e2e --first-call``).

A user's script pays for what a warm cluster has already done: the
interpreter's start, ``import dgemm``, a local cluster started by the call,
its kernels built or loaded, its buffers allocated.  :func:`time_first_call`
runs such a script (:func:`first_call_script`) in a new process and splits
its time; the product is checked like every timed run.

Where the time went, process by process (the script, the workers' fork
server, each worker), is recorded without changing the script: a
``sitecustomize`` module (:data:`PHASES_SITE`) on the processes' path notes
when named functions of dgemm, distributed and multiprocessing begin and end
and when the heavy modules are imported (:func:`phases`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dgemm.benchmarks.inputs import codec_dict
from dgemm.benchmarks.measure import check_stored, flops, tflops
from dgemm.benchmarks.objectstore import is_remote, open_zarr, remove_array

FIRST_CALL_TIMEOUT = 900          # seconds a first-call script may take (cluster start included)
FIRST_CALL_MARK = "DGEMM-FIRST-CALL "
FIRST_CALL_SCRIPT = """\
# A user's script: dgemm's first call, with no cluster (dgemm.matmul starts its own).
import json, os, sys, time
start = time.time()
import dgemm
imported = time.time()
if __name__ == "__main__":      # dgemm's local cluster spawns workers, which import the script again
    dgemm.matmul(sys.argv[1], sys.argv[2], out=sys.argv[3]{extra}{options})
    done = time.time()
    # untimed, for the benchmark's record: the devices of the cluster the call started
    from dgemm.benchmarks.first_call import ran_on
    workers = ran_on()
    print({mark!r} + json.dumps({{"start": start, "imported": imported, "done": done, "workers": workers,
                                  "pid": os.getpid(), "reported": time.time()}}), flush=True)
"""
PHASES_ENV = "DGEMM_FIRST_CALL_PHASES"   # the file the processes note their phases in (JSON lines)
# The sitecustomize of the first-call script's processes (:func:`phases`): it wraps the functions named in _HOOKS
# as their modules are imported (a meta path finder), and notes the first start and end of each, per process.
PHASES_SITE = r'''
# dgemm's first-call benchmark (dgemm.benchmarks.first_call): when each phase of the call began and ended, in
# every process of the call (the script, the workers' fork server, the workers), appended to the file named by
# $DGEMM_FIRST_CALL_PHASES as JSON lines.  It wraps named functions as their modules are imported and changes
# nothing else; another sitecustomize on the path after this one's folder is run too.
import os as _os
import sys as _sys
import time as _time

_PATH = _os.environ.get("DGEMM_FIRST_CALL_PHASES")
_HOOKS = {
    "dgemm.client.prestart": [("start", "prestart")],
    "dgemm.client.request": [("Request.check", "checks")],
    "dgemm.cluster.local": [("local_client", "cluster"), ("_import_dashboard", "dashboard_import"),
                            ("DeviceCluster._connect_dashboard", "dashboard_connect")],
    "dgemm.cluster.readiness": [("prepare", "prepare")],
    "dgemm.client.steps": [("_plan", "plan"), ("_open_output", "open_output"), ("_compute", "compute"),
                           ("_complete", "complete")],
    "dgemm.opencl.discovery": [("list_devices", "list_devices")],
    "dgemm.worker.state": [("DeviceState.__init__", "device_open")],
    "dgemm.worker.plugin": [("DgemmPlugin.setup", "plugin_setup"), ("Warmer._run", "warm")],
    "dgemm.worker.tasks": [("_gemm_block", "first_gemm"), ("store", "first_store")],
    "distributed.nanny": [("WorkerProcess._run", "worker_process"), ("WorkerProcess.start", "nanny_process_start")],
    "distributed.worker": [("Worker._register_with_scheduler", "register")],
    "distributed.scheduler": [("Scheduler.__init__", "scheduler_init"), ("Scheduler.start_unsafe", "scheduler_start")],
    "distributed.client": [("Client.__init__", "client_init")],
    "multiprocessing.forkserver": [],   # its main: see _forkserver_main
}
# Modules whose import is noted too: where the heavy ones are imported, and by which process.
_IMPORTS = {"dask", "distributed", "distributed.dashboard.scheduler", "bokeh", "pandas", "pyopencl", "zarr",
            "numcodecs", "dgemm.client.request", "dgemm.client.steps", "dgemm.worker.plugin"}
_seen = set()


def _note(phase, edge):
    key = (_os.getpid(), phase, edge)   # per process (a forked one inherits its parent's)
    if key in _seen:
        return
    _seen.add(key)
    line = '{"pid": %d, "phase": "%s", "edge": "%s", "t": %.6f}\n' % (_os.getpid(), phase, edge, _time.time())
    fd = _os.open(_PATH, _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o644)
    try:
        _os.write(fd, line.encode())   # one write per line: processes never interleave
    finally:
        _os.close(fd)


def _wrapped(fn, phase):
    import functools
    import inspect

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def timed(*args, **kwargs):
            _note(phase, "start")
            try:
                return await fn(*args, **kwargs)
            finally:
                _note(phase, "end")
    else:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            _note(phase, "start")
            try:
                return fn(*args, **kwargs)
            finally:
                _note(phase, "end")
    return timed


def _forkserver_main(main):
    """The fork server's main, noting when its preload began and ended (it then serves forks for ever)."""
    def timed(listener_fd, alive_r, preload, *args, **kwargs):
        _note("preload", "start")
        for name in preload or ():
            if name != "__main__":
                try:
                    __import__(name)
                except ImportError:
                    pass
        _note("preload", "end")
        return main(listener_fd, alive_r, preload, *args, **kwargs)
    return timed


def _patch(module):
    if module.__name__ == "multiprocessing.forkserver":
        module.main = _forkserver_main(module.main)
        return
    for qualname, phase in _HOOKS.get(module.__name__, ()):
        *owners, name = qualname.split(".")
        owner = module
        for o in owners:
            owner = getattr(owner, o)
        raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        if isinstance(raw, (classmethod, staticmethod)):
            setattr(owner, name, type(raw)(_wrapped(raw.__func__, phase)))
        else:
            setattr(owner, name, _wrapped(raw, phase))


class _Finder:
    """Notes a noted module's import, and patches a hooked one just after it has run."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _HOOKS and fullname not in _IMPORTS:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            _note(f"import {fullname}", "start")
            try:
                exec_module(module)
            finally:
                _note(f"import {fullname}", "end")
            try:
                _patch(module)
            except Exception as e:   # a renamed function: that phase goes unnoted, the call runs as ever
                _note(f"unhooked {fullname} ({type(e).__name__})", "start")

        spec.loader.exec_module = exec_and_patch
        return spec


def _next_sitecustomize():
    """Run the sitecustomize this one shadows, if any (a distribution's own)."""
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    path = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if _PATH:
    _note("site", "start")
    for _name in [n for n in _HOOKS if n in _sys.modules and n != "multiprocessing.forkserver"]:
        _patch(_sys.modules[_name])
    _sys.meta_path.insert(0, _Finder())
try:
    _next_sitecustomize()
except Exception:
    pass
'''


def first_call_script(compressors="auto", storage_options: bool = False) -> str:
    """The script :func:`time_first_call` runs: ``import dgemm`` and one ``dgemm.matmul(a, b, out=c)``.

    ``compressors`` is left to dgemm's default (``"auto"``) as a user's call
    leaves it, or ``None`` (raw C); codec objects have no place in it.  With
    ``storage_options``, the call takes them from its fourth argument (JSON).

    >>> "compressors" in first_call_script(), "compressors=None" in first_call_script(None)
    (False, True)
    >>> "storage_options=json.loads(sys.argv[4])" in first_call_script(storage_options=True)
    True
    """
    if compressors == "auto":
        extra = ""
    elif compressors is None:
        extra = ", compressors=None"
    else:
        raise ValueError(f"the first-call script writes C with zarr's default codec or none, not {compressors!r}")
    options = ", storage_options=json.loads(sys.argv[4])" if storage_options else ""
    return FIRST_CALL_SCRIPT.format(extra=extra, options=options, mark=FIRST_CALL_MARK)


def ran_on() -> list[dict]:
    """Run by the first-call script after its call: the workers of the local cluster the call started.

    One entry per worker (by address): its device's ``id``, ``name`` and
    ``type``, the ``flops`` its block products did and ``warm_seconds``, what
    preparing its device took (staging buffers, kernels); ``{"device": None}``
    for a worker without a dgemm device.  The record says from this what the
    script ran on, whatever ``devices`` it was given.
    """
    from dgemm.cluster import local_client
    from dgemm.worker import describe_worker

    client = local_client()   # the call's own cluster: started already
    warmed = client.run(_warm_seconds)
    workers = []
    for addr, d in sorted(client.run(describe_worker).items()):
        if not d or not d.get("ok"):
            workers.append({"device": None})
            continue
        info = d["device"]
        workers.append({"device": info.id, "name": info.name, "type": info.type,
                        "flops": sum(s.get("flops", 0) for s in d.get("stats", {}).values()),
                        "warm_seconds": warmed.get(addr)})
    return workers


def _warm_seconds(dask_worker=None) -> dict | None:
    """Run on a worker: what its device's preparation took (:class:`dgemm.worker.plugin.Warmer`'s ``seconds``)."""
    from dgemm.names import WORKER_PLUGIN

    plugin = dask_worker.plugins.get(WORKER_PLUGIN) if dask_worker is not None else None
    return dict(getattr(getattr(plugin, "_warmer", None), "seconds", None) or {}) or None


def phases(lines, t0: float, script_pid: int | None = None) -> dict:
    """Where the first call's time went: the notes of :data:`PHASES_SITE`, by process, from ``t0``.

    ``lines`` are the noted JSON lines (``{"pid", "phase", "edge", "t"}``).
    Returns ``{"script": {...}, "fork_server": {...} or None, "workers":
    [{...}, ...]}``, each ``{phase: [start, end]}`` in seconds from ``t0``
    (None where not seen), ``"import MODULE"`` for the noted imports.  The
    script is the process ``script_pid`` (default: the first to start); the
    fork server the one that preloaded; the workers those that ran a worker.

    >>> notes = ['{"pid": 1, "phase": "site", "edge": "start", "t": 10.5}',
    ...          '{"pid": 2, "phase": "preload", "edge": "start", "t": 10.6}',
    ...          '{"pid": 2, "phase": "preload", "edge": "end", "t": 11.5}',
    ...          '{"pid": 3, "phase": "register", "edge": "end", "t": 12.0}',
    ...          '{"pid": 3, "phase": "worker_process", "edge": "start", "t": 11.75}']
    >>> p = phases(notes, 10.0)
    >>> p["script"], p["fork_server"]["preload"], p["workers"] == [{"worker_process": [1.75, None], "register": [None, 2.0]}]
    ({'site': [0.5, None]}, [0.6, 1.5], True)
    """
    import json as _json

    by_pid: dict = {}
    first: dict = {}
    for line in lines:
        try:
            note = _json.loads(line)
        except ValueError:   # a line cut short by a process killed while it wrote
            continue
        pid = note["pid"]
        first.setdefault(pid, note["t"])
        span = by_pid.setdefault(pid, {}).setdefault(note["phase"], [None, None])
        span[0 if note["edge"] == "start" else 1] = round(note["t"] - t0, 4)
    if script_pid is None and first:
        script_pid = min(first, key=first.get)
    server = next((pid for pid, p in by_pid.items() if "preload" in p), None)
    workers = sorted((pid for pid, p in by_pid.items() if "worker_process" in p and pid not in (script_pid, server)),
                     key=lambda pid: by_pid[pid]["worker_process"][0] or 0)
    return {"script": by_pid.get(script_pid, {}), "fork_server": by_pid.get(server),
            "workers": [by_pid[pid] for pid in workers]}


def time_first_call(a_path, b_path, out_path, m: int, n: int, k: int, devices: str | None = None,
                    compressors="auto", keep: bool = False, timeout: float = FIRST_CALL_TIMEOUT,
                    storage_options: dict | None = None, workdir=None,
                    before: Callable[[], dict] | None = None) -> dict:
    """Time dgemm's first call from a fresh script, from the process's start to the call's return.

    A new Python process (this interpreter) runs :func:`first_call_script`:
    it imports dgemm and calls ``dgemm.matmul(a, b, out=out)`` once with no
    client, so the call starts its local cluster, builds or loads its
    kernels and allocates its buffers, as a user's script does.

    Parameters
    ----------
    a_path, b_path, out_path : str or os.PathLike
        The inputs and the output (local paths or URLs).
    m, n, k : int
        The product's shape, for its rate.
    devices : str, optional
        ``DGEMM_DEVICES`` of the script's cluster.
    compressors : "auto" or None
        The output's codec: zarr's default or none.
    keep : bool
        Keep the output; otherwise it is removed afterwards.
    timeout : float
        Seconds the script may take.
    storage_options : dict, optional
        Given to the call (as JSON, in its arguments).
    workdir : path, optional
        The script's folder and working directory (default: the folder of
        ``out_path``, which must then be local).
    before : callable, optional
        Runs first, untimed; its answer is the entry's ``cold``.

    Returns
    -------
    dict
        ``seconds`` from just before the process is spawned to the return of
        the call, split into ``process_start_seconds``, ``import_seconds``
        and ``matmul_seconds``; ``exit_seconds``, what the process took
        after it (closing its cluster); ``workers``, the devices of the
        script's cluster (:func:`ran_on`); ``phases``, where the time went
        in each process (:func:`phases`); the sampled check and the script.

    Raises
    ------
    RuntimeError
        The script failed: its exit status and the end of its output.
    """
    if workdir is None and is_remote(out_path):
        raise ValueError(f"the first-call script needs a local workdir: out {os.fspath(out_path)!r} is remote")
    # the script runs in workdir: local paths must not depend on this process's folder
    a_path, b_path, out_path = (p if is_remote(p) else os.path.abspath(p) for p in (a_path, b_path, out_path))
    workdir = Path(workdir if workdir is not None else Path(out_path).parent).resolve()
    script = workdir / "first_call.py"
    script.write_text(first_call_script(compressors, storage_options=bool(storage_options)))
    site = workdir / "first_call_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(PHASES_SITE)
    noted = workdir / "first_call_phases.jsonl"
    noted.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", PHASES_ENV: str(noted),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    if devices:
        env["DGEMM_DEVICES"] = devices
    remove_array(out_path, storage_options)
    argv = [sys.executable, str(script), os.fspath(a_path), os.fspath(b_path), os.fspath(out_path)]
    if storage_options:
        argv.append(json.dumps(storage_options))
    cold = before() if before is not None else None
    t0 = time.time()       # wall clock: the child's times are compared with it
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    ended = time.time()
    marks = [line for line in proc.stdout.splitlines() if line.startswith(FIRST_CALL_MARK)]
    if proc.returncode != 0 or not marks:
        tail = " ".join((proc.stderr or proc.stdout).split()[-80:])
        raise RuntimeError(f"the first-call script exited with {proc.returncode}: {tail}")
    t = json.loads(marks[-1][len(FIRST_CALL_MARK):])
    seconds = t["done"] - t0
    zc = open_zarr(out_path, storage_options)
    attrs = dict(zc.attrs).get("dgemm", {})
    check = check_stored(a_path, b_path, out_path, storage_options)
    entry = {"m": m, "n": n, "k": k, "devices": devices, "seconds": seconds,
             "tflops": tflops(flops(m, n, k), seconds),
             "process_start_seconds": t["start"] - t0, "import_seconds": t["imported"] - t["start"],
             "matmul_seconds": t["done"] - t["imported"], "dgemm_seconds": attrs.get("seconds"),
             "exit_seconds": ended - t["reported"], "workers": t["workers"], "check": check, "ok": check["passed"],
             "status": "ok" if check["passed"] else "FAILED",
             "output_compressors": [codec_dict(c) for c in zc.compressors],
             "script": script.read_text(), "cold": cold,
             "phases": phases(noted.read_text().splitlines() if noted.exists() else [], t0, t.get("pid"))}
    if not keep:
        remove_array(out_path, storage_options)
    return entry

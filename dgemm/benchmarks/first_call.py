"""dgemm's first call from a fresh script, timed from the process's start (``dgemm bench e2e --first-call``).

A user's script pays for what a warm cluster has already done: the
interpreter's start, ``import dgemm``, a local cluster started by the call,
its kernels built or loaded, its buffers allocated.  :func:`time_first_call`
runs such a script (:func:`first_call_script`) in a new process and splits
its time; the product is checked like every timed run.
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
import json, sys, time
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
                                  "reported": time.time()}}), flush=True)
"""


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
    ``type``, and the ``flops`` its block products did; ``{"device": None}``
    for a worker without a dgemm device.  The record says from this what the
    script ran on, whatever ``devices`` it was given.
    """
    from dgemm.cluster import local_client
    from dgemm.worker import describe_worker

    workers = []
    for _, d in sorted(local_client().run(describe_worker).items()):   # the call's own cluster: started already
        if not d or not d.get("ok"):
            workers.append({"device": None})
            continue
        info = d["device"]
        workers.append({"device": info.id, "name": info.name, "type": info.type,
                        "flops": sum(s.get("flops", 0) for s in d.get("stats", {}).values())})
    return workers


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
        script's cluster (:func:`ran_on`); the sampled check and the script.

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
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
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
             "script": script.read_text(), "cold": cold}
    if not keep:
        remove_array(out_path, storage_options)
    return entry

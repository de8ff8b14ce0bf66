"""The other devices of a host's one worker process (``worker-process: host``): a Dask worker each, in it.

With ``worker-process: host`` a launcher starts one process per host
instead of one per device (:func:`dgemm.cluster.spec.host_worker`): its
worker, under its nanny, drives the first device, and its dgemm plugin
starts here one :class:`distributed.Worker` per other device, in the same
process and on the same event loop, before it registers.  For the scheduler
and the dashboard each is a worker like any other (its own address, its
``GPU=1``, its own GEMM tasks, its own row), so the placement, the metering
and the release of memory work as with one process per device; what the
process adds is that the blocks several of its devices read are decoded
once (:mod:`dgemm.storage.sharing`), with no copy through shared memory.

The process's environment names the others (:data:`ENV`, set by the
launcher).  They have no nanny of their own: the main worker's nanny
restarts the whole process, and the plugin starts them again; they close
with the main worker.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os

logger = logging.getLogger(__name__)

# JSON list of [device id, worker name]: the devices of this process other than its first, set by the launcher.
ENV = "DGEMM_SIBLINGS"


def wanted(environ=None) -> list[tuple[str, str | int]]:
    """``(device, name)`` of each other device this process drives (none unless the launcher said so).

    A name is a string or, as a local cluster names its workers, a number.

    >>> wanted({ENV: '[["0:1", "job-1"], ["0:2", 2]]'})
    [('0:1', 'job-1'), ('0:2', 2)]
    >>> wanted({})
    []
    """
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not text:
        return []
    try:
        pairs = [(str(d), n if isinstance(n, int) else str(n)) for d, n in json.loads(text)]
    except (ValueError, TypeError) as e:
        raise ValueError(f"{ENV}={text!r}: expected a JSON list of [device, name] pairs ({e})") from None
    return pairs


def encode(pairs) -> str:
    """The :data:`ENV` value naming ``pairs`` (``(device, name)``; a number stays one).

    >>> wanted({ENV: encode([("0:1", 1)])})
    [('0:1', 1)]
    """
    return json.dumps([[str(d), n if isinstance(n, int) else str(n)] for d, n in pairs])


async def start(worker, pairs, plugin) -> list:
    """Start a worker per ``(device, name)`` in this process, beside ``worker``, each with ``plugin(device)``.

    Each gets ``worker``'s scheduler, security, interface, threads, memory
    limit (the process's, which all of them watch) and resources; they
    start together.  A device that does not open leaves its worker without
    ``GPU``, as under one process per device.
    """
    from distributed import Worker
    from distributed.comm import get_address_host

    host = get_address_host(worker.address)
    scratch = os.path.dirname(str(worker.local_directory).rstrip(os.sep)) or None
    workers = [Worker(worker.scheduler.address, name=name, nthreads=worker.state.nthreads,
                      memory_limit=worker.memory_manager.memory_limit, host=host, security=worker.security,
                      resources=dict(worker.state.total_resources), local_directory=scratch,
                      plugins={plugin(device)})
               for device, name in pairs]
    await asyncio.gather(*workers)
    return workers


async def close(workers) -> None:
    """Close the workers :func:`start` started (those still open), together."""
    results = await asyncio.gather(*(w.close(reason="dgemm: its process's main worker closed")
                                     for w in workers if w.status.name not in ("closing", "closed")),
                                   return_exceptions=True)
    for r in results:
        if isinstance(r, Exception):
            logger.warning("dgemm: closing a worker of this process failed: %s: %s", type(r).__name__, r)

"""The device memory a worker's codecs keep beside its panel cache, as the client's plan counts it.

A worker gives its panel cache its device's memory share less what a block
product holds (:meth:`~dgemm.client.plan.Plan.device_bytes`), less what its
device codecs keep: the decode slots' calls
(:func:`dgemm.worker.decoding.device_bytes`) and the encoder's kept buffers
(:func:`dgemm.worker.encoding.device_bytes`).  The client orders each
worker's blocks by whether their panels fit that cache
(:func:`dgemm.client.order.grow`), so it counts the same, from each worker's
description (:func:`dgemm.worker.tasks.codecs_for_plan`) and the run's
blocks that touch the most chunks.  At 49152² float32
on an 80 GB H100 the codecs kept 16-28 GiB of the 63 GiB share (bench/NOTES.md,
issue 28, twenty-fourth session).
"""
from __future__ import annotations

import numpy as np

from dgemm.client.graph import mirrored
from dgemm.cluster import device_limits
from dgemm.opencl.scratch import ENCODE_SLOTS
from dgemm.sizes import cache_budget
from dgemm.storage import encoded
from dgemm.worker import decoding, encoding


def panel_cache_bytes(plan, workers: dict, a=None, b=None, out=None, drop=(), beta: float = 0.0) -> float | None:
    """The panel cache of the smallest of ``workers``' devices (their descriptions: :func:`dgemm.cluster.prepare`)
    while they run ``plan``'s blocks of ``a`` and ``b`` into the Zarr array ``out``, as the client counts it: the
    device's memory share less a block product's buffers and what the workers' codecs keep beside them
    (:func:`codecs_bytes`; none counted where ``a`` is None, none for the encoder where ``out`` is), a margin off
    for the padding; None where the devices' memory is unknown."""
    memory, _ = device_limits(workers)
    if memory is None:
        return None
    kind = "CPU" if any(d["device"].type == "CPU" for d in workers.values()) else None
    held = 0 if a is None else max((codecs_bytes(plan, a, b, out, drop, d.get("codecs"), beta)
                                    for d in workers.values()), default=0)
    return 0.9 * cache_budget(memory, plan.device_bytes() + held, kind)


def codecs_bytes(plan, a, b, out, drop, codecs: dict | None, beta: float = 0.0) -> int:
    """Device bytes a worker whose description says ``codecs`` keeps for its codecs while it runs ``plan``'s blocks
    of ``a`` and ``b`` (:class:`~dgemm.storage.Operand`) into the Zarr array ``out`` (None: none yet; ``drop``:
    the axes the output drops; ``beta``: C's factor, which tells a Gram product); 0 where the worker says
    nothing of them (an older worker, no device)."""
    if not codecs or not (plan.rows and plan.cols and plan.ks):
        return 0
    held = 0
    if codecs.get("decode"):
        only = None if codecs.get("only") is None else frozenset(codecs["only"])
        # (Zarr operands only: the device decodes no other; another's references would build its graph)
        refs = [_largest(op, rows, cols) for op, rows, cols in ((a, plan.rows, plan.ks), (b, plan.ks, plan.cols))
                if getattr(op, "zarr", None) is not None]
        held += decoding.device_bytes([decoding.through(r, bool(codecs.get("share")), only) for r in refs],
                                      codecs.get("memory"))
    # C's chunks are encoded by the GEMM tasks only where they feed the stores (no k split, no mirror: add_store)
    if codecs.get("encode") and out is not None and len(plan.segments) == 1 and not mirrored(plan, a, b, beta):
        found = encoded.chunks_of(out, plan.rows[0], plan.cols[0], drop)
        if found is not None and found.dtype == np.dtype(plan.dtype):
            held += encoding.device_bytes(found, ENCODE_SLOTS)
    return held


def _largest(op, rows, cols):
    """The block of ``op`` (rows x cols cuts) whose decode call holds the most (:func:`~dgemm.worker.decoding.call_bytes`:
    the whole chunks it touches, a product of each axis' count, so the largest is found one axis at a time): a
    block that starts inside a chunk touches one more than the first block may."""
    ref = op.block_refs(rows, cols)[0]
    i = max(range(len(rows)), key=lambda i: decoding.call_bytes(ref(i, 0)))
    j = max(range(len(cols)), key=lambda j: decoding.call_bytes(ref(i, j)))
    return ref(i, j)

"""The functions the tasks of a dgemm graph run, in the workers (:mod:`dgemm.client.graph` builds the graph).

``dgemm-gemm``    :func:`gemm_block`, one block product on this worker's device
``dgemm-reduce``  :func:`reduce_blocks`, the sum of a C block's k segments
``dgemm-mirror``  :func:`mirror`, a symmetric product's block below the diagonal: one above, transposed
``dgemm-store``   :func:`store`, one C block written (as long as its run owns the output), then marked done
``dgemm-done``    :func:`done`, after every store
"""
from __future__ import annotations

import numpy as np

from dgemm import config
from dgemm.opencl import codecs
from dgemm.opencl.device import device_error, is_opencl_error, raise_plain
from dgemm.storage import ZarrBlock, encoded, hostcache, read_block, sharing
from dgemm.storage import store_block as store_values
from dgemm.worker import decoding, encoding


def gemm_block(a_refs, b_refs, c_ref, m, n, alpha, beta, trans_a, trans_b, dtype, precision=None,
               scope=None, reserve=0, ahead=None, twin=False, out=None):
    """One C block: ``alpha * sum_k op(A_ik) op(B_kj) + beta * C_ij`` on this worker's device.

    The A and B blocks are read and uploaded ahead of the device and kept in
    its panel cache for the run ``scope`` (see
    :meth:`dgemm.opencl.engine.BlockEngine.stream`), their Zarr blocks
    through the host cache where it is on (:func:`dgemm.storage.hostcache.through`), else
    decoded on the device where the ``device-codecs`` setting says so (:mod:`dgemm.worker.decoding`),
    else, where other device workers run in this process (``worker-process: host``), those that several of
    them read through the process's board (:mod:`dgemm.storage.sharing`);
    ``reserve`` is the device memory the product itself needs besides the
    cache; ``ahead`` lists the blocks the products this worker is expected
    to run next will read first, read while this one finishes.  A failed
    read raises :class:`OSError` naming the array, rows and columns, and the
    chunk when it can tell (:func:`dgemm.storage.unreadable`).  ``twin``: A
    and B are blocks of one array in one layout (a Gram product), staged
    once for both sides (see :meth:`~dgemm.opencl.engine.BlockEngine.stream`).

    ``out`` (``(array, rows, cols, drop)``: the output block this task's
    store task writes, where it writes this task's result as it is): where
    the ``device-codecs`` setting is on and the output's chunks are plain
    zstd frames, they are encoded on the device and the result is an
    :class:`~dgemm.storage.encoded.EncodedBlock` (:mod:`dgemm.worker.encoding`),
    not the block's values.
    """
    # At call time, so that the package dgemm.worker may import this module without a cycle.
    from dgemm.worker import device_state

    state = device_state()
    try:
        return _gemm_block(state, a_refs, b_refs, c_ref, m, n, alpha, beta, trans_a, trans_b, dtype, precision,
                           scope, reserve, ahead, twin, out)
    except Exception as e:
        # The engine names its own device errors; any other of pyopencl's (a kernel build, say) would reach
        # the client as an empty Exception: its record does not pickle (issue 26).
        if not is_opencl_error(e):
            raise
        name = state.device.info.name if state.device is not None else "?"
        raise_plain(device_error(name, f"a {m}x{n} {dtype} block product", e))


def decodes_on_device(state, scope) -> bool:
    """Whether a product of the run ``scope`` on this worker, its inputs not shared through the host cache, has the
    device decode the chunks it takes: the ``device-codecs`` setting says so, and ``auto``, which leaves some
    codecs to the host, gives way to a host's device workers decoding their shared blocks once
    (``worker-process: host``)."""
    return state.device is not None and _decodes(state.device.info.type, lambda: scope is not None and state.siblings())


def _decodes(kind: str, siblings) -> bool:
    """Whether the ``device-codecs`` setting (read now) has a device of type ``kind`` decode the inputs' chunks,
    ``siblings()`` telling whether the host's device workers share their blocks (asked only where it matters)."""
    mode = config.get("device-codecs") or "auto"
    return codecs.enabled(mode, kind) and not (codecs.codecs_of(mode, kind) is not None and siblings())


def codecs_for_plan(state) -> dict | None:
    """What a client's plan needs to know of this worker's codecs on its device (the settings read now, as a run's
    products read them) to count the device memory they keep beside the panel cache: :func:`codecs_described`
    of its device; None without a device."""
    if state.device is None:
        return None
    return codecs_described(state.device.info.type, state.memory_share(), hostcache.settings() is not None,
                            state.siblings())


def codecs_described(kind: str, memory: int, host_cache: bool = False, siblings: bool = False) -> dict:
    """The codecs a worker's device of type ``kind`` runs under the settings read now, as :func:`codecs_for_plan`
    describes them: ``decode`` (the device decodes the inputs' chunks: not where a host cache (``host_cache``)
    serves them, nor under ``auto`` where the host's device workers decode their shared blocks once
    (``siblings``)), ``share`` and ``only`` (:class:`~dgemm.worker.decoding.DeviceDecoded`'s), ``encode`` (C's
    chunks encoded there) and ``memory`` (the device's memory share, bytes).  ``dgemm plan`` describes the local
    device so, with no worker."""
    mode = config.get("device-codecs") or "auto"
    only = codecs.codecs_of(mode, kind)
    return {"decode": not host_cache and _decodes(kind, lambda: siblings), "share": codecs.shares(mode, kind),
            "only": None if only is None else sorted(only), "encode": codecs.enabled(mode, kind, "encode"),
            "memory": memory}


def _gemm_block(state, a_refs, b_refs, c_ref, m, n, alpha, beta, trans_a, trans_b, dtype, precision, scope, reserve,
                ahead, twin=False, out=None):
    engine = state.engine(dtype, precision)
    # once per product, before any read: a bad host-cache setting fails with its own message
    shared = hostcache.current() if scope is not None else None
    if shared is not None:
        a_refs = [hostcache.through(shared, scope, r) for r in a_refs]
        b_refs = [hostcache.through(shared, scope, r) for r in b_refs]
        ahead = [(hostcache.through(shared, scope, r), side, extent) for r, side, extent in ahead or ()]
    elif decodes_on_device(state, scope):
        share, only = decoding.shared(state.device), decoding.only(state.device)
        a_refs = [decoding.through(r, share, only) for r in a_refs]
        b_refs = [decoding.through(r, share, only) for r in b_refs]
        ahead = [(decoding.through(r, share, only), side, extent) for r, side, extent in ahead or ()]
        # the decode slots' buffers beside the cache, within their part of the device's memory
        memory = state.memory_share()
        decoding.limit_calls(state.device, memory)
        decoding.size_slots(state.device, a_refs + b_refs, memory)
        reserve += decoding.reserve(state.device, a_refs + b_refs, memory)
    elif scope is not None and state.siblings():   # other device workers in this process: decode shared blocks once
        board = sharing.board()
        a_refs = [sharing.through(board, scope, r) for r in a_refs]
        b_refs = [sharing.through(board, scope, r) for r in b_refs]
        ahead = [(sharing.through(board, scope, r), side, extent) for r, side, extent in ahead or ()]
    found = encoding.target(state.device, engine.dtype, out)
    if found is not None:   # the encoder's kept buffers beside the cache (grown by an earlier block, maybe)
        state.device.encode_scratch.budget = encoding.device_bytes(found)     # (what reserve counts for a slot)
        reserve += max(encoding.device_bytes(found, state.device.encode_scratch.slots()),
                       state.device.encode_scratch.nbytes())
    state.plan_cache(reserve)
    c = read_block(c_ref) if c_ref is not None and beta != 0 else None
    return engine.stream(a_refs, b_refs, m, n, alpha=alpha, beta=beta, c=c, trans_a=trans_a, trans_b=trans_b,
                         scope=scope, ahead=ahead, twin=twin,
                         finish=None if found is None else encoding.finisher(state.device, found, engine.count))


def reduce_blocks(parts):
    """Sum the k segments of one C block."""
    out = parts[0].copy()
    for p in parts[1:]:
        out += p
    return out


def mirror(block, diagonal=False):
    """A block of a symmetric C from its mirror image ``block`` above the diagonal: transposed (C-contiguous,
    as the store writes whole rows).

    ``diagonal``: ``block`` is on the diagonal; its upper triangle is kept and
    mirrored into its lower one, so that C is exactly symmetric (a device's
    block product need not be: the tensor-core kernels sum ``a_i b_j`` and
    ``a_j b_i`` in different orders).
    """
    block = np.asarray(block)
    if not diagonal:
        return np.ascontiguousarray(block.T)
    out = np.triu(block)
    out += np.triu(block, 1).T
    return out


def store(array, rows, cols, block, drop, marker=None, fence=None, originals=None):
    """Write one C block, then its completion marker; returns its shape (the store holds the data).

    ``marker`` is ``(BlockMarkers, i, j)``.  The marker is written only after
    every chunk of the block: a worker killed in between leaves the block
    unmarked, and a re-run (dask's retry, or ``resume=True``) rewrites it.  A
    block already marked is not written again (dask re-runs the store of a
    block when the worker holding its result dies).

    ``fence`` (a :class:`~dgemm.storage.lease.Fence`) is checked before the
    write and again before the marker: a task of a run that no longer holds
    the output's lease writes nothing more and fails.  ``originals`` (an
    in-place update, :class:`~dgemm.storage.originals.Originals`) keeps the
    original C block before it is first overwritten.

    ``block`` is the block's values, or its chunks encoded on the device
    (an :class:`~dgemm.storage.encoded.EncodedBlock`), written as they are.
    """
    if marker is None:
        store_block(array, rows, cols, block, drop)
        return block.shape
    markers, i, j = marker
    if fence is not None:
        fence.check(i, j)
    if markers.is_done(i, j):
        return block.shape
    if originals is not None:
        originals.keep(i, j, ZarrBlock(array, tuple(rows), tuple(cols)))
    store_block(array, rows, cols, block, drop)
    if fence is not None:
        fence.check(i, j, stored=True)
    markers.mark(i, j)
    return block.shape


def store_block(array, rows, cols, block, drop) -> None:
    """Write one C block: its values (:func:`dgemm.storage.store_block`, its chunks encoded on
    :func:`encode_threads` threads), or its chunks' frames as they are (an
    :class:`~dgemm.storage.encoded.EncodedBlock`: :func:`dgemm.storage.encoded.write`, on as many)."""
    if isinstance(block, encoding.PendingBlock):    # (its chunks being encoded on the device still, maybe)
        block = block.result()
    if isinstance(block, encoded.EncodedBlock):
        found = block.chunks
        if (found.rows, found.cols) != (tuple(rows), tuple(cols)):
            raise ValueError(f"internal: the chunks of rows {found.rows}, columns {found.cols} reached the store "
                             f"of rows {tuple(rows)}, columns {tuple(cols)}")
        encoded.write(block, threads=encode_threads())
    else:
        store_values(array, rows, cols, block, drop, threads=encode_threads())


def encode_threads() -> int:
    """The threads a store task encodes its C block's chunks on.

    One while this worker has block products still to run: its other
    threads (more stores) and its device's readers keep the cores busy then.
    Once it has none (the run's end), its share of the worker's threads
    among the tasks running there: the last blocks, which the run waits
    for, are encoded by all of the worker's cores instead of one a block
    (the drain after the last GEMM was one block's encode on one core,
    0.3 s on an H100 host; bench/NOTES.md), and never by more (the other
    workers of the host may still be reading).
    """
    from distributed import get_worker

    from dgemm.names import WORKER_PLUGIN

    try:
        worker = get_worker()
    except ValueError:   # not in a worker's task (a local run)
        return 1
    plugin = worker.plugins.get(WORKER_PLUGIN)
    if plugin is None or plugin.products_pending():
        return 1
    return max(1, worker.state.nthreads // max(worker.state.executing_count, 1))   # executing: this task too


def done(shapes):
    """How many blocks were stored (the one result of the done task)."""
    return len(shapes)

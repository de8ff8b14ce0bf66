"""Which way this process read and wrote chunks: dgemm's fast paths (:mod:`dgemm.storage.chunks`) or zarr's.

:func:`dgemm.storage.chunks.read_into` and
:func:`~dgemm.storage.chunks.write_region` decline what they do not handle,
and their callers then read or write through zarr, which gives the same
values more slowly.  A fast path that starts refusing a case it should take
(every edge chunk, every small zstd chunk, S3 writes one object at a time)
would show in no value: these counters show it.  Each path (the names are
:data:`dgemm.names.STORAGE_PATHS`) counts how many times it ran and the
bytes of array elements it moved:

``read_direct``        a raw chunk read from its file straight into the caller's buffer
``read_decoded_into``  a chunk decoded straight into the caller's buffer (zstd, blosc, lz4)
``read_copied``        a chunk decoded (or fetched, raw) into another buffer, then copied:
                       a chunk the region cuts (edge chunks among them), or a codec that
                       cannot decode into a buffer (gzip, a crc32c alone)
``read_fill``          a chunk never written, filled with the fill value
``read_zarr``          a region :func:`~dgemm.storage.chunks.read_into` declined (one
                       count per region): the caller reads it through zarr
``write_direct``       a chunk encoded here and written to its file
``write_batched``      a chunk encoded here and sent in a batch of S3 PUTs
``write_zarr``         a region :func:`~dgemm.storage.chunks.write_region` declined
                       (one count per region): zarr writes it
``s3_put_batch``       a batch of PUTs (:func:`dgemm.storage.remote.put_many`); its bytes
                       are those sent, encoded
``write_helped``       of the chunks written either way above, those a helper thread of
                       their store task encoded (``write_region``'s ``threads``), or wrote as the
                       device encoded them (``encoded.write``'s): a run's last blocks,
                       :func:`dgemm.worker.tasks.store`

Beside the paths, the bytes chunks decoded to and were encoded from, by where the codec ran
(:data:`dgemm.names.CODEC_COUNTERS`: ``device_decoded_bytes``, ``host_decoded_bytes``,
``device_encoded_bytes``, ``host_encoded_bytes``; :func:`codec`): the host's are dgemm's own
reader's and writer's (a compressor, not a crc32c alone; zarr's reads and writes, ``*_zarr``, are
not counted), the device's those of :mod:`dgemm.opencl.codecs` (the worker counts them).  A chunk
counts its whole decoded size each time it is decoded, an edge chunk or one cut by the region too.

Counts are of chunks (inner chunks, in a shard) except where said.  The
figures are per process, for its life (a worker's snapshot carries them:
:meth:`dgemm.worker.DeviceState.totals`); a run's share is the difference
of two snapshots (:func:`since`).  Updating them takes one lock per chunk,
which costs nothing next to a chunk's read or decode.
"""
from __future__ import annotations

import threading

from dgemm.names import CODEC_COUNTERS, STORAGE_PATHS

_LOCK = threading.Lock()
_COUNTS = dict.fromkeys(STORAGE_PATHS, 0)
_BYTES = dict.fromkeys(STORAGE_PATHS, 0)
_CODEC = dict.fromkeys(CODEC_COUNTERS, 0)


def record(path: str, nbytes: int, count: int = 1) -> None:
    """Count ``count`` uses of ``path`` (one of :data:`~dgemm.names.STORAGE_PATHS`) moving ``nbytes`` bytes."""
    with _LOCK:
        _COUNTS[path] += count
        _BYTES[path] += int(nbytes)


def codec(name: str, nbytes: int) -> None:
    """Count ``nbytes`` decoded or encoded bytes under ``name`` (one of :data:`~dgemm.names.CODEC_COUNTERS`)."""
    with _LOCK:
        _CODEC[name] += int(nbytes)


def snapshot() -> dict:
    """``{"storage_<path>": count, "storage_<path>_bytes": bytes}`` for every path, and the codec byte
    counters (:data:`~dgemm.names.CODEC_COUNTERS`), this process so far."""
    with _LOCK:
        out = {}
        for path in STORAGE_PATHS:
            out[f"storage_{path}"] = _COUNTS[path]
            out[f"storage_{path}_bytes"] = _BYTES[path]
        out.update(_CODEC)
        return out


def since(before: dict, after: dict | None = None) -> dict:
    """What :func:`snapshot` grew by between ``before`` and ``after`` (default: now)."""
    after = snapshot() if after is None else after
    return {k: v - before.get(k, 0) for k, v in after.items()}

"""How many threads read a device's input blocks: the decoding readers (a share of the host's cores) and the
copiers of raw chunks (:meth:`dgemm.opencl.device.Device.pool`)."""
from __future__ import annotations

import os

from dgemm import config


# Raw chunks copied from files at once, per device: beyond 8 the copies contend for the host's memory
# bandwidth with the uploads (one H100, 32768² float32 in 8192² chunks from /dev/shm: 2.30 s with 8
# readers, 2.85 s with 16).
COPY_THREADS = 8


def reader_share(cpus: int, devices: int) -> int:
    """Reader threads per device worker on a host of ``cpus`` cores and ``devices`` device workers: 2 to 32.

    Decoding compressed chunks is CPU work that scales with threads (zstd
    on a 32-core H200 host: 0.9 GB/s on one, 21 on 32; bench/NOTES.md,
    "Issue 27"), so a device gets its share of the cores, up to 32 (each
    thread holds a page-locked staging buffer).  Raw chunks are only
    copied, by a pool of at most :data:`COPY_THREADS` (:meth:`Device.pool`).

    >>> reader_share(64, 4), reader_share(16, 1), reader_share(2, 2), reader_share(12, 4), reader_share(128, 2)
    (16, 16, 2, 3, 32)
    """
    return max(2, min(32, cpus // max(1, devices)))


def read_threads() -> int:
    """Threads a device reads and uploads with: the ``read-threads`` setting (``DGEMM_READ_THREADS``).

    Unset, this host's :func:`reader_share` for one device; launchers that
    put several device workers on a host set each one's share.  Reading a
    Zarr chunk is mostly copying and decoding outside the GIL, so several
    threads keep the disk (or the page cache) and PCIe busy together.
    """
    return config.get("read-threads") or reader_share(os.cpu_count() or 1, 1)

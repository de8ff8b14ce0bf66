"""Size rules every layer shares: the kernels' 32-bit indexing, rounding up to tiles, and what one
block product holds on a device (the client plans by it, the worker sizes its panel cache by it)."""
from __future__ import annotations

INT32_MAX = 2**31 - 1   # the kernels index buffers with 32-bit integers


def roundup(x: int, m: int) -> int:
    """Smallest multiple of ``m`` that is >= ``x``.

    >>> roundup(100, 32), roundup(96, 32), roundup(0, 32)
    (128, 96, 0)
    """
    return -(-x // m) * m


# Share of a device's memory a plan may fill (the rest: programs, the driver,
# another dtype's engine).
MEMORY_FRACTION = 0.8


def cache_budget(memory: int, reserve: int, device_type: str | None = None) -> int:
    """Bytes of a device's panel cache: its share of ``memory`` less what one block product holds (``reserve``).

    The share is :data:`MEMORY_FRACTION`; a CPU device, whose memory is the
    host's, keeps a quarter of that.

    >>> cache_budget(100, 30), cache_budget(100, 30, "CPU"), cache_budget(100, 90)
    (50, 0, 0)
    """
    share = MEMORY_FRACTION * memory * (0.25 if device_type == "CPU" else 1.0)
    return max(0, int(share - reserve))


# The block asked for on a GPU when the user gives none: M, N and K.  Each block product costs its worker's host
# about 15 ms besides its GEMMs (its reads ahead asked, its kernels launched, its result handed to the store),
# and 45 while the inputs are still being decoded beside it; a 4096-cube product's GEMMs take 11 ms on an H200,
# so the device idled between products: 32768^2 zstd in and out took 2.24-2.37 s with 4096-cube blocks and
# 1.47-1.81 with these, across machines (raw 1.24-1.37 either way; bench/NOTES.md, issue 28, seventeenth
# session).  K stays at 4096: an input block (8192 x 4096) is what a reader thread stages and a device decode
# call holds.
GPU_TARGET = (8192, 8192, 4096)


# Below this much memory per worker a GPU keeps 4096-cube blocks: what a worker holds beside a product's working
# set grows with the block (its decode slots, the page-locked staging NVIDIA's driver backs with device memory,
# the panel cache's entries), and 8192-wide blocks were measured on 80 and 141 GB devices only.
LARGE_BLOCKS_MEMORY = 24 << 30


def default_target(device_types, memory: int | None = None) -> int | tuple[int, int, int]:
    """The block size asked for when the user gives none, by the types of the devices that will run it.

    ``device_types`` are OpenCL device types (``"CPU"``, ``"GPU"``, ...):
    1024 when every device is a CPU, else :data:`GPU_TARGET` along M, N
    and K (also when none is known), or 4096 where ``memory`` (bytes per
    worker of the smallest device, when known) is below
    :data:`LARGE_BLOCKS_MEMORY`.

    >>> default_target(["CPU", "CPU"]), default_target(["CPU", "GPU"]), default_target([])
    (1024, (8192, 8192, 4096), (8192, 8192, 4096))
    >>> default_target(["GPU"], memory=80 << 30), default_target(["GPU"], memory=16 << 30)
    ((8192, 8192, 4096), 4096)
    """
    types = list(device_types)
    if types and all(t == "CPU" for t in types):
        return 1024
    return 4096 if memory is not None and memory < LARGE_BLOCKS_MEMORY else GPU_TARGET


def input_block_elements(target) -> int:
    """Elements of the largest input block a ``target`` (an int, or M, N and K) asks for: M x K of A, K x N of B.

    >>> input_block_elements(1024), input_block_elements((8192, 8192, 4096))
    (1048576, 33554432)
    """
    m, n, k = (target,) * 3 if isinstance(target, int) else target
    return max(m, n) * k


def working_set(bm: int, bn: int, bk: int, tiles: tuple[int, int, int], itemsize: int) -> tuple[int, int]:
    """Device bytes one block product holds, and its largest single buffer.

    The engine keeps the A and B panels padded to the tiles (``kp x mp`` and
    ``kp x np``), the padded C accumulator, two unpadded Cs for the downloads
    (one comes down while the next product runs), and one staging buffer as
    large as the largest host block it uploads.

    >>> working_set(64, 64, 64, (64, 64, 16), 4)
    (98304, 16384)
    >>> working_set(100, 10, 1, (64, 64, 16), 8)   # padded to 128 x 64, k to 16
    (114112, 65536)
    """
    tm, tn, tk = tiles
    mp, np_, kp = roundup(max(bm, 1), tm), roundup(max(bn, 1), tn), roundup(max(bk, 1), tk)
    buffers = (kp * mp, kp * np_, mp * np_, max(bm * bk, bk * bn, bm * bn), bm * bn, bm * bn)
    return itemsize * sum(buffers), itemsize * max(buffers)


def index_overflow(bm: int, bn: int, bk: int, tiles: tuple[int, int, int]) -> str | None:
    """Why blocks of ``bm x bn x bk`` overflow the kernels' 32-bit indexing (None if they do not).

    >>> index_overflow(4096, 4096, 4096, (64, 64, 16)) is None
    True
    >>> index_overflow(50000, 50000, 64, (64, 64, 16))
    'a C block of 50048 x 50048 padded elements exceeds 2**31 - 1'
    """
    tm, tn, tk = tiles
    mp, np_, kp = roundup(max(bm, 1), tm), roundup(max(bn, 1), tn), roundup(max(bk, 1), tk)
    for what, x, y in (("a C block", mp, np_), ("an A block", mp, kp), ("a B block", kp, np_)):
        if x * y > INT32_MAX:
            return f"{what} of {x} x {y} padded elements exceeds 2**31 - 1"
    return None


def host_memory() -> int:
    """Bytes of this host's memory a process may use: distributed's figure (the cgroup's limit where there is
    one), else the physical memory.

    >>> host_memory() > 0
    True
    """
    try:
        from distributed.system import MEMORY_LIMIT
        return int(MEMORY_LIMIT)
    except ImportError:
        import os
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

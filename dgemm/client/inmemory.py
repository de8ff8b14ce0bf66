"""numpy in, numpy out: products whose operands are all in this process's memory.

Such a product is computed at once and returned as a :class:`numpy.ndarray`,
as :func:`numpy.matmul` would.  Below the ``small-flops`` setting numpy's
own BLAS does it here (a cluster's round trip costs more than the product);
above it the blocks are scattered to the workers, each block sent once as
its own piece of data (never inside the task graph), and gathered back.
"""
from __future__ import annotations

import numpy as np

from dgemm import config


def is_small(flops: int) -> bool:
    """Whether a product of ``flops`` (2·m·n·k) is cheaper here than on the devices (``small-flops``).

    >>> import dask
    >>> with dask.config.set({"dgemm.small-flops": 1000}):
    ...     is_small(999), is_small(1000)
    (True, False)
    """
    return flops < config.get("small-flops")


def host_product(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, *, alpha: float, beta: float,
                 dtype: np.dtype) -> np.ndarray:
    """``alpha * a @ b + beta * c`` with numpy, in ``dtype`` (``c`` is None when beta is 0).

    >>> host_product(np.eye(2), np.array([[1.0, 2.0], [3.0, 4.0]]), np.ones((2, 2)), alpha=2.0, beta=1.0,
    ...              dtype=np.dtype("f8"))
    array([[3., 5.],
           [7., 9.]])
    """
    out = np.matmul(a.astype(dtype, copy=False), b.astype(dtype, copy=False))
    if alpha != 1:
        out *= dtype.type(alpha)
    if c is not None and beta != 0:
        out += dtype.type(beta) * c.astype(dtype, copy=False)
    return out


def scatter_blocks(client, x: np.ndarray, row_bounds, col_bounds, name: str):
    """``x`` cut into the plan's blocks and sent to the cluster, one piece of data per block.

    Returns a dask array whose chunks are those blocks, held by the workers
    (a task graph that names them, not one that carries them).
    """
    import dask.array as da

    keys = [(i, j) for i in range(len(row_bounds)) for j in range(len(col_bounds))]
    blocks = [np.ascontiguousarray(x[r0:r1, c0:c1])
              for (r0, r1), (c0, c1) in ((row_bounds[i], col_bounds[j]) for i, j in keys)]
    futures = client.scatter(blocks, hash=False)
    dsk = {(name, i, j): f for (i, j), f in zip(keys, futures)}
    chunks = (tuple(b - a for a, b in row_bounds), tuple(b - a for a, b in col_bounds))
    return da.Array(dsk, name, chunks=chunks, dtype=x.dtype, meta=np.empty((0, 0), dtype=x.dtype)), futures

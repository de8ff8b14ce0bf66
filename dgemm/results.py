"""Reading results back: a finished output carries a completion marker."""
from __future__ import annotations

from dgemm.storage import COMPLETE_ATTR


class IncompleteResultError(RuntimeError):
    """The output exists but its run did not finish."""


def open_result(path):
    """Open a dgemm output, refusing one whose run did not complete.

    Parameters
    ----------
    path : str, os.PathLike or zarr store
        Where ``dgemm.matmul(..., out=path)`` wrote.

    Returns
    -------
    zarr.Array
    """
    import zarr

    arr = zarr.open_array(path, mode="r")
    meta = arr.attrs.get(COMPLETE_ATTR)
    if meta is None:
        raise IncompleteResultError(f"{path} was not written by dgemm (no {COMPLETE_ATTR!r} attribute)")
    if not meta.get("complete"):
        raise IncompleteResultError(f"{path} is incomplete: the dgemm run that writes it did not finish")
    return arr

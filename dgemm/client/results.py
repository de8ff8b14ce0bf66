"""Reading results back: a finished output carries a completion marker."""
from __future__ import annotations

from dgemm.errors import IncompleteResultError
from dgemm.storage import COMPLETE_ATTR
from dgemm.storage.options import access_hint, is_url


def open_result(path, *, storage_options: dict | None = None):
    """Open a dgemm output, refusing one whose run did not complete.

    Parameters
    ----------
    path : str, os.PathLike or zarr store
        Where ``dgemm.matmul(..., out=path)`` wrote.
    storage_options : dict, optional
        Options of the filesystem behind a URL ``path`` (e.g. s3fs's
        ``key``, ``secret``, ``endpoint_url``), as for :func:`dgemm.matmul`;
        refused with anything but a URL.

    Returns
    -------
    zarr.Array
    """
    import zarr

    if storage_options and not is_url(path):
        raise ValueError(f"storage_options= applies to a URL (such as 's3://bucket/c.zarr'), not to {path!r}; "
                         "local paths need none, and stores carry their own")
    try:
        arr = zarr.open_array(path, mode="r", storage_options=storage_options or None)
    except Exception as e:
        hint = access_hint(e, storage_options) if is_url(path) else ""
        if not hint:
            raise
        raise ValueError(f"cannot open {path} ({type(e).__name__}: {e}){hint}") from None
    meta = arr.attrs.get(COMPLETE_ATTR)
    if meta is None:
        raise IncompleteResultError(f"{path} was not written by dgemm (no {COMPLETE_ATTR!r} attribute)")
    if not meta.get("complete"):
        raise IncompleteResultError(f"{path} is incomplete: the dgemm run that writes it did not finish")
    return arr

"""``storage_options=``: the options of the filesystem behind URL operands and outputs.

As :func:`dask.array.from_zarr` and :func:`dask.array.to_zarr` take them:
they open the stores of URLs (``s3://``, ``gs://``, any fsspec protocol);
local paths need none.  The opened arrays carry them to the workers (an
fsspec filesystem pickles with its options), so workers need no
credentials or endpoint of their own.
"""
from __future__ import annotations

import os
from collections.abc import Mapping


def is_url(x) -> bool:
    """Whether ``x`` is a URL that fsspec opens (what zarr passes ``storage_options`` to).

    >>> is_url("s3://bucket/a.zarr"), is_url("simplecache::s3://b/a.zarr"), is_url("a.zarr"), is_url(3)
    (True, True, False, False)
    """
    if not isinstance(x, (str, os.PathLike)):
        return False
    s = os.fspath(x)
    # zarr's own rule (zarr.storage._common._is_fsspec_uri): a protocol, or a chain of them
    return isinstance(s, str) and ("://" in s or ("::" in s and "local://" not in s))


def check_storage_options(storage_options, targets: dict) -> dict | None:
    """``storage_options`` as a plain dict (None when empty), refused where no URL in ``targets`` would use them.

    ``targets`` maps names (``"a"``, ``"out"``) to what the user passed.

    >>> check_storage_options({"anon": True}, {"a": "s3://b/a.zarr", "b": "b.zarr"})
    {'anon': True}
    >>> check_storage_options(None, {"a": "a.zarr"}) is None
    True
    """
    if storage_options is None:
        return None
    if not isinstance(storage_options, Mapping) or not all(isinstance(k, str) for k in storage_options):
        raise TypeError("storage_options must be a dict of option names to values, as dask.array.from_zarr "
                        f"takes it (e.g. {{'anon': True}}), not {type(storage_options).__name__}")
    if not storage_options:
        return None
    if not any(is_url(x) for x in targets.values()):
        given = ", ".join(name for name, x in targets.items() if x is not None)
        raise ValueError(f"storage_options= applies to URLs such as 's3://bucket/a.zarr', and none of {given} "
                         "is one (local paths need none; opened arrays and stores carry their own)")
    return dict(storage_options)


def access_hint(error: Exception, storage_options: dict | None) -> str:
    """What to check when opening a URL failed for another reason than nothing being there ("" then).

    >>> access_hint(FileNotFoundError("x"), None)
    ''
    >>> access_hint(PermissionError("Forbidden"), {"anon": True})
    '; check storage_options (credentials, endpoint_url)'
    """
    if isinstance(error, (FileNotFoundError, ValueError, KeyError)):  # nothing there, or not Zarr
        return ""
    if not storage_options:
        return ("; storage_options= gives its filesystem credentials and endpoint "
                "(s3fs: key, secret, endpoint_url; or anon=True)")
    return "; check storage_options (credentials, endpoint_url)"


def check_remote_parent(url: str, storage_options: dict | None, what: str = "out") -> None:
    """Refuse, before any work, a URL whose filesystem cannot be opened or whose place cannot be reached.

    Walks up from the URL's parent to the first folder that exists, so a
    missing bucket, bad credentials or a wrong endpoint are refused now
    rather than after the product is computed.  Object stores have no real
    folders: a missing prefix is fine, a missing bucket is not.
    """
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(url, **(storage_options or {}))
    except ImportError as e:  # fsspec names the package to install
        raise ValueError(f"{what} {url!r}: {e}") from None
    except (ValueError, TypeError) as e:  # an unknown protocol, or options the filesystem does not take
        raise ValueError(f"{what} {url!r}: {type(e).__name__}: {e}") from None
    node = fs._parent(path) or path
    while True:
        try:
            fs.info(node)
            return
        except FileNotFoundError:
            up = fs._parent(node)
            if not up or up == node:
                raise ValueError(f"{what} {url!r}: {node!r} does not exist (a bucket must be created first)") from None
            node = up
        except Exception as e:
            raise ValueError(f"{what} {url!r}: cannot reach {node!r} ({type(e).__name__}: {e})"
                             f"{access_hint(e, storage_options)}") from None

"""The output: checked before any work (:func:`check_output`), created once planned, written block by block."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from dgemm.storage.markers import COMPLETE_ATTR
from dgemm.storage.operands import is_zarr_array


@dataclass
class OutputSpec:
    """A checked but not yet created output."""

    target: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    overwrite: bool
    array: Any = None             # an existing zarr.Array given as ``out``
    resume: bool = False          # ``array`` is an earlier dgemm output to finish
    compressors: Any = "auto"     # codecs of a new output (zarr.create_array's ``compressors``)

    @property
    def chunks(self) -> tuple[int, ...] | None:
        if self.array is None:
            return None
        # A task writes whole shards where there are shards, whole chunks otherwise.
        return tuple(getattr(self.array, "shards", None) or self.array.chunks)


def check_output(out, shape: tuple[int, ...], dtype: np.dtype, overwrite: bool,
                 resume: bool = False) -> OutputSpec:
    """Check that ``out`` can receive a ``shape``/``dtype`` result; write nothing.

    With ``resume``, an existing ``out`` must be a dgemm output of that
    shape and dtype, and is returned opened for writing (``spec.resume``);
    a missing one gives a fresh output.
    """
    from zarr.abc.store import Store
    from zarr.storage import MemoryStore

    if resume:
        existing = _open_for_resume(out)
        if existing is not None:
            spec = check_output(existing, shape, dtype, False)
            meta = existing.attrs.get(COMPLETE_ATTR)
            if not isinstance(meta, dict) or "complete" not in meta:
                raise ValueError(f"cannot resume: out {_name(out)} was not written by dgemm "
                                 f"(it has no {COMPLETE_ATTR!r} attribute); pass overwrite=True to replace it")
            spec.resume = True
            return spec
    if is_zarr_array(out):
        if tuple(out.shape) != tuple(shape):
            raise ValueError(f"out has shape {tuple(out.shape)}, but the result has shape {tuple(shape)}")
        if out.dtype != dtype:
            raise ValueError(f"out has dtype {out.dtype}, but the result is {dtype}")
        if out.read_only:
            raise PermissionError("out is opened read-only; open it with mode='r+' or 'a'")
        _refuse_memory(out.store)
        return OutputSpec(out, tuple(shape), dtype, overwrite, array=out)
    if isinstance(out, Store):
        if out.read_only:
            raise PermissionError(f"out store {out} is read-only")
        _refuse_memory(out)
        if not overwrite and _exists(out):
            raise FileExistsError(f"out {out} already holds Zarr data; pass overwrite=True to replace it")
        return OutputSpec(out, tuple(shape), dtype, overwrite)
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a path, URL, zarr store or zarr.Array, not {type(out).__name__}")
    target = os.fspath(out)
    if target.startswith("memory://"):
        _refuse_memory(MemoryStore())
    if "://" not in target or target.startswith("file://"):
        local = target[len("file://"):] if target.startswith("file://") else target
        if os.path.exists(local):
            if not overwrite:
                raise FileExistsError(f"out {target!r} already exists; pass overwrite=True to replace it")
            if not os.path.isdir(local):
                raise FileExistsError(f"out {target!r} is a file, not a Zarr store; remove it first")
        parent = os.path.abspath(local)
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.access(parent, os.W_OK) or (os.path.exists(local) and not os.access(local, os.W_OK)):
            raise PermissionError(f"out {target!r} is not writable ({parent} does not allow writing)")
    elif not overwrite and _exists(target):
        raise FileExistsError(f"out {target!r} already holds Zarr data; pass overwrite=True to replace it")
    return OutputSpec(target, tuple(shape), dtype, overwrite)


def _name(out) -> str:
    return repr(os.fspath(out)) if isinstance(out, (str, os.PathLike)) else str(getattr(out, "store_path", out))


def _open_for_resume(out):
    """The existing array at ``out`` opened for writing, or None when there is nothing there."""
    import zarr
    from zarr.abc.store import Store

    if is_zarr_array(out):
        return out
    if not isinstance(out, (str, os.PathLike, Store)):
        return None  # check_output explains what is wrong with it
    if isinstance(out, (str, os.PathLike)):
        local = os.fspath(out)
        if "://" not in local or local.startswith("file://"):
            local = local[len("file://"):] if local.startswith("file://") else local
            if not os.path.exists(local):
                return None
    elif not _exists(out):
        return None
    try:
        return zarr.open_array(out, mode="r+")
    except Exception as e:
        raise ValueError(f"cannot resume: out {_name(out)} exists but is not a Zarr array "
                         f"({type(e).__name__}: {e})") from None


def _refuse_memory(store) -> None:
    from zarr.storage import MemoryStore
    if isinstance(store, MemoryStore):
        raise ValueError("out is an in-memory Zarr store, which worker processes cannot write to; "
                         "give a path or URL, or use out=None for a lazy dask array")


def _exists(target) -> bool:
    import zarr
    try:
        zarr.open(target, mode="r")
        return True
    except Exception:
        return False


def create_output(spec: OutputSpec, chunks: tuple[int, ...], meta: dict):
    """Create the output array (metadata only); marked incomplete until the run ends."""
    import zarr

    attrs = {COMPLETE_ATTR: {"complete": False, **meta}}
    if spec.array is not None:
        spec.array.attrs.update(attrs)
        return spec.array
    return zarr.create_array(store=spec.target, shape=spec.shape, chunks=chunks, dtype=spec.dtype,
                             fill_value=0, overwrite=spec.overwrite, attributes=attrs, compressors=spec.compressors,
                             config={"write_empty_chunks": True})


def store_block(array, rows: tuple[int, int], cols: tuple[int, int], block: np.ndarray, drop: tuple = ()):
    """Write one output block (whole chunks) into ``array``.

    ``drop`` names the axes of the 2-D block that the output does not have
    (matmul with 1-D operands, as numpy squeezes them).  Idempotent: writing
    the same block again (a task re-run after a worker died) stores the same
    chunks, each replaced whole.
    """
    region = tuple(slice(*r) for ax, r in enumerate((rows, cols)) if ax not in drop)
    array[region] = np.squeeze(block, axis=drop) if drop else block

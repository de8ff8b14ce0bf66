"""The output: checked before any work (:func:`check_output`), created once planned, written block by block."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from dgemm.storage.layout import Layout
from dgemm.storage.locations import ZARR_METADATA, absolute, check_protocol, local_path, locate
from dgemm.storage.markers import COMPLETE_ATTR
from dgemm.storage.operands import is_zarr_array
from dgemm.storage.options import check_remote_parent, is_url


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
    storage_options: dict | None = None   # of a URL ``target``'s filesystem (dgemm.storage.options)
    layout: Layout | None = None  # chunks, shards, format, dims, attributes of a new output (dgemm.storage.layout)

    @property
    def chunks(self) -> tuple[int, ...] | None:
        if self.array is None:
            return None
        # A task writes whole shards where there are shards, whole chunks otherwise.
        return tuple(getattr(self.array, "shards", None) or self.array.chunks)


def check_output(out, shape: tuple[int, ...], dtype: np.dtype, overwrite: bool,
                 resume: bool = False, storage_options=None) -> OutputSpec:
    """Check that ``out`` can receive a ``shape``/``dtype`` result; write nothing.

    A local path (or ``file://`` URL) becomes absolute here, on the client,
    and a store or array with a relative root is re-created with an absolute
    one: the workers, in folders of their own, write where the user meant.
    ``overwrite`` replaces only what is already Zarr data (an array or a
    group) or an empty folder, never other files: a folder holding anything
    that neither Zarr nor dgemm wrote is refused, naming it
    (:func:`refuse_foreign`).  An output that is a symbolic link to a
    folder is replaced inside that folder, the link kept; a dangling link,
    a path under a file, or a name longer than the file system allows is
    refused here, before any cluster.  Stores that the workers cannot
    write are refused: in this process's memory, or a zip file.

    With ``resume``, an existing ``out`` must be a dgemm output of that
    shape and dtype, and is returned opened for writing (``spec.resume``);
    a missing one gives a fresh output.
    """
    from zarr.abc.store import Store

    if resume:
        try:
            existing = open_existing(out, storage_options, mode="r+")
        except NotAnArrayError as e:
            raise ValueError(f"cannot resume: out {_name(out)} exists but is not a Zarr array ({e})") from None
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
        if out.dtype.newbyteorder("=") != dtype:   # either byte order: zarr converts on write
            raise ValueError(f"out has dtype {out.dtype}, but the result is {dtype}")
        if out.read_only:
            raise PermissionError("out is opened read-only; open it with mode='r+' or 'a'")
        for kind, sizes in (("chunk", tuple(out.chunks)), ("shard", tuple(getattr(out, "shards", None) or ()))):
            if any(int(s) <= 0 for s in sizes):   # damaged metadata: the plan would divide by it on the cluster
                raise ValueError(f"out ({out.store_path}) has a {kind} size of 0 in its metadata ({kind}s {sizes}): "
                                 "its zarr.json (or .zarray) is damaged; write to a new path, or pass its path "
                                 "with overwrite=True to replace it")
        _refuse_unwritable(out.store)
        out = absolute(out)
        return OutputSpec(out, tuple(shape), dtype, overwrite, array=out)
    if isinstance(out, Store):
        if out.read_only:
            raise PermissionError(f"out store {out} is read-only")
        _refuse_unwritable(out)
        out = _real_folder(absolute(out), overwrite)
        if _exists(out):
            if not overwrite:
                raise FileExistsError(f"out {out} already holds Zarr data; pass overwrite=True to replace it")
        if overwrite:
            _check_replaceable(out, str(out))
        return OutputSpec(out, tuple(shape), dtype, overwrite)
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a path, URL, zarr store or zarr.Array, not {type(out).__name__}")
    target = os.fspath(out)
    local = local_path(target)
    if local is None:
        check_protocol(target, "out", storage_options)
        where = locate(target)
        if where is not None and where.process_local:
            _refuse_memory()
        check_remote_parent(target, storage_options, "out")
        if not overwrite and _exists(target, storage_options):
            raise FileExistsError(f"out {target!r} already holds Zarr data; pass overwrite=True to replace it")
        if overwrite:
            from zarr.storage import FsspecStore
            _check_replaceable(FsspecStore.from_url(target, storage_options=storage_options), repr(target))
        return OutputSpec(target, tuple(shape), dtype, overwrite, storage_options=storage_options)
    if os.path.islink(local) and not os.path.exists(local):
        # zarr would fail to create a folder there, once a cluster had started
        raise FileExistsError(f"out {target!r} is a symbolic link to {os.readlink(local)!r}, which does not exist; "
                              "remove the link, or create the folder it points to")
    if os.path.exists(local):
        if not overwrite:
            raise FileExistsError(f"out {target!r} already exists; pass overwrite=True to replace it")
        if not os.path.isdir(local):
            raise FileExistsError(f"out {target!r} is a file, not a Zarr store; remove it first")
        names = os.listdir(local)
        if names and not any(n in names for n in ZARR_METADATA):
            raise FileExistsError(_not_zarr(repr(target)))
        refuse_foreign(_folder_entries(local), repr(target), _file_reader(local))
        if os.path.islink(local):
            # Replacing deletes the folder and creates it again: that of the link's target, whose Zarr data
            # is replaced there (checked above: nothing else is in it), the link itself kept as it is.
            local = os.path.realpath(local)
    parent = local
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise NotADirectoryError(f"out {target!r} cannot be created: {parent} is a file, not a folder")
    _check_name_lengths(local, parent, target)
    if not os.access(parent, os.W_OK) or (os.path.exists(local) and not os.access(local, os.W_OK)):
        raise PermissionError(f"out {target!r} is not writable ({parent} does not allow writing)")
    return OutputSpec(local, tuple(shape), dtype, overwrite)


def _real_folder(store, overwrite: bool):
    """A local store whose folder is a symbolic link: refused dangling; for ``overwrite``, the store of its target.

    Replacing deletes the store's folder and creates it again (zarr); through
    a link that deletes what is behind it and then fails on the link.  Over
    the target instead, the Zarr data there is replaced (the rest checked by
    :func:`_check_replaceable`) and the link kept.
    """
    from zarr.storage import LocalStore

    if not isinstance(store, LocalStore) or not os.path.islink(store.root):
        return store
    root = str(store.root)
    if not os.path.exists(root):
        raise FileExistsError(f"out {root!r} is a symbolic link to {os.readlink(root)!r}, which does not exist; "
                              "remove the link, or create the folder it points to")
    return LocalStore(os.path.realpath(root), read_only=store.read_only) if overwrite else store


def _check_name_lengths(local: str, parent: str, target: str) -> None:
    """Refuse a path that the file system cannot hold (ENAMETOOLONG), before zarr tries to create it."""
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
        path_max = os.pathconf(parent, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):   # no limits to ask for (not POSIX): zarr finds out
        return
    for name in os.path.relpath(local, parent).split(os.sep):
        if name_max and len(os.fsencode(name)) > name_max:
            raise ValueError(f"out {target!r} cannot be created: its name {name[:40]!r}... is "
                             f"{len(os.fsencode(name))} bytes long, more than the {name_max} that the file system "
                             f"of {parent} allows for one name; give a shorter name")
    # the chunk keys and dgemm's records go below it: room for their few dozen bytes
    if path_max and len(os.fsencode(local)) + 64 > path_max:
        raise ValueError(f"out {target!r} cannot be created: its path is {len(os.fsencode(local))} bytes long, "
                         f"too long for the file system's {path_max} with the chunk files below it; "
                         "give a shorter path")


def _not_zarr(name: str) -> str:
    return (f"out {name} holds files but no Zarr array or group (no {', '.join(ZARR_METADATA)} at its top); "
            "overwrite=True replaces only Zarr data, never other files: write the product to a new path, or "
            "remove what is there yourself")


def check_replaceable(target, storage_options=None) -> None:
    """Refuse to replace ``target`` (a checked output's path, URL or store) if it holds anything of the user's.

    :func:`check_output` checks this before any work; the run checks again
    just before it deletes anything (:meth:`~dgemm.storage.output_run.OutputRun.open`),
    since a cluster may take a while to start, and a file saved there
    meanwhile would go with the rest.

    Raises
    ------
    FileExistsError
        It holds files (or keys) that neither Zarr nor dgemm wrote.
    """
    from zarr.abc.store import Store

    if isinstance(target, Store):
        _check_replaceable(target, str(target))
        return
    local = local_path(target)
    if local is None:
        from zarr.storage import FsspecStore
        _check_replaceable(FsspecStore.from_url(target, storage_options=storage_options), repr(target))
    elif os.path.isdir(local):
        refuse_foreign(_folder_entries(local), repr(target), _file_reader(local))


def _check_replaceable(store, name: str) -> None:
    """Refuse to overwrite a store that holds anything but Zarr data (zarr would delete all of it)."""
    from zarr.core.sync import sync

    from dgemm.storage.locations import local_folder

    async def holds_other_files() -> bool:
        for key in ZARR_METADATA:
            if await store.exists(key):
                return False
        async for _ in store.list_dir(""):
            return True
        return False

    async def every_key() -> list[str]:
        return [k async for k in store.list_prefix("")]

    try:
        other = sync(holds_other_files())
    except (FileNotFoundError, NotADirectoryError):
        return
    if other:
        raise FileExistsError(_not_zarr(name))
    folder = local_folder(store)
    if folder is not None:   # the folder itself: its links and empty folders too, which a store does not list
        entries = _folder_entries(folder) if os.path.isdir(folder) else []
        refuse_foreign(entries, name, _file_reader(folder))
        return
    elif getattr(store, "supports_listing", True):
        try:
            entries = sync(every_key())
        except (FileNotFoundError, NotADirectoryError):
            return
    else:   # a store that cannot list: only its metadata keys can be told apart; zarr deletes nothing it cannot see
        return
    refuse_foreign(entries, name, lambda key: _store_get(store, key))


# Names Zarr gives a node's metadata (zarr.json in v3; .zarray/.zgroup/.zattrs in v2).
_METADATA_NAMES = {"zarr.json", ".zarray", ".zgroup", ".zattrs"}
# A folder that dgemm set aside to delete in the background (dgemm.storage.keys.set_aside), left by a crash.
_DISCARDED = re.compile(r"\..+\.dgemm-discarded-[0-9a-f]{32}")
# An empty folder that only chunk keys go into ("c", "c/3", "3").
_CHUNK_FOLDER = re.compile(r"(c|\d+)([/.]\d+)*")
# The temporary file of a chunk whose writer was killed mid-write (a worker SIGKILLed): dgemm's writes
# "<key>.<32 hex>.partial" (dgemm.storage.chunks), zarr's local store "<key less its last .suffix>.<hex>.partial".
_PARTIAL = re.compile(r"(.+)\.[0-9a-f]{32}\.partial")
_SHOWN = 5   # foreign files named in the message; the rest are counted


def _folder_entries(folder: str) -> list[str]:
    """Everything under a local ``folder``, as keys (``a/b``): its files, links, and empty folders (``a/``).

    Links are not followed (deleting one deletes the link only), but each
    is listed: dgemm never writes one.
    """
    out = []
    for top, dirs, files in os.walk(folder):
        rel = os.path.relpath(top, folder)
        pre = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for d in dirs:
            if os.path.islink(os.path.join(top, d)):
                out.append(pre + d)
        out.extend(pre + f for f in files)
        if not dirs and not files and pre:
            out.append(pre)
    return out


def _store_get(store, key: str) -> bytes | None:
    from dgemm.storage import keys
    return keys.get(store, key)


def _file_reader(folder: str):
    """``read(key)`` of a local folder: the bytes of its file ``key``, None when there is none."""
    def read(key: str) -> bytes | None:
        try:
            with open(os.path.join(folder, *key.split("/")), "rb") as f:
                return f.read()
        except OSError:
            return None
    return read


def foreign_entries(entries: list[str], read) -> list[str]:
    """Those of ``entries`` (keys under an output, ``a/b``; a folder ends in ``/``) that neither Zarr nor dgemm wrote.

    Zarr's and dgemm's are a node's metadata (a folder with ``zarr.json``,
    ``.zarray`` or ``.zgroup`` is a node), the chunk keys of an array node
    (by its chunk key encoding and number of dimensions), dgemm's records
    under a node's ``.dgemm/``, folders dgemm set aside to delete, and the
    temporary file of a chunk whose writer was killed mid-write.
    ``read(key)`` gives a metadata key's bytes (None: no such key).  Anything else is the user's: a notes
    file, a folder of pictures, a file in a chunk folder, a symbolic link.
    """
    import json

    nodes: dict[str, Any] = {}
    for e in entries:
        head, _, name = e.rpartition("/")
        if name in ZARR_METADATA:
            nodes.setdefault(head, None)
            raw = read(e)
            if name != ".zgroup" and raw is not None:
                try:
                    meta = json.loads(raw)
                except ValueError:   # unreadable metadata: its node's chunks cannot be told apart
                    continue
                nodes[head] = _chunk_key_pattern(meta, name)
    foreign = []
    for e in entries:
        parts = e.rstrip("/").split("/")
        # the deepest node holding e
        for depth in range(len(parts) - (0 if e.endswith("/") else 1), -1, -1):
            node = "/".join(parts[:depth])
            if node in nodes:
                break
        else:
            foreign.append(e)
            continue
        rest = parts[depth:]
        if e.endswith("/") and not rest:
            continue   # the node's own folder, empty
        if len(rest) == 1 and rest[0] in _METADATA_NAMES:
            continue
        if rest[0] == ".dgemm" or _DISCARDED.fullmatch(rest[0]):
            continue
        pattern = nodes[node]
        key = "/".join(rest)
        if pattern is not None and pattern.fullmatch(key):
            continue
        half = _PARTIAL.fullmatch(key)
        if pattern is not None and half and (pattern.fullmatch(half[1]) or pattern.fullmatch(half[1] + ".0")):
            continue   # a chunk's temporary file, left by a writer killed mid-write: replaced with the rest
        if pattern is not None and e.endswith("/") and _CHUNK_FOLDER.fullmatch(key):
            continue   # a chunk folder left empty (its chunks deleted)
        foreign.append(e)
    return foreign


def _chunk_key_pattern(meta: dict, name: str):
    """The regular expression of an array node's chunk keys, from its metadata; None for a group."""
    shape = meta.get("shape")
    if not isinstance(shape, list):
        return None
    digits = [r"\d+"] * max(len(shape), 1)
    if name == ".zarray":
        sep = re.escape(meta.get("dimension_separator") or ".")
        return re.compile(sep.join(digits))
    encoding = meta.get("chunk_key_encoding") or {}
    config = encoding.get("configuration") or {}
    if encoding.get("name") == "v2":
        return re.compile(re.escape(config.get("separator", ".")).join(digits))
    sep = re.escape(config.get("separator", "/"))
    return re.compile("c" + "".join(sep + d for d in digits[:len(shape)]))


def refuse_foreign(entries: list[str], name: str, read) -> None:
    """Refuse to replace an output holding anything that neither Zarr nor dgemm wrote; name a few, and how many.

    Raises
    ------
    FileExistsError
        Something of the user's is there: ``overwrite=True`` would delete it with the Zarr data.
    """
    foreign = foreign_entries(entries, read)
    if foreign:
        shown = ", ".join(repr(f) for f in sorted(foreign)[:_SHOWN])
        more = f" and {len(foreign) - _SHOWN} more" if len(foreign) > _SHOWN else ""
        raise FileExistsError(
            f"out {name} holds {len(foreign)} file(s) or folder(s) that neither Zarr nor dgemm wrote ({shown}"
            f"{more}); overwrite=True replaces only Zarr data, never other files: move them out, or write the "
            "product to a new path")


def output_codecs(compressors, shape: tuple[int, ...], dtype: np.dtype, zarr_format: int | None = None) -> list:
    """The compressors a new ``shape``/``dtype`` output would get, as plain data; refuses invalid ones.

    Zarr builds its codec pipeline for a one-element array of that dtype in
    memory and encodes one chunk with it, so a bad value fails here, before
    any work, and nothing of the user's is written.
    """
    import zarr
    from zarr.storage import MemoryStore

    ones = tuple(1 for _ in shape)
    try:
        probe = zarr.create_array(store=MemoryStore(), shape=ones, chunks=ones, dtype=dtype,
                                  compressors=compressors, fill_value=0, zarr_format=zarr_format or 3)
        probe[...] = 1
    except Exception as e:
        raise ValueError(f"compressors={compressors!r} cannot compress a {np.dtype(dtype).name} Zarr "
                         f"v{zarr_format or 3} array "
                         f"({type(e).__name__}: {e}); give zarr codecs such as zarr.codecs.ZstdCodec(level=3) "
                         "or numcodecs.zarr3.Zlib(), a list of them, None (no compression) or \"auto\"") from None
    return codec_configs(probe.compressors)


def codec_configs(codecs) -> list:
    """Codecs as comparable plain data (their Zarr metadata)."""
    out = []
    for c in codecs or ():
        to_dict = getattr(c, "to_dict", None) or getattr(c, "get_config", None)
        out.append(to_dict() if to_dict is not None else repr(c))
    return out


def _name(out) -> str:
    return repr(os.fspath(out)) if isinstance(out, (str, os.PathLike)) else str(getattr(out, "store_path", out))


def _refuse_memory() -> None:
    raise ValueError("out is an in-memory Zarr store, which worker processes cannot write to; "
                     "give a path or URL, or use out=None for a lazy dask array")


def _refuse_unwritable(store) -> None:
    """Refuse stores that the workers cannot write: this process's memory, a zip file."""
    from zarr.storage import ZipStore

    inner = store
    while hasattr(inner, "_store"):   # a WrapperStore (LoggingStore...) writes where its store does
        inner = inner._store
    if isinstance(inner, ZipStore):
        raise ValueError("out is a ZipStore: dgemm's workers write out's blocks at the same time, from "
                         "several processes, and a zip file cannot be written concurrently (it would be left "
                         "corrupt); write to a folder or an object store, and zip that afterwards if you need "
                         "a zip")
    if locate(inner).process_local:
        _refuse_memory()


def _exists(target, storage_options=None) -> bool:
    """Whether a URL or store holds Zarr data (an array or a group) at its root."""
    try:
        return open_existing(target, storage_options) is not None
    except NotAnArrayError:
        return True


class NotAnArrayError(ValueError):
    """Something is where an output would be, but no Zarr array: the message is what opening it raised."""


def open_existing(out, storage_options=None, *, mode: str = "r"):
    """The Zarr array already at ``out``, or None where there is nothing.

    dgemm's one way to open an output that may be there already: to check a
    new one (:func:`check_output`), to resume one, or to replace one
    (:mod:`dgemm.storage.output_run`).  *Nothing* is a local path that does
    not exist, a URL or store with no Zarr array or group at its root (or
    one that cannot be reached), or an ``out`` of a type no output has
    (:func:`check_output` says what is wrong with it).  Relative paths and
    store roots are made absolute first.

    Parameters
    ----------
    out : str, os.PathLike, zarr store or zarr.Array
        An array is returned as it is.
    storage_options : dict, optional
        Of a URL's filesystem; ignored for anything else.
    mode : str
        Zarr's access mode: ``"r+"`` to write into the array.

    Returns
    -------
    zarr.Array or None

    Raises
    ------
    NotAnArrayError
        Something is there that is no array: a Zarr group, or a local
        folder or file that Zarr cannot open.
    """
    import zarr
    from zarr.abc.store import Store

    if is_zarr_array(out):
        return out
    if not isinstance(out, (str, os.PathLike, Store)):
        return None
    local = local_path(out) if isinstance(out, (str, os.PathLike)) else None
    if local is not None and not os.path.exists(local):
        return None
    is_remote = isinstance(out, (str, os.PathLike)) and local is None
    try:
        node = zarr.open(absolute(out), mode=mode, storage_options=storage_options if is_remote else None)
    except Exception as e:
        if local is None:   # no Zarr node at a URL or in a store: nothing there
            return None
        raise NotAnArrayError(f"{type(e).__name__}: {e}") from None
    if not isinstance(node, zarr.Array):
        raise NotAnArrayError(f"a Zarr group is there ({node.store_path})")
    return node


def create_output(spec: OutputSpec, chunks: tuple[int, ...], meta: dict, over=None):
    """Create the output array (metadata only); marked incomplete until the run ends.

    ``chunks`` are the user's where the spec's layout has them (the
    caller's otherwise); the layout's other options (shards, format, dims,
    attributes) are given to zarr as the user gave them.  ``over`` is the
    old output that dgemm's run has emptied to replace it (a writable
    ``zarr.Array``): the new metadata is written over the old there
    (:func:`_write_over`), never by zarr's ``overwrite``, which deletes every
    key of the array, the lease of the run that replaces it with them.
    """
    import zarr

    attrs = {COMPLETE_ATTR: {"complete": False, **meta}}
    if spec.array is not None:
        spec.array.attrs.update(attrs)
        return spec.array
    layout = spec.layout or Layout()
    kwargs = dict(shape=spec.shape, chunks=layout.chunks or chunks, dtype=spec.dtype, fill_value=0,
                  attributes={**(layout.attributes or {}), **attrs}, compressors=spec.compressors,
                  config={"write_empty_chunks": True}, **layout.create_kwargs())
    if over is not None:
        return _write_over(over, kwargs)
    return zarr.create_array(store=spec.target, storage_options=spec.storage_options if is_url(spec.target) else None,
                             overwrite=spec.overwrite, **kwargs)


def _write_over(old, kwargs: dict):
    """Make ``old`` (emptied of its chunks and records) the array ``kwargs`` describe, writing its metadata over.

    Zarr makes the metadata on an array in memory, exactly as it would in
    the store; each metadata document is then written over the old one (a
    reader finds the old array, marked incomplete, or the new one, never
    nothing), and the old format's that the new one has not (``.zarray``
    after a v3 ``zarr.json``) are deleted.  Every other key stays: the
    lease of the run replacing ``old`` first of all.
    """
    import zarr
    from zarr.storage import MemoryStore

    from dgemm.storage import keys

    draft = zarr.create_array(store=MemoryStore(), **kwargs)
    node = old.path.strip("/")
    docs = {name: keys.get(draft.store, name) for name in sorted(_METADATA_NAMES)}
    for name, raw in docs.items():
        if raw is not None:
            keys.put(old.store, f"{node}/{name}" if node else name, raw)
    for name, raw in docs.items():
        if raw is None:
            keys.delete(old.store, f"{node}/{name}" if node else name)
    return zarr.open_array(store=old.store, path=node, mode="r+", config=kwargs["config"])


def store_block(array, rows: tuple[int, int], cols: tuple[int, int], block: np.ndarray, drop: tuple = (),
                threads: int = 1):
    """Write one output block (whole chunks) into ``array``.

    ``drop`` names the axes of the 2-D block that the output does not have
    (matmul with 1-D operands, as numpy squeezes them).  Idempotent: writing
    the same block again (a task re-run after a worker died) stores the same
    chunks, each replaced whole.  ``threads``: encode its chunks on this
    many threads (:func:`dgemm.storage.chunks.write_region`).
    """
    from dgemm.storage.chunks import write_region

    region = tuple(slice(*r) for ax, r in enumerate((rows, cols)) if ax not in drop)
    data = np.squeeze(block, axis=drop) if drop else block
    if not write_region(array, region, data, threads=threads):    # encoded and written by dgemm where it can, else by zarr
        array[region] = data

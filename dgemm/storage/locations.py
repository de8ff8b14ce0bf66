"""Where an array lives: one :class:`Location` for every way a user names a Zarr array.

A path (relative or absolute, through a symlink or not), a ``file://`` URL,
an ``s3://`` or other fsspec URL, a :class:`zarr.Array`, a Zarr store, or a
dask array read from Zarr: :func:`locate` and :func:`sources` reduce each to
the place its bytes are, so that "out is the input a" or "out's folder
holds an input" is decided on where things are, never on how they were
spelt.

Workers run in their own working folders, often on other hosts, so what
reaches them must not depend on this process's: :func:`absolute` re-opens
what the user passed with every local path made absolute, as
:func:`dask.array.from_zarr` does.  :func:`check_readable` refuses, before
any work, what no worker can reach: stores that exist only in this process
(``zarr.storage.MemoryStore``, fsspec's ``memory://``) and URLs whose
protocol fsspec does not know or cannot load.

The functions that open something (:func:`open_array`, :func:`absolute`)
pass ``storage_options`` (the options of the filesystem behind a URL, as
:func:`dask.array.from_zarr` takes them) on; the others take it so that a
caller can hand one set to all of them, and ignore it: a location is a
protocol, a bucket and a path, which no option changes.  (An endpoint is not
part of it: the same bucket and path on two endpoints count as one array,
which refuses some valid calls and lets no wrong one through.)
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

LOCAL = "file"                      # the protocol of this host's filesystem, however it was spelt
_LOCAL_PROTOCOLS = ("file", "local")
_ZARR_MEMORY = "zarr-memory"        # a zarr.storage.MemoryStore: a dict in this process
PROCESS_LOCAL = (_ZARR_MEMORY, "memory")
_CACHES = ("simplecache", "filecache", "blockcache", "cached")   # fsspec's caches, in front of another filesystem
ZARR_METADATA = ("zarr.json", ".zarray", ".zgroup")


@dataclass(frozen=True)
class Location:
    """Where an array (or a folder, prefix or store) is, in canonical form.

    ``protocol`` is ``"file"`` for this host's filesystem, else the fsspec
    protocol's first name (``"s3"`` for ``s3a://``, ``"gs"`` for ``gcs://``,
    ``"memory"``), or ``"zarr-memory"`` for a :class:`zarr.storage.MemoryStore`.
    ``path`` is, for ``"file"``, the real path (symlinks resolved) joined
    with the array's path inside its store; for other protocols the path
    fsspec gives (``bucket/key`` for object stores), without a trailing
    slash; for a MemoryStore its identity in this process and the path
    inside it.  Two locations are the same array exactly when they are
    equal.

    >>> Location("s3", "bucket/g.zarr").contains(Location("s3", "bucket/g.zarr/a"))
    True
    >>> Location("file", "/data/a.zarr").contains(Location("file", "/data/a.zarr2"))
    False
    """

    protocol: str
    path: str

    @property
    def is_local(self) -> bool:
        """On this host's filesystem (a folder or a zip file)."""
        return self.protocol == LOCAL

    @property
    def process_local(self) -> bool:
        """Held in this process's memory, where no worker (another process) can read or write it."""
        return self.protocol in PROCESS_LOCAL

    @property
    def url(self) -> str:
        """A URL-like spelling for messages and run fingerprints (``file:///abs/a.zarr``, ``s3://b/a.zarr``)."""
        if self.protocol == _ZARR_MEMORY:
            return f"memory-store:{self.path}"
        if self.protocol == "memory":
            return f"memory://{self.path.lstrip('/')}"
        return f"{self.protocol}://{self.path}"

    def __str__(self) -> str:
        return self.url

    def contains(self, other: Location) -> bool:
        """Whether ``other`` is this location or lies inside it (this folder or prefix holds it)."""
        if other.protocol != self.protocol:
            return False
        if other.path == self.path:
            return True
        return other.path.startswith(self.path.rstrip("/") + "/")


# -- spellings ------------------------------------------------------------------
def split_url(s: str) -> tuple[str | None, str]:
    """``(protocol, rest)`` of the storage part of ``s``; protocol None for a plain path.

    In an fsspec chain (``simplecache::s3://b/k``) the last link is where the
    bytes are.

    >>> split_url("s3://bucket/a.zarr"), split_url("a.zarr"), split_url("simplecache::gs://b/k")
    (('s3', 'bucket/a.zarr'), (None, 'a.zarr'), ('gs', 'b/k'))
    """
    last = s.rsplit("::", 1)[-1]
    protocol, sep, rest = last.partition("://")
    if not sep:
        return None, last
    return protocol.lower(), rest


def local_path(x, storage_options=None) -> str | None:
    """The absolute local path that a path or ``file://`` URL names; None for any other URL or object.

    Relative paths are taken from this process's working folder, where the
    user wrote them; symlinks are kept (only comparisons resolve them).

    >>> local_path("file:///tmp/x.zarr"), local_path("s3://b/x.zarr")
    ('/tmp/x.zarr', None)
    """
    if not isinstance(x, (str, os.PathLike)):
        return None
    s = os.fsdecode(os.fspath(x))
    if "::" in s:  # a chain (a cache in front of a filesystem) is fsspec's to open
        return None
    protocol, rest = split_url(s)
    if protocol is None or protocol in _LOCAL_PROTOCOLS:
        return os.path.abspath(rest)
    return None


def _filesystem_class(protocol: str):
    """fsspec's filesystem class for ``protocol``, or None when unknown or not installed."""
    import fsspec
    try:
        return fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError):
        return None


def _canonical_protocol(protocol: str, cls=None) -> str:
    names = getattr(cls, "protocol", None) if cls is not None else None
    if isinstance(names, (tuple, list)) and names:
        names = names[0]
    name = names if isinstance(names, str) else protocol
    return LOCAL if name in _LOCAL_PROTOCOLS else name


def _first(protocol) -> str:
    return protocol[0] if isinstance(protocol, (tuple, list)) else protocol


def _join(root: str, sub: str) -> str:
    sub = sub.strip("/")
    if not sub:
        return root
    return f"{root.rstrip('/')}/{sub}" if root.rstrip("/") else f"/{sub}"


def _real(path) -> str:
    return os.path.realpath(os.path.abspath(os.fspath(path)))


def _url_location(s: str) -> Location:
    local = local_path(s)
    if local is not None:
        return Location(LOCAL, _real(local))
    last = s.rsplit("::", 1)[-1]
    protocol, rest = split_url(last)
    cls = _filesystem_class(protocol)
    name = _canonical_protocol(protocol, cls)
    path = rest
    if cls is not None:
        try:
            path = cls._strip_protocol(last)
        except Exception:  # normalising is best effort: the spelling itself still identifies it
            path = rest
    if "://" in path:   # http(s) keeps its scheme in its paths (and one class serves both)
        name, path = path.split("://", 1)
    return Location(name, path.rstrip("/") or "/")


def _store_location(store, path: str) -> Location:
    from zarr.storage import FsspecStore, LocalStore, MemoryStore, WrapperStore, ZipStore

    if isinstance(store, WrapperStore):
        return _store_location(store._store, path)
    if isinstance(store, LocalStore):
        return Location(LOCAL, _join(_real(store.root), path))
    if isinstance(store, ZipStore):
        return Location(LOCAL, _join(_real(store.path), path))
    if isinstance(store, MemoryStore):
        return Location(_ZARR_MEMORY, _join(str(id(store._store_dict)), path))
    if isinstance(store, FsspecStore):
        fs = getattr(store.fs, "sync_fs", store.fs)       # zarr wraps a synchronous filesystem
        while _canonical_protocol(_first(fs.protocol)) in _CACHES and hasattr(fs, "fs"):
            fs = fs.fs                                      # a cache in front: the bytes are behind it
        name = _canonical_protocol(_first(fs.protocol), type(fs))
        if name == LOCAL:
            return Location(LOCAL, _join(_real(store.path), path))
        return Location(name, _join(store.path.rstrip("/") or "/", path))
    # A store of a kind not known here: the same only as itself.
    return Location(f"store-{type(store).__name__}", _join(str(id(store)), path))


def local_folder(store) -> str | None:
    """The folder of this host whose files are ``store``'s keys (key ``a/b``: file ``<folder>/a/b``), or None.

    A :class:`~zarr.storage.LocalStore`, or an fsspec store on the local
    filesystem (``file://``), through zarr's wrapper stores.  None for
    anything else: remote and in-memory stores, a zip file, a cache in
    front of a filesystem (its reads go through the cache).
    """
    from zarr.storage import FsspecStore, LocalStore, WrapperStore

    if isinstance(store, WrapperStore):
        return local_folder(store._store)
    if isinstance(store, LocalStore):
        return str(store.root)
    if isinstance(store, FsspecStore):
        fs = getattr(store.fs, "sync_fs", store.fs)       # zarr wraps a synchronous filesystem
        if _canonical_protocol(_first(fs.protocol), type(fs)) == LOCAL:
            return str(store.path)
    return None


def locate(x, storage_options=None) -> Location | None:
    """Where ``x`` is: a path, URL, :class:`zarr.Array` or Zarr store; None for anything else.

    Nothing is opened or read: a path or URL need not exist yet (an output).
    A dask array can read several arrays: see :func:`sources`.

    >>> locate("s3a://bucket/x.zarr/")
    Location(protocol='s3', path='bucket/x.zarr')
    >>> locate(3) is None
    True
    """
    import zarr
    from zarr.abc.store import Store

    if isinstance(x, zarr.Array):
        return _store_location(x.store, x.path)
    if isinstance(x, Store):
        return _store_location(x, "")
    if isinstance(x, (str, os.PathLike)):
        return _url_location(os.fsdecode(os.fspath(x)))
    return None


def location(x, storage_options=None) -> str | None:
    """:func:`locate` as a string (``file:///abs/a.zarr``, ``s3://bucket/a.zarr``), None where there is none.

    >>> location("/tmp/x.zarr/")
    'file:///tmp/x.zarr'
    """
    where = locate(x, storage_options)
    return where.url if where is not None else None


def same(x, y, storage_options=None) -> bool:
    """Whether ``x`` and ``y`` name the same array (or folder), however each is spelt.

    >>> same("/tmp/a.zarr", "file:///tmp/a.zarr/"), same("s3://b/a.zarr", "/tmp/a.zarr")
    (True, False)
    """
    wx, wy = locate(x, storage_options), locate(y, storage_options)
    return wx is not None and wx == wy


# -- dask arrays ------------------------------------------------------------------
def is_dask_array(x) -> bool:
    """Whether ``x`` is a dask array, without importing dask.array (no dask array exists before it is imported).

    ``import dask.array`` costs 0.3–1 s (more where it finds pandas): a
    script's first call with paths for operands does not pay for it.
    """
    import sys

    da = sys.modules.get("dask.array")
    return da is not None and isinstance(x, da.Array)


_is_dask_array = is_dask_array


# id(graph) -> (weak reference to the graph, its Zarr arrays): one call's checks look at an operand several
# times.  Not by name: an array made absolute keeps its name (and its keys) with a new graph.
_FOUND: dict = {}

# How many wrappers deep an array in a graph is looked for (xarray's open_zarr: four).
_WRAPPER_DEPTH = 8


def zarr_arrays(x) -> list:
    """The :class:`zarr.Array` objects that the dask array ``x`` reads (those in its graph).

    Looks where dask keeps the arrays it reads (``from_array``, ``from_zarr``,
    ``map_blocks`` arguments): blockwise arguments, and the values of
    materialised layers and their tasks' arguments, one level deep (a graph
    can have 10⁵ tasks).  Other layers are not materialised to be searched.
    """
    import zarr
    from dask._task_spec import DataNode, Task
    from dask.blockwise import Blockwise
    from dask.highlevelgraph import MaterializedLayer

    graph = x.__dask_graph__()
    ref, arrays = _FOUND.get(id(graph), (None, ()))
    if ref is not None and ref() is graph:
        return list(arrays)
    found: dict = {}

    def literal(value) -> None:
        if isinstance(value, DataNode):
            value = value.value
        # Array wrappers hold the array they wrap as .array or ._array (xarray's lazily indexed
        # adapters around its ZarrArrayWrapper, several deep): follow them to the zarr.Array.
        for _ in range(_WRAPPER_DEPTH):
            if isinstance(value, zarr.Array):
                found.setdefault(id(value), value)
                return
            inner = getattr(value, "array", None)
            if inner is None or inner is value:
                inner = getattr(value, "_array", None)
            if inner is None or inner is value:
                return
            value = inner

    for layer in graph.layers.values():
        if isinstance(layer, Blockwise):   # its arguments, without materialising every task
            for value in (*layer.task.args, *(dep for dep, _ in layer.indices)):
                literal(value)
        elif isinstance(layer, MaterializedLayer):
            for value in layer.mapping.values():
                if isinstance(value, Task):
                    for arg in value.args:
                        literal(arg)
                else:
                    literal(value)
    if len(_FOUND) > 16:
        _FOUND.clear()
    _FOUND[id(graph)] = (weakref.ref(graph), tuple(found.values()))
    return list(found.values())


def plain_zarr(x):
    """The :class:`zarr.Array` that the dask array ``x`` is, read whole and unchanged; None for anything else.

    ``da.from_zarr(z)`` and ``da.from_array(z)`` (any chunks) are ``z``
    itself; anything computed from them (a cast, a slice, a sum) is not.
    """
    from dask.array.core import getter, getter_inline, getter_nofancy
    from dask.blockwise import Blockwise

    if not _is_dask_array(x):
        return None
    layers = x.__dask_graph__().layers
    if set(layers) - {x.name, f"original-{x.name}"} or x.name not in layers:
        return None
    arrays = zarr_arrays(x)
    if len(arrays) != 1:
        return None
    z = arrays[0]
    if tuple(z.shape) != tuple(x.shape) or z.dtype != x.dtype:
        return None
    layer = layers[x.name]
    tasks = [layer.task] if isinstance(layer, Blockwise) else list(layer.values())
    if not all(getattr(t, "func", None) in (getter, getter_inline, getter_nofancy) for t in tasks):
        return None
    return z


def sources(x, storage_options=None) -> list[Location]:
    """Every place the operand ``x`` reads: its own location, or those of the Zarr arrays in a dask graph."""
    if _is_dask_array(x):
        return [locate(z) for z in zarr_arrays(x)]
    where = locate(x, storage_options)
    return [] if where is None else [where]


# -- making things absolute ---------------------------------------------------------
def _absolute_store(store):
    """``store`` itself, or one of the same mode over the same files with nothing relative.

    A local store with a relative path is re-created with the absolute one;
    an ``FsspecStore`` over the local filesystem becomes a ``LocalStore``,
    which creates the folders it writes into (fsspec's local filesystem does
    not, so an output through it fails on its first new folder).
    """
    from zarr.storage import FsspecStore, LocalStore, ZipStore

    if isinstance(store, LocalStore) and not os.path.isabs(store.root):
        return LocalStore(os.path.abspath(store.root), read_only=store.read_only)
    if isinstance(store, ZipStore) and not os.path.isabs(store.path):
        return ZipStore(os.path.abspath(store.path), mode=store._zmode, read_only=store.read_only,
                        compression=store.compression, allowZip64=store.allowZip64)
    if isinstance(store, FsspecStore) and _store_location(store, "").is_local:
        return LocalStore(os.path.abspath(store.path), read_only=store.read_only)
    return store


def _with_store(array, store):
    """``array`` over ``store`` (the same array, elsewhere spelt): metadata and settings kept, nothing read."""
    import zarr
    from zarr.core.array import AsyncArray
    from zarr.storage import StorePath

    aa = array._async_array
    return zarr.Array(AsyncArray(metadata=aa.metadata, store_path=StorePath(store, aa.store_path.path),
                                 config=aa.config))


def _relative(z) -> bool:
    return _absolute_store(z.store) is not z.store


def _absolute_graph(x):
    """The dask array ``x`` with each Zarr array of a relative local store in its graph made absolute.

    The graph keeps its keys; only the array objects it holds (a layer's
    value, or a blockwise argument) are replaced.
    """
    import dask.array as da
    from dask._task_spec import DataNode
    from dask.blockwise import Blockwise
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    swaps = {id(z): absolute(z) for z in zarr_arrays(x) if _relative(z)}
    if not swaps:
        return x

    def swap(v):
        if id(v) in swaps:
            return swaps[id(v)]
        if isinstance(v, DataNode) and id(v.value) in swaps:
            return DataNode(v.key, swaps[id(v.value)])
        return v

    graph = x.__dask_graph__()
    layers = {}
    for name, layer in graph.layers.items():
        if isinstance(layer, Blockwise):
            indices = tuple((swap(dep), ind) for dep, ind in layer.indices)
            if any(new is not old for (new, _), (old, _) in zip(indices, layer.indices)):
                layer = Blockwise(layer.output, layer.output_indices, layer.task, indices, layer.numblocks,
                                  concatenate=layer.concatenate, new_axes=layer.new_axes,
                                  output_blocks=layer.output_blocks, annotations=layer.annotations,
                                  io_deps=layer.io_deps)
        elif isinstance(layer, MaterializedLayer):
            mapping = {k: swap(v) for k, v in layer.items()}
            if any(mapping[k] is not v for k, v in layer.items()):
                layer = MaterializedLayer(mapping, annotations=layer.annotations,
                                          collection_annotations=layer.collection_annotations)
        layers[name] = layer
    out = da.Array(HighLevelGraph(layers, graph.dependencies), x.name, x.chunks, meta=x._meta)
    left = [z for z in zarr_arrays(out) if _relative(z)]
    if left:
        raise ValueError(f"a dask array reads the Zarr array {left[0].store} by a path relative to this "
                         "process's working folder, which the workers (in folders of their own) would resolve "
                         "elsewhere, and dgemm cannot make it absolute in this graph; open the array with an "
                         "absolute path (os.path.abspath) before building the dask array")
    return out


def absolute(x, storage_options=None):
    """What the user passed, with nothing in it relative to this process's working folder.

    A local path or ``file://`` URL becomes an absolute path (a string); a
    :class:`zarr.storage.LocalStore` or ``ZipStore`` with a relative root is
    re-created with the absolute one (same mode), an ``FsspecStore`` over the
    local filesystem becomes a ``LocalStore`` of the same files; a
    :class:`zarr.Array` over such a store is the same array over the new
    store; a dask array gets its graph's Zarr arrays so re-created.  Anything
    else (remote URLs and stores, numpy arrays) is returned as it is.

    >>> absolute("file:///tmp/a.zarr"), absolute("s3://b/a.zarr")
    ('/tmp/a.zarr', 's3://b/a.zarr')
    """
    import zarr
    from zarr.abc.store import Store

    if isinstance(x, (str, os.PathLike)):
        local = local_path(x)
        return local if local is not None else os.fsdecode(os.fspath(x))
    if isinstance(x, zarr.Array):
        store = _absolute_store(x.store)
        return x if store is x.store else _with_store(x, store)
    if isinstance(x, Store):
        return _absolute_store(x)
    if _is_dask_array(x):
        return _absolute_graph(x)
    return x


def open_array(x, *, mode: str, storage_options=None):
    """Open a path, URL or store as a :class:`zarr.Array`, with nothing relative left (:func:`absolute`).

    ``storage_options`` go to the filesystem of a URL, never to a local path.
    """
    import zarr

    x = absolute(x)
    is_remote = isinstance(x, str) and local_path(x) is None
    return zarr.open_array(x, mode=mode, storage_options=storage_options if is_remote else None)


# -- what the workers can reach -------------------------------------------------------
def check_protocol(x, what: str, storage_options=None) -> None:
    """Refuse a URL whose protocol fsspec does not know, or whose filesystem package is not installed.

    Each link of a chain is checked.  Anything but a URL passes.
    """
    import fsspec
    from fsspec.registry import known_implementations

    if not isinstance(x, (str, os.PathLike)) or local_path(x) is not None:
        return
    s = os.fsdecode(os.fspath(x))
    for link in s.split("::"):
        protocol, _ = split_url(link)
        if protocol is None or protocol in _LOCAL_PROTOCOLS:
            continue
        try:
            fsspec.get_filesystem_class(protocol)
        except ValueError:
            raise ValueError(f"{what} ({s!r}): fsspec knows no protocol {protocol!r} "
                             "(fsspec.available_protocols() lists those it knows)") from None
        except ImportError as e:
            hint = known_implementations.get(protocol, {}).get("err") or str(e)
            raise ImportError(f"{what} ({s!r}): the {protocol}:// protocol needs a package that is not "
                              f"installed here: {hint}") from None


def describe_process_local(where: Location) -> str:
    """How to name a process-local store in a message."""
    if where.protocol == _ZARR_MEMORY:
        return "an in-memory Zarr store (zarr.storage.MemoryStore)"
    return f"fsspec's in-memory filesystem ({where.url})"


def check_readable(x, what: str, storage_options=None) -> None:
    """Refuse, before any work, an input that the workers cannot read.

    A URL must have a protocol fsspec can load (:func:`check_protocol`).
    A store in this process's memory (a ``MemoryStore``, ``memory://``) is
    empty in every worker, another process, so reading it there would give
    zeros: refused, naming the fix.  A dask array whose graph holds a
    ``MemoryStore`` array is dask's to ship (the store travels with its
    data); one over ``memory://`` is refused like the rest.
    """
    check_protocol(x, what, storage_options)
    places = sources(x, storage_options)
    if _is_dask_array(x):
        places = [p for p in places if p.protocol != _ZARR_MEMORY]
    for where in places:
        if where.process_local:
            raise ValueError(
                f"{what} is stored in {describe_process_local(where)}, which exists only in this process: "
                "dgemm's workers are other processes and would read nothing there. Pass the data itself "
                f"instead (for a Zarr array z: {what}=np.asarray(z[...]), read here and sent with the work) or "
                "write it to a path or URL that the workers reach")

"""A region's stored chunks as compressed frames, for a decoder that is not the host's.

:func:`region` says, from zarr's metadata alone (nothing read), whether a
:class:`~dgemm.storage.blocks.ZarrBlock`'s chunks are each one frame of one
compressor, and where each chunk's elements go in the block;
:meth:`Frames.fetch` reads their bytes as stored, without decoding them.  The
worker hands them to a device decoder (:mod:`dgemm.opencl.codecs`, joined to
this module by :mod:`dgemm.worker.decoding`: storage and opencl know nothing
of each other).

Only the simplest layout is described: an unsharded 2-D array whose chunks
have one bytes-to-bytes codec, a compressor numcodecs knows (Zarr v2's
``compressor`` with no filters, C order; zarr v3's ``bytes`` codec then one
compressor), elements in this machine's byte order.  Everything else gives
None, and the block is read by :mod:`dgemm.storage.chunks` as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dgemm.storage import chunks, source


@dataclass(frozen=True)
class Piece:
    """One stored chunk of a region and where its elements go.

    ``name`` is what errors call it (``chunk (i, j) (store key '...')``, as the
    host reader's errors do).  The chunk decodes to a ``chunk``-shaped array
    (an edge chunk too, as zarr stores it); its rows and columns from
    ``inside`` (a corner and a size) go to the block at ``at``.  ``direct``:
    those are the whole chunk and whole rows of the block, so the decoded
    chunk is the block's bytes from ``offset`` on, as it is.
    """

    key: str                      # relative to the array, as the store is asked
    name: str
    inside: tuple[int, int]       # first row and column of the chunk that the block holds
    at: tuple[int, int]           # where they go in the block
    size: tuple[int, int]         # rows and columns the block takes from the chunk
    direct: bool
    offset: int                   # bytes into the block (C order) where a direct chunk starts


@dataclass(frozen=True)
class Frames:
    """The stored chunks of one region (see :func:`region`)."""

    array: Any
    codec: str                    # numcodecs' codec id: "blosc", "zstd", ...
    config: dict                  # its configuration as zarr's metadata gives it ("cname": "lz4", ...)
    chunk: tuple[int, int]
    dtype: np.dtype               # native byte order
    fill: Any                     # what a chunk never written reads as
    shape: tuple[int, int]        # the region's
    pieces: tuple[Piece, ...]
    steps: tuple = ()             # the host's decoder of these chunks (dgemm.storage.chunks)

    @property
    def chunk_nbytes(self) -> int:
        """Bytes one chunk decodes to (an edge chunk too)."""
        return self.chunk[0] * self.chunk[1] * self.dtype.itemsize

    def fetch_into(self, host, align: int = 16):
        """Each piece's stored bytes packed into ``host`` (uint8), one after another, each start
        ``align``-aligned: an iterator of ``(bytes-like, start)``, ``(None, None)`` for a chunk never
        written, a start of None for bytes past the room left (a copy of their own).  Local files are
        read straight into ``host``.

        Checks first that this process sees the array's store
        (:func:`dgemm.storage.chunks.visible`); read errors are the store's.
        """
        chunks.visible(self.array)
        return source.Source(self.array).fetch_packed([p.key for p in self.pieces], host, align)

    def bound(self) -> int:
        """The pieces' decoded bytes: room for their frames where they compress (the reader's staging
        buffer has this size already); a frame that expanded past the room left is read aside."""
        return len(self.pieces) * self.chunk_nbytes


    def decode_on_host(self, frame, name: str) -> np.ndarray:
        """One chunk's frame decoded here, as the host reader decodes it (counted as decoded on the host):
        for a frame the device decoder leaves to the host."""
        target = np.empty(self.chunk_nbytes, np.uint8)
        got = chunks._decode(self.steps, frame, target, name)
        if got is not target:
            target[...] = got
        return target


def codec_config(array) -> tuple[str, dict] | None:
    """``(codec id, configuration)`` of an array's one compressor; None when it has none or several steps."""
    meta = array.metadata
    if meta.zarr_format == 2:
        comp = meta.compressor
        return None if comp is None else (str(comp.codec_id), dict(comp.get_config()))
    codecs = list(meta.codecs)
    if len(codecs) != 2:
        return None
    d = codecs[1].to_dict()
    name = str(d.get("name", "")).removeprefix("numcodecs.")
    return name, {"id": name, **(d.get("configuration") or {})}


def region(block) -> Frames | None:
    """The stored chunks of a :class:`~dgemm.storage.blocks.ZarrBlock`, or None where this module leaves it
    to :mod:`dgemm.storage.chunks` (see the module's notes)."""
    arr = block.array
    if getattr(block, "expand", None) is not None or getattr(arr, "ndim", None) != 2:
        return None
    try:
        lay = chunks.layout(arr)
    except chunks.Unsupported:
        return None
    if lay.shard is not None or len(lay.steps) != 1 or not isinstance(lay.steps[0], chunks._Numcodec) \
            or not lay.dtype.isnative:
        return None
    found = codec_config(arr)
    if found is None:
        return None
    shape = tuple(int(n) for n in arr.shape)
    rows, cols = block.rows, block.cols
    width, itemsize = cols[1] - cols[0], lay.dtype.itemsize
    reg = (slice(*rows), slice(*cols))
    path = arr.path.strip("/")
    pieces = []
    for idx in ((i, j) for i in range(rows[0] // lay.chunk[0], -(-rows[1] // lay.chunk[0]))
                for j in range(cols[0] // lay.chunk[1], -(-cols[1] // lay.chunk[1]))):
        inside, outs, whole = chunks._cover(idx, lay, shape, reg)
        key = lay.key(idx)
        full = f"{path}/{key}" if path else key
        size = (outs[0].stop - outs[0].start, outs[1].stop - outs[1].start)
        pieces.append(Piece(key, f"chunk {idx} (store key {full!r})", (inside[0].start, inside[1].start),
                            (outs[0].start, outs[1].start), size, whole and size[1] == width,
                            outs[0].start * width * itemsize))
    return Frames(arr, found[0], found[1], tuple(lay.chunk), lay.dtype, lay.fill,
                  (rows[1] - rows[0], cols[1] - cols[0]), tuple(pieces), lay.steps)

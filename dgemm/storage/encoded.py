"""Output chunks encoded elsewhere (on the device) and written here as they are.

:func:`chunks_of` says, from zarr's metadata alone, whether the chunks of an
output block may be encoded as plain zstd frames by someone other than
numcodecs: the output's codec chain is exactly one zstd compressor without a
checksum (zarr v3's ``bytes`` then ``ZstdCodec(checksum=False)``, Zarr v2's
``numcodecs.Zstd`` with no filters, C order), unsharded, elements in this
machine's byte order, 2-D, on a store :func:`dgemm.storage.chunks.write_region`
writes itself (local files, S3 through :mod:`dgemm.storage.remote`), and the
block made of whole chunks (an edge chunk whole up to the array's edge).  It
then lists each chunk's store key and where its elements lie in the block.
A zstd frame is what numcodecs' and zarr's Zstd decode, whatever wrote it, so
the frames of those chunks are the chunk objects.

The worker (:mod:`dgemm.worker.encoding`) encodes them on the device and
hands back an :class:`EncodedBlock`; :func:`write` stores its frames under
their keys as the host writer stores its own chunks (a temporary file moved
into place, or a batch of S3 PUTs), counted as ``write_direct`` /
``write_batched`` (:mod:`dgemm.storage.fastpaths`).  Everything else is
written by :func:`dgemm.storage.outputs.store_block` as before.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from dgemm.storage import chunks, fastpaths, source
from dgemm.storage import threads as threads_mod


@dataclass(frozen=True)
class Chunk:
    """One output chunk of a block: its store key and the block's part of it.

    The chunk is stored ``shape``-sized (an edge chunk too, as zarr stores
    it: what lies outside the array is the fill value); its first ``size``
    rows and columns are the block's, from ``at`` on.
    """

    key: str                      # relative to the array
    at: tuple[int, int]           # first row and column in the block
    size: tuple[int, int]         # rows and columns of the block in it (less than the chunk's at the array's edge)


@dataclass(frozen=True)
class Chunks:
    """The chunks an output block is made of (see :func:`chunks_of`)."""

    array: Any
    rows: tuple[int, int]
    cols: tuple[int, int]
    shape: tuple[int, int]        # the chunk's
    dtype: np.dtype               # native byte order
    fill: Any                     # what the part of an edge chunk outside the array holds
    pieces: tuple[Chunk, ...]

    @property
    def chunk_nbytes(self) -> int:
        """Bytes one chunk holds before encoding (an edge chunk too)."""
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    def contiguous(self, piece: Chunk) -> bool:
        """Whether ``piece``'s bytes are the chunk's, back to back in the block (C order): a whole chunk as
        wide as the block."""
        width = self.cols[1] - self.cols[0]
        return piece.size == self.shape and self.shape[1] == width


@dataclass
class EncodedBlock:
    """An output block as the frames of its chunks, one per :attr:`Chunks.pieces`, back to back in ``data``.

    What a GEMM task hands its store task (:func:`dgemm.worker.tasks.store`)
    in place of the block's values; ``shape`` is the block's.
    """

    chunks: Chunks
    data: np.ndarray              # uint8: the frames, back to back
    sizes: tuple[int, ...]        # each frame's bytes
    encoded: int = 0              # bytes the chunks held before encoding

    @property
    def shape(self) -> tuple[int, int]:
        c = self.chunks
        return (c.rows[1] - c.rows[0], c.cols[1] - c.cols[0])

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def __sizeof__(self) -> int:   # what dask's memory accounting counts
        return self.nbytes + 1024

    def frames(self) -> list:
        """Each chunk's frame (views of ``data``)."""
        view = memoryview(self.data.reshape(-1).view(np.uint8))
        ends = np.cumsum(self.sizes).tolist()
        return [view[e - n:e] for e, n in zip(ends, self.sizes)]


def chunks_of(array, rows: tuple[int, int], cols: tuple[int, int], drop: tuple = ()) -> Chunks | None:
    """The chunks of ``array[rows, cols]`` where each may be written as one plain zstd frame; else None.

    None (the block is encoded and written by :func:`~dgemm.storage.outputs.store_block`
    as before) for every case the module's notes leave out: another codec
    chain, a checksum, sharding, v2 filters or Fortran order, another byte
    order, an output with fewer than two axes (``drop``), a read-only array,
    a store written through zarr, or a block that cuts a chunk.
    """
    if drop or getattr(array, "ndim", None) != 2 or getattr(array, "read_only", True):
        return None
    try:
        lay = chunks.layout(array)
    except chunks.Unsupported:
        return None
    if lay.shard is not None or len(lay.steps) != 1 or not lay.dtype.isnative:
        return None
    step = lay.steps[0]
    if not isinstance(step, chunks._Numcodec) or step.name != "zstd" or getattr(step.codec, "checksum", False):
        return None
    from dgemm.storage import remote

    if source.Source(array).root is None and not remote.handles(array.store):
        return None
    shape = tuple(int(n) for n in array.shape)
    rows, cols = (int(rows[0]), int(rows[1])), (int(cols[0]), int(cols[1]))
    region = (slice(*rows), slice(*cols))
    pieces = []
    for idx in itertools.product(*[range(s.start // c, -(-s.stop // c)) for s, c in zip(region, lay.chunk)]):
        for i, c, n, s in zip(idx, lay.chunk, shape, region):
            if s.start > i * c or s.stop < min((i + 1) * c, n):
                return None     # a part of a chunk: the host path (zarr reads, merges and rewrites it)
        _, outs, _ = chunks._cover(idx, lay, shape, region)
        pieces.append(Chunk(lay.key(idx), (outs[0].start, outs[1].start),
                            (outs[0].stop - outs[0].start, outs[1].stop - outs[1].start)))
    if not pieces:
        return None
    return Chunks(array, rows, cols, (int(lay.chunk[0]), int(lay.chunk[1])), lay.dtype, lay.fill, tuple(pieces))


def write(block: EncodedBlock, threads: int = 1) -> None:
    """Store an :class:`EncodedBlock`'s frames as its chunks (each replaced whole: a re-run rewrites them alike).

    Local files go through a temporary file moved into place, S3 objects in
    one batch of PUTs, as :func:`dgemm.storage.chunks.write_region` writes
    its own; a store that takes neither (an object too large for one PUT)
    gets each frame through zarr's ``store.set``.  ``threads``: local files
    written by this thread and ``threads - 1`` helpers
    (:func:`dgemm.storage.threads.shared`), as the host writer's chunks are
    at a run's end, where the last block's writes are what the run waits for.
    """
    from dgemm.storage import remote

    found = block.chunks
    array = found.array
    if len(block.sizes) != len(found.pieces):
        raise ValueError(f"internal: {len(block.sizes)} frames for {len(found.pieces)} chunks")
    chunks.visible(array)
    src = source.Source(array)
    itemsize = found.dtype.itemsize
    frames = block.frames()
    if src.root is not None:
        def put(item, helper: bool) -> None:
            piece, frame = item
            chunks._write_file(src.file(piece.key), frame)
            nbytes = piece.size[0] * piece.size[1] * itemsize
            fastpaths.record("write_direct", nbytes)
            if helper:
                fastpaths.record("write_helped", nbytes)
        threads_mod.shared(put, list(zip(found.pieces, frames)), threads)
        return
    items = [(src._key(p.key), f) for p, f in zip(found.pieces, frames)]
    if remote.put_many(array.store, items) is None:
        _set_each(array.store, items)
        fastpaths.record("write_zarr", sum(p.size[0] * p.size[1] * itemsize for p in found.pieces))
        return
    fastpaths.record("write_batched", sum(p.size[0] * p.size[1] * itemsize for p in found.pieces),
                     len(found.pieces))


def _set_each(store, items) -> None:
    """Each ``(key, frame)`` through the store's own ``set`` (zarr's event loop)."""
    import asyncio

    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    proto = default_buffer_prototype()

    async def put():
        await asyncio.gather(*(store.set(key, proto.buffer.from_bytes(bytes(frame))) for key, frame in items))
    sync(put())

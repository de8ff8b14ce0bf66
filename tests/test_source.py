"""dgemm.storage.source: a Zarr array's stored chunk bytes, read from local files or asked of the store.

Most of it is exercised through :mod:`dgemm.storage.chunks` (tests/test_chunks.py); here, the packed read
the device decoders' readers use: every chunk's stored bytes, compared with zarr's own read of the store.
"""
from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec
from zarr.storage import LocalStore

from dgemm.storage.source import Source

# -- packed reads: a region's stored frames one after another in the caller's (staging) buffer ---------------------
@pytest.mark.parametrize("kind", ["local", "memory"])
def test_fetch_packed_reads_each_frame_into_its_place(tmp_path, rng, kind):
    """Each chunk's stored bytes exactly, each at a 16-aligned start in the buffer (a local file read straight
    there), a chunk never written as (None, None), and a frame past the room left as a copy of its own."""
    store = LocalStore(str(tmp_path / "a.zarr")) if kind == "local" else zarr.storage.MemoryStore()
    arr = zarr.create_array(store, shape=(24, 16), chunks=(8, 16), dtype="float32", compressors=ZstdCodec(),
                            fill_value=0.0)
    arr[:16] = rng.standard_normal((16, 16)).astype(np.float32)     # chunk (2, 0) never written
    keys = [arr.metadata.encode_chunk_key((i, 0)) for i in range(3)]
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    stored = [sync(store.get(k, default_buffer_prototype())).to_bytes() for k in keys[:2]]     # (zarr's own read)
    source = Source(arr)
    first = len(stored[0])
    room = -(-first // 16) * 16 + len(stored[1])
    for size, fits in ((room + 100, [True, True]), (room - 1, [True, False])):
        host = np.full(size, 0xAB, np.uint8)
        got = list(source.fetch_packed([keys[0], keys[2], keys[1]], host, align=16))
        assert got[1] == (None, None)
        (one, at0), (two, at1) = got[0], got[2]
        assert at0 == 0 and bytes(one) == stored[0] and np.shares_memory(one, host)
        if fits[1]:
            assert at1 == -(-first // 16) * 16 and np.shares_memory(two, host)
            assert (host[first:at1] == 0xAB).all()      # (the gap before an aligned start is left alone)
        else:
            assert at1 is None and not np.shares_memory(two, host)
        assert bytes(two) == stored[1]

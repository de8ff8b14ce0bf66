""":mod:`dgemm.benchmarks.inputs`: random Zarr matrices that depend on the seed alone, and the end-to-end
benchmark's inputs encoded as asked (codec, Zarr format, shards), holding the same numbers as raw ones."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from dgemm.benchmarks.inputs import make_inputs, random_zarr


def test_random_zarr_is_the_same_whatever_the_threads(tmp_path, monkeypatch):
    a = random_zarr(tmp_path / "a.zarr", (50, 70), (16, 32), "float32", seed=3, threads=1)
    b = random_zarr(tmp_path / "b.zarr", (50, 70), (16, 32), "float32", seed=3, threads=4)
    monkeypatch.setattr("dgemm.benchmarks.inputs.PANEL_BYTES", 16 * 32 * 4)    # one chunk per write
    c = random_zarr(tmp_path / "c.zarr", (50, 70), (16, 32), "float32", seed=3, threads=3)
    np.testing.assert_array_equal(a[...], c[...])
    assert a.compressors == () and a.chunks == (16, 32) and a.dtype == np.float32
    np.testing.assert_array_equal(a[...], b[...])
    assert 0.5 < a[...].std() < 1.5


@pytest.mark.parametrize("codec, fmt, shards", [("default", 3, None), ("default", 3, 32), ("default", 2, None),
                                                ("blosc-lz4", 3, None), ("blosc-lz4", 2, None)])
def test_inputs_are_encoded_as_asked(tmp_path, codec, fmt, shards):
    """zarr reads back the codec, the format and the shards asked for; the numbers are the raw inputs' own."""
    import numcodecs
    from zarr.codecs import BloscCodec, ShardingCodec, ZstdCodec

    (tmp_path / "raw").mkdir()
    (tmp_path / "enc").mkdir()
    raw = make_inputs(tmp_path / "raw", 64, 48, 80, 16, "float32", seed=5)
    ins = make_inputs(tmp_path / "enc", 64, 48, 80, 16, "float32", seed=5, codec=codec, zarr_format=fmt,
                      shards=shards)
    assert (ins["codec"], ins["zarr_format"], ins["shards"]) == (codec, fmt, shards)
    for name in ("a", "b"):
        arr = zarr.open_array(ins[name]["path"], mode="r")
        assert arr.metadata.zarr_format == fmt and arr.chunks == (16, 16)
        np.testing.assert_array_equal(arr[...], zarr.open_array(raw[name]["path"], mode="r")[...])
        assert ins[name]["zarr"]["zarr_format"] == fmt and ins[name]["zarr"]["chunks"] == [16, 16]
        (comp,) = arr.compressors
        if fmt == 2:
            assert (Path(ins[name]["path"]) / ".zarray").is_file()
            want = numcodecs.Zstd if codec == "default" else numcodecs.Blosc
            assert isinstance(comp, want) and (codec == "default" or comp.cname == "lz4")
        else:
            assert isinstance(comp, ZstdCodec if codec == "default" else BloscCodec)
            assert codec == "default" or comp.cname.value == "lz4"
        if shards:
            assert arr.shards == (32, 32) and ins[name]["shards"] == [32, 32]
            assert isinstance(arr.metadata.codecs[0], ShardingCodec)
            # one object per shard, not per chunk: 64 x 80 in 32 x 32 shards is 2 x 3 of them
            files = [p for p in (Path(ins[name]["path"]) / "c").rglob("*") if p.is_file()]
            assert len(files) == {"a": 6, "b": 6}[name]
            assert ins[name]["zarr"]["codecs"][0]["name"] == "sharding_indexed"
        else:
            assert arr.shards is None and ins[name]["zarr"]["shards"] is None
    json.dumps(ins)                     # the record's entry is JSON


def test_inputs_on_a_remote_store_need_a_staging_folder(tmp_path):
    from dgemm.benchmarks.objectstore import Location

    with pytest.raises(ValueError, match="give staging"):
        make_inputs(Location("s3://bucket/prefix"), 8, 8, 8, 4, "float32", seed=0)

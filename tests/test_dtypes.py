"""Element types: float32 and float64 in either byte order (issue 14, case 9), on real workers.

Big-endian operands come from numpy and dask arrays, Zarr v2 arrays (``>f4``,
``>f8``), Zarr v3 arrays opened as big-endian, and Zarr v3 arrays whose
``bytes`` codec stores big-endian chunks.  The product must be the float64
numpy one, in this machine's byte order; the devices never see swapped bytes
(a raw big-endian chunk is not read straight into device staging memory).
"""
from __future__ import annotations

import sys

import dask.array as da
import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec

import dgemm
from dgemm.dtypes import check_dtype
from tests._check import check_product, randn

CHUNKS = (64, 64)


@pytest.mark.parametrize("spelling, native", [(">f4", "float32"), ("<f4", "float32"), ("=f4", "float32"),
                                              (">f8", "float64"), ("<f8", "float64"), ("f8", "float64"),
                                              (">i4", None), ("<i8", None), (">c16", None), (">f2", None),
                                              ("S8", None)])
def test_either_byte_order_of_float32_and_float64_only(spelling, native):
    """Both byte orders of float32 and float64 are accepted, as the native dtype; nothing else is."""
    if native is None:
        with pytest.raises(TypeError, match="float32 and float64 only"):
            check_dtype(spelling, "a")
        return
    dt = check_dtype(spelling, "a")
    assert dt == np.dtype(native) and dt.isnative and dt.str == np.dtype(native).str


def big_endian(source: str, x: np.ndarray, path):
    """``x`` as a big-endian operand from ``source`` (for Zarr: a v2 path, a v3 array object)."""
    be = x.astype(x.dtype.newbyteorder(">"))
    if source == "numpy":
        return be
    if source == "dask":
        return da.from_array(be, chunks=CHUNKS)
    fmt = {"zarr-v2": 2, "zarr-v3": 3}[source]
    arr = zarr.create_array(store=str(path), shape=be.shape, chunks=CHUNKS, dtype=be.dtype, zarr_format=fmt)
    arr[...] = be
    assert arr.dtype == be.dtype
    if fmt == 3:
        # Zarr v3 keeps the byte order in the bytes codec: only the array object created as >f4/>f8 reads
        # as big-endian (reopened, it is native), so it is what the user passes
        return arr
    assert zarr.open_array(str(path), mode="r").dtype == be.dtype   # v2: opened as big-endian
    return str(path)


def big_endian_codec(x: np.ndarray, path) -> str:
    """``x`` in a raw Zarr v3 array whose ``bytes`` codec stores big-endian chunks (its dtype reads as native)."""
    arr = zarr.create_array(store=str(path), shape=x.shape, chunks=CHUNKS, dtype=x.dtype,
                            serializer=BytesCodec(endian="big"), compressors=None)
    arr[...] = x
    raw = (path / "c" / "0" / "0").read_bytes()
    # the chunk file really holds swapped bytes: read straight into memory it would be garbage here
    assert raw == np.ascontiguousarray(x[:CHUNKS[0], :CHUNKS[1]]).astype(x.dtype.newbyteorder(">")).tobytes()
    assert sys.byteorder == "big" or raw != np.ascontiguousarray(x[:CHUNKS[0], :CHUNKS[1]]).tobytes()
    return str(path)


@pytest.mark.parametrize("source", ["numpy", "dask", "zarr-v2", "zarr-v3"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_big_endian_operands_from_every_source(client, tmp_path, rng, source, dtype):
    """``>f4``/``>f8`` A (and C) from each source times a big-endian-codec B: the numpy product, native order."""
    m, k, n = 128, 192, 128
    A, B, C = randn(rng, (m, k), dtype), randn(rng, (k, n), dtype), randn(rng, (m, n), dtype)
    a = big_endian(source, A, tmp_path / "a.zarr")
    b = big_endian_codec(B, tmp_path / "b.zarr")
    c = big_endian(source, C, tmp_path / "c.zarr")

    out = dgemm.matmul(a, b, out=str(tmp_path / "ab.zarr"), client=client, block=64)
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    check_product(out[...], A, B, dtype=dtype)

    got = dgemm.gemm(a, b, c=c, alpha=0.5, beta=-2.0, trans_b=False, out=str(tmp_path / "g.zarr"), client=client,
                     block=64)
    assert got.dtype == np.dtype(dtype) and got.dtype.isnative
    check_product(got[...], A, B, alpha=0.5, beta=-2.0, c=C, dtype=dtype)

    # no out: numpy in, numpy out; dask or Zarr in, a lazy dask array out
    b2 = big_endian(source, B, tmp_path / "b2.zarr")
    res = dgemm.matmul(a, b2, client=client, block=64)
    res = client.compute(res, sync=True) if isinstance(res, da.Array) else res
    assert isinstance(res, np.ndarray) and res.dtype == np.dtype(dtype) and res.dtype.isnative
    check_product(res, A, B, dtype=dtype)


def test_mixed_byte_orders_and_precisions_promote_to_native_float64(client, tmp_path, rng):
    A, B = randn(rng, (100, 130), "float32"), randn(rng, (130, 70), "float64")
    a = big_endian("zarr-v2", A, tmp_path / "a.zarr")
    got = dgemm.matmul(a, B.astype("<f8"), out=str(tmp_path / "c.zarr"), client=client, block=64)
    assert got.dtype == np.dtype("float64") and got.dtype.isnative
    check_product(got[...], A, B, dtype="float64")


def test_a_big_endian_c_is_updated_in_place(client, tmp_path, rng):
    """gemm(..., out=c) where C is stored big-endian: accepted (the result is native, zarr converts on write)."""
    A, B, C0 = randn(rng, (64, 48)), randn(rng, (48, 40)), randn(rng, (64, 40))
    c = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=C0.shape, chunks=(32, 20), dtype=">f8",
                          zarr_format=2)
    c[...] = C0
    out = dgemm.gemm(A, B, c, beta=-0.5, out=c, client=client)
    got = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")[...]
    assert got.dtype == ">f8"     # C keeps its byte order
    check_product(got.astype("f8"), A, B, beta=-0.5, c=C0, dtype="float64")
    assert out.attrs["dgemm"]["complete"]

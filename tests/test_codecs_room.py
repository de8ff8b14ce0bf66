"""dgemm.client.codecs_room: the device memory the client's plan counts for a worker's codecs.

That the figure is the worker's own (its panel cache's budget under each setting) is checked on a real worker
in tests/test_memory.py (``_budgets_off_and_on``); here, what it counts for which operands and settings.
"""
from __future__ import annotations

import numpy as np
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from dgemm.client.codecs_room import codecs_bytes
from dgemm.client.plan import make_plan
from dgemm.opencl.scratch import ENCODE_SLOTS, SLOTS
from dgemm.storage import Operand, ZarrBlock, encoded
from dgemm.worker import decoding, encoding

ON = {"decode": True, "share": False, "only": None, "encode": False, "memory": None}


def _array(path, shape, chunks, compressor, rng):
    z = zarr.create_array(store=str(path), shape=shape, chunks=chunks, dtype="float32", compressors=compressor)
    z[...] = rng.standard_normal(shape).astype("float32")
    return str(path)


def _plan(m, n, k, block):
    return make_plan(m, n, k, "float32", (1, 1, 1), a_chunks=(block, block), b_chunks=(block, block), target=block)


def _worst(op, rows, cols) -> int:
    """The most any block of ``op`` holds in a decode call, every block counted."""
    ref = op.block_refs(rows, cols)[0]
    return max(decoding.call_bytes(ref(i, j)) for i in range(len(rows)) for j in range(len(cols)))


def test_the_inputs_largest_blocks_count_as_the_worker_counts_them(tmp_path, rng):
    """Zarr zstd inputs, A's blocks and B's of other sizes, edge blocks: the decode slots' room of the larger of
    the two operands' largest blocks, as ``decoding.device_bytes`` counts it with the worker's flags and memory
    share; nothing where the worker's device decodes no input, or says nothing (an older worker)."""
    a = Operand(_array(tmp_path / "a.zarr", (100, 70), (32, 32), ZstdCodec(), rng), "a")
    b = Operand(_array(tmp_path / "b.zarr", (70, 50), (16, 16), ZstdCodec(), rng), "b")
    plan = _plan(100, 50, 70, 64)
    assert plan.rows[0] == (0, 64) and plan.rows[-1][1] - plan.rows[-1][0] < 64      # (an edge block)
    worst_a, worst_b = _worst(a, plan.rows, plan.ks), _worst(b, plan.ks, plan.cols)
    assert worst_a != worst_b
    full = max(worst_a, worst_b)
    assert codecs_bytes(plan, a, b, None, (), ON) == SLOTS * decoding.BATCH * full
    share = int(1.5 * full * SLOTS / decoding.SLOTS_SHARE)
    assert codecs_bytes(plan, a, b, None, (), {**ON, "memory": share}) == SLOTS * decoding.call_cap(share)
    assert codecs_bytes(plan, a, b, None, (), {**ON, "share": True}) == SLOTS * full
    assert codecs_bytes(plan, a, b, None, (), {**ON, "decode": False}) == 0
    assert codecs_bytes(plan, a, b, None, (), None) == 0 and codecs_bytes(plan, a, b, None, (), {}) == 0


def test_blocks_that_cut_the_chunks_count_the_most_chunks_one_touches(tmp_path, rng):
    """A's k chunks (40) not a divisor of the blocks' k (64): a later k block starts inside a chunk and touches
    one more than the first; that one counts."""
    a = Operand(_array(tmp_path / "a.zarr", (64, 192), (64, 40), ZstdCodec(), rng), "a")
    b = Operand(_array(tmp_path / "b.zarr", (192, 64), (64, 64), ZstdCodec(), rng), "b")
    plan = _plan(64, 64, 192, 64)
    worst = _worst(a, plan.rows, plan.ks)
    first = decoding.call_bytes(a.block_refs(plan.rows, plan.ks)[0](0, 0))
    assert worst > first and worst > _worst(b, plan.ks, plan.cols), (worst, first)
    assert codecs_bytes(plan, a, b, None, (), {**ON, "share": True}) == SLOTS * worst


def test_inputs_the_device_does_not_take_count_nothing(tmp_path, rng):
    """Blosc inputs where the worker's device takes zstd's alone (``auto``), and in-memory operands (never
    decoded on the device; counted without building their graphs): nothing."""
    blosc = Operand(_array(tmp_path / "l.zarr", (64, 64), (32, 32), BloscCodec(cname="lz4"), rng), "a")
    plan = _plan(64, 64, 64, 64)
    assert codecs_bytes(plan, blosc, blosc, None, (), {**ON, "only": ["zstd"]}) == 0
    assert codecs_bytes(plan, blosc, blosc, None, (), ON) > 0
    x = Operand(np.ones((64, 64), "float32"), "a")
    assert codecs_bytes(plan, x, x, None, (), ON) == 0


def test_an_output_encoded_on_the_device_counts_the_encoders_slots(tmp_path, rng):
    """C in plain zstd chunks, encoded on the worker's device: its encoder's kept buffers for the first C block;
    nothing for C in another codec, or where the worker encodes on the host."""
    a = Operand(_array(tmp_path / "a.zarr", (64, 64), (32, 32), None, rng), "a")
    plan = _plan(64, 64, 64, 64)
    out = zarr.open_array(_array(tmp_path / "c.zarr", (64, 64), (32, 32), ZstdCodec(), rng), mode="r+")
    found = encoded.chunks_of(out, (0, 64), (0, 64))
    assert found is not None
    enc = {**ON, "decode": False, "encode": True}
    assert codecs_bytes(plan, a, a, out, (), enc) == encoding.device_bytes(found, ENCODE_SLOTS) > 0
    assert codecs_bytes(plan, a, a, out, (), {**enc, "encode": False}) == 0
    other = zarr.open_array(_array(tmp_path / "d.zarr", (64, 64), (32, 32), BloscCodec(cname="lz4"), rng),
                            mode="r+")
    assert codecs_bytes(plan, a, a, other, (), enc) == 0


def test_c_reduced_or_mirrored_counts_no_encoder(tmp_path, rng):
    """Where the GEMM tasks do not feed the stores (a k split's partial blocks are reduced; a Gram product's
    lower blocks are mirrored), the worker never encodes C on the device: nothing counted for it."""
    x = _array(tmp_path / "x.zarr", (64, 64), (32, 32), None, rng)
    out = zarr.open_array(_array(tmp_path / "c.zarr", (64, 64), (32, 32), ZstdCodec(), rng), mode="r+")
    enc = {**ON, "decode": False, "encode": True}
    wide = Operand(_array(tmp_path / "w.zarr", (64, 256), (32, 32), None, rng), "a")
    tall = Operand(_array(tmp_path / "t.zarr", (256, 64), (32, 32), None, rng), "b")
    split = make_plan(64, 64, 256, "float32", (1, 1, 1), target=64, n_workers=4)
    assert len(split.segments) > 1
    assert codecs_bytes(split, wide, tall, out, (), enc) == 0
    a, xt = Operand(x, "b"), Operand(x, "a")
    xt.transpose()
    gram = _plan(64, 64, 64, 32)
    assert codecs_bytes(gram, xt, a, out, (), enc, beta=0.0) == 0
    assert codecs_bytes(gram, xt, a, out, (), enc, beta=1.0) > 0      # (C added in: not assumed symmetric)

"""zstd frames planned on the device (dgemm.opencl.codecs.zstd_devplan, ``zstd_plan``) against the host's fast plan.

The fast plan (:mod:`dgemm.opencl.codecs.zstd_fastplan`) is itself checked row
for row against the block-by-block reader (tests/test_zstd_fastplan.py).  Here
the kernel's rows must be the fast plan's, frame for frame, and where the fast
plan gives up (the block-by-block reader then reads the frame, with its
errors) the kernel must give up too: the same corpus (numcodecs ``Zstd`` at
levels -5 to 19, with and without checksum) and damaged frames from it.  Then
``decode_zstd`` with heads in place of plans, and a worker's block whose frame
only the host decodes (found from its blocks alone).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

numcodecs = pytest.importorskip("numcodecs")
pytest.importorskip("pyopencl")
from numcodecs import Zstd  # noqa: E402

from dgemm.opencl.codecs import zstd_decode as zd  # noqa: E402
from dgemm.opencl.codecs import zstd_devplan as dp  # noqa: E402
from dgemm.opencl.codecs import zstd_fastplan as fp  # noqa: E402
from dgemm.opencl.codecs import zstd_frames as zf  # noqa: E402

from test_zstd_fastplan import _corpus, _same  # noqa: E402


def _fast(frame):
    data = memoryview(frame).cast("B")
    hsize, size, checksum = zf.header(data)
    return fp._fast(data, hsize, size, checksum, "f")


def _head(frame):
    try:
        return dp.head(frame, "f")
    except (zf.ZstdFrameError, zf.ZstdUnsupported):
        return None


def device_plans(dev, frames, calls: int = 1):
    """Each frame's plan by ``zstd_plan`` (None where it gives up), ``calls`` calls of the frames in turn."""
    import pyopencl as cl

    step = -(-len(frames) // calls)
    return [p for k in range(0, len(frames), step) for p in _plan_call(dev, frames[k:k + step], cl.wait_for_events)]


def _plan_call(dev, frames, wait, prog=None) -> list:
    """One ``zstd_plan`` call's plans of ``frames`` (None where a header is refused or the kernel gives up), its
    waits made by ``wait``, its program ``prog`` (the device's own by default)."""
    import pyopencl as cl

    host, starts = zd._packed(frames)
    bufs = []

    def take(nbytes, what):
        bufs.append(dev.buffer(max(nbytes, 1), what))
        return bufs[-1]

    src = take(host.nbytes + 16, "test frames")
    try:
        cl.enqueue_copy(dev.queue, src, host).wait()
        prog = prog if prog is not None else zd.program(dev, zd.default_lanes(dev))
        heads = [_head(f) for f in frames]       # (a frame whose header is refused: the host's, None here)
        mine = [k for k, h in enumerate(heads) if h is not None]
        got = dp.plan(prog, dev.queue, src, [frames[k] for k in mine], [starts[k] for k in mine],
                      [heads[k] for k in mine], take, wait)
        planned = dict(zip(mine, got))
        return [planned.get(k) for k in range(len(frames))]
    finally:
        for b in bufs:
            b.release()


def test_device_plans_are_the_fast_plans(any_device, rng):
    corpus = _corpus(rng)
    got = device_plans(any_device, list(corpus.values()), calls=4)
    planned = []
    for (key, frame), dev in zip(corpus.items(), got):
        fast = _fast(frame)
        if dev is None and fast is not None:      # (level 19's block splitter: many small blocks)
            assert len(fast.blocks) > dp.slots(dp.head(frame)), key
            continue
        assert (dev is None) == (fast is None), key
        if dev is not None:
            _same(dev, fast)
            planned.append(key)
    # Zarr's default (level 3) float32 chunks, with their few blocks of sequences, and raw blocks of bytes
    assert {("normal", 3, False), ("walk", 3, False), ("product", 3, False), ("mixed", 3, False),
            ("bytes", 3, False), ("normal", 19, True)} <= set(planned), planned


def test_the_rows_read_is_queued_behind_the_kernel_and_waited_for_in_its_place(any_device, rng):
    """The host waits once, for the read: NVIDIA's driver shows a kernel's end to the host late beside the GEMMs
    (bench/NOTES.md, issue 28, thirty-third session), and the in-order queue runs the read after the kernel."""
    import pyopencl as cl

    frames = [Zstd(level=3).encode(rng.standard_normal(1 << 15).astype(np.float32).tobytes()) for _ in range(2)]
    waited = []

    def wait(events):
        waited.append([e.command_type for e in events])
        cl.wait_for_events(events)

    for frame, plan in zip(frames, _plan_call(any_device, frames, wait)):
        _same(plan, _fast(frame))
    assert waited and cl.command_type.READ_BUFFER in waited[0], waited
    assert not any(cl.command_type.NDRANGE_KERNEL in w for w in waited), "the kernel's own end was waited for"


def test_a_plan_kernel_that_failed_raises_though_its_rows_were_read(any_device, rng):
    """The read queued behind the kernel runs whatever the kernel did; a failed kernel still fails the plan."""
    import threading

    import pyopencl as cl

    from dgemm.opencl import nogil

    failed = cl.UserEvent(any_device.context)
    failed.set_status(-5)       # (CL_OUT_OF_RESOURCES, as a launch that failed on the device would be)

    class Failing:      # the program, its plan kernel's launch failed
        lock, plan_lanes = threading.Lock(), 1

        def plan(self, *args):
            return failed

    frames = [Zstd(level=3).encode(rng.standard_normal(1 << 12).astype(np.float32).tobytes())]
    with pytest.raises(cl.Error, match="a command waited for"):
        _plan_call(any_device, frames, nogil.wait, prog=Failing())


def test_the_kernel_gives_up_where_the_fast_plan_does(any_device, rng):
    """Bytes flipped in block headers, literals headers, jump tables and sequence sections; truncations."""
    frames = [f for (name, level, checksum), f in _corpus(rng).items()
              if level in (1, 3) and name in ("normal", "walk", "ints", "mixed") and not checksum]
    damaged = []
    for frame in frames:
        data = np.frombuffer(frame, np.uint8)
        hsize = zf.header(frame)[0]
        spots = list(range(hsize, min(len(data), hsize + 24))) + list(rng.integers(hsize, len(data), 12))
        for at in spots:
            for flip in (0x01, 0x80, 0xFF):
                bad = data.copy()
                bad[at] ^= flip
                damaged.append(bad.tobytes())
        damaged += [frame[:-cut] for cut in (1, 2, 3, 7, len(data) // 2)]
    got = device_plans(any_device, damaged, calls=8)
    refused = planned = 0
    for frame, dev in zip(damaged, got):
        try:
            fast = _fast(frame)
        except (zf.ZstdFrameError, zf.ZstdUnsupported):
            assert dev is None      # (the header refused: the host gives its error)
            continue
        if dev is None and fast is not None:
            assert len(fast.blocks) > dp.slots(dp.head(frame))
            continue
        if dev is None:
            refused += 1
        else:
            _same(dev, fast)
            planned += 1
    assert refused > 50 and planned > 50, (refused, planned)


def test_streams_of_no_bytes_or_without_an_end_mark_are_left_to_the_host(any_device, rng):
    """As the fast plan leaves them (tests/test_zstd_fastplan.py): the block-by-block reader then refuses them."""
    frame = Zstd(level=3).encode(rng.standard_normal(1 << 18, dtype=np.float32))
    plan = _fast(frame)
    damaged = []
    for row in plan.streams[:8]:
        bad = bytearray(frame)
        bad[row[zf.S_SRC] + row[zf.S_LEN] - 1] = 0            # the stream's last byte holds its end mark
        damaged.append(bytes(bad))
    jump = plan.streams[0, zf.S_SRC] - 6                        # the first block's jump table
    bad = bytearray(frame)
    bad[jump + 2:jump + 4] = (0).to_bytes(2, "little")           # stream 2 of no bytes
    damaged.append(bytes(bad))
    assert device_plans(any_device, [frame] + damaged)[1:] == [None] * len(damaged)


def test_a_frame_of_more_blocks_than_its_rows_is_planned_on_the_host(any_device, rng, monkeypatch):
    frame = Zstd(level=3).encode(rng.standard_normal(1 << 18, dtype=np.float32))
    assert device_plans(any_device, [frame])[0] is not None
    monkeypatch.setattr(dp, "slots", lambda head: 2)
    assert device_plans(any_device, [frame])[0] is None
    want = Zstd().decode(frame)
    assert _decode(any_device, [frame], heads=True) == want       # (through the host's plan)


def _decode(dev, frames, heads: bool, names=None):
    """``decode_zstd`` of ``frames`` into a poisoned buffer, with heads (planned on the device) or without."""
    import pyopencl as cl

    names = names or [f"chunk/{i}" for i in range(len(frames))]
    plans = [dp.head(f, n) for f, n in zip(frames, names)] if heads else None
    size = sum(zf.header(f)[1] for f in frames)
    out = dev.buffer(size + 64, "test output")
    try:
        cl.enqueue_fill_buffer(dev.queue, out, np.uint8(0x5A), 0, out.size).wait()
        zd.decode_zstd(dev, frames, out, names=names, plans=plans)
        got = np.empty(out.size, np.uint8)
        cl.enqueue_copy(dev.queue, got, out).wait()
    finally:
        out.release()
    assert (got[size:] == 0x5A).all(), "written past the frames' output"
    return got[:size].tobytes()


def test_a_call_with_heads_decodes_and_refuses_as_with_host_plans(any_device, rng):
    frames = [Zstd(level=level).encode(rng.standard_normal(n, dtype=np.float32))
              for level, n in ((3, 300_000), (1, 70_000), (19, 200_000), (-1, 5_000))]
    frames.append(Zstd(level=3).encode(bytes(rng.choice(np.frombuffer(b"acgt ,.\n", np.uint8), 400_000))))
    assert _decode(any_device, frames, heads=True) == b"".join(Zstd().decode(f) for f in frames)
    checked = 0
    for k in range(60):         # damaged frames: the same error, or the same bytes, both ways
        bad = bytearray(frames[k % len(frames)])
        hsize = zf.header(bytes(bad))[0]
        # (every other one in the first block's headers and tables, where most damage is found)
        at = int(rng.integers(hsize, min(hsize + 48, len(bad)) if k % 2 else len(bad)))
        bad[at] ^= int(rng.integers(1, 256))
        outcome = []
        for heads in (True, False):
            try:
                outcome.append(_decode(any_device, [frames[1], bytes(bad)], heads=heads))
            except (zf.ZstdFrameError, zf.ZstdUnsupported) as e:
                outcome.append((type(e), str(e)))
        assert outcome[0] == outcome[1], (k, at)
        checked += isinstance(outcome[0], tuple)
    assert checked > 15, checked


def test_a_call_reports_its_plan_kernel_with_its_commands(any_device, rng):
    """The plan kernel's event and its rows' read come with the call's others (the timelines and the engine's
    counters time them), once a call, and only where the call plans on the device."""
    import pyopencl as cl

    frames = [Zstd(level=3).encode(rng.standard_normal(n, dtype=np.float32)) for n in (300_000, 70_000)]
    size = sum(zf.header(f)[1] for f in frames)
    out = any_device.buffer(size + 64, "test output")
    try:
        for heads in (True, False):
            events: list = []
            plans = [dp.head(f, "f") for f in frames] if heads else None
            zd.decode_zstd(any_device, frames, out, plans=plans, events=events)
            kinds = [what for what, _ in events]
            assert kinds.count("plan") == kinds.count("plan_read") == (1 if heads else 0), kinds
            cl.wait_for_events([e for _, e in events])
            assert all(e.command_execution_status == cl.command_execution_status.COMPLETE for _, e in events)
    finally:
        out.release()


def test_headed_reads_the_header_alone(rng):
    frame = Zstd(level=3).encode(rng.standard_normal(1000, dtype=np.float32))
    reason, head = zd.headed(frame, "c/0")
    assert reason is None and head == dp.FrameHead("c/0", 4000, len(frame), zf.header(frame)[0], False)
    assert zd.headed(frame[:3], "c/1") == (None, None)                       # corrupt: the call raises
    assert zd.headed(b"\x50\x2a\x4d\x18" + bytes(8), "c/2")[0] is not None   # a skippable frame: the host's


def test_a_frame_only_the_host_decodes_is_found_by_the_call_and_read_on_the_host(any_device, tmp_path, rng):
    """A chunk's frame followed by a skippable frame: libzstd decodes it, the device path leaves it to the
    host, and only its blocks tell (the header does not)."""
    from test_decoding import LZ4, create, device_read

    from dgemm.storage import ZarrBlock

    arr, data = create(tmp_path / "a.zarr", LZ4["v2 zstd"], rng, dtype="float32")
    path = os.path.join(str(arr.store_path).removeprefix("file://"), "1.0")
    with open(path, "ab") as f:
        f.write((0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little") + b"skip")
    np.testing.assert_array_equal(arr[8:16, 0:16], data[8:16, 0:16])     # (zarr reads it)
    got, _, grew = device_read(any_device, ZarrBlock(arr, (0, 24), (0, 16)))
    np.testing.assert_array_equal(got, data[:24, :16])
    part = 8 * 16 * 4
    assert grew["host_decoded_bytes"] == part and grew["device_decoded_bytes"] == 2 * part, grew


def _no_host_plans(monkeypatch):
    def refused(frame, name="frame"):
        raise AssertionError(f"{name} planned on the host")

    monkeypatch.setattr(fp, "plan", refused)


def test_a_workers_blocks_of_zarr_chunks_are_planned_on_the_device(any_device, tmp_path, rng, monkeypatch):
    """Zarr's default zstd chunks of float32, through a reader's block (its frames' headers read on the host, the
    rest on the device) and through a shared call of blocks queued behind busy slots: no frame planned on the
    host, every value right."""
    from test_decoding import _queued_behind_held_slots, create, device_read
    from zarr.codecs import ZstdCodec

    from dgemm.storage import ZarrBlock
    from dgemm.worker.decoding import DeviceDecoded

    arr, data = create(tmp_path / "a.zarr", {"compressors": ZstdCodec(level=3)}, rng, shape=(80, 4096),
                       chunks=(16, 4096), dtype="float32")
    _no_host_plans(monkeypatch)
    got, _, grew = device_read(any_device, ZarrBlock(arr, (0, 48), (0, 4096)))
    np.testing.assert_array_equal(got, data[:48])
    assert grew["device_decoded_bytes"] == data[:48].nbytes and grew["host_decoded_bytes"] == 0, grew
    spans = [(0, 32), (32, 48), (48, 80)]
    blocks = [DeviceDecoded(ZarrBlock(arr, r, (0, 4096))) for r in spans]
    got, errors, calls = _queued_behind_held_slots(any_device, blocks, monkeypatch)
    assert len(calls) == 1, calls
    for (r0, r1), values in zip(spans, got):
        np.testing.assert_array_equal(values, data[r0:r1])


def _blocks(frame):
    """``(header bytes, [[last, type, size, payload]...], bytes after the last block)`` of a frame."""
    data = bytes(frame)
    pos = hsize = zf.header(data)[0]
    out = []
    while True:
        h = int.from_bytes(data[pos:pos + 3], "little")
        kind = (h >> 1) & 3
        n = 1 if kind == zf.RLE else h >> 3
        out.append([h & 1, kind, h >> 3, data[pos + 3:pos + 3 + n]])
        pos += 3 + n
        if h & 1:
            return data[:hsize], out, data[pos:]


def _frame(head, blocks, tail=b""):
    return head + b"".join((last | kind << 1 | size << 3).to_bytes(3, "little") + payload
                           for last, kind, size, payload in blocks) + tail


def test_a_sequence_section_of_no_sequences_continues_the_prefix(any_device, rng):
    """A sequences section whose count is written in two bytes, 0x80 0x00: no sequences, as the host's reader
    reads it; the blocks after it still have their output places (as the fast plan gives them)."""
    for _ in range(50):     # float noise whose blocks after the third have no sequences (most draws)
        original = Zstd(level=3).encode(rng.standard_normal(1 << 18, dtype=np.float32))
        plan = _fast(original)
        if plan is not None and (plan.blocks[2:, zf.B_NSEQ] == 0).all():
            break
    else:
        pytest.fail("no draw of float noise without sequences in its last blocks")
    head, blocks, tail = _blocks(original)
    assert blocks[2][3][-1] == 0                          # (its section: one byte, 0)
    blocks[2][3] = blocks[2][3][:-1] + bytes([0x80, 0x00, 0x00, 0x01])
    blocks[2][2] += 3
    frame = _frame(head, blocks, tail)
    fast = _fast(frame)
    assert fast is not None and (fast.blocks[3:, zf.B_PRE] > 0).all()
    _same(device_plans(any_device, [frame])[0], fast)


def test_errors_of_several_frames_come_in_the_frames_order(any_device, rng):
    """The first frame corrupt in its blocks (planned on the device, then on the host), the second in its
    header (planned on the host at once): the first frame's error, as with every frame planned on the host."""
    first = bytearray(Zstd(level=3).encode(rng.standard_normal(50_000, dtype=np.float32)))
    first[zf.header(bytes(first))[0]] ^= 0x06            # its first block's type: 3 (reserved)
    second = bytearray(Zstd(level=3).encode(rng.standard_normal(50_000, dtype=np.float32)))
    second[4] |= 0x08                                      # the frame header's reserved bit
    frames, names = [bytes(first), bytes(second)], ["chunk/0", "chunk/1"]
    out = any_device.buffer(400_000, "test output")
    try:
        raised = []
        for check in (zd.checked, zd.headed):     # the readers' before, and now
            plans = [check(f, n)[1] for f, n in zip(frames, names)]
            with pytest.raises(zf.ZstdFrameError) as info:
                zd.decode_zstd(any_device, frames, out, names=names, plans=plans)
            raised.append(str(info.value))
    finally:
        out.release()
    assert raised[0] == raised[1] and raised[0].startswith("zstd frame chunk/0: "), raised


def test_a_block_sent_back_decodes_each_chunk_on_the_host_once(any_device, tmp_path, rng):
    """One chunk whose header leaves it to the host (no content size) and one whose blocks do (a skippable
    frame after it): the block goes back to host plans once, and each chunk is counted once."""
    from test_decoding import LZ4, create, device_read

    from dgemm.storage import ZarrBlock

    arr, data = create(tmp_path / "a.zarr", LZ4["v2 zstd"], rng, dtype="float32")
    root = str(arr.store_path).removeprefix("file://")
    with open(os.path.join(root, "0.0"), "rb") as f:
        head, blocks, tail = _blocks(f.read())
    with open(os.path.join(root, "0.0"), "wb") as f:    # (a single-segment header of no content size)
        f.write(_frame(zf.MAGIC.to_bytes(4, "little") + bytes([0x00, 0x00]), blocks, tail))
    with open(os.path.join(root, "1.0"), "ab") as f:
        f.write((0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little") + b"skip")
    np.testing.assert_array_equal(arr[0:16, 0:16], data[0:16, 0:16])     # (zarr reads both)
    got, _, grew = device_read(any_device, ZarrBlock(arr, (0, 24), (0, 16)))
    np.testing.assert_array_equal(got, data[:24, :16])
    part = 8 * 16 * 4
    assert grew["host_decoded_bytes"] == 2 * part and grew["device_decoded_bytes"] == part, grew

"""zstd frames planned on the device: :mod:`.zstd_fastplan`'s rows made by ``zstd_decode.cl``'s ``zstd_plan``.

Planning a 64 MiB frame on the host takes about 0.7 ms of Python alone, but
a worker's readers all plan at once, each holding Python's lock, and there
a plan took 35 ms of wall time and 4 of CPU (one H200's host, 12 threads;
bench/NOTES.md, issue 28, twenty-second session).  With every frame's plan
kept from run to run, a 32768² product under ``device-codecs: on`` went
from 1.81 s to 1.58.  So the host reads each frame's header alone
(:func:`head`: a few bytes) and the decode call plans the frames it was
given heads for after uploading them: a work-group a frame walks the block
headers and reads every literal section, and writes the rows
:func:`.zstd_fastplan.plan` would have made, which come back in one read.
The host then reads only the sequence sections of the few blocks that have
one (:func:`.zstd_frames._sequences`, as the fast plan does: a 64 MiB float
chunk of Zarr's default level has about 3 of its 512).

Where the fast plan would give up, so does the kernel (status 1), and the
frame is planned on the host, which gives its errors: a corrupt or
unsupported frame is refused exactly as before.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from dgemm.opencl.codecs import zstd_frames as zf

PLAN_COLUMNS = 6    # zstd_plan's frame rows: start in the uploaded bytes, size, header size, checksum, slot, slots
PLAN_OUT = 4        # and what it writes per frame: status (0: planned), blocks, trees, literals
PLAN_SCRATCH = 3    # its scratch per block slot


@dataclasses.dataclass(frozen=True)
class FrameHead:
    """What a frame's header says, in place of its plan: the decode call plans the frame on the device."""

    name: str
    size: int           # the content size
    csize: int          # the frame's bytes
    hsize: int = 0      # the header's bytes
    checksum: bool = False


def head(frame, name: str = "frame") -> FrameHead:
    """The frame's :class:`FrameHead`; raises what :func:`.zstd_frames.header` raises (the host plan's first errors)."""
    data = memoryview(frame).cast("B")
    hsize, size, checksum = zf.header(data, name)
    return FrameHead(name, size, len(data), hsize, bool(checksum))


def slots(head: FrameHead) -> int:
    """Block rows the kernel may write for a frame: twice the blocks of 128 KiB its content needs, and no more
    than its bytes could hold.  A frame of more is planned on the host: level 19's block splitter writes
    random walks of float32 in blocks of 8 KiB (16 times as many), Zarr's default level in whole blocks."""
    return int(min(head.csize // 4 + 1, 2 * -(-head.size // zf.BLOCK_MAX) + 2))


def plan(prog, queue, src, frames, starts, heads, take, wait, events: list | None = None) -> list:
    """Plan ``frames`` (each at ``starts`` in the device buffer ``src``, uploaded; ``heads`` their
    :class:`FrameHead`) with ``zstd_plan``.

    ``take(nbytes, what)`` gives device buffers; ``wait(events)`` waits for
    commands without Python's lock; ``events`` gets ``("plan", event)`` of the
    kernel and ``("plan_read", event)`` of its rows' read, for their profiling times.  Returns per frame its
    :class:`~.zstd_frames.FramePlan`, or None where the host must plan it
    (any of the fast plan's checks failing, a sequence section the host's
    reader refuses, more blocks than :func:`slots`).
    """
    import pyopencl as cl

    rows, at = [], []
    base = 0
    for start, h in zip(starts, heads):
        most = slots(h)
        at.append(base)
        rows.append((start, h.csize, h.hsize, int(h.checksum), base, most))
        base += most
    if not rows:
        return []
    table = np.array(rows, np.int64)
    # the kernel's rows in one buffer (status, blocks, streams, trees), read back at once
    parts = np.cumsum([0, len(rows) * PLAN_OUT, base * zf.BLOCK_COLUMNS, 4 * base * zf.STREAM_COLUMNS,
                       base * zf.TREE_COLUMNS])
    back = np.empty(int(parts[-1]), np.int64)
    out, blocks, streams, trees = (back[a:b].reshape(-1, w) for a, b, w in
                                   zip(parts, parts[1:], (PLAN_OUT, zf.BLOCK_COLUMNS, zf.STREAM_COLUMNS,
                                                          zf.TREE_COLUMNS)))
    bufs = [take(table.nbytes, "zstd plan frames"), take(back.nbytes, "zstd plan rows"),
            take(8 * PLAN_SCRATCH * base, "zstd plan scratch")]
    up = cl.enqueue_copy(queue, bufs[0], table, is_blocking=False)
    with prog.lock:
        lanes = prog.plan_lanes
        done = prog.plan(queue, (len(rows) * lanes,), (lanes,), src, bufs[0], bufs[1],
                         *(np.int64(x) for x in parts[1:4]), bufs[2])
    if events is not None:
        events.append(("plan", done))
    # The rows' read is enqueued at once behind the kernel (the queue is in order: it starts when the kernel has
    # run) and waited for in its place: on NVIDIA's driver a wait for the kernel (and its table's upload) returned 5
    # ms after the kernel's end at the median, 27-37 ms beside the GEMMs, and a wait for a copy within 1-3 ms of its
    # end (bench/NOTES.md, issue 28, thirty-third session).  Not a blocking read: NVIDIA's driver holds its own
    # lock through one, and other threads' calls wait.
    read = cl.enqueue_copy(queue, back, bufs[1], is_blocking=False)
    if events is not None:
        events.append(("plan_read", read))
    wait([read, up])
    if done.command_execution_status < 0:   # (a failed kernel: its status is the error)
        wait([done])
    plans = []
    for k, (frame, h, first) in enumerate(zip(frames, heads, at)):
        status, nb, ntrees, literals = (int(x) for x in out[k])
        plans.append(None if status else _frame_plan(memoryview(frame).cast("B"), h.name, h.size, h.checksum,
                                                       blocks[first:first + nb], streams[4 * first:4 * (first + nb)],
                                                       trees[first:first + ntrees], literals))
    return plans


def _frame_plan(data, name, size, checksum, blocks, streams, trees, literals):
    """A planned frame's :class:`~.zstd_frames.FramePlan` from the kernel's rows (its sequence sections read here),
    or None where the host's reader refuses a sequence section (the host plan gives the error)."""
    compressed = blocks[:, zf.B_TYPE] == zf.COMPRESSED
    if not compressed.all():        # (stream rows only for compressed blocks, as the host's)
        streams = streams.reshape(-1, 4, zf.STREAM_COLUMNS)[compressed].reshape(-1, zf.STREAM_COLUMNS)
    nseq, fse = 0, np.zeros((0, 2), np.uint32)
    with_seqs = np.flatnonzero(blocks[:, zf.B_NSEQ] < 0)
    if len(with_seqs):
        f = zf._Frame(data, name)
        blocks = blocks.copy()
        for b in with_seqs:         # in order: a table may repeat the one before it
            row = blocks[b].tolist()
            at, end = row[zf.B_SSRC], row[zf.B_SRC] + row[zf.B_SIZE]
            try:        # (it writes B_NSEQ and B_SSRC over the kernel's marks: a section it takes has sequences)
                zf._sequences(f, row, at, end, int(b))
            except (zf.ZstdFrameError, zf.ZstdUnsupported, IndexError):
                return None
            blocks[b] = row
        zf._prefix_positions(blocks)    # (a section of no sequences, "0x80 0x00", continues the prefix)
        nseq = f.nseq
        if f.fse:
            fse = np.concatenate(f.fse)
    expected = int.from_bytes(data[len(data) - 4:], "little") if checksum else None
    return zf.FramePlan(name, size, len(data), expected, blocks, streams, trees, fse, literals, nseq)

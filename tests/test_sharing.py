"""dgemm.storage.sharing: decoded blocks shared by the device workers of one process.

Threads race on the same blocks: each is decoded once, its other readers
wait for it (no polling) and copy it, the last frees it; a failed decode
leaves each waiter to decode (and fail) on its own; a block that does not
fit is decoded by each reader; a run's blocks go with the run.  Every
output starts poisoned (NaN), so a reader handed nothing is caught.  The
product through a cluster of one process is in ``test_siblings.py``.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from dgemm.storage import sharing
from dgemm.storage.sharing import Board

SHAPE = (64, 48)
NBYTES = SHAPE[0] * SHAPE[1] * 8


def expected(i: int) -> np.ndarray:
    return np.random.default_rng(500 + i).standard_normal(SHAPE)


def poisoned() -> np.ndarray:
    return np.full(SHAPE, np.nan)


class Decoder:
    """Block ``i``'s decode, counted; ``gate`` (an Event) holds it until set, ``fail`` makes it raise."""

    def __init__(self, i: int, gate: threading.Event | None = None, fail: bool = False):
        self.i, self.gate, self.fail, self.calls = i, gate, fail, 0
        self.started = threading.Event()

    def __call__(self, out):
        self.calls += 1
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10), "the test's gate was never opened"
        if self.fail:
            raise OSError(f"block {self.i} is damaged")
        out[...] = expected(self.i)


def test_each_block_is_decoded_once_for_its_readers_and_freed_by_the_last():
    board = Board(1 << 30)
    dec = Decoder(1)
    outs = [poisoned() for _ in range(3)]
    served = [board.fetch("run", "k1", 3, out, dec) for out in outs]
    assert served == [False, True, True] and dec.calls == 1
    for out in outs:
        np.testing.assert_array_equal(out, expected(1))
    assert len(board) == 0, "the last reader leaves the block on the board"
    assert board.held() == NBYTES   # its buffer, kept for the next block of the size
    assert board.drop() == NBYTES and board.held() == 0


def test_a_reader_waits_for_the_decode_under_way_instead_of_decoding_again():
    board = Board(1 << 30)
    gate = threading.Event()
    first, second = Decoder(2, gate), Decoder(2)
    outs, results = [poisoned(), poisoned()], {}
    t1 = threading.Thread(target=lambda: results.__setitem__(0, board.fetch("run", "k", 2, outs[0], first)))
    t1.start()
    assert first.started.wait(10)
    t2 = threading.Thread(target=lambda: results.__setitem__(1, board.fetch("run", "k", 2, outs[1], second)))
    t2.start()
    t2.join(0.2)
    assert t2.is_alive(), "the second reader did not wait for the first one's decode"
    gate.set()
    t1.join(10), t2.join(10)
    assert results == {0: False, 1: True} and (first.calls, second.calls) == (1, 0)
    np.testing.assert_array_equal(outs[1], expected(2))
    assert len(board) == 0


def test_many_threads_race_on_many_blocks_and_each_is_decoded_once():
    board = Board(1 << 30)
    decoders = {i: Decoder(i) for i in range(6)}
    readers, wrong, lock = 4, [], threading.Lock()
    barrier = threading.Barrier(readers)

    def read(order):
        barrier.wait()
        for i in order:
            out = poisoned()
            board.fetch("run", ("b", i), readers, out, decoders[i])
            if not np.array_equal(out, expected(i)):
                with lock:
                    wrong.append(i)

    threads = [threading.Thread(target=read, args=(list(range(6))[::1 if t % 2 else -1],)) for t in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not wrong and {i: d.calls for i, d in decoders.items()} == dict.fromkeys(range(6), 1)
    assert len(board) == 0


def test_a_failed_decode_raises_and_each_waiter_decodes_on_its_own():
    board = Board(1 << 30)
    gate = threading.Event()
    bad, mine = Decoder(3, gate, fail=True), Decoder(3)
    errors, out = [], poisoned()

    def first():
        try:
            board.fetch("run", "k", 2, poisoned(), bad)
        except OSError as e:
            errors.append(e)

    t1 = threading.Thread(target=first)
    t1.start()
    assert bad.started.wait(10)
    t2 = threading.Thread(target=lambda: board.fetch("run", "k", 2, out, mine))
    t2.start()
    gate.set()
    t1.join(10), t2.join(10)
    assert [str(e) for e in errors] == ["block 3 is damaged"]
    assert mine.calls == 1, "the waiter used nothing of the failed decode: it decoded the block itself"
    np.testing.assert_array_equal(out, expected(3))
    assert len(board) == 0 and board.held() == 0


def test_a_block_that_does_not_fit_is_decoded_by_each_reader():
    board = Board(NBYTES - 1)
    dec = Decoder(4)
    outs = [poisoned(), poisoned()]
    assert [board.fetch("run", "k", 2, out, dec) for out in outs] == [False, False] and dec.calls == 2
    for out in outs:
        np.testing.assert_array_equal(out, expected(4))
    assert len(board) == 0 and board.held() == 0


def test_a_runs_blocks_go_with_the_run_and_other_runs_keep_theirs():
    board = Board(1 << 30)
    board.fetch("run1", "k", 2, poisoned(), Decoder(5))
    board.fetch("run2", "k", 2, poisoned(), Decoder(6))
    assert len(board) == 2 and board.held() == 2 * NBYTES
    assert board.drop("run1") == NBYTES and len(board) == 1
    out = poisoned()
    again = Decoder(6)
    assert board.fetch("run2", "k", 2, out, again) is True and again.calls == 0, "run2 lost its block"
    np.testing.assert_array_equal(out, expected(6))
    out = poisoned()
    assert board.fetch("run1", "k", 2, out, Decoder(5)) is False, "run1's block outlived its run"
    np.testing.assert_array_equal(out, expected(5))
    board.drop()
    assert len(board) == 0 and board.held() == 0


def test_through_wraps_only_compressed_zarr_blocks_that_other_workers_read(tmp_path):
    """A zstd block read by two workers of the host goes through the board; one read by one worker, raw
    chunks (a copy would save nothing), arrays in memory, no board or no run pass by.  A damaged chunk
    raises the block's one read error."""
    import zarr

    from dgemm.storage import ZarrBlock

    data = expected(7)
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=SHAPE, chunks=(32, 24), dtype="f8")   # zstd
    arr[...] = data
    raw = zarr.create_array(str(tmp_path / "raw.zarr"), shape=SHAPE, chunks=(32, 24), dtype="f8", compressors=None)
    raw[...] = data
    board = Board(1 << 30)
    ref = ZarrBlock(arr, (0, SHAPE[0]), (0, SHAPE[1]), host_shared=True, host_readers=2)
    alone = ZarrBlock(arr, ref.rows, ref.cols)
    raw_ref = ZarrBlock(raw, ref.rows, ref.cols, host_shared=True, host_readers=2)
    held = np.ones(3)
    assert sharing.through(board, "run", alone) is alone and sharing.through(board, "run", raw_ref) is raw_ref
    assert sharing.through(board, "run", held) is held
    assert sharing.through(None, "run", ref) is ref and sharing.through(board, None, ref) is ref
    shared = sharing.through(board, "run", ref)
    assert isinstance(shared, sharing.Sibling)
    assert (shared.shape, shared.dtype, shared.key(), shared.copies) == (ref.shape, ref.dtype, ref.key(), False)
    for served in (False, True):
        out = poisoned()
        assert shared.fill_into(out) is served
        np.testing.assert_array_equal(out, data)
    (tmp_path / "a.zarr" / "c" / "1" / "1").write_bytes(b"not zstd")
    with pytest.raises(OSError) as err:
        sharing.through(board, "run2", ref).fill_into(poisoned())
    assert str(err.value).startswith(f"dgemm could not read Zarr array file://{tmp_path}/a.zarr rows 0:64, "
                                     f"columns 0:48, chunk (1, 1) (store key 'c/1/1'): ")

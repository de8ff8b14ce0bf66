""":mod:`dgemm.benchmarks.pagecache` (``dgemm bench e2e --cold``): files leave the page cache, and the answer
says how much of them was cached before and after."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from dgemm.benchmarks import pagecache


def droppable(folder: Path) -> str | None:
    """None where files under ``folder`` can leave the page cache; else why not (tmpfs, no fadvise)."""
    why = pagecache.supported()
    if why:
        return why
    probe = folder / "probe.bin"
    probe.write_bytes(os.urandom(1 << 20))
    r = pagecache.drop([probe])
    probe.unlink()
    if r["cached_before"] is None or r["cached_after"] is None:
        return "mincore cannot tell what is cached here"
    return None if r["cached_after"] < r["cached_before"] else f"{folder}'s filesystem keeps its pages (tmpfs?)"


def test_drop_says_what_left_the_page_cache(tmp_path):
    why = droppable(tmp_path)
    if why:
        pytest.skip(why)
    data = os.urandom(3 * 2**20 + 123)                 # not a whole number of pages
    (tmp_path / "d").mkdir()
    for name in ("x.bin", "d/y.bin"):
        (tmp_path / name).write_bytes(data)
    (tmp_path / "d" / "y.bin").read_bytes()
    r = pagecache.drop([tmp_path / "x.bin", tmp_path / "d"])
    assert r["files"] == 2 and r["bytes"] == 2 * len(data)
    assert r["cached_before"] == 2 * len(data)          # just written (dirty) and read: every byte cached
    assert r["cached_after"] == 0 and r["dropped_bytes"] == r["cached_before"]
    assert (tmp_path / "x.bin").read_bytes() == data    # dropped from the cache, not from the disk
    assert pagecache.cached_bytes(tmp_path / "x.bin") == len(data)

"""dgemm.opencl.binaries: the disk cache of finished programs, on plain bytes.

The PTX route it serves runs on NVIDIA's OpenCL only (tests/test_ptx_cache.py,
``-m gpu``); keying, atomic writes, damaged entries and concurrent writers
from several processes are the cache's own and are tested here.
"""
from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from dgemm import config
from dgemm.opencl import binaries

PARTS = {"sources": "d1", "options": ["-DWG=2"], "device": {"name": "H100", "driver": "580"}, "dgemm": "0.1"}


def payload(seed: int, n: int = 1 << 16) -> bytes:
    """Random, non-constant bytes: a damaged copy cannot look whole by chance."""
    return os.urandom(8) + bytes((seed * 131 + i * 7) % 251 for i in range(n))


def entries(folder) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_the_key_names_every_part_and_nothing_else():
    base = binaries.key(**PARTS)
    assert base == binaries.key(**dict(reversed(list(PARTS.items()))))   # order does not matter
    for name in PARTS:
        changed = {**PARTS, name: "something else"}
        assert binaries.key(**changed) != base, name
    assert binaries.key(**{**PARTS, "device": {"name": "H100", "driver": "581"}}) != base   # a new driver
    assert binaries.key(**PARTS, extra=()) != base


def test_an_entry_round_trips_and_is_written_whole(tmp_path):
    data = payload(1)
    entry = binaries.key(**PARTS)
    assert binaries.load(entry, tmp_path) is None
    path = binaries.store(entry, data, tmp_path)
    assert path is not None and path.parent == tmp_path
    assert binaries.load(entry, tmp_path) == data
    assert entries(tmp_path) == [path.name]                     # no temporary file left beside it
    assert path.read_bytes().startswith(binaries.MAGIC)


@pytest.mark.parametrize("damage", ["truncated", "a byte changed", "empty", "a foreign file", "header only"])
def test_a_damaged_entry_is_ignored_removed_and_built_again(tmp_path, damage):
    data, entry = payload(2), binaries.key(**PARTS)
    path = binaries.store(entry, data, tmp_path)
    raw = path.read_bytes()
    broken = {"truncated": raw[:-100], "a byte changed": raw[:-50] + bytes([raw[-50] ^ 1]) + raw[-49:],
              "empty": b"", "a foreign file": b"\x7fELF" + data, "header only": raw[:len(raw) - len(data)]}[damage]
    path.write_bytes(broken)
    assert binaries.load(entry, tmp_path) is None
    assert not path.exists()                                    # removed: the next writer starts clean
    path.write_bytes(broken)
    built = []
    got, hit = binaries.cached(entry, lambda: (built.append(1) or "program", data), folder=tmp_path)
    assert (got, hit, built) == ("program", False, [1])
    assert binaries.load(entry, tmp_path) == data              # a whole entry took its place


def test_a_hit_does_not_build_and_an_entry_the_loader_refuses_is_built_again(tmp_path):
    data, entry = payload(3), binaries.key(**PARTS)

    def never():
        raise AssertionError("built on a hit")
    binaries.store(entry, data, tmp_path)
    assert binaries.cached(entry, never, use=lambda b: ("loaded", b), folder=tmp_path) == (("loaded", data), True)

    def refuse(b):   # whole, but the driver will not load it
        raise RuntimeError("clBuildProgram failed: INVALID_BINARY")
    fresh = payload(4)
    got, hit = binaries.cached(entry, lambda: ("fresh", fresh), use=refuse, folder=tmp_path)
    assert (got, hit) == ("fresh", False)
    assert binaries.load(entry, tmp_path) == fresh              # the refused entry was replaced


def test_keys_are_hex_so_an_entry_stays_in_its_folder(tmp_path):
    with pytest.raises(ValueError, match="lower-case hex"):
        binaries.store("../elsewhere", b"x", tmp_path)
    assert not (tmp_path.parent / "elsewhere.bin").exists()


def test_an_unwritable_folder_keeps_nothing_and_fails_nothing(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a folder")
    folder = blocker / "programs"
    assert binaries.store(binaries.key(**PARTS), b"data", folder) is None
    got, hit = binaries.cached(binaries.key(**PARTS), lambda: ("program", b"data"), folder=folder)
    assert (got, hit) == ("program", False)


def test_the_setting_turns_the_cache_off_or_moves_it(tmp_path, monkeypatch):
    import platformdirs

    monkeypatch.delenv("DGEMM_PROGRAM_CACHE", raising=False)
    assert binaries.cache_dir() == type(binaries.cache_dir())(platformdirs.user_cache_dir("dgemm")) / "programs"
    monkeypatch.setenv("DGEMM_PROGRAM_CACHE", str(tmp_path / "mine"))
    entry = binaries.key(**PARTS)
    binaries.cached(entry, lambda: ("p", b"data"))
    assert binaries.load(entry, tmp_path / "mine") == b"data"
    monkeypatch.setenv("DGEMM_PROGRAM_CACHE", "off")
    assert binaries.cache_dir() is None
    built = []
    assert binaries.cached(entry, lambda: (built.append(1) or "p", b"data")) == ("p", False)
    assert built == [1] and binaries.load(entry) is None and binaries.store(entry, b"x") is None
    monkeypatch.setenv("DGEMM_PROGRAM_CACHE", "relative/folder")
    with pytest.raises(ValueError, match="DGEMM_PROGRAM_CACHE='relative/folder' must be on, off or an absolute"):
        config.get("program-cache")


def _writer(folder: str, entry: str, seed: int, until: float) -> int:
    """Store this process's payload under ``entry`` again and again until ``until``; how many times."""
    data, n = payload(seed, 1 << 20), 0
    while time.time() < until or n < 20:
        assert binaries.store(entry, data, folder) is not None
        n += 1
    return n


def test_writers_in_two_processes_never_leave_a_reader_a_half_entry(tmp_path):
    """Two processes rewrite one entry (1 MiB, each its own bytes) while this one reads it: every read is one
    writer's whole entry, none is missing or mixed, and no temporary file is left behind."""
    entry = binaries.key(**PARTS)
    seeds = (5, 6)
    wanted = {seed: payload(seed, 1 << 20)[8:] for seed in seeds}   # each writer's own random head aside
    binaries.store(entry, payload(seeds[0], 1 << 20), tmp_path)
    ctx = multiprocessing.get_context("spawn")
    until = time.time() + 4.0
    with ctx.Pool(2) as pool:
        runs = [pool.apply_async(_writer, (str(tmp_path), entry, seed, until)) for seed in seeds]
        reads = 0
        while not all(r.ready() for r in runs) or reads < 50:
            got = binaries.load(entry, tmp_path)
            assert got is not None, "a reader found no whole entry while writers replaced it"
            assert any(got[8:] == w for w in wanted.values()), "a reader got bytes of no single writer"
            reads += 1
        written = [r.get(timeout=60) for r in runs]
    assert min(written) >= 20 and reads >= 50
    assert entries(tmp_path) == [entry + ".bin"]

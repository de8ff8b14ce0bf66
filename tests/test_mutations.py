"""dev/mutations.py: every mutation still finds its anchor, and its tests still exist.

The pass itself takes minutes and is not part of the suite; what rots
silently between passes, when code moves, is a mutation whose anchor is no
longer in its file (reported as ``anchor not found`` only when someone runs
the pass) or whose test file was renamed.  A layout change must carry the
mutations along.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mutations():
    spec = importlib.util.spec_from_file_location("dgemm_dev_mutations", ROOT / "dev" / "mutations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


MODULE = _mutations()


@pytest.mark.parametrize("m", MODULE.MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_has_its_anchor_once_and_its_tests(m):
    assert MODULE.anchor_problem(ROOT, m) is None, f"{m.name}: {MODULE.anchor_problem(ROOT, m)} in {m.file}"
    files = [t for t in m.tests if t.startswith("tests/")]
    assert files and all((ROOT / t.split("::")[0]).is_file() for t in files), f"{m.name}: missing {files}"
    for t in files:     # a test named by its function (renamed since?): its def is there
        if "::" in t:
            name = t.split("::")[-1].split("[")[0]
            assert f"def {name}(" in (ROOT / t.split("::")[0]).read_text(), f"{m.name}: no test {t}"


def test_a_test_killed_by_a_signal_counts_as_caught_and_is_named(tmp_path):
    """A mutation that makes a kernel read out of bounds can crash PoCL's process, not fail a test: the pass
    counts that as caught and names the test that was running (faulthandler's trace)."""
    import os
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_boom.py").write_text(
        "import os\nimport signal\n\n\ndef test_fine():\n    pass\n\n\ndef test_boom():\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n")
    crashed = MODULE.run_tests(tmp_path, dict(os.environ), ("tests/test_boom.py",), timeout=120)
    assert crashed["rc"] == -11
    assert crashed["failed"] == "crashed (signal 11) in tests/test_boom.py::test_boom"
    assert MODULE.outcome(crashed) == "caught"
    fine = MODULE.run_tests(tmp_path, dict(os.environ), ("tests/test_boom.py::test_fine",), timeout=120)
    assert fine["rc"] == 0 and MODULE.outcome(fine) == "SURVIVED"

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

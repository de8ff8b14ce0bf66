"""Where a measurement comes from (dgemm.provenance): the commit, the command line, the time."""
from __future__ import annotations

from dgemm import provenance


def test_command_line():
    assert provenance.command_line(["/x/.venv/bin/dgemm", "bench", "kernel", "--sizes", "64,128"]) == \
        "dgemm bench kernel --sizes 64,128"
    assert provenance.command_line(["bench/overhead.py", "--out", "a b"]) == "bench/overhead.py --out 'a b'"
    assert provenance.command_line(["/x/dgemm/__main__.py", "bench", "kernel"]) == "python -m dgemm bench kernel"


def test_git_commit_falls_back_to_the_environment(monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")
    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    monkeypatch.setenv("DGEMM_COMMIT", "abc1234")
    assert provenance.git_commit() == ("abc1234", None)
    monkeypatch.delenv("DGEMM_COMMIT")
    assert provenance.git_commit() == ("unknown", None)


def test_the_environment_names_the_commit_before_git(monkeypatch):
    """A copy of the tree may carry a stale .git: the commit the caller names wins."""
    monkeypatch.setenv("DGEMM_COMMIT", "abc1234")
    assert provenance.git_commit() == ("abc1234", None)


def test_the_commit_setting_names_the_commit(monkeypatch):
    """The commit comes through dgemm.config: a Dask setting works as the variable does."""
    import dask

    monkeypatch.delenv("DGEMM_COMMIT", raising=False)
    with dask.config.set({"dgemm.commit": "def5678"}):
        assert provenance.git_commit() == ("def5678", None)

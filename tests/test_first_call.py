""":mod:`dgemm.benchmarks.first_call`: the script is a user's, and a script that fails says why.

A first call that succeeds runs in tests/test_e2e.py, inside a whole benchmark run.
"""
from __future__ import annotations

import pytest

from dgemm.benchmarks.first_call import first_call_script, time_first_call


def test_the_script_is_a_users_call():
    script = first_call_script()
    assert "if __name__ == \"__main__\":" in script and "dgemm.matmul(sys.argv[1], sys.argv[2], out=sys.argv[3])" in script
    compile(first_call_script(None, storage_options=True), "first_call.py", "exec")
    with pytest.raises(ValueError, match="zarr's default codec or none"):
        first_call_script(["a codec object"])


def test_a_first_call_that_fails_says_why(tmp_path):
    """The script's own error comes back (here dgemm refuses a missing input before starting a cluster)."""
    with pytest.raises(RuntimeError, match=r"first-call script exited with 1:.*no-such-input"):
        time_first_call(tmp_path / "no-such-input.zarr", tmp_path / "b.zarr", tmp_path / "c.zarr", 8, 8, 8,
                        timeout=120)
    assert not (tmp_path / "c.zarr").exists()

""":mod:`dgemm.benchmarks.first_call`: the script is a user's, a script that fails says why, and the devices
asked for are those its cluster runs on (its record says which).

A first call that succeeds runs in tests/test_e2e.py, inside a whole benchmark run.
"""
from __future__ import annotations

import pytest
import zarr

from _check import randn
from conftest import DEVICES
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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_devices_reach_the_script_and_the_record_says_what_it_ran_on(tmp_path, rng):
    """``devices`` (``dgemm bench e2e --first-call --devices``) is the script's cluster: here two workers on one CPU.

    The default on this host would be one worker per GPU, else one on the CPU device.
    """
    cpus = [d for d in DEVICES if d.type == "CPU"]
    if not cpus:
        pytest.skip("no CPU OpenCL device (install pocl-binary-distribution)")
    m, k, n = 64, 48, 40
    for name, data in (("a", randn(rng, (m, k), "float32")), ("b", randn(rng, (k, n), "float32"))):
        zarr.create_array(store=str(tmp_path / f"{name}.zarr"), shape=data.shape, chunks=(16, 16),
                          dtype=data.dtype)[...] = data
    r = time_first_call(tmp_path / "a.zarr", tmp_path / "b.zarr", tmp_path / "c.zarr", m, n, k, devices="cpu,cpu",
                        timeout=240)
    print(f"the script ran on {r['workers']}")
    assert r["ok"] and r["devices"] == "cpu,cpu"
    assert [w["device"] for w in r["workers"]] == [cpus[0].id, cpus[0].id], r["workers"]
    assert sum(w["flops"] for w in r["workers"]) >= 2 * m * n * k
    # where the time went, process by process: the call checked before it started its cluster, its fork server
    # (begun before the checks) preloaded, each of its two workers registered, and those that did block products
    # (both, or one: the product is small) noted their first
    p = r["phases"]
    print(f"phases: {p}")
    script, server, workers = p["script"], p["fork_server"], p["workers"]
    assert script["checks"][1] <= script["cluster"][0] <= script["cluster"][1] <= r["seconds"], script
    assert server["preload"][0] <= script["checks"][0] and None not in server["preload"], server
    assert len(workers) == 2 and all(script["cluster"][0] <= w["worker_process"][0] <= w["register"][1]
                                     for w in workers), workers
    products = [w["first_gemm"][0] for w in workers if "first_gemm" in w]
    assert len(products) == sum(w["flops"] > 0 for w in r["workers"]) and min(products) >= script["checks"][1], p

"""Run the GPU-marked tests (``pytest -m gpu``) and record their summary as JSON.

CI has no GPU, so the tests of the tensor-core kernels and of large sizes
run only where there is one.  Whenever the kernels, the engine or the PTX
pipeline change, run this on the GPU machine and commit the record::

    python dev/gpu_tests.py --out bench/results        # <date>-<device>-gpu-tests.json

The record names the device, its driver, the commit and the command, and
counts passed, failed, skipped and errors (each failure with its test id).
It exits with pytest's status.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)


def summarize(junit_xml: str) -> dict:
    """Counts and failed test ids from a pytest JUnit XML report."""
    root = ET.parse(junit_xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for suite in suites:
        for case in suite.iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            if case.find("failure") is not None:
                out["failed"] += 1
                out["failures"].append(name)
            elif case.find("error") is not None:
                out["errors"] += 1
                out["failures"].append(name)
            elif case.find("skipped") is not None:
                out["skipped"] += 1
            else:
                out["passed"] += 1
    return out


def main(argv=None) -> int:
    from dgemm.benchmarks.records import command_line, git_commit, result_path, utc_now, write_json
    from dgemm.opencl.discovery import list_devices

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join("bench", "results"), help="folder of the JSON record")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = p.parse_args(argv)
    gpus = [d for d in list_devices() if d.type == "GPU"]
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "gpu.xml")
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "--junitxml", xml,
               "tests", *args.pytest_args]
        status = subprocess.call(cmd, cwd=HERE)
        counts = summarize(xml) if os.path.exists(xml) else {"error": "pytest wrote no report"}
    commit, dirty = git_commit()
    date = utc_now()
    record = {"benchmark": "gpu-tests", "date": date, "commit": commit, "commit_dirty": dirty,
              "command": command_line(), "pytest": " ".join(cmd[1:]), "exit_status": status,
              "devices": [{"name": d.name, "driver": d.driver, "platform": d.platform} for d in gpus],
              **counts}
    path = result_path(args.out, date, [d.name for d in gpus] or ["no-gpu"], "gpu-tests")
    write_json(path, record)
    print(f"record written to {path}: {counts}")
    return status


if __name__ == "__main__":
    sys.exit(main())

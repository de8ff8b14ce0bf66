"""deploy/: what can be checked without a GPU cluster.

The Kubernetes manifest parses and asks for GPUs; the job scripts dask-jobqueue
generates from deploy/slurm.py and deploy/pbs.py run ``dgemm worker`` with
flags the command accepts; the Dockerfile registers NVIDIA's OpenCL driver and
installs this package with pins that satisfy pyproject.toml; the preloads the
recipes use install dgemm's plugins.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
import tempfile
from pathlib import Path

import pytest

from dgemm.cli import cli

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomllib (3.11+) or tomli")

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"deploy_{name}", DEPLOY / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse_worker_command(args: list[str]) -> dict:
    """Parse ``dgemm worker ARGS`` as the command line would, without running it; return its parameters."""
    return cli.commands["worker"].make_context("worker", list(args)).params


def dgemm_worker_line(script: str) -> list[str]:
    lines = [ln for ln in script.splitlines() if "-m dgemm worker" in ln]
    assert len(lines) == 1, script
    words = shlex.split(lines[0])
    i = words.index("-m")
    assert words[i + 1:i + 3] == ["dgemm", "worker"], words
    return words[i + 3:]


# -- dask-jobqueue ----------------------------------------------------------------
@pytest.fixture(scope="module")
def jobqueue():
    return pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is a test extra: pip install -e '.[test]'")


def test_slurm_job_script_runs_dgemm_worker(jobqueue):
    from dask.utils import parse_bytes
    from dask_jobqueue.slurm import SLURMJob

    kw = load("slurm").options(gpus_per_node=4, cores=32, memory="256GB", partition="gpu", account="proj",
                               prologue=("source /opt/venv/bin/activate",))
    script = SLURMJob(scheduler="tcp://10.0.0.1:8786", name="dgemm-0", **kw).job_script()
    assert "#SBATCH --gres=gpu:4" in script and "#SBATCH -p gpu" in script and "#SBATCH -A proj" in script
    assert "#SBATCH --cpus-per-task=32" in script
    assert script.index("source /opt/venv/bin/activate") < script.index("-m dgemm worker")
    params = parse_worker_command(dgemm_worker_line(script))
    assert params["scheduler"] == "tcp://10.0.0.1:8786"
    assert params["name"] == "dgemm-0" and params["nthreads"] == 8      # 32 cores over 4 GPU workers
    assert params["devices"] == "gpu" and params["death_timeout"] is not None
    assert parse_bytes(params["memory_limit"]) == pytest.approx(parse_bytes("256GB") / 4, rel=0.01)


def test_pbs_job_script_runs_dgemm_worker(jobqueue):
    from dask_jobqueue.pbs import PBSJob

    kw = load("pbs").options(gpus_per_node=2, cores=16, memory="128GB", queue="gpuq")
    script = PBSJob(scheduler="tcp://10.0.0.1:8786", name="dgemm-3", **kw).job_script()
    assert "#PBS -l select=1:ncpus=16:ngpus=2:mem=128gb" in script and "#PBS -q gpuq" in script
    params = parse_worker_command(dgemm_worker_line(script))
    assert params["name"] == "dgemm-3" and params["nthreads"] == 8 and params["devices"] == "gpu"


def test_jobqueue_tls_flags_are_accepted(jobqueue, tmp_path):
    """jobqueue turns ``security=`` into --tls-* flags of the worker command."""
    from dask_jobqueue.slurm import SLURMJob
    from distributed.security import Security

    files = {n: tmp_path / f"{n}.pem" for n in ("ca", "cert", "key")}
    for f in files.values():
        f.write_text("x")
    sec = Security(tls_ca_file=str(files["ca"]), tls_worker_cert=str(files["cert"]),
                   tls_worker_key=str(files["key"]), require_encryption=True)
    kw = load("slurm").options(gpus_per_node=1)
    script = SLURMJob(scheduler="tls://10.0.0.1:8786", name="w", security=sec, protocol="tls://", **kw).job_script()
    params = parse_worker_command(dgemm_worker_line(script))
    assert params["tls_ca_file"] == str(files["ca"]) and params["tls_cert"] == str(files["cert"])
    assert params["tls_key"] == str(files["key"]) and params["protocol"] == "tls://"


@pytest.mark.parametrize("name", ["slurm", "pbs"])
def test_recipes_dry_run(jobqueue, name, capsys):
    load(name).main(["a.zarr", "b.zarr", "c.zarr", "--dry-run"])
    out = capsys.readouterr().out
    assert out.startswith("#!/usr/bin/env bash") and "-m dgemm worker tcp://SCHEDULER:8786" in out


# -- Kubernetes ---------------------------------------------------------------------
def test_kubernetes_manifest():
    yaml = pytest.importorskip("yaml", reason="pyyaml is a test extra")
    [doc] = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "dgemm-cluster.yaml").read_text()))
    assert doc["apiVersion"] == "kubernetes.dask.org/v1" and doc["kind"] == "DaskCluster"
    [worker] = doc["spec"]["worker"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert worker["command"] == ["dgemm"] and worker["args"][0] == "worker"
    params = parse_worker_command([str(a) for a in worker["args"][1:]])
    assert params["name"] == "$(DASK_WORKER_NAME)" and params["devices"] == "gpu"
    # the scheduler's address comes from DASK_SCHEDULER_ADDRESS, which the operator sets
    assert params["scheduler"] is None
    assert next(p for p in cli.commands["worker"].params if p.name == "scheduler").envvar == "DASK_SCHEDULER_ADDRESS"
    port = next(p["containerPort"] for p in worker["ports"] if p["name"] == "http-dashboard")
    assert params["dashboard_address"] == str(port)
    [sched] = doc["spec"]["scheduler"]["spec"]["containers"]
    assert sched["command"] == ["dask"] and sched["args"][0] == "scheduler"
    assert sched["args"][sched["args"].index("--preload") + 1] == "dgemm.scheduler"
    ports = {p["name"]: p["containerPort"] for p in sched["ports"]}
    assert ports == {"tcp-comm": 8786, "http-dashboard": 8787}
    assert {p["targetPort"] for p in doc["spec"]["scheduler"]["service"]["ports"]} == set(ports)
    assert worker["image"] == sched["image"]


# -- Docker -------------------------------------------------------------------------
def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of deploy/Dockerfile, continuation lines joined, comments dropped."""
    lines = [ln for ln in (DEPLOY / "Dockerfile").read_text().splitlines() if not ln.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    return [tuple(ln.split(None, 1)) if " " in ln.strip() else (ln.strip(), "")
            for ln in text.splitlines() if ln.strip()]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_pins() -> dict:
    pins = {}
    for ln in (DEPLOY / "requirements.txt").read_text().splitlines():
        ln = ln.split("#", 1)[0].strip()
        if ln:
            name, eq, version = ln.partition("==")
            assert eq and version, f"not pinned: {ln}"
            pins[_norm(name)] = version
    return pins


def test_dockerfile_registers_the_nvidia_opencl_driver():
    from dgemm.opencl.discovery import nvidia_icd_problem

    instr = dockerfile()
    env = " ".join(a for i, a in instr if i == "ENV")
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env
    run = " ".join(a for i, a in instr if i == "RUN")
    assert "echo libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd" in run
    # the registration is the one `dgemm devices` asks for, and it satisfies dgemm's check
    with tempfile.TemporaryDirectory() as vendors:
        lib = Path(vendors) / "libnvidia-opencl.so.1"
        lib.write_text("")
        hint = nvidia_icd_problem(vendors, (str(lib),))
        assert hint and "echo libnvidia-opencl.so.1 >" in hint
        (Path(vendors) / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
        assert nvidia_icd_problem(vendors, (str(lib),)) is None


def test_dockerfile_installs_this_package_with_its_entrypoint():
    instr = dockerfile()
    [entry] = [a for i, a in instr if i == "ENTRYPOINT"]
    assert json.loads(entry) == ["dgemm"] and "dgemm" in PYPROJECT["project"]["scripts"]
    [cmd] = [a for i, a in instr if i == "CMD"]
    assert json.loads(cmd)[0] in cli.commands
    # COPY sources exist and bring what the build needs: pyproject, its readme, the packages
    sources = {s for i, a in instr if i == "COPY" for s in a.split()[:-1]}
    for s in sources:
        assert (ROOT / s).exists(), s
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"], "dgemm"}
    assert needed <= sources, needed - sources
    run = " ".join(a for i, a in instr if i == "RUN")
    assert "pip install --no-cache-dir -r /tmp/requirements.txt" in run
    assert "pip install --no-cache-dir --no-deps /src/dgemm" in run and "dgemm --version" in run


def test_pinned_versions_satisfy_pyproject():
    from packaging.requirements import Requirement

    pins = requirement_pins()
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        name = _norm(req.name)
        assert name in pins, f"{req.name} is a dependency but not pinned in deploy/requirements.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (dep, pins[name])
    for test_only in ("pocl-binary-distribution", "pytest", "hypothesis"):  # not in the GPU image
        assert test_only not in pins


# -- the preloads the recipes use ---------------------------------------------------------
@pytest.mark.parametrize("preload", ["dgemm.scheduler", "dgemm.dashboard"])   # the second: the earlier name
def test_preloads_install_the_plugins(any_device, preload):
    """``dask scheduler --preload dgemm.scheduler`` and ``dask worker --preload dgemm.worker``, in-process."""
    import asyncio

    from distributed import Scheduler, Worker

    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0",
                             preload=[preload]) as s:
            assert "dgemm-dashboard" in s.plugins and "dgemm-placement" in s.plugins
            async with Worker(s.address, nthreads=1, preload=["dgemm.worker"], dashboard=False,
                              resources={"GPU": 1}) as w:
                plugin = w.plugins["dgemm"]
                assert plugin.state is not None and plugin.state.device is not None, plugin.state.error
                assert "dgemm" in w.metrics
                assert s.workers[w.address].resources == {"GPU": 1}
                # any device (no DGEMM_DEVICE here): the first GPU, else a CPU device
                assert plugin.state.device.info.type in ("GPU", "CPU", "ACCELERATOR")
    asyncio.run(main())

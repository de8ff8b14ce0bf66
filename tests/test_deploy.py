"""dgemm.deploy and deploy/: what can be checked without a GPU cluster or a batch system.

The job scripts dask-jobqueue generates from the packaged recipes
(:mod:`dgemm.deploy.slurm`, :mod:`dgemm.deploy.pbs`, ``dgemm jobqueue ...``)
run ``dgemm worker`` with flags the command accepts, and their clusters'
schedulers carry dgemm's plugins (a real SLURM runs them in
tests/test_slurm.py; PBS has no server in Debian, so its job script is what is
checked); the Kubernetes manifest parses, asks for GPUs and, where
dask-kubernetes is installed, satisfies its DaskCluster resource's schema; the
Dockerfile registers NVIDIA's OpenCL driver and installs this package with pins
that satisfy pyproject.toml; the preloads the recipes use install dgemm's
plugins.
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
    """The packaged recipe ``dgemm.deploy.<name>``."""
    return importlib.import_module(f"dgemm.deploy.{name}")


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


@pytest.mark.parametrize("name, queue", [("slurm", "--partition"), ("pbs", "--queue")])
def test_jobqueue_command_prints_the_job_script(jobqueue, name, queue):
    """``dgemm jobqueue NAME --dry-run``: the recipe's job script, with the command line's values in it."""
    from click.testing import CliRunner

    r = CliRunner().invoke(cli, ["jobqueue", name, "--dry-run", "--jobs", "2", "--gpus-per-node", "2", "--cores", "12",
                                 "--memory", "64GB", queue, "gpuq", "--account", "proj", "--prologue", "module load x",
                                 "--devices", "0:0,0:1", "--interface", "lo"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("#!/usr/bin/env bash") and "-m dgemm worker tcp://SCHEDULER:8786" in r.output
    assert r.output.index("module load x") < r.output.index("-m dgemm worker")
    assert ("#SBATCH -p gpuq" in r.output and "#SBATCH --gres=gpu:2" in r.output and "#SBATCH -A proj" in r.output
            if name == "slurm" else
            "#PBS -q gpuq" in r.output and "#PBS -l select=1:ncpus=12:ngpus=2:mem=64gb" in r.output)
    params = parse_worker_command(dgemm_worker_line(r.output))
    assert params["nthreads"] == 6 and params["devices"] == "0:0,0:1" and params["interface"] == "lo"
    # the library gives the same script
    kw = {"queue" if name == "pbs" else "partition": "gpuq"}
    assert load(name).job_script(gpus_per_node=2, cores=12, memory="64GB", account="proj", prologue=["module load x"],
                                 devices="0:0,0:1", interface="lo", **kw) == r.output


@pytest.mark.parametrize("args, message", [
    (["--cores", "2", "--gpus-per-node", "4"], "cores=2 is fewer than gpus_per_node=4"),
    (["--memory", "lots"], "memory='lots'"),
    (["--devices", " "], "devices=' '"),
    (["--gpus-per-node", "0"], "--gpus-per-node"),
    (["a.zarr", "b.zarr"], "give A, B and OUT"),
])
def test_jobqueue_command_errors_before_anything_is_submitted(jobqueue, args, message, monkeypatch):
    from click.testing import CliRunner

    import dgemm.deploy.jobqueue as recipes

    def no_cluster(*a, **k):
        raise AssertionError("a cluster was started")
    monkeypatch.setattr(recipes, "start_cluster", no_cluster)
    r = CliRunner().invoke(cli, ["jobqueue", "slurm", *args])
    assert r.exit_code == 2 and message in r.output, r.output


def test_jobqueue_command_checks_the_operands_before_submitting(jobqueue, tmp_path, monkeypatch):
    """A missing input or an existing output is refused before any job is queued."""
    from click.testing import CliRunner

    import dgemm.deploy.jobqueue as recipes

    def no_cluster(*a, **k):
        raise AssertionError("a cluster was started")
    monkeypatch.setattr(recipes, "start_cluster", no_cluster)
    r = CliRunner().invoke(cli, ["jobqueue", "slurm", str(tmp_path / "missing.zarr"), str(tmp_path / "b.zarr"),
                                 str(tmp_path / "c.zarr")])
    assert r.exit_code != 0 and "missing.zarr" in r.output, r.output
    # inputs that fit, but an output that is already there (and no --overwrite): refused, and left as it was
    import numpy as np
    import zarr

    rng = np.random.default_rng()
    for name, shape in (("a.zarr", (8, 6)), ("b.zarr", (6, 4)), ("c.zarr", (8, 4))):
        arr = zarr.create_array(store=str(tmp_path / name), shape=shape, chunks=shape, dtype="float64")
        arr[...] = rng.standard_normal(shape)
    before = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")[...]
    r = CliRunner().invoke(cli, ["jobqueue", "slurm", *(str(tmp_path / n) for n in ("a.zarr", "b.zarr", "c.zarr"))])
    assert r.exit_code == 2 and "c.zarr" in r.output and "overwrite" in r.output, r.output
    assert (zarr.open_array(str(tmp_path / "c.zarr"), mode="r")[...] == before).all()


def test_pbs_memory_is_never_less_than_asked():
    from dask.utils import parse_bytes

    from dgemm.deploy.jobqueue import pbs_memory

    units = {"kb": 2**10, "mb": 2**20, "gb": 2**30, "tb": 2**40}
    for text in ("256GB", "128GiB", "1.5TB", "0.3kB", "100 MiB", "7tb"):
        got = pbs_memory(text)
        number, unit = int(got[:-2]), got[-2:]
        assert number * units[unit] >= parse_bytes(text), (text, got)
    with pytest.raises(ValueError, match="256"):
        pbs_memory("256")


def test_recipe_options_refuse_what_cannot_make_a_job():
    slurm = load("slurm")
    for kwargs, message in [({"gpus_per_node": 0}, "gpus_per_node must be a positive integer"),
                            ({"cores": 2.5}, "cores must be a positive integer"),
                            ({"memory": "much"}, "memory='much'"),
                            ({"devices": ""}, "devices=''")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            slurm.options(**kwargs)
    with pytest.raises(TypeError, match="sequence of shell lines"):
        slurm.options(prologue="source x")
    with pytest.raises(TypeError, match="#SBATCH options"):
        slurm.options(extra_directives="--exclusive")


@pytest.mark.parametrize("name", ["slurm", "pbs"])
def test_recipe_cluster_has_dgemms_scheduler(jobqueue, name):
    """The cluster a recipe makes (no job submitted): dgemm's scheduler plugins and allowed-failures,
    the caller's own scheduler options and preloads kept beside them."""
    from dgemm.cluster.local import ALLOWED_FAILURES

    cluster = load(name).cluster(gpus_per_node=2, cores=4, memory="8GB", interface="lo",
                                 scheduler_options={"dashboard_address": "127.0.0.1:0", "preload": ["json"]})
    try:
        s = cluster.scheduler
        assert "dgemm-dashboard" in s.plugins and "dgemm-placement" in s.plugins
        assert s.allowed_failures == ALLOWED_FAILURES
        assert [p.name for p in s.preloads] == ["json", "dgemm.scheduler"]
        assert "-m dgemm worker" in cluster.job_script() and "--interface lo" in cluster.job_script()
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
    finally:
        cluster.close()


FAKE_SBATCH = """#!/bin/sh
if [ -n "$DGEMM_TEST_REFUSE" ]; then
  echo "sbatch: error: invalid partition specified: $DGEMM_TEST_REFUSE" >&2
  echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2
  exit 1
fi
# dask-jobqueue submits a scale's jobs at once: the count is read and written under a lock (without it two
# sbatch once read "1 1" while a third wrote, and a job was refused)
until mkdir "$DGEMM_TEST_BATCH/count.lock" 2>/dev/null; do sleep 0.01; done
n=$(cat "$DGEMM_TEST_BATCH/count" 2>/dev/null || echo 100)
n=$((n + 1))
echo $n > "$DGEMM_TEST_BATCH/count"
rmdir "$DGEMM_TEST_BATCH/count.lock"
echo "Submitted batch job $n"
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """``sbatch`` and ``scancel`` stand-ins first on PATH: sbatch numbers the jobs (or refuses them while
    DGEMM_TEST_REFUSE names a partition), scancel notes the ids it is given; no job runs."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "scancel").write_text('#!/bin/sh\necho "$@" >> "$DGEMM_TEST_BATCH/cancelled"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DGEMM_TEST_BATCH", str(tmp_path))
    return tmp_path


def test_submit_turns_a_refused_job_into_one_line(jobqueue, fake_slurm, monkeypatch):
    """A job sbatch refuses: :func:`submit` says what sbatch said, at once; the cluster stays usable and closes."""
    from dgemm.deploy.jobqueue import SubmissionError, submit

    cluster = load("slurm").cluster(gpus_per_node=2, cores=2, memory="2GB", interface="lo",
                                    scheduler_options={"dashboard_address": "127.0.0.1:0"})
    with cluster:
        monkeypatch.setenv("DGEMM_TEST_REFUSE", "nosuch")
        with pytest.raises(SubmissionError) as refused:
            submit(cluster, 2)
        assert str(refused.value).startswith("sbatch refused the job (exit status 1): sbatch: error: invalid "
                                             "partition specified: nosuch"), refused.value
        assert "\n" not in str(refused.value) and not cluster.worker_spec and not cluster.workers
        monkeypatch.delenv("DGEMM_TEST_REFUSE")
        submit(cluster, 1)                        # the same cluster, the partition right: the job is taken
        assert [job.job_id for job in cluster.workers.values()] == ["101"]
    assert (fake_slurm / "cancelled").read_text().split() == ["101"]     # closing the cluster cancelled it


def test_scaling_down_gives_up_jobs_without_workers_first(jobqueue, fake_slurm):
    """Several workers per job (<job>-0, <job>-1): scaling down gives up the jobs none of whose workers are
    there (queued, or ended by scancel) and keeps those whose workers run (distributed alone keeps any two of
    the six: these two once in 15)."""
    import time

    from distributed import Worker

    from dgemm.deploy.jobqueue import submit

    cluster = load("slurm").cluster(gpus_per_node=2, cores=2, memory="2GB", interface="lo",
                                    scheduler_options={"dashboard_address": "127.0.0.1:0"})
    with cluster:
        submit(cluster, 6)
        names = list(cluster.worker_spec)
        live = [names[1], names[4]]      # neither the oldest nor the newest: the order alone cannot pick them

        async def join():        # the live jobs' workers, two each, as their dgemm worker would start them
            return [await Worker(cluster.scheduler_address, name=f"{job}-{i}", nthreads=1)
                    for job in live for i in range(2)]
        workers = cluster.sync(join)
        try:
            deadline = time.monotonic() + 30
            while len(cluster.scheduler_info["workers"]) < 4:
                assert time.monotonic() < deadline, cluster.scheduler_info
                time.sleep(0.1)
            ids = {name: job.job_id for name, job in cluster.workers.items()}
            cluster.scale(jobs=2)
            assert sorted(cluster.worker_spec) == sorted(live)
            deadline = time.monotonic() + 30
            while set(cluster.workers) != set(live):
                assert time.monotonic() < deadline, cluster.workers
                time.sleep(0.1)
            cancelled = (fake_slurm / "cancelled").read_text().split()
            assert sorted(cancelled) == sorted(ids[n] for n in names if n not in live), (cancelled, ids)
        finally:
            async def leave():
                for w in workers:
                    await w.close()
            cluster.sync(leave)


def test_recipes_are_no_longer_scripts_in_deploy():
    """deploy/ keeps the Dockerfile, the manifest, TLS and the walkthrough; the recipes are installed with dgemm."""
    assert not list(DEPLOY.glob("*.py"))
    text = (DEPLOY / "README.md").read_text()
    assert "dgemm jobqueue slurm" in text and "dgemm.deploy" in text


# -- Kubernetes ---------------------------------------------------------------------
def test_kubernetes_manifest():
    yaml = pytest.importorskip("yaml", reason="pyyaml is a test extra")
    [doc] = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "dgemm-cluster.yaml").read_text()))
    assert doc["apiVersion"] == "kubernetes.dask.org/v1" and doc["kind"] == "DaskCluster"
    [worker] = doc["spec"]["worker"]["spec"]["containers"]
    # a quantity as a string: the DaskCluster resource's schema refuses an integer there
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
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


def daskcluster_schema() -> dict:
    """The openAPIV3Schema of the DaskCluster resource, from an installed dask-kubernetes, made strict.

    dask-kubernetes is no test extra: it needs the kubernetes client, whose
    recent releases require python-dateutil>=3 while botocore (s3fs, moto)
    requires <3.  Where it is installed, its operator's Helm chart holds the
    CRD the operator registers.  Kubernetes silently drops fields a
    structural schema does not name (a misspelt one too); ``kubectl apply
    --validate=strict`` refuses them, as ``additionalProperties: false`` does here.
    """
    spec = importlib.util.find_spec("dask_kubernetes")     # located, not imported (that needs its dependencies)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("dask-kubernetes is not installed (not a test extra: the kubernetes client it needs requires "
                    "python-dateutil>=3, botocore <3); pip install dask-kubernetes checks the manifest against "
                    "its DaskCluster schema")
    jsonschema = pytest.importorskip("jsonschema", reason="validating against the CRD's schema needs jsonschema")
    yaml = pytest.importorskip("yaml", reason="pyyaml is a test extra")
    crd_path = (Path(next(iter(spec.submodule_search_locations))) / "operator" / "deployment" / "helm"
                / "dask-kubernetes-operator" / "crds" / "daskcluster.yaml")
    if not crd_path.exists():
        pytest.skip(f"this dask-kubernetes ships no DaskCluster CRD at {crd_path}")
    crd = yaml.safe_load(crd_path.read_text())
    assert crd["spec"]["names"]["kind"] == "DaskCluster", crd_path
    [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]

    def strict(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)
        return node

    schema = strict(v1["schema"]["openAPIV3Schema"])
    return {"schema": schema, "validator": jsonschema.Draft7Validator(schema), "group": crd["spec"]["group"]}


def test_kubernetes_manifest_satisfies_the_daskcluster_schema():
    import copy

    import yaml

    found = daskcluster_schema()
    [doc] = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "dgemm-cluster.yaml").read_text()))
    assert doc["apiVersion"] == f"{found['group']}/v1"
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    errors = sorted(found["validator"].iter_errors(body), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
    # not vacuous: a misspelt field and a wrong type are refused
    bad = copy.deepcopy(body)
    bad["spec"]["worker"]["replica"] = bad["spec"]["worker"].pop("replicas")
    bad["spec"]["worker"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8788"
    assert len(list(found["validator"].iter_errors(bad))) >= 2


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

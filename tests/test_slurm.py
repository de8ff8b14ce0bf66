"""dgemm on a real SLURM: a one-node cluster started here, dgemm workers submitted through dask-jobqueue.

The ``slurm`` fixture writes a ``slurm.conf`` into a temporary folder and runs
``munged`` (with a key of its own), ``slurmctld`` and ``slurmd`` as this
test's child processes on 127.0.0.1, stopped at the end.  The node declares
four GPUs as SLURM's ``gres/gpu`` (placeholder files: SLURM counts and hands
them out, nothing opens them), so the recipes' ``--gres=gpu:G`` requests are
scheduled as on a GPU cluster; each job runs two workers, as a GPU node runs
one per GPU (``--gpus-per-node 2``), both on the PoCL CPU device (``--devices
cpu,cpu``).

Every job runs in a working folder of its own (``--chdir``) that holds decoy
arrays named like the client's, with a temporary folder of its own and none of
the client's environment (``--export=NONE``): relative paths, the client's
temporary folder or a variable set only on the client would give a wrong
result, or none.

The README's "Clusters" commands are run verbatim, with this one-node
cluster's sizes appended (the last value of an option wins).  Then, as its
Python recipe: scale up, a job cancelled (``scancel``) in the middle of a
product (nothing lost, as with a killed worker), scale down; and a job sbatch
refuses, which must end the command at once.  The jobs ``squeue`` listed are
printed and kept in ``test-artifacts/slurm.log``.  Every wait has a deadline,
and every test's jobs are cancelled at its end, so one failure stays one.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import zarr

import dgemm
from _check import check_product, randn, wait_for
from conftest import DEVICES
from dgemm.storage import COMPLETE_ATTR, BlockMarkers
from test_readme import cluster_guide

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])   # the daemons live in sbin
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
MISSING = [b for b in BINARIES if shutil.which(b, path=SBIN) is None]
NODE = "dgemm-node"
# Only the client sets it: a job that saw it would have been given the client's environment.
CLIENT_ONLY = "DGEMM_TEST_CLIENT_ONLY"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"SLURM is not installed ({', '.join(MISSING)} not found): "
                                             "apt-get install slurm-wlm munge (.ci/run does)"),
    pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() != 0,
                       reason="a SLURM of the test's own needs root (slurmd starts every job as its user)"),
    pytest.mark.skipif(not DEVICES, reason="no OpenCL device (pip install pocl-binary-distribution)"),
]


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket stays bound until all are picked, so none is picked twice."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]



SLURM_CONF = """\
ClusterName=dgemmtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/munge/munge.socket
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd.pid
SlurmctldLogFile={base}/slurmctld.log
SlurmdLogFile={base}/slurmd.log
# no cgroups, accounting or MPI: a container's root runs this
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
# several jobs share the node, by CPUs
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
# the node's CPUs and memory as configured below, not as found (CI has 2 cores)
SlurmdParameters=config_overrides
KillWait=5
MinJobAge=5
InactiveLimit=0
GresTypes=gpu
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=8 RealMemory=16000 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


class Slurm:
    """The running one-node SLURM: its folder, the environment its commands need, and its queue."""

    def __init__(self, base: Path, env: dict, log):
        self.base, self.env, self.log = base, env, log

    def run(self, *args, check=True, timeout=60) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def jobs(self) -> list[tuple[str, str, str]]:
        """``(job id, name, state)`` of every job squeue lists."""
        out = self.run("squeue", "-h", "-o", "%i %j %T").stdout
        return [tuple(ln.split()) for ln in out.splitlines() if ln.strip()]

    def show(self, when: str) -> list[tuple[str, str, str]]:
        """squeue's listing, logged (printed and kept in test-artifacts/slurm.log) under ``when``."""
        listing = self.run("squeue", "-o", "%.6i %.9P %.8j %.8T %.6M %.4C %.12b %R").stdout
        self.log(f"squeue, {when}:\n{listing.rstrip()}")
        return self.jobs()

    def running(self) -> list[str]:
        return [i for i, _, state in self.jobs() if state == "RUNNING"]

    def job_outputs(self, folder: Path) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(folder.glob("slurm-*.out")))

    def daemon_logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.base.glob("*.log")))

    def drain(self, timeout: float = 60) -> bool:
        """Cancel every job and wait (at most ``timeout`` s) until squeue lists none; False, logged, if some stay."""
        self.run("scancel", "--full", "-u", "root", check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.run("squeue", "-h", "-o", "%i %T", check=False)
            if left.returncode == 0 and not left.stdout.strip():
                return True
            time.sleep(0.5)
        self.log(f"jobs still listed {timeout:g} s after scancel:\n{left.stdout.rstrip()}")
        return False


@pytest.fixture(scope="module")
def slurm():
    """munged, slurmctld and slurmd started from a generated configuration in a temporary folder; stopped after."""
    import tempfile

    # Short, private paths: munge and slurmd put Unix sockets there (at most 107 bytes of path).
    base = Path(tempfile.mkdtemp(prefix="dgemm-slurm-"))
    for sub in ("munge", "state", "spool"):
        (base / sub).mkdir()
    (base / "munge").chmod(0o700)
    key = base / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    gpus = [base / f"gpu{i}" for i in range(4)]
    for g in gpus:
        g.touch()
    conf = base / "slurm.conf"
    ctld_port, d_port = _free_ports(2)
    conf.write_text(SLURM_CONF.format(host=host, base=base, node=NODE, ctld_port=ctld_port, d_port=d_port))
    (base / "gres.conf").write_text(f"NodeName={NODE} Name=gpu File={base}/gpu[0-3]\n")
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": SBIN}
    ARTIFACTS.mkdir(exist_ok=True)
    artifact = open(ARTIFACTS / "slurm.log", "w")
    t0 = time.monotonic()

    def log(text: str):
        line = f"[{time.monotonic() - t0:6.1f} s] {text}"
        print(line)
        artifact.write(line + "\n")
        artifact.flush()

    procs = []

    def start(name, *args):
        out = open(base / f"{name}.out", "w")
        procs.append((name, subprocess.Popen([name, *args], env=env, stdout=out, stderr=subprocess.STDOUT), out))

    cluster = Slurm(base, env, log)
    try:
        start("munged", "--foreground", "--force", f"--key-file={key}", f"--socket={base}/munge/munge.socket",
              f"--pid-file={base}/munge/munged.pid", f"--seed-file={base}/munge/munged.seed",
              f"--log-file={base}/munge/munged.log")
        wait_for(lambda: (base / "munge" / "munge.socket").exists() or procs[0][1].poll() is not None, 30, "munged")
        assert procs[0][1].poll() is None, (base / "munged.out").read_text()
        start("slurmctld", "-D", "-f", str(conf))
        start("slurmd", "-D", "-N", NODE, "-f", str(conf))

        def idle():
            for name, p, _ in procs:
                if p.poll() is not None:
                    said = (base / f"{name}.out").read_text()
                    raise AssertionError(f"{name} exited:\n{cluster.daemon_logs()}\n{said}")
            r = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False)
            return r.returncode == 0 and r.stdout.strip() == "idle"
        try:
            wait_for(idle, 60, "the SLURM node to be idle")
        except AssertionError as e:
            raise AssertionError(f"{e}:\n{cluster.run('sinfo', '-N', '-l', check=False).stdout}\n"
                                 f"{cluster.daemon_logs()}") from None
        log(f"one-node SLURM up in {base}:\n{cluster.run('sinfo', '-N', '-o', '%N %P %T %c %G').stdout.rstrip()}")
        yield cluster
    finally:
        if procs and procs[-1][0] == "slurmd" and procs[-1][1].poll() is None:
            cluster.drain()       # slurmd ends the jobs' processes: stopped before it, none is left behind
        for name, p, out in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            out.close()
        artifact.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def folders(tmp_path, slurm, monkeypatch):
    """The client's working folder (the test runs there) and a job's, as on another host.

    The job's folder holds decoys named like the client's arrays; the client
    has a temporary folder and a variable of its own that no job gets.
    """
    client, node = tmp_path / "client", tmp_path / "node"
    for d in (client, node, client / "tmp", node / "tmp"):
        d.mkdir()
    monkeypatch.chdir(client)
    monkeypatch.setenv("TMPDIR", str(client / "tmp"))
    monkeypatch.setenv(CLIENT_ONLY, "1")
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    monkeypatch.setenv("PATH", SBIN)
    try:
        yield client, node
    finally:
        if any(True for _ in node.glob("slurm-*.out")):
            slurm.log(f"job outputs in {node}:\n{slurm.job_outputs(node)}")
        # a failed test's jobs would hold the node's GPUs and fail the next test too
        slurm.drain()


# Workers per job: several, as on a GPU node (jobqueue's processes > 1: workers <job>-0, <job>-1), each on
# the CPU device.
PER_JOB = 2


def one_node(node: Path) -> dict:
    """What this one-node cluster adds to the recipe: small jobs of PER_JOB workers on the CPU device, in their
    own folder and environment (the prologue: a node's own temporary folder, the tests' hermetic tuning database,
    and the tests' OpenCL drivers: ``--export=NONE`` keeps conftest's ``OCL_ICD_VENDORS`` from the jobs, whose
    workers would otherwise see a second PoCL where one is installed, and ``cpu`` names every CPU device)."""
    drivers = os.environ.get("OCL_ICD_VENDORS")
    return dict(gpus_per_node=PER_JOB, cores=PER_JOB, memory="4GB", partition="debug",
                devices=",".join(["cpu"] * PER_JOB),
                extra_directives=[f"--chdir={node}", "--export=NONE"],
                prologue=[f"export TMPDIR={node / 'tmp'}",
                          f"export DGEMM_TUNING_DB={shlex.quote(os.environ['DGEMM_TUNING_DB'])}",
                          *([f"export OCL_ICD_VENDORS={shlex.quote(drivers)}"] if drivers else [])])


def as_flags(values: dict) -> list[str]:
    """:func:`one_node`'s values as ``dgemm jobqueue slurm`` options."""
    flags = ["--gpus-per-node", str(values["gpus_per_node"]), "--cores", str(values["cores"]),
             "--memory", values["memory"], "--partition", values["partition"], "--devices", values["devices"],
             "--interface", "lo", "--timeout", "120"]
    flags += [f"--directive={d}" for d in values["extra_directives"]]
    for line in values["prologue"]:
        flags += ["--prologue", line]
    return flags


def zarr_in(path, data, chunks):
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype)
    arr[...] = data
    return arr


def blocks_done(path) -> int:
    try:
        arr = zarr.open_array(str(path), mode="r")
        meta = arr.attrs[COMPLETE_ATTR]
        owner = meta.get("owner") or meta["run"]["id"]
    except Exception:
        return 0
    return len(BlockMarkers(arr, owner).done())


# -- the README's commands ---------------------------------------------------------------------
def test_readme_cluster_guide_runs_on_slurm(slurm, folders, rng):
    """Each line of the README's Clusters guide, run in the client's folder with the one-node values appended."""
    client_dir, node = folders
    guide = cluster_guide()
    sizes = {"a.zarr": ["--shape", "256", "192", "--chunks", "64", "64"],
             "b.zarr": ["--shape", "192", "160", "--chunks", "64", "64"]}
    # decoys where the jobs run: a worker reading a relative path there gets these (or fails on the shape)
    for name, shape in (("a.zarr", (256, 192)), ("b.zarr", (192, 160))):
        zarr_in(node / name, randn(rng, shape), (64, 64))
    env = dict(os.environ)
    ran = []
    for line in guide:
        words = shlex.split(line)
        assert words[0] == "dgemm", line
        added = (sizes[words[2]] if words[1] == "random" else
                 as_flags(one_node(node)) if words[1:3] == ["jobqueue", "slurm"] else [])
        args = [sys.executable, "-m", "dgemm", *words[1:], *added]
        slurm.log(f"$ {line}    (+ {shlex.join(added)})")
        if "--dry-run" in words:
            r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
            script = r.stdout
            assert f"#SBATCH --gres=gpu:{PER_JOB}" in script, script
            assert "-m dgemm worker tcp://SCHEDULER:8786" in script, script
            (client_dir / "job.sh").write_text(script)
            # the real controller accepts the job as written (and places it on the node's GPUs), without running it
            test = slurm.run("sbatch", "--test-only", str(client_dir / "job.sh"), check=False)
            slurm.log(f"sbatch --test-only: {(test.stdout + test.stderr).strip()}")
            assert test.returncode == 0 and NODE in test.stdout + test.stderr, test.stdout + test.stderr
        elif words[1:3] == ["jobqueue", "slurm"]:
            seen = _run_watching_the_queue(slurm, args, env)
            assert max(len(jobs) for jobs in seen) == 2, seen            # --jobs 2, both listed
            wait_for(lambda: not slurm.jobs(), 60, "the command's jobs to be cancelled at its end")
        else:
            r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
        ran.append(words[1])
    assert ran.count("jobqueue") == 2 and ran.count("random") == 2, guide
    a, b = zarr.open_array("a.zarr", mode="r")[...], zarr.open_array("b.zarr", mode="r")[...]
    check_product(dgemm.open_result("c.zarr")[...], a, b, dtype="float32")   # dgemm random: float32 by default
    assert not (node / "c.zarr").exists()


@contextmanager
def _running(args: list[str], env: dict | None = None):
    """``args`` started, its output (stdout and stderr) collected by a thread; killed if still running at the end.

    Yields the process and the list its output lines go to.
    """
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        yield proc, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)


def _run_watching_the_queue(slurm: Slurm, args: list[str], env: dict, timeout: float = 300) -> list[list]:
    """Run ``dgemm jobqueue slurm A B OUT ...`` to its end (at most ``timeout`` s), logging squeue while its jobs
    run."""
    deadline = time.monotonic() + timeout
    seen, logged = [], 0
    with _running(args, env) as (proc, output):
        while proc.poll() is None and time.monotonic() < deadline:
            jobs = slurm.jobs()
            running = [j for j in jobs if j[2] == "RUNNING"]
            if len(running) > logged:       # each time more of its jobs run
                slurm.show(f"{len(running)} of the command's jobs running")
                logged = len(running)
            seen.append(jobs)
            time.sleep(0.5)
        status = proc.poll()
    text = "".join(output)
    slurm.log(f"dgemm jobqueue slurm said:\n{text.rstrip()[-2000:]}")
    assert status is not None, f"still running after {timeout:g} s (killed); squeue listed {seen[-1:]}:\n{text}"
    assert status == 0, text
    workers = 2 * PER_JOB
    assert f"{workers} workers joined" in text and "written to: c.zarr" in text, text
    return seen


def test_jobqueue_command_keeps_the_cluster_until_sigterm(slurm, folders, rng):
    """``dgemm jobqueue slurm`` without A B OUT: the scheduler file for clients, the jobs cancelled on SIGTERM."""
    from distributed import Client

    client_dir, node = folders
    sf = client_dir / "sched.json"
    with _running([sys.executable, "-m", "dgemm", "jobqueue", "slurm", "--jobs", "1", "--scheduler-file",
                   "sched.json", *as_flags(one_node(node))]) as (proc, output):
        wait_for(lambda: (sf.exists() and sf.read_text().strip()) or proc.poll() is not None, 60, "the scheduler file")
        assert proc.poll() is None, "".join(output)
        A, B = randn(rng, (96, 64)), randn(rng, (64, 80))
        zarr_in("a.zarr", A, (32, 64))
        zarr_in("b.zarr", B, (64, 40))
        with Client(scheduler_file=str(sf), timeout="30s", set_as_default=False) as client:
            client.wait_for_workers(PER_JOB, timeout=120)
            assert len(slurm.show("dgemm jobqueue slurm --jobs 1, serving")) == 1
            check_product(dgemm.matmul("a.zarr", "b.zarr", out="c.zarr", client=client)[...], A, B, dtype="float64")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, "".join(output)
    text = "".join(output)
    slurm.log(f"dgemm jobqueue slurm (serving) said:\n{text.rstrip()[-1500:]}")
    assert "scheduler: tcp://127.0.0.1:" in text and "press Ctrl-C to stop" in text, text
    wait_for(lambda: not slurm.jobs(), 60, "its job to be cancelled")


def test_a_refused_job_ends_the_command_at_once(slurm, folders, rng):
    """A job sbatch refuses (no such partition): one line with what sbatch said, exit status 1, nothing queued.

    Without A B OUT the command would otherwise serve forever, with them wait
    --timeout for workers that never come: the subprocess's limit fails it.
    """
    client_dir, node = folders
    zarr_in("a.zarr", randn(rng, (64, 48)), (32, 48))
    zarr_in("b.zarr", randn(rng, (48, 32)), (48, 32))
    for operands in ([], ["a.zarr", "b.zarr", "c.zarr"]):
        args = [sys.executable, "-m", "dgemm", "jobqueue", "slurm", *operands, "--jobs", "2",
                *as_flags(one_node(node)), "--partition", "nosuch"]
        r = subprocess.run(args, capture_output=True, text=True, timeout=90)
        slurm.log(f"$ dgemm jobqueue slurm {shlex.join(operands)} ... --partition nosuch: exit status {r.returncode}\n"
                  f"{r.stderr.rstrip()}")
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
        assert r.returncode == 1 and "Traceback" not in r.stderr and len(errors) == 1, r.stdout + r.stderr
        [error] = errors
        assert error.startswith("Error: sbatch refused the job"), error
        assert "nosuch" in error and "partition" in error.lower(), error
        assert "workers joined" not in r.stdout and not slurm.jobs()
    assert not Path("c.zarr").exists()


# -- the Python recipe: scale up and down, a job cancelled mid-run -----------------------------------
def _job_workers(client, cluster, job_id: str) -> list[str]:
    """Addresses of the workers job ``job_id`` started: jobqueue names them ``<job>-0``, ``<job>-1``, ..."""
    names = [name for name, job in cluster.workers.items() if job.job_id == job_id]
    return [addr for addr, w in client.scheduler_info()["workers"].items()
            if any(str(w["name"]).startswith(f"{name}-") for name in names)]


def test_scale_and_a_cancelled_job_lose_nothing(slurm, folders, rng):
    """``slurm.cluster(...)``, ``cluster.scale(jobs=...)`` up and down, and ``scancel`` of a job mid-product."""
    from distributed import Client

    from dgemm.deploy import slurm as recipe

    client_dir, node = folders
    m, k, n = 2048, 256, 2048
    A, B = randn(rng, (m, k)), randn(rng, (k, n))
    zarr_in("a.zarr", A, (32, k))                   # relative: the client's folder
    zarr_in("b.zarr", B, (k, 32))
    zarr_in(node / "a.zarr", randn(rng, (m, k)), (32, k))   # decoys where the jobs run
    zarr_in(node / "b.zarr", randn(rng, (k, n)), (k, 32))

    cluster = recipe.cluster(**one_node(node), interface="lo",
                             scheduler_options={"dashboard_address": "127.0.0.1:0"})   # 8787 is the session's
    with cluster, Client(cluster, set_as_default=False) as client:
        cluster.scale(jobs=2)
        client.wait_for_workers(2 * PER_JOB, timeout=120)
        assert len(slurm.show("scaled to 2 jobs")) == 2
        names = {w["name"] for w in client.scheduler_info()["workers"].values()}
        assert names == {f"{job}-{i}" for job in cluster.workers for i in range(PER_JOB)}, names
        where = client.run(lambda: (os.getcwd(), os.environ.get("TMPDIR"), os.environ.get(CLIENT_ONLY)))
        assert set(where.values()) == {(str(node), str(node / "tmp"), None)}, where

        with ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            run = pool.submit(dgemm.matmul, "a.zarr", "b.zarr", out="c.zarr", client=client, block=(32, 32, k))

            def busy_job():
                """A running job whose workers hold GEMM tasks, the newest first, and their addresses (as
                seen then: a second look at the scheduler's workers could race with its updates)."""
                if run.done():
                    return "finished", []
                processing = client.processing()
                for job_id in sorted(slurm.running(), key=int, reverse=True):
                    addrs = _job_workers(client, cluster, job_id)
                    if any(processing.get(a) for a in addrs):
                        return job_id, addrs
            wait_for(lambda: blocks_done("c.zarr") >= 4 or run.done(), 120, "the first blocks")
            victim, addrs = wait_for(busy_job, 60, "a job whose workers hold tasks")
            assert victim != "finished", "the product finished before a job could be cancelled: make it longer"
            assert len(addrs) == PER_JOB, addrs
            held = {a: len(client.processing(addrs).get(a, ())) for a in addrs}
            at = blocks_done("c.zarr")
            assert any(held.values()) and not run.done(), (held, at)
            slurm.run("scancel", victim)
            slurm.log(f"scancel {victim} with {at} blocks stored, its workers holding {held} tasks")
            wait_for(lambda: victim not in slurm.running(), 60, f"job {victim} to end")
            wait_for(lambda: not set(addrs) & set(client.scheduler_info()["workers"]), 60,
                      f"job {victim}'s workers to leave")
            left_at = blocks_done("c.zarr")
            assert not run.done(), f"the product ended before job {victim} left: make it longer"
            slurm.log(f"job {victim} and its workers gone with {left_at} blocks stored")
            result = run.result(timeout=240)
            slurm.log(f"product done, {time.monotonic() - started:.1f} s after it began")
        slurm.show("after the cancelled job")
        check_product(result[...], A, B, dtype="float64")
        meta = dgemm.open_result("c.zarr").attrs[COMPLETE_ATTR]
        total = meta["blocks"]        # the grid dgemm chose (block sizes are rounded to its kernel's tiles)
        assert meta["complete"] is True and left_at < total, (meta, left_at)
        owner = meta.get("owner") or meta["run"]["id"]
        # complete: every block was stored (its marker checked), then the markers went (only resume reads them)
        assert meta["blocks_run"] == total and not BlockMarkers(zarr.open_array("c.zarr", mode="r"), owner).done()
        slurm.log(f"all {total} blocks stored, {left_at} of them before job {victim} left")
        assert not (node / "c.zarr").exists()

        # the cancelled job's place is given up, a new job takes it (scale up), then one job goes (scale down)
        cluster.scale(jobs=1)
        wait_for(lambda: len(client.scheduler_info()["workers"]) == PER_JOB and len(slurm.running()) == 1, 60,
                  "one job and its workers")
        cluster.scale(jobs=2)
        client.wait_for_workers(2 * PER_JOB, timeout=120)
        assert len(slurm.show("scaled up again to 2 jobs")) == 2
        cluster.scale(jobs=1)
        wait_for(lambda: len(client.scheduler_info()["workers"]) == PER_JOB, 60,
                  "one job's workers after scaling down")
        wait_for(lambda: len(slurm.jobs()) == 1, 60, "one job after scaling down")
        slurm.show("scaled down to 1 job")
        A2, B2 = randn(rng, (100, 70)), randn(rng, (70, 90))
        zarr_in("a2.zarr", A2, (50, 70))
        zarr_in("b2.zarr", B2, (70, 45))
        check_product(dgemm.matmul("a2.zarr", "b2.zarr", out="c2.zarr", client=client)[...], A2, B2,
                      dtype="float64")
    wait_for(lambda: not slurm.jobs(), 60, "the jobs to be cancelled when the cluster closes")
    slurm.show("cluster closed")

"""Shared fixtures: OpenCL devices and engines reused for the whole session, one
two-worker DeviceCluster for the distributed tests, fresh random inputs.

Kernel compilation is the main cost on PoCL, so each (device, dtype, params)
engine is built once per session (:func:`engine_for`), and every distributed
test shares the ``client`` fixture's cluster.
"""
from __future__ import annotations

import os
import socket
import tempfile

import numpy as np
import pytest

# Hermetic tuning: the user's own tuning database must not change which kernel
# parameters the tests exercise.  Set before any worker process is spawned so
# that the workers inherit it too.
_SESSION_TMP = tempfile.mkdtemp(prefix="dgemm-tests-")
os.environ.setdefault("DGEMM_TUNING_DB", os.path.join(_SESSION_TMP, "no-user-tuning.json"))

# One PoCL: where the host's only OpenCL driver is a system PoCL (Debian's pocl-opencl-icd, which
# .ci/run installs), the tests and their workers use it alone.  pyopencl's ICD loader otherwise also
# loads the PoCL that pocl-binary-distribution puts in pyopencl's folder: the same cores twice (every
# device test runs on both), and that PoCL 3.0 (LLVM 14) builds no kernel on CPUs its LLVM does not
# know ("unknown target CPU 'generic'", AMD Zen 5), where Debian's (3.1, LLVM 15) picks its target by
# the CPU's features.  An ICD file as OCL_ICD_VENDORS is the only form that leaves pyopencl's own
# out.  Hosts with another driver (a GPU's ICD) or no system PoCL, and a set OCL_ICD_VENDORS, keep
# what they have.
_VENDORS = "/etc/OpenCL/vendors"
if "OCL_ICD_VENDORS" not in os.environ and os.path.isdir(_VENDORS) and \
        sorted(f for f in os.listdir(_VENDORS) if f.endswith(".icd")) == ["pocl.icd"]:
    os.environ["OCL_ICD_VENDORS"] = os.path.join(_VENDORS, "pocl.icd")

# numpy operands go to the devices however small: the devices are what the tests check (tests of the
# small-product path set dgemm.small-flops themselves).
import dask  # noqa: E402

dask.config.set({"dgemm.small-flops": 0})

from dgemm.opencl.discovery import list_devices  # noqa: E402
from s3server import s3  # noqa: E402,F401  (the moto S3 server fixture)

DEVICES = list_devices()
HAS_GPU = any(d.type == "GPU" for d in DEVICES)
NO_GPU_REASON = "no GPU OpenCL device"
# Devices of the test cluster: two workers sharing the CPU device by default.
CLUSTER_DEVICES = os.environ.get("DGEMM_TEST_DEVICES", "cpu,cpu")


# The default dashboard port is the user's (their own cluster, another test run): a cluster a test starts
# names its dashboard address (":0", "127.0.0.1:0").  So that a test whose cluster does not fails, the
# session holds 8787 (default_dashboard_port_held) and distributed's warning on falling back is an error.
DEFAULT_DASHBOARD_PORT = 8787


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", f"error:Port {DEFAULT_DASHBOARD_PORT} is already in use:UserWarning")


def pytest_report_header(config):
    lines = [f"OpenCL devices: {', '.join(f'{d.id} {d.name} ({d.type})' for d in DEVICES) or 'none'}"]
    lines.append(f"dgemm test cluster devices: {CLUSTER_DEVICES}")
    return lines


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and not HAS_GPU:
        pytest.skip(NO_GPU_REASON)


# -- devices and engines ------------------------------------------------------
_device_cache: dict = {}
_engine_cache: dict = {}


def get_device(info):
    """One :class:`dgemm.opencl.device.Device` per OpenCL device for the whole session."""
    from dgemm.opencl.device import Device
    if info.id not in _device_cache:
        _device_cache[info.id] = Device(info)
    return _device_cache[info.id]


def engine_for(device, dtype, params=None):
    """The session's :class:`BlockEngine` for ``device``, ``dtype`` and ``params`` (built once)."""
    from dgemm.opencl.engine import BlockEngine
    dtype = np.dtype(dtype)
    if dtype == np.float64 and not device.info.fp64:
        pytest.skip(f"{device.info.name} has no double precision (cl_khr_fp64)")
    key = (device.info.id, dtype, params)
    if key not in _engine_cache:
        _engine_cache[key] = BlockEngine(device, dtype, params)
    return _engine_cache[key]


@pytest.fixture(scope="session", params=DEVICES or [None], ids=[d.name for d in DEVICES] or ["no-device"])
def device(request):
    """Each OpenCL device of this host in turn (engine tests run once per device)."""
    if request.param is None:
        pytest.skip("no OpenCL device on this host (install pocl-binary-distribution for a CPU one)")
    return get_device(request.param)


@pytest.fixture(scope="session")
def any_device():
    """One device (the first CPU device if there is one) for tests that need just one.

    ``DGEMM_TEST_ANY_DEVICE=gpu`` takes the first GPU instead: on a GPU machine the codec tests (round
    trips, fuzz corpora, hostile frames) then run where the kernels' lanes really run at once, which a
    CPU's work-items in turn cannot show (a missing barrier, a race on local memory).
    """
    if not DEVICES:
        pytest.skip("no OpenCL device on this host (install pocl-binary-distribution for a CPU one)")
    kind = os.environ.get("DGEMM_TEST_ANY_DEVICE", "").lower()
    if kind not in ("", "cpu", "gpu"):
        pytest.fail(f"DGEMM_TEST_ANY_DEVICE={kind!r}: cpu (the default) or gpu")
    if kind == "gpu":
        gpus = [d for d in DEVICES if d.type == "GPU"]
        if not gpus:
            pytest.fail("DGEMM_TEST_ANY_DEVICE=gpu, and this host has no GPU OpenCL device")
        return get_device(gpus[0])
    cpus = [d for d in DEVICES if d.type == "CPU"]
    return get_device((cpus or DEVICES)[0])


@pytest.fixture(scope="session")
def gpu_device():
    """The first GPU device (tests marked ``gpu`` skip without one)."""
    gpus = [d for d in DEVICES if d.type == "GPU"]
    if not gpus:
        pytest.skip(NO_GPU_REASON)
    return get_device(gpus[0])


@pytest.fixture(scope="session")
def engines():
    """``engines(device, dtype, params=None)``: the session-cached engine."""
    return engine_for


# -- the cluster --------------------------------------------------------------
@pytest.fixture(scope="session")
def cluster():
    from dgemm.cluster import DeviceCluster
    if not DEVICES:
        pytest.skip("no OpenCL device on this host (install pocl-binary-distribution for a CPU one)")
    c = DeviceCluster(CLUSTER_DEVICES, dashboard_address=":0")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="session")
def client(cluster):
    from distributed import Client
    c = Client(cluster, set_as_default=False)
    c.wait_for_workers(len(cluster.device_ids), timeout=120)
    try:
        yield c
    finally:
        c.close()


# -- the default dashboard port --------------------------------------------------
@pytest.fixture(scope="session", autouse=True)
def default_dashboard_port_held():
    """Hold 127.0.0.1:8787 for the session, so that no cluster a test starts gets it.

    A cluster of this process asking for it then warns that the port is in
    use, an error here (:func:`pytest_configure`): the test that started it
    fails.  One in a subprocess (``dgemm demo``, a user's script) falls back
    to a free port.  Held by another process already: taken either way.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", DEFAULT_DASHBOARD_PORT))
        sock.listen(1)   # listening: a bind to it fails even with SO_REUSEADDR (as tornado binds)
    except OSError:
        sock.close()
        sock = None
    try:
        yield sock
    finally:
        if sock is not None:
            sock.close()


@pytest.fixture(scope="session", autouse=True)
def local_clusters_on_free_ports():
    """dgemm's own local cluster (a call with no client, ``dgemm matmul`` without ``--scheduler``) gets a
    free dashboard port: :func:`dgemm.cluster.local.local_client` starts it with DeviceCluster's default,
    8787, which no caller can change."""
    import dgemm.cluster.local as local

    device_cluster = local.DeviceCluster

    def on_a_free_port(devices=None, **kwargs):
        kwargs.setdefault("dashboard_address", "127.0.0.1:0")
        return device_cluster(devices, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local, "DeviceCluster", on_a_free_port)
        yield


# -- random inputs ------------------------------------------------------------
@pytest.fixture
def rng():
    """A fresh generator per test; the seed is printed (shown when the test fails).

    Set ``DGEMM_TEST_SEED`` to replay a failure.
    """
    seed = int(os.environ.get("DGEMM_TEST_SEED") or np.random.SeedSequence().entropy % 2**63)
    print(f"DGEMM_TEST_SEED={seed}")
    return np.random.default_rng(seed)


class NoClient:
    """Stands in for a client where none may be used: validation must fail first."""

    def __getattr__(self, name):
        raise AssertionError(f"input validation reached the cluster (client.{name})")


@pytest.fixture
def no_client():
    return NoClient()


# -- a cluster started in another working folder --------------------------------
class Elsewhere:
    """A ``dgemm cluster`` process started in its own working folder (``home``), as users run one.

    Relative paths, temporary folders and environment variables of the
    client (the test) must not reach its workers: a test that ``chdir``s to
    ``tmp_path`` and passes relative paths sees what a user sees.  ``home``
    holds nothing a test should read; a wrongly resolved relative path finds
    nothing there (or the decoys a test puts there on purpose).
    """

    def __init__(self, home, client, proc):
        self.home, self.client, self.proc = home, client, proc


@pytest.fixture(scope="session")
def elsewhere(tmp_path_factory):
    """``dgemm cluster`` (two workers) run as a separate process in its own folder; yields an :class:`Elsewhere`."""
    import subprocess
    import sys
    import time

    from distributed import Client

    if not DEVICES:
        pytest.skip("no OpenCL device on this host (install pocl-binary-distribution for a CPU one)")
    home = tmp_path_factory.mktemp("cluster-home")
    sched = home / "scheduler.json"
    # no AWS_*: S3 credentials must reach the workers through storage_options (tests/test_s3.py)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DGEMM_TEST", "AWS_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                      env.get("PYTHONPATH")]))
    log = open(home / "cluster.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "dgemm", "cluster", "--devices", CLUSTER_DEVICES, "--port", "0",
                             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched)],
                            cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not sched.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dgemm cluster did not start: {(home / 'cluster.log').read_text()}")
            time.sleep(0.2)
        client = Client(scheduler_file=str(sched), set_as_default=False)
        client.wait_for_workers(len(CLUSTER_DEVICES.split(",")), timeout=120)
        try:
            yield Elsewhere(home, client, proc)
        finally:
            client.close()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()

"""Device discovery and selection (no OpenCL context is created here)."""
from __future__ import annotations

import pytest

from dgemm.opencl import discovery
from dgemm.opencl.discovery import DeviceInfo, cl_device, icd_hint, list_devices, select_devices, worker_device


def dev(pi, di, name, type_, vendor="v"):
    return DeviceInfo(pi, di, f"plat{pi}", name, vendor, type_, 1 << 30, 65536, 1024, 4, True, None, "")


CPU0 = dev(0, 0, "pthread-Intel Xeon", "CPU", "GenuineIntel")
GPU0 = dev(1, 0, "NVIDIA H100 80GB HBM3", "GPU", "NVIDIA Corporation")
GPU1 = dev(1, 1, "NVIDIA H100 80GB HBM3", "GPU", "NVIDIA Corporation")
ACC = dev(2, 0, "FPGA thing", "ACCELERATOR")
ALL = [CPU0, GPU0, GPU1, ACC]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("DGEMM_DEVICES", raising=False)
    monkeypatch.delenv("DGEMM_DEVICE", raising=False)


@pytest.mark.parametrize("spec,expected", [
    (None, [GPU0, GPU1]),                 # every GPU by default
    ("gpu", [GPU0, GPU1]),
    ("GPU", [GPU0, GPU1]),
    ("cpu", [CPU0]),
    ("accelerator", [ACC]),
    ("all", ALL),
    ("1:1", [GPU1]),
    ("0", [CPU0]),                        # n-th device overall
    ("3", [ACC]),
    ("h100", [GPU0]),                     # a name substring, case-insensitive: the first match
    ("xeon, xeon", [CPU0, CPU0]),         # repeats put several workers on one device
    ("cpu,gpu", [CPU0, GPU0, GPU1]),
    ("1:0,,1:1", [GPU0, GPU1]),           # empty items are ignored
])
def test_select(spec, expected):
    assert select_devices(spec, ALL) == expected


def test_cpu_is_the_first_cpu_device_alone():
    # two drivers offering the host's cores (Debian's PoCL beside pip's; PoCL beside Intel's runtime): one
    # worker a `cpu`, not one per driver, each splitting the same cores
    cpu1 = dev(3, 0, "pthread-skylake-avx512-Intel Xeon", "CPU", "GenuineIntel")
    devices = [GPU0, CPU0, cpu1, ACC]
    assert select_devices("cpu", devices) == [CPU0]
    assert select_devices("cpu,cpu", devices) == [CPU0, CPU0]
    assert select_devices("all", devices) == [GPU0, CPU0, ACC]
    assert select_devices("3:0", devices) == [cpu1]                   # named, the other one
    assert select_devices("skylake", devices) == [cpu1]
    assert select_devices("cpu", [cpu1, CPU0]) == [cpu1]              # the first in platform order


def test_default_without_gpu_is_the_first_cpu():
    cpu1 = dev(0, 1, "second cpu", "CPU")
    assert select_devices(None, [ACC, CPU0, cpu1]) == [CPU0]
    assert select_devices(None, [ACC]) == [ACC]


@pytest.mark.parametrize("spec", ["tpu", "5", "9:9", "gpu"])
def test_no_match_lists_the_devices(spec):
    devices = [CPU0, ACC]
    with pytest.raises(LookupError) as err:
        select_devices(spec, devices)
    msg = str(err.value)
    assert f"no OpenCL device matches {spec!r}" in msg
    assert "0:0 pthread-Intel Xeon (CPU)" in msg and "2:0 FPGA thing (ACCELERATOR)" in msg


def test_no_devices_at_all(monkeypatch):
    monkeypatch.setattr(discovery, "icd_hint", lambda: "HINT")
    with pytest.raises(LookupError, match="no OpenCL device found. HINT"):
        select_devices("cpu", [])


def test_environment_variables(monkeypatch):
    monkeypatch.setenv("DGEMM_DEVICES", "cpu,1:1")
    assert select_devices(None, ALL) == [CPU0, GPU1]
    assert select_devices("gpu", ALL) == [GPU0, GPU1]       # an explicit spec wins
    monkeypatch.setenv("DGEMM_DEVICE", "1:1")
    assert worker_device(ALL) == GPU1
    monkeypatch.setenv("DGEMM_DEVICE", "")
    monkeypatch.delenv("DGEMM_DEVICES")
    assert worker_device(ALL) == GPU0
    monkeypatch.setenv("DGEMM_DEVICE", "nonexistent-device")
    with pytest.raises(LookupError, match="nonexistent-device"):
        worker_device(ALL)


def test_devices_from_the_dask_configuration(monkeypatch):
    """The devices and device settings through dask.config; a DGEMM_* variable wins."""
    import dask

    monkeypatch.delenv("DGEMM_DEVICES", raising=False)
    monkeypatch.delenv("DGEMM_DEVICE", raising=False)
    with dask.config.set({"dgemm.devices": "cpu,1:1", "dgemm.device": "1:1"}):
        assert select_devices(None, ALL) == [CPU0, GPU1]
        assert worker_device(ALL) == GPU1
        monkeypatch.setenv("DGEMM_DEVICE", "0:0")
        assert worker_device(ALL) == CPU0


def test_device_info_properties():
    assert GPU1.id == "1:1"
    assert GPU0.short_vendor == "NVIDIA"
    assert dev(0, 0, "x", "GPU", "Advanced Micro Devices, Inc.").short_vendor == "AMD"
    assert dev(0, 0, "x", "CPU", "Intel(R) Corporation").short_vendor == "Intel"
    assert dev(0, 0, "x", "GPU", "Apple").short_vendor == "Apple"
    assert dev(0, 0, "x", "CPU", "AuthenticAMD").short_vendor == "AMD"
    assert dev(0, 0, "x", "CPU", "Unknown Vendor Ltd").short_vendor == "Unknown Vendor Ltd"


def _fake_fs(monkeypatch, icd_files: dict, libs: list):
    import builtins
    import io

    real_open = builtins.open

    def fake_glob(pattern):
        if pattern.startswith("/etc/OpenCL/vendors"):
            return list(icd_files)
        if "libnvidia-opencl" in pattern:
            return list(libs) if pattern.startswith("/usr/lib/*/") else []
        return []

    def fake_open(path, *a, **k):
        if path in icd_files:
            return io.StringIO(icd_files[path])
        return real_open(path, *a, **k)

    monkeypatch.setattr(discovery.glob, "glob", fake_glob)
    monkeypatch.setattr(discovery.os.path, "isfile", lambda p: p in icd_files)
    monkeypatch.setattr(builtins, "open", fake_open)


def test_icd_hint_unregistered_nvidia_library(monkeypatch):
    _fake_fs(monkeypatch, {"/etc/OpenCL/vendors/pocl.icd": "libpocl.so.2\n"},
             ["/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1"])
    hint = icd_hint()
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1" in hint
    assert "echo libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd" in hint


def test_icd_hint_registered_nvidia_library(monkeypatch):
    _fake_fs(monkeypatch, {"/etc/OpenCL/vendors/nvidia.icd": "libnvidia-opencl.so.1\n"},
             ["/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1"])
    assert "pocl-binary-distribution" in icd_hint()


def test_icd_hint_without_nvidia(monkeypatch):
    _fake_fs(monkeypatch, {}, [])
    hint = icd_hint()
    assert "pip install pocl-binary-distribution" in hint and "nvidia" not in hint.lower()


def test_list_devices_without_platforms(monkeypatch):
    import pyopencl as cl

    def no_platforms():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setattr(cl, "get_platforms", no_platforms)
    assert list_devices() == []


def test_list_devices_on_this_host():
    import pyopencl as cl

    found = list_devices()
    n = sum(len(p.get_devices()) for p in cl.get_platforms())
    assert len(found) == n
    for info in found:
        assert info.type in ("GPU", "CPU", "ACCELERATOR", "OTHER")
        assert info.global_mem > 0 and info.local_mem > 0 and info.max_work_group_size >= 1
        assert cl_device(info).name.strip() == info.name
        assert cl_device(info.id).name.strip() == info.name
        if "portable computing language" in info.platform.lower():
            assert info.architecture == f"pocl-{info.type.lower()}"
    assert sorted({(d.platform_index, d.device_index) for d in found}) == \
        [(d.platform_index, d.device_index) for d in found]


def test_nvidia_icd_problem_names_the_missing_registration(tmp_path):
    from dgemm.opencl.discovery import nvidia_icd_problem
    lib = tmp_path / "lib" / "libnvidia-opencl.so.1"
    lib.parent.mkdir()
    lib.write_text("")
    vendors = tmp_path / "vendors"
    globs = (str(tmp_path / "lib" / "libnvidia-opencl.so*"),)
    msg = nvidia_icd_problem(str(vendors), globs)
    assert msg and str(lib) in msg and "nvidia.icd" in msg and str(vendors) in msg
    vendors.mkdir()
    (vendors / "pocl.icd").write_text("libpocl.so.2")
    assert nvidia_icd_problem(str(vendors), globs) is not None
    (vendors / "nvidia.icd").write_text("libnvidia-opencl.so.1")
    assert nvidia_icd_problem(str(vendors), globs) is None
    assert nvidia_icd_problem(str(vendors), (str(tmp_path / "nowhere" / "*.so"),)) is None

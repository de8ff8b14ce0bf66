"""What OpenCL devices this host has, without creating any context.

Enumerating platforms and devices is cheap and safe in any process (the
client included); contexts and queues are made only in workers
(:mod:`dgemm.opencl.device`).
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from dgemm import config

# The variables of the "device" (the one device a worker process uses) and "devices" (which
# devices a local cluster uses) settings, as launchers and messages name them.


@dataclass(frozen=True)
class DeviceInfo:
    """Facts about one OpenCL device; plain data, safe to send over the wire."""

    platform_index: int
    device_index: int
    platform: str
    name: str
    vendor: str
    type: str            # "GPU", "CPU", "ACCELERATOR" or "OTHER"
    global_mem: int
    local_mem: int
    max_work_group_size: int
    compute_units: int
    fp64: bool
    architecture: str | None
    driver: str

    @property
    def id(self) -> str:
        """``"platform:device"``, the form ``DGEMM_DEVICE`` takes."""
        return f"{self.platform_index}:{self.device_index}"

    @property
    def dmma(self) -> bool:
        """NVIDIA compute capability >= 8.0: float64 ``mma.sync`` reachable through inline PTX."""
        return self.compute_capability >= 80

    @property
    def compute_capability(self) -> int:
        """NVIDIA compute capability as 10*major+minor (e.g. 90), 0 elsewhere."""
        arch = self.architecture or ""
        return int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else 0

    @property
    def short_vendor(self) -> str:
        """The vendor as the tuning database names it (``NVIDIA``, ``AMD``...)."""
        v = self.vendor.lower()
        for needle, name in _VENDORS:
            if needle in v:
                return name
        return self.vendor


_VENDORS = (("nvidia", "NVIDIA"), ("advanced micro", "AMD"), ("amd", "AMD"),
            ("intel", "Intel"), ("apple", "Apple"), ("arm", "ARM"))


def _type_name(t: int) -> str:
    import pyopencl as cl
    for name in ("GPU", "CPU", "ACCELERATOR"):
        if t & getattr(cl.device_type, name):
            return name
    return "OTHER"


def _architecture(dev, platform_name: str) -> str | None:
    try:  # cl_nv_device_attribute_query
        return f"sm_{dev.compute_capability_major_nv}{dev.compute_capability_minor_nv}"
    except Exception:
        pass
    if "portable computing language" in platform_name.lower():
        return f"pocl-{_type_name(dev.type).lower()}"
    return None


def _info(pi: int, di: int, plat, dev) -> DeviceInfo:
    return DeviceInfo(
        platform_index=pi, device_index=di, platform=plat.name.strip(), name=dev.name.strip(),
        vendor=dev.vendor.strip(), type=_type_name(dev.type), global_mem=int(dev.global_mem_size),
        local_mem=int(dev.local_mem_size), max_work_group_size=int(dev.max_work_group_size),
        compute_units=int(dev.max_compute_units),
        fp64=bool(dev.double_fp_config) or "cl_khr_fp64" in dev.extensions,
        architecture=_architecture(dev, plat.name), driver=dev.driver_version.strip())


def list_devices() -> list[DeviceInfo]:
    """Every OpenCL device of every platform, in platform order."""
    import pyopencl as cl
    out = []
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # the ICD loader reports "no platforms" as an error
        return []
    for pi, plat in enumerate(platforms):
        try:
            devs = plat.get_devices()
        except cl.Error:
            continue
        out.extend(_info(pi, di, plat, d) for di, d in enumerate(devs))
    return out


def cl_device(info_or_id):
    """The ``pyopencl.Device`` for a :class:`DeviceInfo` or ``"p:d"`` id."""
    import pyopencl as cl
    ident = info_or_id.id if isinstance(info_or_id, DeviceInfo) else info_or_id
    pi, di = (int(x) for x in ident.split(":"))
    return cl.get_platforms()[pi].get_devices()[di]


def select_devices(spec: str | None = None, devices: list[DeviceInfo] | None = None) -> list[DeviceInfo]:
    """Choose devices from a specification.

    ``spec`` is a comma-separated list whose items are ``gpu``, ``cpu``,
    ``all``, a ``platform:device`` id, or a substring of a device name; an
    item may repeat to put several workers on one device.  ``None`` (and
    the ``devices`` setting, ``$DGEMM_DEVICES``, unset) means every GPU,
    else the first CPU device, else the first device.

    ``cpu`` (and ``all``'s CPU) is the first CPU device alone: every CPU
    device of a host runs on the host's same cores, whichever driver offers
    it (PoCL beside Intel's runtime, or two PoCLs), so a worker each would
    split those cores twice over.  Another is named by its id or name.

    >>> d = [DeviceInfo(0, 0, "P", "cpu0", "v", "CPU", 1, 1, 1, 1, True, None, ""),
    ...      DeviceInfo(1, 0, "Q", "gpu0", "v", "GPU", 1, 1, 1, 1, True, None, "")]
    >>> [x.name for x in select_devices(None, d)]
    ['gpu0']
    >>> [x.name for x in select_devices("cpu,cpu", d)]
    ['cpu0', 'cpu0']
    >>> [x.name for x in select_devices("cpu", d + [DeviceInfo(2, 0, "R", "cpu1", "v", "CPU", 1, 1, 1, 1, True, None, "")])]
    ['cpu0']
    >>> select_devices("tpu", d)
    Traceback (most recent call last):
    ...
    LookupError: no OpenCL device matches 'tpu'; devices: 0:0 cpu0 (CPU), 1:0 gpu0 (GPU)
    """
    if devices is None:
        devices = list_devices()
    if spec is None:
        spec = config.get("devices")
    if not devices:
        raise LookupError("no OpenCL device found. " + icd_hint())
    if spec is None:
        gpus = [d for d in devices if d.type == "GPU"]
        cpus = [d for d in devices if d.type == "CPU"]
        return gpus or cpus[:1] or devices[:1]
    chosen: list[DeviceInfo] = []
    first_cpu = next((d for d in devices if d.type == "CPU"), None)
    for item in (s.strip() for s in str(spec).split(",")):
        if not item:
            continue
        low = item.lower()
        if low == "all":
            hits = [d for d in devices if d.type != "CPU" or d is first_cpu]
        elif low == "cpu":
            hits = [first_cpu] if first_cpu is not None else []
        elif low in ("gpu", "accelerator"):
            hits = [d for d in devices if d.type.lower() == low]
        elif ":" in item and all(p.isdigit() for p in item.split(":")):
            hits = [d for d in devices if d.id == item]
        elif item.isdigit():  # n-th device overall
            hits = [devices[int(item)]] if int(item) < len(devices) else []
        else:
            hits = [d for d in devices if low in d.name.lower()][:1]
        if not hits:
            listing = ", ".join(f"{d.id} {d.name} ({d.type})" for d in devices)
            raise LookupError(f"no OpenCL device matches {item!r}; devices: {listing}")
        chosen.extend(hits)
    return chosen


def worker_device(devices: list[DeviceInfo] | None = None) -> DeviceInfo:
    """The device a worker process uses: the ``device`` setting (``$DGEMM_DEVICE``), else as select_devices."""
    return select_devices(config.get("device"), devices)[0]


NVIDIA_LIB_GLOBS = ("/usr/lib*/libnvidia-opencl.so*", "/usr/lib/*/libnvidia-opencl.so*",
                    "/usr/local/nvidia/lib*/libnvidia-opencl.so*")


def nvidia_icd_problem(vendors_dir: str = "/etc/OpenCL/vendors",
                       lib_globs: tuple[str, ...] = NVIDIA_LIB_GLOBS) -> str | None:
    """Say so when NVIDIA's OpenCL driver library is installed but no ICD file registers it.

    Container images often ship ``libnvidia-opencl.so.1`` without
    ``/etc/OpenCL/vendors/nvidia.icd``; the ICD loader then shows no NVIDIA
    platform at all.  Returns the explanation and the fix, or None.
    """
    registered = ""
    for f in glob.glob(os.path.join(vendors_dir, "*.icd")):
        if os.path.isfile(f):
            with open(f) as fh:
                registered += fh.read()
    libs = [p for pat in lib_globs for p in glob.glob(pat)]
    if libs and "nvidia-opencl" not in registered:
        return (f"NVIDIA's OpenCL driver library is present ({libs[0]}) but no ICD file in {vendors_dir} "
                f"registers it, so its GPUs are invisible to OpenCL: run  mkdir -p {vendors_dir} && "
                f"echo libnvidia-opencl.so.1 > {vendors_dir}/nvidia.icd")
    return None


def icd_hint() -> str:
    """What to do when no (suitable) OpenCL device is found."""
    return nvidia_icd_problem() or ("Install an OpenCL driver; for a CPU device: pip install "
                                    "pocl-binary-distribution (pip install 'dgemm[pocl]').")

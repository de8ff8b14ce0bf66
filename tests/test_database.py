"""The tuning database: fallback order, user over shipped, store round trip."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dgemm.opencl import database as tuning
from dgemm.opencl.discovery import DeviceInfo
from dgemm.opencl.params import KernelParams
from dgemm.opencl.database import LEVELS, Choice, lookup, shipped_path, store, user_path

INFO = DeviceInfo(0, 0, "Plat", "Acme X1", "Acme Corporation", "GPU", 2**30, 65536, 1024, 8, True, "acme-arch", "1.0")

P = {  # distinct valid parameter sets, one per level, so the answer shows where it came from
    "device": KernelParams(TSM=16, TSN=16, TSK=16, WPTM=1, WPTN=1, WIDTH=1),
    "architecture": KernelParams(TSM=32, TSN=32, TSK=16, WPTM=4, WPTN=4, WIDTH=4),
    "vendor": KernelParams(TSM=64, TSN=64, TSK=8, WPTM=4, WPTN=4, WIDTH=2),
    "default": KernelParams(TSM=96, TSN=64, TSK=16, WPTM=6, WPTN=4, WIDTH=2),
}


def entry(p, tuned=False, **extra):
    return {"params": p.as_dict(), "tuned": tuned, **extra}


def full_db(dtype="float32"):
    return {
        "device": {INFO.name: {dtype: entry(P["device"], tuned=True)}},
        "architecture": {INFO.architecture: {dtype: entry(P["architecture"])}},
        "vendor": {"Acme Corporation": {dtype: entry(P["vendor"])}},
        "default": {dtype: entry(P["default"])},
    }


def test_fallback_order():
    db = full_db()
    for level in LEVELS:
        c = lookup(INFO, "float32", [("user", db)])
        assert (c.level, c.params, c.database) == (level, P[level], "user")
        if level != "default":
            key = {"device": INFO.name, "architecture": INFO.architecture, "vendor": "Acme Corporation"}[level]
            assert c.key == key
            del db[level]      # remove this level: the next one answers
    del db["default"]
    c = lookup(INFO, "float32", [("user", db)])
    assert (c.level, c.key, c.database, c.tuned) == ("default", "built-in", "none", False)
    assert c.params.problems(4, INFO.max_work_group_size, INFO.local_mem) == []


def test_dtype_entries_are_separate():
    c = lookup(INFO, "float64", [("user", full_db("float32"))])
    assert c.key == "built-in"
    assert lookup(INFO, "float64", [("user", full_db("float64"))]).level == "device"


def test_vendor_level_uses_the_short_vendor_name():
    info = DeviceInfo(0, 0, "NVIDIA CUDA", "NVIDIA H100", "NVIDIA Corporation", "GPU", 2**34, 49152, 1024,
                      132, True, "sm_90", "550")
    db = {"vendor": {"NVIDIA": {"float32": entry(P["vendor"])}}}
    c = lookup(info, "float32", [("shipped", db)])
    assert (c.level, c.key) == ("vendor", "NVIDIA")


def test_no_architecture_skips_that_level():
    info = DeviceInfo(0, 0, "P", "Acme X1", "Acme Corporation", "GPU", 1, 65536, 1024, 1, True, None, "")
    db = full_db()
    del db["device"]
    assert lookup(info, "float32", [("user", db)]).level == "vendor"


def test_user_database_overrides_shipped_at_the_same_level():
    user = {"architecture": {INFO.architecture: {"float32": entry(P["device"], tuned=True)}}}
    shipped = {"architecture": {INFO.architecture: {"float32": entry(P["architecture"])}}}
    c = lookup(INFO, "float32", [("user", user), ("shipped", shipped)])
    assert (c.database, c.params, c.tuned) == ("user", P["device"], True)


def test_more_specific_shipped_entry_beats_less_specific_user_entry():
    user = {"vendor": {"Acme Corporation": {"float32": entry(P["vendor"])}}}
    shipped = {"device": {INFO.name: {"float32": entry(P["device"])}}}
    c = lookup(INFO, "float32", [("user", user), ("shipped", shipped)])
    assert (c.database, c.level) == ("shipped", "device")


def test_invalid_or_too_big_entries_are_skipped():
    bad = KernelParams(TSM=64, WPTM=3)                                      # fails problems()
    too_big = KernelParams(TSM=128, TSN=128, TSK=64, WPTM=8, WPTN=8, WIDTH=4)   # 128 KiB of local memory
    assert too_big.problems(4) == [] and too_big.problems(4, INFO.max_work_group_size, INFO.local_mem)
    db = full_db()
    db["device"][INFO.name]["float32"] = entry(bad)
    db["architecture"][INFO.architecture]["float32"] = entry(too_big)
    assert lookup(INFO, "float32", [("user", db)]).level == "vendor"


def test_describe():
    c = Choice(P["vendor"], "vendor", "NVIDIA", "shipped", False)
    assert c.describe() == ("shipped database, vendor entry 'NVIDIA' (untuned default; `dgemm tune` may help; "
                            "fma kernel)")
    assert "(tuned; fma kernel)" in Choice(P["device"], "device", "X", "user", True).describe()
    assert Choice(P["device"], "device", "X", "user", True, note="why").describe().endswith("; why")


def test_precision_lookup_and_fallback():
    """Named precisions find their entries; a tensor-core precision falls back to FMA where it cannot run."""
    from dgemm.opencl.discovery import DeviceInfo
    h100 = DeviceInfo(0, 0, "NVIDIA CUDA", "H", "NVIDIA Corporation", "GPU", 1, 49152, 1024, 132, True, "sm_90", "")
    cpu = DeviceInfo(0, 0, "PoCL", "C", "Acme", "CPU", 1, 65536, 4096, 2, True, "pocl-cpu", "")
    fma = {"TSM": 64, "TSN": 64, "TSK": 16, "WPTM": 4, "WPTN": 4, "WIDTH": 2}
    dmma = {"TSM": 128, "TSN": 64, "TSK": 8, "WIDTH": 2, "PADA": 4, "PADB": 4, "MMA": 3, "WARPSM": 4, "WARPSN": 2}
    x3 = {"TSM": 128, "TSN": 64, "TSK": 16, "WIDTH": 4, "PADA": 8, "PADB": 8, "MMA": 6, "WARPSM": 4, "WARPSN": 2}
    db = {"architecture": {"sm_90": {"float64": {"params": dmma}, "float64:fma": {"params": fma},
                                     "float32:3xtf32": {"params": x3}}},
          "default": {"float32": {"params": fma}, "float64": {"params": fma}}}
    dbs = [("shipped", db)]
    assert lookup(h100, "float64", dbs).params.precision == "dmma"
    assert lookup(h100, "float64", dbs, precision="fma").params.precision == "fma"
    assert lookup(h100, "float32", dbs).params.precision == "fma"          # defaults never lose accuracy
    assert lookup(h100, "float32", dbs, precision="3xtf32").params.MMA == 6
    c = lookup(h100, "float32", dbs, precision="tf32")                      # no tf32 entry: FMA, said so
    assert c.params.precision == "fma" and "tf32" in c.note
    for prec in ("3xtf32", "tf32"):
        c = lookup(cpu, "float32", dbs, precision=prec)
        assert c.params.precision == "fma" and "compute capability" in c.note
    assert lookup(cpu, "float64", dbs).params.precision == "fma"            # the sm_90 entry is not the CPU's


def test_user_path_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DGEMM_TUNING_DB", str(tmp_path / "db.json"))
    assert user_path() == tmp_path / "db.json"
    monkeypatch.delenv("DGEMM_TUNING_DB")
    assert user_path().name == "tuning.json" and "dgemm" in user_path().parts


def test_env_user_database_overrides_shipped(tmp_path, monkeypatch):
    path = tmp_path / "user.json"
    path.write_text(json.dumps({"architecture": {"pocl-cpu": {"float32": entry(P["default"], tuned=True)}}}))
    monkeypatch.setenv("DGEMM_TUNING_DB", str(path))
    info = DeviceInfo(0, 0, "Portable Computing Language", "cpu-x", "GenuineIntel", "CPU", 2**30, 2**19,
                      4096, 2, True, "pocl-cpu", "")
    c = lookup(info, "float32")
    assert (c.database, c.level, c.params) == ("user", "architecture", P["default"])
    path.unlink()                                    # without it, the shipped entry answers
    c = lookup(info, "float32")
    assert (c.database, c.level) == ("shipped", "architecture")


def test_store_round_trip(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "user.json"
    monkeypatch.setenv("DGEMM_TUNING_DB", str(path))
    p32, p64 = P["architecture"], P["vendor"]
    assert store(INFO, "float32", p32, {"gflops": 123.5, "date": "2025-01-01"}) == path
    store(INFO, "float64", p64, {"gflops": 50.0})
    raw = json.loads(path.read_text())
    assert raw["device"][INFO.name]["float32"] == {"params": p32.as_dict(), "tuned": True, "gflops": 123.5,
                                                   "date": "2025-01-01"}
    assert not path.with_suffix(".tmp").exists()
    c32, c64 = lookup(INFO, "float32"), lookup(INFO, "float64")
    assert (c32.params, c32.level, c32.database, c32.tuned) == (p32, "device", "user", True)
    assert c64.params == p64
    # storing again replaces that entry and keeps the rest of the file
    store(INFO, "float32", p64, {})
    assert lookup(INFO, "float32").params == p64 and lookup(INFO, "float64").params == p64
    other = tmp_path / "explicit.json"
    store(INFO, "float32", p32, {}, path=other)
    assert json.loads(other.read_text())["device"][INFO.name]["float32"]["params"] == p32.as_dict()


def test_shipped_database_entries_are_valid():
    db = json.loads(shipped_path().read_text())
    seen = 0
    for level in ("device", "architecture", "vendor"):
        for key, by_dtype in db.get(level, {}).items():
            for dtype, e in by_dtype.items():
                itemsize = {"float32": 4, "float64": 8}[dtype.split(":")[0]]
                assert KernelParams.from_dict(e["params"]).problems(itemsize) == [], (level, key, dtype)
                seen += 1
    sections = [db["default"]] + [db["default"][t] for t in DEVICE_TYPES if t in db["default"]]
    for section in sections:
        for dtype, e in section.items():
            if dtype in DEVICE_TYPES:
                continue
            assert KernelParams.from_dict(e["params"]).problems({"float32": 4, "float64": 8}[dtype.split(":")[0]]) == []
            seen += 1
    assert seen >= 2


DEVICE_TYPES = ("GPU", "CPU", "ACCELERATOR", "OTHER")
POCL = DeviceInfo(0, 0, "Portable Computing Language", "pthread-Some CPU", "GenuineIntel", "CPU", 2**34,
                  512 * 1024, 4096, 8, True, "pocl-cpu", "3.0")
OTHER_CPU = DeviceInfo(0, 0, "Intel(R) OpenCL", "Some Xeon", "Intel(R) Corporation", "CPU", 2**34, 32 * 1024,
                       8192, 8, True, None, "2023")


def test_shipped_database_gives_cpus_the_cpu_kernel_and_gpus_the_gpu_kernel():
    """CPU devices (PoCL's, and others through the CPU defaults) get GEMMK=1; no GPU entry changed kernel."""
    for info in (POCL, OTHER_CPU):
        for dtype in ("float32", "float64"):
            c = lookup(info, dtype, [("shipped", tuning.load(shipped_path()))])
            assert c.params.GEMMK == 1, (info.name, dtype, c)
            assert c.params.problems(np.dtype(dtype).itemsize, info.max_work_group_size, info.local_mem) == []
    assert lookup(POCL, "float32", [("shipped", tuning.load(shipped_path()))]).level == "architecture"
    c = lookup(OTHER_CPU, "float32", [("shipped", tuning.load(shipped_path()))])
    assert (c.level, c.key) == ("default", "CPU")
    db = tuning.load(shipped_path())
    gpu_sections = [db["default"]] + [by for level in ("device", "architecture", "vendor")
                                      for key, by in db.get(level, {}).items() if key not in ("pocl-cpu",)
                                      and not key.startswith("pthread-")]
    for section in gpu_sections:
        for dtype, e in section.items():
            if dtype not in DEVICE_TYPES:
                assert KernelParams.from_dict(e["params"]).GEMMK == 0, (dtype, e)
    for dtype in ("float32", "float64"):
        assert lookup(INFO, dtype, [("shipped", db)]).params.GEMMK == 0      # a GPU without entries


def test_device_type_defaults_come_before_the_plain_defaults():
    cpu_p = KernelParams(GEMMK=1, TSM=24, TSN=32, TSK=64, WPTM=6, WPTN=16, VWN=8, WIDTH=1)
    db = {"default": {"float32": entry(P["default"]), "CPU": {"float32": entry(cpu_p)}}}
    c = lookup(OTHER_CPU, "float32", [("shipped", db)])
    assert (c.level, c.key, c.params) == ("default", "CPU", cpu_p)
    assert c.describe().startswith("shipped database, default entry 'CPU'")
    c = lookup(INFO, "float32", [("shipped", db)])                          # a GPU: the plain default
    assert (c.level, c.key, c.params) == ("default", "default", P["default"])
    # more specific first, whichever database: the shipped type default beats a plain user default
    user = {"default": {"float32": entry(P["vendor"])}}
    assert lookup(OTHER_CPU, "float32", [("user", user), ("shipped", db)]).params == cpu_p
    # and any higher level beats it
    user = {"vendor": {"Intel": {"float32": entry(P["vendor"])}}}
    assert lookup(OTHER_CPU, "float32", [("user", user), ("shipped", db)]).level == "vendor"
    # an entry the device cannot run is passed over (too much local memory for this one)
    big = KernelParams(GEMMK=1, TSM=192, TSN=256, TSK=512, WPTM=6, WPTN=16, VWN=8, WIDTH=1)
    db["default"]["CPU"]["float32"] = entry(big)
    assert lookup(OTHER_CPU, "float32", [("shipped", db)]).key == "default"
    # no type section, no plain default: the built-in fallback
    assert lookup(OTHER_CPU, "float64", [("shipped", db)]).key == "built-in"


def test_lookup_default_reads_both_databases(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "shipped_path", lambda: tmp_path / "missing.json")
    monkeypatch.setenv("DGEMM_TUNING_DB", str(tmp_path / "also-missing.json"))
    c = lookup(INFO, "float32")
    assert (c.key, c.database) == ("built-in", "none")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_real_device_choice_is_valid(any_device, dtype):
    c = lookup(any_device.info, dtype)
    itemsize = 4 if dtype == "float32" else 8
    assert c.params.problems(itemsize, any_device.info.max_work_group_size, any_device.info.local_mem) == []
    assert c.level in LEVELS


def test_the_wgmma_entry_and_its_mma_sync_fallback():
    """sm_90's tf32 path is the wgmma kernel; wgmma=False (its PTX route failed) takes the mma.sync entry;
    the wgmma entry is never chosen for another architecture, not even a later one."""
    wg = KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=5, GROUPM=8)
    mma = KernelParams(TSM=128, TSN=128, TSK=16, WIDTH=4, PADA=8, PADB=8, MMA=5, WARPSM=2, WARPSN=2)
    db = {"architecture": {arch: {"float32:tf32": entry(wg, tuned=True), "float32:tf32/mma.sync": entry(mma)}
                           for arch in ("sm_90", "sm_100")}}

    def info(arch):
        return DeviceInfo(0, 0, "NVIDIA CUDA", "NVIDIA H100", "NVIDIA Corporation", "GPU", 2**34, 49152, 1024,
                          132, True, arch, "580")
    assert lookup(info("sm_90"), "float32", [("shipped", db)], precision="tf32").params == wg
    assert lookup(info("sm_90"), "float32", [("shipped", db)], precision="tf32", wgmma=False).params == mma
    assert lookup(info("sm_100"), "float32", [("shipped", db)], precision="tf32").params == mma
    shipped = lookup(info("sm_90"), "float32", precision="tf32")   # the shipped database
    assert shipped.params.k_major and shipped.level == "architecture"
    assert lookup(info("sm_90"), "float32", precision="tf32", wgmma=False).params.MMA == 5


def test_a_user_stand_in_does_not_hide_the_shipped_wgmma_entry():
    """At one level the name asked for comes before a later name in any database: a tuned user
    ``float32:tf32/mma.sync`` (what dgemm tune stores for mma.sync) leaves the shipped wgmma entry
    the tf32 choice and is the stand-in; the same name in the user database still wins."""
    wg = KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=5, GROUPM=8)
    wg2 = KernelParams(MMA=7, TSM=64, TSN=192, TSK=32, WARPSM=1, WARPSN=1, STAGES=4, GROUPM=4)
    mma = KernelParams(TSM=128, TSN=128, TSK=16, WIDTH=4, PADA=8, PADB=8, MMA=5, WARPSM=2, WARPSN=2)
    h100 = DeviceInfo(0, 0, "NVIDIA CUDA", "NVIDIA H100", "NVIDIA Corporation", "GPU", 2**34, 49152, 1024,
                      132, True, "sm_90", "580")
    shipped = {"device": {h100.name: {"float32:tf32": entry(wg)}}}
    user = {"device": {h100.name: {"float32:tf32/mma.sync": entry(mma, tuned=True)}}}
    dbs = [("user", user), ("shipped", shipped)]
    c = lookup(h100, "float32", dbs, precision="tf32")
    assert (c.params, c.database) == (wg, "shipped")
    c = lookup(h100, "float32", dbs, precision="tf32", wgmma=False)
    assert (c.params, c.database) == (mma, "user")
    user["device"][h100.name]["float32:tf32"] = entry(wg2, tuned=True)
    assert lookup(h100, "float32", dbs, precision="tf32").params == wg2


def test_hopper_float32_defaults_to_the_wgmma_3xtf32_kernel():
    """On sm_90 float32's default is 3xTF32 on wgmma (faster and at least as accurate, README); "fma" still
    finds the tuned FMA kernel, and where the PTX route fails the default falls back to it, not further."""
    h100 = DeviceInfo(0, 0, "NVIDIA CUDA", "NVIDIA H100 80GB HBM3", "NVIDIA Corporation", "GPU", 2**36, 49152,
                      1024, 132, True, "sm_90", "580")
    h200 = DeviceInfo(0, 0, "NVIDIA CUDA", "NVIDIA H200", "NVIDIA Corporation", "GPU", 2**37, 49152,
                      1024, 132, True, "sm_90", "580")
    for info in (h100, h200):
        default = lookup(info, "float32")
        assert default.params.k_major and default.params.precision == "3xtf32", default
        fma = lookup(info, "float32", precision="fma")
        assert fma.params.precision == "fma" and fma.level in ("device", "architecture") and fma.tuned
        assert lookup(info, "float32", wgmma=False).params == fma.params
    ampere = DeviceInfo(0, 0, "NVIDIA CUDA", "NVIDIA A100", "NVIDIA Corporation", "GPU", 2**35, 49152,
                        1024, 108, True, "sm_80", "580")
    assert lookup(ampere, "float32").params.precision == "fma"

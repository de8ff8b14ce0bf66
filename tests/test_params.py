"""KernelParams: the rules a parameter set must obey, and its conversions."""
from __future__ import annotations

import dataclasses

import pytest

from dgemm.opencl.params import KernelParams, lcm_tiles

VALID = [
    KernelParams(),
    KernelParams(TSM=32, TSN=32, TSK=16, WPTM=4, WPTN=4, WIDTH=4),
    KernelParams(TSM=96, TSN=64, TSK=16, WPTM=6, WPTN=4, WIDTH=2),
    KernelParams(TSM=16, TSN=32, TSK=32, WPTM=2, WPTN=4, WIDTH=1, PADA=1, PADB=3),
    KernelParams(TSM=32, TSN=64, TSK=32, WPTM=2, WPTN=8, WIDTH=8, PADA=8, PADB=8),
    KernelParams(TSM=48, TSN=40, TSK=16, WPTM=3, WPTN=5, WIDTH=1),
    KernelParams(TSM=96, TSN=64, TSK=16, WPTM=6, WPTN=4, WIDTH=2, VWM=2, VWN=4),
    KernelParams(TSM=64, TSN=32, TSK=16, WPTM=8, WPTN=2, WIDTH=2, VWM=8, VWN=2, PADA=8, PADB=2),
]


@pytest.mark.parametrize("p", VALID, ids=str)
@pytest.mark.parametrize("itemsize", [4, 8])
def test_valid_sets_have_no_problems(p, itemsize):
    assert p.problems(itemsize) == []
    assert p.problems(itemsize, max_work_group_size=p.threads, local_mem_size=p.local_mem_bytes(itemsize)) == []


# (parameters, a fragment every message list must contain)
INVALID = {
    "zero-tsm": (dict(TSM=0), "TSM=0 must be a positive integer"),
    "negative-wptn": (dict(WPTN=-4), "WPTN=-4 must be a positive integer"),
    "negative-pad": (dict(PADA=-1), "PADA=-1 must be a non-negative integer"),
    "float-field": (dict(TSK=16.0), "TSK=16.0 must be a positive integer"),
    "width-3": (dict(WIDTH=3, TSM=48, TSN=48, WPTM=3, WPTN=3), "WIDTH=3 must be 1, 2, 4 or 8"),
    "tsm-not-multiple-of-wptm": (dict(TSM=64, WPTM=3), "TSM and TSN must be multiples of WPTM and WPTN"),
    "tsn-not-multiple-of-wptn": (dict(TSN=64, WPTN=5), "TSN must be multiples of WPTM and WPTN"),
    "tsm-not-multiple-of-width": (dict(TSM=36, WPTM=4, WIDTH=8, TSN=64, WPTN=4), "TSM=36 must be a multiple of WIDTH=8"),
    "pada-not-multiple-of-width": (dict(PADA=2, WIDTH=4), "PADA=2 must be a multiple of WIDTH=4"),
    "padb-not-multiple-of-width": (dict(PADB=1, WIDTH=2), "PADB=1 must be a multiple of WIDTH=2"),
    "vwm-3": (dict(VWM=3), "VWM=3 must be 1, 2, 4 or 8"),
    "vwn-16": (dict(VWN=16), "VWN=16 must be 1, 2, 4 or 8"),
    "vwm-vs-wptm": (dict(VWM=8), "WPTM=4 and PADA=0 must be multiples of VWM=8"),
    "vwn-vs-padb": (dict(VWN=4, PADB=2, WIDTH=2), "WPTN=4 and PADB=2 must be multiples of VWN=4"),
    "zero-vwn": (dict(VWN=0), "VWN=0 must be a positive integer"),
    "a-tile-uneven": (dict(TSM=64, TSN=64, TSK=8, WPTM=4, WPTN=4, WIDTH=8),
                      "the A tile (8x64, vectors of 8) does not split evenly over 256 work-items"),
    "b-tile-uneven": (dict(TSM=64, TSN=16, TSK=4, WPTM=1, WPTN=1, WIDTH=1),
                      "does not split evenly"),
}


def test_device_limits():
    p = KernelParams()                       # 256 work-items, 2*16*128*4 bytes of local memory
    assert p.threads == 256 and p.local_mem_bytes(4) == 16384
    assert p.problems(4, max_work_group_size=255) == ["256 work-items per group exceed the device's 255"]
    assert p.problems(4, local_mem_size=16383) == ["16384 bytes of local memory exceed the device's 16383"]
    assert p.problems(8, local_mem_size=16384) == ["32768 bytes of local memory exceed the device's 16384"]
    padded = KernelParams(PADA=4, PADB=4)
    assert padded.local_mem_bytes(4) == 2 * 16 * (64 + 4 + 64 + 4) * 4


def test_geometry():
    p = KernelParams(TSM=96, TSN=64, TSK=16, WPTM=6, WPTN=4, WIDTH=2)
    assert p.local_size == (16, 16)          # (along N, along M)
    assert p.threads == 256
    assert p.tiles == (96, 64, 16)
    q = KernelParams(TSM=64, TSN=32, TSK=8, WPTM=8, WPTN=2, WIDTH=2)
    assert q.local_size == (16, 8) and q.threads == 128


def test_defines_and_dict_round_trip():
    p = KernelParams(TSM=16, TSN=32, TSK=32, WPTM=2, WPTN=4, WIDTH=1, PADA=1, PADB=3)
    assert p.defines() == {"TSM": 16, "TSN": 32, "TSK": 32, "WPTM": 2, "WPTN": 4, "WIDTH": 1, "VWM": 1, "VWN": 1,
                           "PADA": 1, "PADB": 3, "GROUPM": 0, "MMA": 0, "WARPSM": 2, "WARPSN": 2, "GEMMK": 0}
    assert KernelParams.from_dict(p.as_dict()) == p
    assert KernelParams.from_dict({"TSM": "32", "WPTM": 2.0}) == KernelParams(TSM=32, WPTM=2)
    assert hash(p) == hash(KernelParams.from_dict(p.as_dict()))   # usable as a cache key


def test_groupm_zero_or_positive():
    assert KernelParams(GROUPM=0).problems(4) == []
    assert KernelParams(GROUPM=8).problems(4) == []
    assert any("GROUPM" in m for m in KernelParams(GROUPM=-1).problems(4))


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"unknown kernel parameters: \['TILE', 'tsm'\]"):
        KernelParams.from_dict({"TSM": 32, "tsm": 32, "TILE": 8})


def test_lcm_tiles():
    assert lcm_tiles([]) == KernelParams().tiles
    assert lcm_tiles([KernelParams(TSM=32, TSN=32, TSK=16, WPTM=4, WPTN=4)]) == (32, 32, 16)
    assert lcm_tiles([KernelParams(TSM=96, WPTM=6), KernelParams(TSM=64, TSN=40, WPTN=5, TSK=8)]) == (192, 320, 16)


def test_mma_params_rules():
    ok = KernelParams(MMA=1, TSM=64, TSN=64, TSK=16, WARPSM=2, WARPSN=2, WIDTH=2, PADA=4, PADB=4)
    assert ok.problems(8) == [] and ok.threads == 128 and ok.local_size == (64, 2)
    assert any("float64 only" in m for m in ok.problems(4))
    assert KernelParams(MMA=1, TSM=48, TSN=64, WARPSM=4, WARPSN=2, WIDTH=2).problems(8)   # 48 % 32
    assert KernelParams(MMA=1, TSK=6, WIDTH=2).problems(8)                                # TSK % 4
    assert KernelParams(MMA=5).problems(8)
    assert any("multiple of 16" in m for m in KernelParams(MMA=2, TSM=64, TSN=64, WARPSM=8, WARPSN=1, WIDTH=2).problems(8))
    assert any("k=16" in m for m in KernelParams(MMA=4, TSK=8, WIDTH=2).problems(8))


# -- GEMMK=1: the CPU kernel (kernels/gemm_cpu.cl) ------------------------------------
CPU = dict(GEMMK=1, TSM=48, TSN=64, TSK=128, WPTM=6, WPTN=16, VWN=8, WIDTH=1)


@pytest.mark.parametrize("kw", [CPU, dict(CPU, VWN=16), dict(CPU, VWN=1, WPTN=4, TSN=32), dict(CPU, GROUPM=8),
                                dict(CPU, TSM=6, TSN=16, TSK=1), dict(CPU, TSM=40, WPTM=5, TSN=24, WPTN=24)],
                         ids=["6x16", "vwn16", "scalar", "groupm", "one-block", "odd-block"])
def test_cpu_sets_are_valid(kw):
    p = KernelParams(**kw)
    for itemsize in (4, 8):
        assert p.problems(itemsize) == []
        assert p.problems(itemsize, max_work_group_size=1, local_mem_size=p.local_mem_bytes(itemsize)) == []


def test_cpu_geometry():
    """One work-item per group, a TSM x TSN tile each; local memory holds one packed K block of A and B."""
    p = KernelParams(**CPU)
    assert p.local_size == (1, 1) and p.threads == 1
    assert p.launch(96, 256) == ((4, 2), (1, 1))
    assert p.tiles == (48, 64, 128)
    assert p.local_mem_bytes(4) == 128 * (48 + 64) * 4 and p.local_mem_bytes(8) == 128 * (48 + 64) * 8
    assert p.problems(8, local_mem_size=p.local_mem_bytes(8) - 1) == [
        f"{p.local_mem_bytes(8)} bytes of local memory exceed the device's {p.local_mem_bytes(8) - 1}"]


CPU_INVALID = {
    "gemmk-2": (dict(CPU, GEMMK=2), "GEMMK=2 must be 0 (the GPU kernel, gemm.cl) or 1"),
    "gemmk-negative": (dict(CPU, GEMMK=-1), "GEMMK=-1 must be a non-negative integer"),
    "with-mma": (dict(CPU, MMA=1), "GEMMK=1 is an FMA kernel: MMA must be 0, not 1"),
    "vwn-3": (dict(CPU, VWN=3, WPTN=48, TSN=48), "VWN=3 must be one of 1, 2, 4, 8, 16 for GEMMK=1"),
    "vwn-32": (dict(CPU, VWN=32, WPTN=32), "VWN=32 must be one of 1, 2, 4, 8, 16 for GEMMK=1"),
    "width": (dict(CPU, WIDTH=4),
              "GEMMK=1 does not use WIDTH, VWM, PADA, PADB: they must be 1, 1, 0, 0 (not 4, 1, 0, 0)"),
    "vwm": (dict(CPU, VWM=2), "(not 1, 2, 0, 0)"),
    "pad": (dict(CPU, PADA=8, PADB=8), "(not 1, 1, 8, 8)"),
    "wptn-vs-vwn": (dict(CPU, WPTN=12, TSN=48), "WPTN=12 must be a multiple of VWN=8"),
    "tsm-vs-wptm": (dict(CPU, TSM=64), "TSM and TSN must be multiples of WPTM and WPTN"),
    "tsn-vs-wptn": (dict(CPU, TSN=40), "TSM and TSN must be multiples of WPTM and WPTN"),
}


@pytest.mark.parametrize("kw,msg", list(INVALID.values()) + list(CPU_INVALID.values()),
                         ids=list(INVALID) + [f"cpu-{k}" for k in CPU_INVALID])
def test_invalid_sets_are_reported(kw, msg):
    problems = KernelParams(**kw).problems(4)
    assert problems, f"{kw} passed problems()"
    assert any(msg in p for p in problems), problems


def test_gpu_kernel_is_the_default():
    """GEMMK defaults to 0: every parameter set written before it existed still means the GPU kernel."""
    assert KernelParams().GEMMK == 0
    assert KernelParams.from_dict({"TSM": 32, "TSN": 32, "WPTM": 4, "WPTN": 4}).GEMMK == 0
    assert KernelParams().local_size == (16, 16)


def test_wgmma_params_rules():
    """MMA=7 (gemm_wgmma.cl): its own shape rules, its macros, and local memory past the 48 KiB OpenCL reports."""
    p = KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=5, GROUPM=8)
    assert p.k_major and p.precision == "tf32" and p.problems(4, 1024, 49152) == []
    assert p.local_size == (256, 1) and p.launch(256, 384) == ((6 * 256, 1), (256, 1))
    assert p.local_mem_bytes(4) == 5 * 32 * 256 * 4 > 49152
    assert p.defines() == {"WG": 2, "BN": 128, "BK": 32, "STAGES": 5, "GROUPM": 8, "LAYOUT": 2, "ROUND": 0,
                           "SPLIT": 0, "PROMOTE": 1}
    assert KernelParams.from_dict(p.as_dict()) == p
    assert not KernelParams(MMA=5).k_major and "STAGES" not in KernelParams().defines()
    bad = KernelParams(MMA=7, TSM=64, TSN=100, TSK=16, WARPSM=2, WARPSN=2, STAGES=2)
    problems = " | ".join(bad.problems(4))
    for text in ("TSM must be 64 * WARPSM (128), not 64", "WARPSN must be 1", "TSN=100 must be a multiple of 8",
                 "TSK must be 32", "STAGES=2 must be at least 3"):
        assert text in problems, problems
    assert "float32 only" in " ".join(p.problems(8))
    assert "exceed" in " ".join(dataclasses.replace(p, TSN=256, STAGES=8).problems(4))   # 256 KiB > 227

def test_a_cp_async_ring_needs_sm_80_and_counts_its_tiles():
    """STAGES >= 2 on the FMA and mma.sync kernels: a ring of local tiles filled by cp.async (tile_loads.cl)."""
    ring = KernelParams(TSM=64, TSN=256, TSK=8, WPTM=16, WPTN=8, WIDTH=4, VWM=4, VWN=2, PADA=4, PADB=4, STAGES=4)
    assert ring.problems(4, 1024, 49152) == [] and ring.defines()["STAGES"] == 4
    assert ring.local_mem_bytes(4) == 4 * 8 * (68 + 260) * 4 == 2 * dataclasses.replace(ring, STAGES=0).local_mem_bytes(4)
    assert ring.min_compute_capability == 80 and KernelParams(MMA=3, STAGES=3).min_compute_capability == 90
    assert KernelParams().min_compute_capability == 0 and "STAGES" not in KernelParams().defines()
    assert "STAGES=1 must be 0" in " ".join(KernelParams(STAGES=1).problems(4))
    assert "exceed" in " ".join(dataclasses.replace(ring, STAGES=8).problems(4, 1024, 49152))
    cpu = KernelParams(GEMMK=1, TSM=48, TSN=64, TSK=64, WPTM=6, WPTN=16, WIDTH=1, VWN=8, STAGES=3)
    assert "GEMMK=1 (the CPU kernel) copies no tiles by cp.async" in " ".join(cpu.problems(4))


def test_wgmma_3xtf32_params():
    p = KernelParams(MMA=8, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=3)
    assert p.k_major and p.precision == "3xtf32" and p.parts == 2 and p.problems(4, 1024, 49152) == []
    assert p.defines()["SPLIT"] == 1 and p.local_mem_bytes(4) == 2 * 3 * 32 * 256 * 4
    assert KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=3).parts == 1
    assert "exceed" in " ".join(dataclasses.replace(p, STAGES=4).problems(4))   # 256 KiB > 227


def test_promote_is_the_wgmma_3xtf32_kernels_alone():
    """PROMOTE (tiles per IEEE add) reaches gemm_wgmma.cl for MMA=8; elsewhere it must stay 1 and out of -D."""
    p = KernelParams(MMA=8, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=3, PROMOTE=2)
    assert p.problems(4, 1024, 49152) == [] and p.defines()["PROMOTE"] == 2
    assert KernelParams.from_dict(p.as_dict()) == p
    assert KernelParams.from_dict({"MMA": 8, "TSM": 128}).PROMOTE == 1   # entries written before it existed
    assert "PROMOTE" not in KernelParams().defines() and "PROMOTE" not in KernelParams(MMA=3).defines()
    assert "PROMOTE=2 is the wgmma 3xTF32 kernel's" in " ".join(KernelParams(PROMOTE=2).problems(4))
    assert "PROMOTE=2 is the wgmma 3xTF32 kernel's" in " ".join(
        KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=3, PROMOTE=2).problems(4))
    assert "PROMOTE=0 must be a positive integer" in " ".join(dataclasses.replace(p, PROMOTE=0).problems(4))

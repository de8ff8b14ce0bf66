"""The Device layer: dtypes, building (and refusing to build) kernels."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from dgemm.opencl.device import Device, DeviceError, Kernels
from dgemm.tuning.params import KernelParams


@pytest.mark.parametrize("dtype", ["int32", "int64", "complex64", "float16", "bool", "object", "U3"])
def test_check_dtype_refuses(any_device, dtype):
    with pytest.raises(TypeError, match=f"float32 and float64, not {np.dtype(dtype)}"):
        any_device.check_dtype(dtype)


def test_check_dtype_accepts(any_device):
    assert any_device.check_dtype("f4") == np.float32
    if any_device.info.fp64:
        assert any_device.check_dtype(np.float64) == np.float64


def test_float64_without_fp64_is_a_device_error(any_device):
    no_fp64 = copy.copy(any_device)
    no_fp64.info = dataclasses.replace(any_device.info, fp64=False)
    with pytest.raises(DeviceError, match="has no double precision"):
        no_fp64.check_dtype("float64")
    with pytest.raises(DeviceError, match="cl_khr_fp64"):
        no_fp64.kernels("float64")
    assert no_fp64.check_dtype("float32") == np.float32


def test_kernels_built_once_per_dtype_and_params(device):
    p = KernelParams(TSM=32, TSN=32, TSK=16, WPTM=4, WPTN=4, WIDTH=4)
    k1 = device.kernels("float32", p)
    assert isinstance(k1, Kernels)
    assert device.kernels(np.float32, KernelParams.from_dict(p.as_dict())) is k1
    assert k1.params == p and k1.dtype == np.float32
    for name in ("gemm", "pad_zeros", "unpad", "transpose_pad"):
        assert getattr(k1, name) is not None
    if device.info.fp64:
        assert device.kernels("float64", p) is not k1


def test_default_kernels_follow_the_tuning_choice(device):
    choice = device.choice("float32")
    assert device.kernels("float32").params == choice.params
    assert choice.params.problems(4, device.info.max_work_group_size, device.info.local_mem) == []


INVALID = {
    "width-3": KernelParams(WIDTH=3, TSM=48, TSN=48, WPTM=3, WPTN=3),
    "tsm-vs-wptm": KernelParams(TSM=64, WPTM=3),
    "pada-vs-width": KernelParams(PADA=2, WIDTH=4),
    "uneven-tile-load": KernelParams(TSM=64, TSN=64, TSK=8, WPTM=4, WPTN=4, WIDTH=8),
    "vwm-vs-wptm": KernelParams(VWM=8),
    "vwn-vs-padb": KernelParams(VWN=4, PADB=2, WIDTH=2),
}
# What the kernels' own #error directives say about each of those.
PREPROCESSOR_ERRORS = {
    "width-3": "WIDTH must be 1, 2, 4 or 8",
    "tsm-vs-wptm": "TSM and TSN must be multiples of WPTM and WPTN",
    "pada-vs-width": "TSM, TSN, PADA and PADB must be multiples of WIDTH",
    "uneven-tile-load": "each work-item must load a whole number of vectors of each tile",
    "vwm-vs-wptm": "WPTM, PADA must be multiples of VWM and WPTN, PADB of VWN",
    "vwn-vs-padb": "WPTM, PADA must be multiples of VWM and WPTN, PADB of VWN",
}


@pytest.mark.parametrize("name", list(INVALID))
def test_invalid_params_refused_before_building(any_device, name):
    p = INVALID[name]
    assert p.problems(4)
    with pytest.raises(ValueError, match="invalid kernel parameters") as err:
        any_device.kernels("float32", p)
    for problem in p.problems(4):
        assert problem in str(err.value)
    assert ("float32", p) not in {(k[0].name, k[1]) for k in any_device._kernels}


@pytest.mark.parametrize("name", list(INVALID))
def test_kernel_error_directives_fail_the_build(any_device, monkeypatch, name):
    """Forced past problems(), the OpenCL compiler itself refuses the set (#error)."""
    import pyopencl as cl

    monkeypatch.setattr(KernelParams, "problems", lambda self, *a, **k: [])
    with pytest.raises(cl.Error) as err:
        any_device.kernels("float32", INVALID[name])
    assert PREPROCESSOR_ERRORS[name] in str(err.value)


def test_buffer(any_device):
    assert any_device.buffer(0).size >= 1          # zero-size OpenCL buffers are not allowed
    assert any_device.buffer(1000).size == 1000


def test_separate_device_objects_share_nothing(any_device):
    d = Device(any_device.info)
    try:
        assert d.context is not any_device.context
        assert d._kernels == {}
        p = KernelParams(TSM=32, TSN=32, TSK=16, WPTM=4, WPTN=4, WIDTH=4)
        assert d.kernels("float32", p).params == p
    finally:
        d.close()
    assert d._kernels == {}


def test_mma_kernel_refused_without_tensor_cores(device):
    """The DMMA path is compiled out where it cannot run: a clear error, not a build failure."""
    from dgemm.tuning.params import KernelParams
    if device.info.dmma:
        pytest.skip(f"{device.info.name} has float64 tensor cores; the refusal is for devices without")
    with pytest.raises(ValueError, match="compute capability"):
        device.kernels("float64", KernelParams(MMA=1, TSM=64, TSN=64, TSK=16, WIDTH=2, PADA=4, PADB=4))


def test_download_arrays_reuse_page_locked_memory(any_device, monkeypatch):
    """A freed download array gives its pinned buffer back, only once no view of it is left."""
    import gc

    dev = Device(any_device.info)          # its own free list
    monkeypatch.setenv("DGEMM_PINNED_BYTES", str(64 * 64 * 8))
    a = dev.host_array((64, 64), "float64")
    a[...] = 1.5
    assert a.flags.c_contiguous and a.flags.writeable and a.shape == (64, 64)
    b = dev.host_array((64, 64), "float64")            # over the limit: ordinary memory
    assert b.base is None
    addr = a.__array_interface__["data"][0]
    view = a[:, 3]                                      # a view outlives its array (dask slices results)
    del a
    gc.collect()
    c = dev.host_array((64, 64), "float64")            # the memory is still the view's: not lent again
    assert c.__array_interface__["data"][0] != addr and (view == 1.5).all()
    del view
    gc.collect()
    d = dev.host_array((32, 64), "float32")            # now it comes back (smaller fits)
    assert d.__array_interface__["data"][0] == addr
    d[...] = 2.0
    assert (d == 2.0).all()


def test_staging_is_per_thread_and_grows(any_device):
    from concurrent.futures import ThreadPoolExecutor

    s1 = any_device.staging(100)
    assert s1.nbytes == 100 and any_device.staging(50).__array_interface__["data"][0] == \
        s1.__array_interface__["data"][0]
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(lambda: any_device.staging(100).__array_interface__["data"][0]).result()
    assert other != s1.__array_interface__["data"][0]
    assert any_device.staging(10_000).nbytes == 10_000


def test_poisoned_memory_is_nan_in_both_dtypes(any_device, monkeypatch):
    """Under the tests' debug hook every buffer handed out reads as NaN; outside it nothing is filled."""
    import pyopencl as cl

    import dgemm.opencl.device as device_mod

    monkeypatch.setattr(device_mod, "pinned_limit", lambda: 1 << 20)
    with device_mod.poisoned():
        buf = any_device.buffer(64)
        got = np.zeros(8, np.float64)
        cl.enqueue_copy(any_device.queue, got, buf, is_blocking=True)
        assert np.isnan(got).all() and np.isnan(got.view(np.float32)).all()
        staged = any_device.staging(32)
        staged[...] = 0                                  # lent again: poisoned again
        assert np.isnan(any_device.staging(32).view(np.float32)).all()
        assert np.isnan(any_device.host_array((3, 5), "float64")).all()         # page-locked
        monkeypatch.setattr(device_mod, "pinned_limit", lambda: 0)
        assert np.isnan(any_device.host_array((3, 5), "float32")).all()         # ordinary memory
    assert device_mod.POISON is False
    any_device.staging(32)[...] = 0
    assert (any_device.staging(32) == 0).all()                         # outside the hook: not filled

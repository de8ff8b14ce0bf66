"""The Device layer: dtypes, building (and refusing to build) kernels."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from dgemm.opencl.device import Device, DeviceError, Kernels
from dgemm.opencl.params import KernelParams


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


def test_kernels_sharing_a_program_raise_no_retrieval_warning(device):
    # The wgmma kernels reuse the regular program's padding kernels: pyopencl warns at a program's kernel read
    # as an attribute a second time, and those warnings reached every worker's log.
    import warnings

    first = device.kernels("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = Kernels(first.program, first.params, first.dtype)
    assert again.pad_zeros is not first.pad_zeros and again.gemm is not first.gemm


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
    from dgemm.opencl.params import KernelParams
    if device.info.dmma:
        pytest.skip(f"{device.info.name} has float64 tensor cores; the refusal is for devices without")
    with pytest.raises(ValueError, match="compute capability"):
        device.kernels("float64", KernelParams(MMA=1, TSM=64, TSN=64, TSK=16, WIDTH=2, PADA=4, PADB=4))


def test_download_arrays_reuse_page_locked_memory(any_device, monkeypatch):
    """A freed download array gives its pinned buffer back, only once no view of it is left."""
    import gc

    dev = Device(any_device.info)          # its own free list
    dev.idle = False                       # as within a run (an idle device releases what comes back: trim)
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
    from dgemm.opencl import poison
    assert poison.POISON is False
    any_device.staging(32)[...] = 0
    assert (any_device.staging(32) == 0).all()                         # outside the hook: not filled


# -- the CPU kernel (GEMMK=1, kernels/gemm_cpu.cl) --------------------------------------
CPU_SETS = {  # small tiles, so that the odd sizes below take several tiles, register blocks and K blocks
    "6x16-vwn8": KernelParams(GEMMK=1, TSM=12, TSN=32, TSK=16, WPTM=6, WPTN=16, VWN=8, WIDTH=1),
    "vwn16": KernelParams(GEMMK=1, TSM=8, TSN=32, TSK=8, WPTM=4, WPTN=16, VWN=16, WIDTH=1),
    "scalar": KernelParams(GEMMK=1, TSM=8, TSN=8, TSK=5, WPTM=2, WPTN=4, VWN=1, WIDTH=1),
    "odd-block": KernelParams(GEMMK=1, TSM=10, TSN=48, TSK=24, WPTM=5, WPTN=24, VWN=8, WIDTH=1),
    "groupm": KernelParams(GEMMK=1, TSM=12, TSN=16, TSK=32, WPTM=6, WPTN=8, VWN=4, WIDTH=1, GROUPM=2),
    "one-k-block": KernelParams(GEMMK=1, TSM=6, TSN=16, TSK=128, WPTM=6, WPTN=16, VWN=8, WIDTH=1),
}


def _run_gemm(device, dtype, p, a, b, c0, alpha, beta):
    """C = alpha A B + beta C0 by the kernel alone, on inputs zero-padded to its tiles; the padded C back."""
    import pyopencl as cl

    from dgemm.sizes import roundup

    (m, k), n = a.shape, b.shape[1]
    mp, np_, kp = roundup(m, p.TSM), roundup(n, p.TSN), roundup(k, p.TSK)
    at = np.zeros((kp, mp), dtype)
    at[:k, :m] = a.T
    bp = np.zeros((kp, np_), dtype)
    bp[:k, :n] = b
    cp = np.full((mp, np_), np.nan, dtype)      # poisoned: an element the kernel does not write stays NaN
    if c0 is not None:
        cp[:] = 0
        cp[:m, :n] = c0
    kern = device.kernels(dtype, p)
    mf, ctx, q = cl.mem_flags, device.context, device.queue
    bufs = [cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=x) for x in (at, bp, cp)]
    gsize, lsize = p.launch(mp, np_)
    real = np.dtype(dtype).type
    kern.gemm(q, gsize, lsize, np.int32(mp), np.int32(np_), np.int32(kp), real(alpha), real(beta), *bufs).wait()
    out = np.empty_like(cp)
    cl.enqueue_copy(q, out, bufs[2], is_blocking=True)
    return out


@pytest.mark.parametrize("name", list(CPU_SETS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cpu_kernel_matches_numpy(any_device, rng, name, dtype):
    """Odd sizes (padding), several K blocks, alpha and beta, a poisoned C: against float64 numpy."""
    from dgemm.accuracy import tolerance

    if dtype == "float64" and not any_device.info.fp64:
        pytest.skip(f"{any_device.info.name} has no double precision (cl_khr_fp64)")
    p = CPU_SETS[name]
    m, n, k = 53, 37, 71
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    a64, b64, c64 = a.astype(np.float64), b.astype(np.float64), c0.astype(np.float64)
    for alpha, beta, c in ((1.0, 0.0, None), (0.5, -2.0, c0)):
        got = _run_gemm(any_device, dtype, p, a, b, c, alpha, beta)
        assert not np.isnan(got).any(), "the kernel left elements of C unwritten (padding included)"
        assert not got[m:, :].any() and not got[:, n:].any(), "padding rows and columns must come out 0"
        ref = alpha * (a64 @ b64) + (beta * c64 if c is not None else 0)
        scale = abs(alpha) * (np.abs(a64) @ np.abs(b64)) + (abs(beta) * np.abs(c64) if c is not None else 0)
        err = np.max(np.abs(got[:m, :n] - ref) / scale)
        assert err <= tolerance(dtype, k), (alpha, beta, err)


def test_cpu_kernel_beta_zero_ignores_nan_in_c(any_device, rng):
    """BLAS semantics: with beta == 0, C's old contents (NaN here) must not reach the result."""
    p = CPU_SETS["6x16-vwn8"]
    a = rng.standard_normal((24, 40)).astype("float32")
    b = rng.standard_normal((40, 32)).astype("float32")
    got = _run_gemm(any_device, "float32", p, a, b, None, 1.0, 0.0)     # C starts all NaN
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[:24, :32], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


CPU_INVALID = {
    "vwn-vs-wptn": KernelParams(GEMMK=1, TSM=6, TSN=12, TSK=4, WPTM=6, WPTN=12, VWN=8, WIDTH=1),
    "tsm-vs-wptm": KernelParams(GEMMK=1, TSM=8, TSN=16, TSK=4, WPTM=6, WPTN=16, VWN=8, WIDTH=1),
}


@pytest.mark.parametrize("name", list(CPU_INVALID))
def test_cpu_kernel_invalid_params(any_device, monkeypatch, name):
    """Refused before building, and forced past problems(), by the kernel's own #error."""
    import pyopencl as cl

    p = CPU_INVALID[name]
    with pytest.raises(ValueError, match="invalid kernel parameters"):
        any_device.kernels("float32", p)
    monkeypatch.setattr(KernelParams, "problems", lambda self, *a, **k: [])
    with pytest.raises(cl.Error) as err:
        any_device.kernels("float32", p)
    assert "TSM, TSN must be multiples of WPTM, WPTN and WPTN of VWN" in str(err.value)


def _skip_where_wgmma_builds(device):
    if device.info.compute_capability == 90:    # (DGEMM_TEST_ANY_DEVICE=gpu on a Hopper GPU)
        pytest.skip(f"the wgmma kernel builds on {device.info.name}: its fallback is tested where it cannot")


def test_a_wgmma_kernel_the_device_cannot_build_falls_back_and_says_why(any_device):
    """The wgmma kernel's PTX route works on sm_90 only: elsewhere the device builds the kernels the
    database names instead (here: no tf32 path at all, so the FMA kernel) and keeps the reason."""
    _skip_where_wgmma_builds(any_device)
    dev = Device(any_device.info)   # its own: the session's device keeps no failure
    wg = KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=5, GROUPM=8)
    k = dev.kernels(np.float32, wg)
    assert not k.params.k_major and k.params.precision == "fma"
    assert "wgmma is sm_90's" in dev.failed[wg]
    assert dev.kernels(np.float32, wg) is k                     # tried once, not on every call


def test_after_a_wgmma_failure_the_choice_is_its_stand_in_and_says_why(any_device, monkeypatch):
    import dgemm.opencl.device as device_module
    from dgemm.opencl.database import Choice

    wg = KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=5, GROUPM=8)
    fma = KernelParams(TSM=32, TSN=32, TSK=16, WPTM=2, WPTN=2, WIDTH=1)

    def lookup(info, dtype, databases=None, precision=None, wgmma=True):
        return Choice(wg if wgmma else fma, "architecture", "sm_90", "shipped", True)
    monkeypatch.setattr(device_module, "lookup", lookup)
    dev = Device(any_device.info)
    assert dev.choice("float32", "tf32").params == wg                 # nothing failed yet
    dev.failed[wg] = "RuntimeError: clBuildProgram failed"
    c = dev.choice("float32", "tf32")
    assert c.params == fma and "the wgmma kernel failed on this device (RuntimeError: clBuildProgram failed)" in c.note


def test_a_wgmma_failure_is_tried_once_and_kept_as_it_was(any_device, caplog):
    _skip_where_wgmma_builds(any_device)
    dev = Device(any_device.info)
    wg = KernelParams(MMA=7, TSM=128, TSN=128, TSK=32, WARPSM=2, WARPSN=1, STAGES=5, GROUPM=8)
    with caplog.at_level("WARNING", logger="dgemm"):
        first = dev.kernels(np.float32, wg)
        why = dev.failed[wg]
        assert dev.kernels(np.float32, wg) is first and dev.failed[wg] == why
    assert sum("could not be built" in r.getMessage() for r in caplog.records) == 1


# -- the queues that feed the GEMM kernels (queue-priority) -----------------------------------------------------
def test_feeding_queues_ask_for_high_priority_only_where_offered_and_on():
    import dask

    from dgemm.opencl.device import high_priority_queues

    nvidia = "cl_khr_global_int32_base_atomics cl_khr_fp64 cl_khr_priority_hints cl_nv_create_buffer"
    assert high_priority_queues(nvidia)
    assert not high_priority_queues("cl_khr_fp64 cl_khr_throttle_hints")
    assert not high_priority_queues("cl_khr_priority_hints_v2")      # a word of its own, not a prefix
    for value in ("off", "inline"):         # inline: the GEMM kernels' own queue instead
        with dask.config.set({"dgemm.queue-priority": value}):
            assert not high_priority_queues(nvidia)


def test_inline_feeding_puts_the_feeding_kernels_in_the_gemm_queue(any_device):
    """``queue-priority: inline`` (read when a device opens): the feeding kernels' queue and the decode
    slots' queues are the GEMM kernels' own; otherwise the queue the caller's uploads went to, and each
    slot its own."""
    import dask

    assert any_device.inline_feeding is False
    q = any_device.transfer_queue
    assert any_device.kernel_queue(q) is q and any_device.scratch.queue() is not any_device.queue
    with dask.config.set({"dgemm.queue-priority": "inline"}):
        d = Device(any_device.info)
    try:
        assert d.inline_feeding is True and d.priority is False
        assert d.kernel_queue(d.transfer_queue) is d.queue and d.scratch.queue() is d.queue
    finally:
        d.close()


def test_feeding_queues_are_ordinary_where_the_driver_has_no_priority_hints(any_device, rng):
    """Without cl_khr_priority_hints (PoCL) the device asks for nothing more, and its queues work."""
    import dask
    import pyopencl as cl

    hints = "cl_khr_priority_hints" in any_device.cl_device.extensions.split()
    assert any_device.priority == hints
    with dask.config.set({"dgemm.queue-priority": "off"}):
        d = Device(any_device.info)
    try:
        assert d.priority is False
        q = d.feeding_queue()
        x = rng.standard_normal(1000).astype(np.float32)
        buf = d.buffer(x.nbytes, "test")
        cl.enqueue_copy(q, buf, x).wait()
        back = np.empty_like(x)
        cl.enqueue_copy(q, back, buf).wait()
        np.testing.assert_array_equal(back, x)
        buf.release()
    finally:
        d.close()


@pytest.mark.gpu
def test_a_gpus_feeding_queues_are_of_high_priority_where_it_offers_them(gpu_device, engines, rng):
    """Where the driver advertises cl_khr_priority_hints the transfer and decode queues are made with it (or,
    refused, are ordinary and say so); a product through them is right either way."""
    import pyopencl as cl

    from conftest import engine_for

    if "cl_khr_priority_hints" not in gpu_device.cl_device.extensions.split():
        pytest.skip(f"{gpu_device.info.name}'s driver offers no cl_khr_priority_hints: its queues are ordinary")
    q = gpu_device.feeding_queue()
    assert isinstance(q, cl.CommandQueue)
    engine = engine_for(gpu_device, "float32")
    a, b = rng.standard_normal((300, 200)).astype(np.float32), rng.standard_normal((200, 100)).astype(np.float32)
    got = np.asarray(engine.product([(a, b)], 300, 100))
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)

"""The NVIDIA-only paths of the GEMM kernels, checked where no NVIDIA GPU is.

``gemm_dmma.cl`` (mma.sync) and the cp.async ring of ``tile_loads.cl`` (STAGES >= 2) are inline PTX:
PoCL cannot build them.  These tests build them on the CPU device with the PTX replaced by
emulations (the kernels take TILE_CP, TILE_CP_COMMIT, TILE_CP_WAIT, TILE_RING_STATE, DMMA..,
MMA_TF32 and TF32_BITS from the includer when it defines them), so the kernels' own index maps --
which stage a tile goes to and when it is waited for, which fragment element is which row of C
(FRAGPAIRS), the swizzle (SWIZZLE), the fragments read a tile ahead (FRAGPREFETCH) -- run and are
checked against numpy.

* mma.sync: each lane stores its fragments in a scratch array, a barrier, then each lane sums the
  elements of C it owns from everyone's fragments, in the layout the kernel's comments (and the PTX
  ISA) give.  The first version of the kernel (STAGES 0, FRAGPAIRS 0) was checked on the GPU; it
  passing here is what says the emulation reads the fragments as the GPU does.
* cp.async: a copy lands either when it is issued ("early") or only when a cp.async.wait_group
  must have completed it ("late"): the earliest and the latest the hardware allows.  PoCL runs the
  work-items of a group one after the other between barriers, so a copy into a stage someone still
  reads (early) or a wait that does not cover the tile about to be read (late) gives wrong results.
  (Both were seen to: a wait one group short, a refill of the stage being read, a missing barrier,
  the next tile read ahead without waiting for it.)

What this cannot check: speed, registers, and the PTX itself (the last test looks at clang's PTX
when clang-14 or clang-15 is installed: Debian's PoCL, which .ci/run installs, brings clang-15).
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from dgemm.opencl.sources import kernel_dir
from dgemm.opencl.params import KernelParams

# Emulations of the PTX the kernels use.  EMU_* sizes are set per build (-D).
EMULATION = r"""
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
// The state below needs program-scope __global variables (OpenCL C 2.0), where PoCL finds no
// vloadN / vstoreN for the named address spaces: these stand in for them.
#define EMU_VEC_AS(T, N, AS)                                                    \
    __attribute__((overloadable)) T##N emu_vload##N(size_t o, const AS T* p)   \
    {                                                                           \
        T##N v;                                                                 \
        for (int i = 0; i < N; i++) v[i] = p[o * N + i];                        \
        return v;                                                               \
    }                                                                           \
    __attribute__((overloadable)) void emu_vstore##N(T##N v, size_t o, AS T* p) \
    {                                                                           \
        for (int i = 0; i < N; i++) p[o * N + i] = v[i];                        \
    }
#define EMU_VEC(T, N) EMU_VEC_AS(T, N, __global) EMU_VEC_AS(T, N, __local) EMU_VEC_AS(T, N, __private)
EMU_VEC(float, 2) EMU_VEC(float, 4) EMU_VEC(float, 8)
EMU_VEC(double, 2) EMU_VEC(double, 4) EMU_VEC(double, 8)
#undef vload2
#undef vload4
#undef vload8
#undef vstore2
#undef vstore4
#undef vstore8
#define vload2 emu_vload2
#define vload4 emu_vload4
#define vload8 emu_vload8
#define vstore2 emu_vstore2
#define vstore4 emu_vstore4
#define vstore8 emu_vstore8
#define EMU_GROUP() ((int)(get_group_id(1) * get_num_groups(0) + get_group_id(0)))
#define EMU_ITEM() ((int)(get_local_id(1) * get_local_size(0) + get_local_id(0)))

// -- cp.async: a queue of copies per work-item, each tagged with its commit group (private
// state the ring declares through TILE_RING_STATE).  At most STAGES - 1 groups are ever in
// flight; a copy beyond that lands NaN, so a kernel issuing more than the ring should fails. --
#define EMU_QUEUE ((STAGES - 1) * (LPTA + LPTB) * TILE_CP_PIECES)
#define TILE_RING_STATE                                                         \
    ulong emu_dst[EMU_QUEUE], emu_src[EMU_QUEUE];                               \
    int emu_tag[EMU_QUEUE];                                                     \
    int emu_len = 0, emu_committed = 0;

void emu_copy(const ulong dst, const ulong src, const int bytes, const int poison)
{
    __local uchar* d = (__local uchar*)dst;
    const __global uchar* s = (const __global uchar*)src;
    for (int i = 0; i < bytes; i++) d[i] = poison ? 0xff : s[i];   // 0xff..: NaN
}

#define TILE_CP(dst, src)                                                       \
    do {                                                                        \
        if (EMU_LATE && emu_len < EMU_QUEUE) {                                  \
            emu_dst[emu_len] = (ulong)(dst);                                    \
            emu_src[emu_len] = (ulong)(src);                                    \
            emu_tag[emu_len] = emu_committed;                                   \
            emu_len++;                                                          \
        } else {                                                                \
            emu_copy((ulong)(dst), (ulong)(src), TILE_CP_BYTES, EMU_LATE);                     \
        }                                                                       \
    } while (0)
#define TILE_CP_COMMIT() (emu_committed++)
// cp.async.wait_group n: every group but the n newest has landed
#define TILE_CP_WAIT(n)                                                         \
    do {                                                                        \
        int keep_ = 0;                                                          \
        for (int i_ = 0; i_ < emu_len; i_++) {                                  \
            if (emu_tag[i_] < emu_committed - (n)) {                            \
                emu_copy(emu_dst[i_], emu_src[i_], TILE_CP_BYTES, 0);                          \
            } else {                                                            \
                emu_dst[keep_] = emu_dst[i_];                                   \
                emu_src[keep_] = emu_src[i_];                                   \
                emu_tag[keep_] = emu_tag[i_];                                   \
                keep_++;                                                        \
            }                                                                   \
        }                                                                       \
        emu_len = keep_;                                                        \
    } while (0)

// -- mma.sync: lane 4g+q holds A[g + 8h][q + 4s] in a[s * MH + h] (MH = 1 for m8, 2 for m16
// shapes) and B[q + 4s][g] in b[s]; it owns C[g + 8h][2q + e] as c[2h + e] --
__global double emu_frag[EMU_GROUPS][EMU_ITEMS][12];

void emu_mma(const int mh, const int ks, const double* a, const double* b, double* c)
{
    const int grp = EMU_GROUP(), item = EMU_ITEM();
    const int lane = item & 31, warp0 = item - lane, g = lane >> 2, q = lane & 3;
    for (int i = 0; i < mh * ks; i++) emu_frag[grp][item][i] = a[i];
    for (int s = 0; s < ks; s++) emu_frag[grp][item][8 + s] = b[s];
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int h = 0; h < mh; h++) {
        for (int e = 0; e < 2; e++) {
            const int r = g + 8 * h, n = 2 * q + e;
            double sum = 0.0;
            for (int k = 0; k < 4 * ks; k++) {
                const double x = emu_frag[grp][warp0 + (r % 8) * 4 + k % 4][(k / 4) * mh + r / 8];
                const double y = emu_frag[grp][warp0 + n * 4 + k % 4][8 + k / 4];
                sum += x * y;
            }
            c[2 * h + e] += sum;
        }
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
}

#define EMU_MMA(MH, KS, A, B, c0, c1, c2, c3)                                   \
    do {                                                                        \
        double a_[8] = A, b_[4] = B, c_[4] = {c0, c1, c2, c3};                  \
        emu_mma(MH, KS, a_, b_, c_);                                            \
        c0 = c_[0]; c1 = c_[1]; c2 = c_[2]; c3 = c_[3];                         \
    } while (0)
#define L(...) {__VA_ARGS__}
#define DMMA(c0, c1, a, b)                                                      \
    do { double u_ = 0.0, v_ = 0.0; EMU_MMA(1, 1, L(a), L(b), c0, c1, u_, v_); } while (0)
#define DMMA16K4(c0, c1, c2, c3, a0, a1, b0) EMU_MMA(2, 1, L(a0, a1), L(b0), c0, c1, c2, c3)
#define DMMA16K8(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1)                        \
    EMU_MMA(2, 2, L(a0, a1, a2, a3), L(b0, b1), c0, c1, c2, c3)
#define DMMA16K16(c0, c1, c2, c3, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3) \
    EMU_MMA(2, 4, L(a0, a1, a2, a3, a4, a5, a6, a7), L(b0, b1, b2, b3), c0, c1, c2, c3)
#define MMA_TF32(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1)                        \
    EMU_MMA(2, 2, L(as_float(a0), as_float(a1), as_float(a2), as_float(a3)),    \
            L(as_float(b0), as_float(b1)), c0, c1, c2, c3)
// cvt.rna.tf32.f32: 10 mantissa bits, ties away from zero
#define TF32_BITS(x) ((as_uint((float)(x)) + 0x1000u) & 0xffffe000u)
"""

# Small shapes (2 x 2 warps, 2 x 2 work-groups) so that PoCL builds and runs each in seconds.
DMMA = dict(TSM=32, TSN=32, TSK=8, WIDTH=2, PADA=4, PADB=4, MMA=3, WARPSM=2, WARPSN=2)
FMA = dict(TSM=64, TSN=64, TSK=8, WPTM=8, WPTN=4, WIDTH=4, VWM=4, VWN=2)


def _build(device, params: KernelParams, dtype, options: dict, late: bool, kernel_file: str):
    import pyopencl as cl

    defines = {"PRECISION": 8 * np.dtype(dtype).itemsize, **params.defines(), **options,
               "EMU_GROUPS": 4, "EMU_ITEMS": params.threads, "EMU_LATE": int(late)}
    source = EMULATION + f'#include "{kernel_file}"\n'
    return cl.Program(device.context, source).build(
        options=["-cl-std=CL2.0", "-I", str(kernel_dir())] + [f"-D{k}={v}" for k, v in defines.items()])


def _run(device, rng, params: dict, dtype, options=None, late=True, kernel_file="gemm_dmma.cl", beta=0.0,
         tiles=(1, 2, 5)):
    """Build with the emulations; C = alpha AT^T B + beta C on 2 x 2 work-groups for each count of
    K tiles (fewer than the ring's stages, and more), against numpy in float64."""
    import pyopencl as cl

    options = dict(options or {})
    params = KernelParams(**{**params, **{k: options.pop(k) for k in ("PADA", "PADB") if k in options}})
    assert params.problems(np.dtype(dtype).itemsize) == []
    prog = _build(device, params, dtype, options, late, kernel_file)
    queue = cl.CommandQueue(device.context)
    gemm = cl.Kernel(prog, "gemm")
    real = np.dtype(dtype).type
    m, n = 2 * params.TSM, 2 * params.TSN
    for nt in tiles:
        k = nt * params.TSK
        at = rng.uniform(-1, 1, (k, m)).astype(dtype)
        b = rng.uniform(-1, 1, (k, n)).astype(dtype)
        c = rng.uniform(-1, 1, (m, n)).astype(dtype) if beta else np.full((m, n), np.nan, dtype)  # poison
        alpha = 1.5
        want = alpha * (at.astype(np.float64).T @ b.astype(np.float64))
        if beta:
            want += beta * c.astype(np.float64)
        mf = cl.mem_flags
        bufs = [cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x) for x in (at, b)]
        cbuf = cl.Buffer(device.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=c)
        gsize, lsize = params.launch(m, n)
        gemm(queue, gsize, lsize, np.int32(m), np.int32(n), np.int32(k), real(alpha), real(beta), *bufs, cbuf)
        got = np.empty_like(c)
        cl.enqueue_copy(queue, got, cbuf)
        queue.finish()
        assert np.all(np.isfinite(got)), f"{nt} tiles: NaN in C (an element not written, or a copy beyond the ring)"
        # float64: sums of at most 80 exact products; 3xTF32: float32 accuracy
        tol = 1e-13 if real is np.float64 else 2e-5
        err = np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want))
        assert err < tol, f"{nt} tiles: largest error {err:.3g} (relative to the largest |C|)"


@pytest.mark.slow
@pytest.mark.parametrize("mma", [1, 2, 3, 4])
def test_the_emulation_reads_fragments_as_the_gpu_did(any_device, rng, mma):
    """The first version (STAGES 0, FRAGPAIRS 0), correct on the GPU for all four shapes, is correct here too."""
    _run(any_device, rng, {**DMMA, "MMA": mma, "TSK": 16 if mma == 4 else 8}, np.float64)


# (options, copies land late / early): the ring at 2-4 stages, with each read option of gemm_dmma.cl
DMMA_RING = [
    ({"STAGES": 2}, True),
    ({"STAGES": 3, "FRAGPAIRS": 1}, True),
    ({"STAGES": 3, "FRAGPAIRS": 1}, False),
    ({"STAGES": 4, "FRAGPAIRS": 1, "SWIZZLE": 1, "PADA": 0, "PADB": 0}, True),
    ({"STAGES": 3, "FRAGPREFETCH": 1, "FRAGPAIRS": 1}, True),
    ({"STAGES": 4, "FRAGPREFETCH": 1, "SWIZZLE": 1, "PADA": 0, "PADB": 0}, True),
    ({"STAGES": 4, "FRAGPREFETCH": 1, "SWIZZLE": 1, "PADA": 0, "PADB": 0}, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("options, late", DMMA_RING, ids=lambda v: str(v))
def test_dmma_ring_and_fragment_options_match_numpy(any_device, rng, options, late):
    _run(any_device, rng, DMMA, np.float64, options, late=late)


@pytest.mark.slow
def test_dmma_ring_other_shapes_widths_and_beta(any_device, rng):
    # m8n8k4 in pairs; m16n8k4 with two k-steps per tile read ahead; double4 copies (two 16-byte pieces)
    _run(any_device, rng, {**DMMA, "MMA": 1}, np.float64, {"STAGES": 3, "FRAGPAIRS": 1}, beta=0.5, tiles=(3,))
    _run(any_device, rng, {**DMMA, "MMA": 2}, np.float64, {"STAGES": 3, "FRAGPAIRS": 1, "FRAGPREFETCH": 1},
         tiles=(1, 4))
    _run(any_device, rng, {**DMMA, "WIDTH": 4, "TSK": 16}, np.float64,
         {"STAGES": 3, "SWIZZLE": 1, "PADA": 0, "PADB": 0}, tiles=(4,))


@pytest.mark.slow
def test_3xtf32_with_the_ring_and_fragment_pairs(any_device, rng):
    # float32 pairs are 8-byte reads; the swizzle moves 16-byte pieces of four floats
    _run(any_device, rng, {**DMMA, "MMA": 6, "WIDTH": 4, "TSK": 16}, np.float32,
         {"STAGES": 3, "FRAGPAIRS": 1, "SWIZZLE": 1, "PADA": 0, "PADB": 0}, beta=0.5, tiles=(1, 4))


# The FMA kernel's ring: cp.async of 4, 8 and 16 bytes and of 32 (two pieces) per global vector.
FMA_RING = [
    ({"WIDTH": 1}, np.float32, {"STAGES": 3}, True),
    ({"WIDTH": 2}, np.float32, {"STAGES": 2}, False),
    ({}, np.float32, {"STAGES": 4, "FRAGPREFETCH": 1}, True),
    ({}, np.float32, {"STAGES": 3, "FRAGPREFETCH": 1}, False),
    ({"WIDTH": 4, "VWM": 2, "VWN": 4}, np.float64, {"STAGES": 3}, True),
]


@pytest.mark.slow
@pytest.mark.parametrize("change, dtype, options, late", FMA_RING, ids=lambda v: str(v))
def test_fma_ring_matches_numpy(any_device, rng, change, dtype, options, late):
    _run(any_device, rng, {**FMA, **change}, dtype, options, late=late, kernel_file="gemm.cl",
         beta=0.5 if late else 0.0)


@pytest.mark.parametrize("kernel_file, params, options, message", [
    ("gemm_dmma.cl", DMMA, {"STAGES": 1}, "STAGES is 0"),
    ("gemm.cl", FMA, {"STAGES": 1}, "STAGES is 0"),
    ("gemm_dmma.cl", DMMA, {"SWIZZLE": 1, "PADA": 0, "PADB": 0}, "needs STAGES >= 2"),
    ("gemm_dmma.cl", DMMA, {"STAGES": 2, "FRAGPREFETCH": 1}, "STAGES >= 3"),
    ("gemm.cl", FMA, {"STAGES": 2, "FRAGPREFETCH": 1}, "STAGES >= 3"),
    ("gemm_dmma.cl", {**DMMA, "TSN": 128, "TSK": 16}, {"STAGES": 3}, "exceeds 48 KiB"),
    ("gemm_dmma.cl", {**DMMA, "TSN": 16}, {"FRAGPAIRS": 1}, "FRAGPAIRS reads fragments in pairs"),
    ("gemm_dmma.cl", {**DMMA, "WIDTH": 1}, {"STAGES": 2, "SWIZZLE": 1, "PADA": 0, "PADB": 0}, "16-byte pieces"),
    ("gemm.cl", FMA, {"STAGES": 2, "SWIZZLE": 1}, "SWIZZLE is gemm_dmma.cl's"),
])
def test_option_rules_fail_the_build_and_say_why(any_device, kernel_file, params, options, message):
    import pyopencl as cl

    options = dict(options)
    kp = KernelParams(**{**params, **{k: options.pop(k) for k in ("PADA", "PADB") if k in options}})
    dtype = np.float64 if kernel_file == "gemm_dmma.cl" else np.float32
    with pytest.raises(cl.RuntimeError, match=re.escape(message)):
        _build(any_device, kp, dtype, options, True, kernel_file)


CLANG = shutil.which("clang-14") or shutil.which("clang-15")
# The H100's float64 entry in tuning.json (the first version's best)
H100_DMMA = dict(TSM=128, TSN=64, TSK=8, WIDTH=2, PADA=4, PADB=4, MMA=3, WARPSM=4, WARPSN=2)


@pytest.mark.skipif(CLANG is None, reason="neither clang-14 nor clang-15 (OpenCL C -> NVPTX) is installed")
def test_what_nvidia_gets_stages_0_has_no_cp_async_and_the_ring_is_whole(tmp_path):
    """The PTX clang makes for the H100 (sm_80 target): the default has no cp.async; the ring copies
    with 16-byte cp.async to 32-bit shared-window addresses, waits, reads 16-byte pairs, spills nothing."""
    def ptx(**options):
        p = KernelParams(**H100_DMMA)
        defines = {"PRECISION": 64, **p.defines(), **options}
        out = tmp_path / "k.ptx"
        subprocess.run([CLANG, "-x", "cl", "-cl-std=CL1.2", "-target", "nvptx64-nvidia-nvcl", "-Xclang",
                        "-finclude-default-header", "-O2", "-S", "-march=sm_80", "-Dasm=__asm__",
                        "-I", str(kernel_dir()), *(f"-D{k}={v}" for k, v in defines.items()),
                        str(kernel_dir() / "gemm_dmma.cl"), "-o", str(out)], check=True)
        return out.read_text()

    first = ptx()
    assert "cp.async" not in first and "mma.sync.aligned.m16n8k8" in first
    ring = ptx(STAGES=3, FRAGPAIRS=1, FRAGPREFETCH=1)
    copies = re.findall(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16;", ring)
    # A: 128 x 8 doubles, B: 64 x 8, in 16-byte pieces over 256 work-items: 3 each, in the
    # prologue (tiles 0 and 1) and in the loop
    assert len(copies) == 3 * 3
    assert "cp.async.wait_group (3 - 2 - 1);" in ring and "cp.async.wait_group (3 - 2);" in ring
    assert ring.count("cp.async.commit_group;") == 3
    assert "ld.shared.v2.f64" in ring
    assert not re.search(r"\.local|ld\.local|st\.local", ring)

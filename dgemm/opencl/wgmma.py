"""The wgmma (Hopper TF32) kernel: kernels/gemm_wgmma.cl finished in PTX by :mod:`dgemm.opencl.ptx`.

:class:`dgemm.opencl.device.Device` builds it for ``KernelParams(MMA=7, ...)``
(the ``tf32`` and ``3xtf32`` paths on sm_90 devices), ``bench/variants.py`` times its
variants.  Its macros are :meth:`KernelParams.defines` (``WG``, ``BN``, ``BK``... as
the kernel names them): the parameters are written once, in :mod:`dgemm.opencl.params`.  Its operands are K-major (A as M x K, B as N x K):
the engine stages them so (``KernelParams.k_major``).
"""
from __future__ import annotations

from dgemm.opencl.params import KernelParams
from dgemm.opencl.ptx import Site, finish, program_ptx

__all__ = ["build", "options", "sites"]


def _mma(bn: int, accumulate: bool, why: str, group: str = "accumulators", fence: bool = True) -> Site:
    """wgmma.fence (unless ``fence`` is false) + wgmma.mma_async m64n{bn}k8 f32.tf32.tf32 (descriptors, then
    the accumulators); scale-d (D += A B, or D = A B) is a predicate, set from a constant here."""
    return Site(
        ("wgmma.fence.sync.aligned;\n" if fence else "")
        + f"{{{{\n.reg .pred p;\n.reg .b32 one;\nmov.b32 one, 1;\nsetp.ne.b32 p, one, {0 if accumulate else 1};\n"
        f"wgmma.mma_async.sync.aligned.m64n{bn}k8.f32.tf32.tf32 {{regs}}, {{0}}, {{1}}, p, 1, 1;\n}}}}",
        marks=("b64", "b64") + ("f32",) * (bn // 2), at="last", first_list=2, group=group, group_from=2,
        why=why)


def sites(bn: int) -> dict[int, Site]:
    """The edits gemm_wgmma.cl's site numbers stand for, for accumulators of ``m64n{bn}``."""
    acc = ("f32",) * (bn // 2)
    return {
        7101: _mma(bn, True, "D += A * B on the tensor cores, A and B read from local memory through descriptors"),
        7106: _mma(bn, False, "D = A * B (scale-d false: the accumulators start from zero), as 7101 otherwise"),
        # FENCES 0: one wgmma.fence per tile's set (7108), the wgmma after it without their own.  The PTX ISA
        # asks for the fence between other accesses to the registers and a wgmma, not between wgmma of the
        # same shape on the same accumulators (those are ordered by default).
        7108: Site("wgmma.fence.sync.aligned;",
                   why="order the registers' other accesses (IEEE adds, zeroing) before the tile's wgmma"),
        7121: _mma(bn, True, "as 7101, without its fence (7108 precedes the tile's set)", fence=False),
        7126: _mma(bn, False, "as 7106, without its fence (7108 precedes the tile's set)", fence=False),
        # 3xTF32 with OVERLAP: a second register set, and waits that name the set read after them
        7111: _mma(bn, True, "as 7101, into the second register set", "accumulators1"),
        7116: _mma(bn, False, "as 7106, into the second register set", "accumulators1"),
        7113: Site("wgmma.wait_group.sync.aligned 0;", marks=acc, group="accumulators1",
                   why="as 7103, for the second register set"),
        7107: Site("wgmma.wait_group.sync.aligned 1;", marks=acc, group="accumulators",
                   why="all but the newest group done: the first register set is read after it"),
        7117: Site("wgmma.wait_group.sync.aligned 1;", marks=acc, group="accumulators1",
                   why="all but the newest group done: the second register set is read after it"),
        7102: Site("wgmma.commit_group.sync.aligned;", why="close the group of wgmma issued this k-tile"),
        7103: Site("wgmma.wait_group.sync.aligned 0;", marks=acc, group="accumulators",
                   why="the accumulators are read (or the tile overwritten) only after the wgmma finish"),
        7105: Site("wgmma.wait_group.sync.aligned 1;",
                   why="all but the newest wgmma group done: the stage before it may be refilled"),
        7104: Site("fence.proxy.async.shared::cta;",
                   why="make this thread's local-memory stores visible to the tensor cores' (async proxy) reads"),
    }


def options(params: KernelParams) -> list[str]:
    """The OpenCL compiler's ``-D`` options of the wgmma kernel for ``params`` (``MMA=7`` or ``8``).

    >>> options(KernelParams(MMA=7, TSM=128, TSN=256, TSK=32, WARPSM=2, GROUPM=8, STAGES=4))
    ['-DPRECISION=32', '-DWG=2', '-DBN=256', '-DBK=32', '-DSTAGES=4', '-DGROUPM=8', '-DLAYOUT=2', '-DROUND=0', '-DSPLIT=0', '-DPROMOTE=1']
    """
    return ["-DPRECISION=32"] + [f"-D{k}={v}" for k, v in params.defines().items()]


def build(ctx, device, params: KernelParams, extra_options=(), keep: str | None = None):
    """Build gemm_wgmma.cl for ``device`` through the PTX route.

    Parameters
    ----------
    ctx, device : pyopencl.Context, pyopencl.Device
        An NVIDIA sm_90 device and its context.
    params : KernelParams
        A wgmma parameter set (``params.k_major``); its :meth:`~KernelParams.defines` are the macros.
    extra_options : sequence of str
        More compiler options (e.g. ``-cl-nv-verbose`` for ptxas's report).
    keep : str, optional
        A path prefix to write both PTX texts to (``.ptx``, ``-finished.ptx``) before loading.

    Returns
    -------
    (pyopencl.Program, str, str)
        The loaded program (kernels ``gemm_wgmma`` and ``round_tf32``), the PTX
        the OpenCL compiler returned and the finished PTX.

    Raises
    ------
    dgemm.opencl.ptx.PtxEditError
        Where the PTX cannot be finished; pyopencl's errors where it does
        not build or load.
    """
    import pyopencl as cl

    from dgemm.opencl.sources import kernel_dir

    flags = options(params) + [f"-I{kernel_dir()}", *extra_options]
    source = (kernel_dir() / "gemm_wgmma.cl").read_text()
    first = cl.Program(ctx, source).build(options=flags, devices=[device])
    ptx = program_ptx(first, device)
    finished = finish(ptx, sites(params.TSN))
    if keep:
        for suffix, text in ((".ptx", ptx), ("-finished.ptx", finished)):
            with open(keep + suffix, "w") as f:
                f.write(text)
    program = cl.Program(ctx, [device], [finished.encode() + b"\0"]).build(options=list(extra_options))
    return program, ptx, finished

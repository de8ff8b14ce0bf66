"""Tuning parameters of the GEMM kernel and the rules they must obey.

The kernels (``kernels/gemm.cl``, ``gemm_cpu.cl``, ``gemm_dmma.cl``) take
these as ``-D`` macros.  Any set that passes :meth:`KernelParams.problems`
must give correct results; which set is fastest is a question for the tuner
and the tuning database.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MmaKind:
    """What one value of :attr:`KernelParams.MMA` means: the arithmetic, the instruction, the hardware."""

    precision: str                   # the precision= path it implements (dgemm.dtypes.PRECISIONS)
    dtype: str | None                # the one dtype it computes; None: any (the FMA kernel)
    shape: tuple[int, int, int] | None   # the mma.sync instruction's m, n, k; None: no tensor cores
    compute_capability: int          # NVIDIA compute capability (10*major+minor) it needs; 0: any device
    wgmma: bool = False              # Hopper's warpgroup MMA (kernels/gemm_wgmma.cl, the PTX route): sm_90 only

    @property
    def instruction(self) -> str:
        """``m16n8k8`` and the like; ``fma`` for the FMA kernel; ``wgmma.m64nNk8`` (N: the tile's TSN)."""
        if self.wgmma:
            return "wgmma.m64nNk8"
        return "fma" if self.shape is None else "m{}n{}k{}".format(*self.shape)


# Every value MMA may take: the one table the kernel's rules, the tuner's search space and the
# tuning database's fallbacks read (kernels/gemm_dmma.cl implements 1-6, kernels/gemm_wgmma.cl 7).
MMA_KINDS = {
    0: MmaKind("fma", None, None, 0),
    1: MmaKind("dmma", "float64", (8, 8, 4), 80),
    2: MmaKind("dmma", "float64", (16, 8, 4), 90),
    3: MmaKind("dmma", "float64", (16, 8, 8), 90),
    4: MmaKind("dmma", "float64", (16, 8, 16), 90),
    5: MmaKind("tf32", "float32", (16, 8, 8), 80),     # TF32 accuracy
    6: MmaKind("3xtf32", "float32", (16, 8, 8), 80),   # error-compensated: float32 accuracy
    7: MmaKind("tf32", "float32", (64, 8, 8), 90, wgmma=True),   # wgmma through the PTX route
    8: MmaKind("3xtf32", "float32", (64, 8, 8), 90, wgmma=True), # the same, 3xTF32 on split operands
}

# Local memory a Hopper work-group may have (227 KiB).  The wgmma kernel's static local memory is
# finished for sm_90a in PTX, where NVIDIA's OpenCL does not hold it to the 48 KiB it reports (runs
# with 197 KB measured on an H100, 2026-11-23); the other kernels keep the device's figure.
WGMMA_LOCAL_MEM = 227 * 1024


def mma_values(precision: str) -> tuple[int, ...]:
    """The MMA values implementing ``precision``.

    >>> mma_values("dmma"), mma_values("fma")
    ((1, 2, 3, 4), (0,))
    """
    return tuple(v for v, kind in MMA_KINDS.items() if kind.precision == precision)


def min_compute_capability(precision: str) -> int:
    """The lowest NVIDIA compute capability any kernel of ``precision`` needs (0: any device).

    >>> min_compute_capability("dmma"), min_compute_capability("fma")
    (80, 0)
    """
    return min(MMA_KINDS[v].compute_capability for v in mma_values(precision))


_FIELDS = ("TSM", "TSN", "TSK", "WPTM", "WPTN", "WIDTH", "VWM", "VWN", "PADA", "PADB", "GROUPM",
           "MMA", "WARPSM", "WARPSN", "GEMMK", "STAGES", "PROMOTE")

# Vector widths along N the GEMMK=1 kernel accepts (OpenCL vectors of 16 are two AVX registers).
CPU_VWN = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class KernelParams:
    """Compile-time parameters of the register-blocked GEMM kernel.

    Parameters
    ----------
    TSM, TSN, TSK : int
        Tile of C computed by one work-group (TSM x TSN) and the depth of the
        local-memory tiles along K.
    WPTM, WPTN : int
        Register block: elements of C per work-item along M and N.
    WIDTH : int
        Vector width of the global loads (1, 2, 4 or 8).
    VWM, VWN : int
        Vector width of the local-memory reads along M and N (1, 2, 4 or 8):
        a work-item owns groups of VWM adjacent rows and VWN adjacent columns.
    PADA, PADB : int
        Extra elements per row of the local tiles (bank-conflict avoidance).
    GROUPM : int
        Work-group order: 0 is the launch order, ``g > 0`` walks bands of
        ``g`` tile rows column by column (L2 reuse).
    MMA : int
        0: the FMA kernel (``gemm.cl``).  Otherwise NVIDIA tensor cores through
        inline PTX ``mma.sync`` (``gemm_dmma.cl``), one value per precision and
        instruction shape (:data:`MMA_KINDS`): 1-4 float64 (DMMA m8n8k4 on
        sm_80+, m16n8k4, m16n8k8, m16n8k16 on sm_90+), 5-6 float32 through TF32,
        plain (5, TF32 accuracy) or error-compensated 3xTF32 (6, float32
        accuracy).  WPTM, WPTN, VWM and VWN are then unused and the
        work-group is WARPSM x WARPSN warps.
        MMA=7 (8: 3xTF32) is float32 TF32 on Hopper's warpgroup instruction ``wgmma``
        (``gemm_wgmma.cl``, finished in PTX by :mod:`dgemm.opencl.ptx`):
        WARPSM warpgroups of 128 work-items, TSM = 64 WARPSM, TSK = 32 (the
        128-byte swizzle), STAGES tiles in flight, and its operands K-major
        (:attr:`k_major`).
    WARPSM, WARPSN : int
        Warps of an MMA work-group along M and N (MMA=7: warpgroups along M; WARPSN is 1).
    GEMMK : int
        Which FMA kernel (the name is CLBlast's): 0 is the GPU kernel above
        (``gemm.cl``: work-groups sharing tiles through local memory).  1 is
        the CPU kernel (``gemm_cpu.cl``): one work-item per work-group, no
        barrier, computing a TSM x TSN tile of C; for each K block of depth
        TSK it packs that block of A and B into contiguous panels (in local
        memory, which on a CPU is plain memory) and runs a WPTM x WPTN
        register block over them, in vectors of VWN (1, 2, 4, 8 or 16) along
        N.  WIDTH, VWM, PADA and PADB are unused there (WIDTH and VWM must be
        1 and the pads 0, so that equal kernels have equal parameters).
    STAGES : int
        Local-memory tiles filled by ``cp.async`` (NVIDIA sm_80+): 0 moves
        each tile through registers into two local tiles (the portable
        default); >= 2 is a ring of STAGES tiles (``tile_loads.cl``; the FMA
        kernel then reads the next tile's first row early when >= 3).  The
        wgmma kernels (MMA=7, 8) need >= 3; the CPU kernel 0.
    PROMOTE : int
        MMA=8 (3xTF32 on wgmma) only: K tiles the tensor cores sum from zero
        before one IEEE add into the result.  Their float32 accumulation
        truncates, so each such sum must stay short; more tiles per add hide
        the wait before it.  1 for every other kernel.

    Examples
    --------
    >>> p = KernelParams(TSM=96, TSN=64, TSK=16, WPTM=6, WPTN=4, WIDTH=2)
    >>> p.local_size, p.threads
    ((16, 16), 256)
    >>> p.problems(itemsize=4)
    []
    >>> cpu = KernelParams(TSM=48, TSN=64, TSK=128, WPTM=6, WPTN=16, WIDTH=1, VWN=8, GEMMK=1)
    >>> cpu.local_size, cpu.local_mem_bytes(4), cpu.problems(itemsize=4)
    ((1, 1), 57344, [])
    """

    TSM: int = 64
    TSN: int = 64
    TSK: int = 16
    WPTM: int = 4
    WPTN: int = 4
    WIDTH: int = 4
    VWM: int = 1
    VWN: int = 1
    PADA: int = 0
    PADB: int = 0
    GROUPM: int = 0
    MMA: int = 0
    WARPSM: int = 2
    WARPSN: int = 2
    GEMMK: int = 0
    STAGES: int = 0
    PROMOTE: int = 1

    @property
    def k_major(self) -> bool:
        """Whether the kernel takes A as M x K and B as N x K (wgmma's TF32 operands), not A^T and B."""
        kind = MMA_KINDS.get(self.MMA)
        return bool(kind and kind.wgmma)

    @property
    def parts(self) -> int:
        """Halves each operand block has on the device: 2 for the wgmma 3xTF32 kernel ([big; small]), else 1."""
        return 2 if self.k_major and self.precision == "3xtf32" else 1

    @property
    def local_size(self) -> tuple[int, int]:
        """Work-group shape (along N, along M), as the kernel requires."""
        if self.k_major:
            return (128 * self.WARPSM, 1)
        if self.MMA:
            return (32 * self.WARPSN, self.WARPSM)
        if self.GEMMK:
            return (1, 1)
        return (self.TSN // self.WPTN, self.TSM // self.WPTM)

    @property
    def threads(self) -> int:
        x, y = self.local_size
        return x * y

    def launch(self, mp: int, np_: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(global, local) sizes for a padded ``mp x np_`` C.

        >>> KernelParams().launch(128, 256)
        ((64, 32), (16, 16))
        >>> KernelParams(MMA=1, TSM=64, TSN=64, WARPSM=2, WARPSN=2).launch(128, 256)
        ((256, 4), (64, 2))
        """
        lx, ly = self.local_size
        if self.k_major:   # one row of work-groups; the kernel orders the tiles itself (GROUPM)
            return ((mp // self.TSM) * (np_ // self.TSN) * lx, 1), (lx, 1)
        return ((np_ // self.TSN) * lx, (mp // self.TSM) * ly), (lx, ly)

    @property
    def tiles(self) -> tuple[int, int, int]:
        return (self.TSM, self.TSN, self.TSK)

    def local_mem_bytes(self, itemsize: int) -> int:
        """Local memory of one work-group: two (double-buffered) tiles each of A and B.

        GEMMK=1: one packed TSK-deep block of A and of B.
        """
        if self.GEMMK and not self.MMA:
            return self.TSK * (self.TSM + self.TSN) * itemsize
        if self.k_major:
            return self.parts * self.STAGES * self.TSK * (self.TSM + self.TSN) * itemsize
        return max(2, self.STAGES) * self.TSK * (self.TSM + self.PADA + self.TSN + self.PADB) * itemsize

    def problems(self, itemsize: int, max_work_group_size: int | None = None,
                 local_mem_size: int | None = None) -> list[str]:
        """Why this parameter set cannot run (an empty list when it can)."""
        out = []
        for f in _FIELDS:
            v = getattr(self, f)
            zero_ok = f.startswith("PAD") or f in ("GROUPM", "MMA", "GEMMK", "STAGES")
            if not isinstance(v, int) or v < (0 if zero_ok else 1):
                out.append(f"{f}={v!r} must be a {'non-negative' if zero_ok else 'positive'} integer")
        if out:
            return out
        if self.GEMMK not in (0, 1):
            return [f"GEMMK={self.GEMMK} must be 0 (the GPU kernel, gemm.cl) or 1 (the CPU kernel, gemm_cpu.cl)"]
        if self.GEMMK and self.MMA:
            return [f"GEMMK=1 is an FMA kernel: MMA must be 0, not {self.MMA}"]
        if self.GEMMK and self.STAGES:
            return [f"GEMMK=1 (the CPU kernel) copies no tiles by cp.async: STAGES must be 0, not {self.STAGES}"]
        if self.GEMMK:
            return self._cpu_problems() + self._limits(itemsize, max_work_group_size, local_mem_size)
        if self.STAGES == 1:
            return ["STAGES=1 must be 0 (through registers) or at least 2 (a cp.async ring)"]
        if self.PROMOTE != 1 and self.MMA != 8:
            return [f"PROMOTE={self.PROMOTE} is the wgmma 3xTF32 kernel's (MMA=8); it must be 1 here"]
        if self.k_major:
            out = self._wgmma_problems(itemsize)
            return out + self._limits(itemsize, max_work_group_size, WGMMA_LOCAL_MEM if not out else None)
        out = self._mma_problems(itemsize) if self.MMA else self._fma_problems()
        if out and self.MMA and out[0].startswith("MMA="):
            return out
        return out + self._shared_problems(itemsize, max_work_group_size, local_mem_size, bool(out))

    def _cpu_problems(self) -> list[str]:
        """Rules of the GEMMK=1 kernel (gemm_cpu.cl)."""
        out = []
        if self.VWN not in CPU_VWN:
            out.append(f"VWN={self.VWN} must be one of {', '.join(map(str, CPU_VWN))} for GEMMK=1")
        if self.WIDTH != 1 or self.VWM != 1 or self.PADA or self.PADB:
            out.append(f"GEMMK=1 does not use WIDTH, VWM, PADA, PADB: they must be 1, 1, 0, 0 (not {self.WIDTH}, "
                       f"{self.VWM}, {self.PADA}, {self.PADB})")
        if self.WPTN % self.VWN:
            out.append(f"WPTN={self.WPTN} must be a multiple of VWN={self.VWN}")
        if self.TSM % self.WPTM or self.TSN % self.WPTN:
            out.append("TSM and TSN must be multiples of WPTM and WPTN")
        return out

    def _fma_problems(self) -> list[str]:
        out = []
        for f in ("WIDTH", "VWM", "VWN"):
            if getattr(self, f) not in (1, 2, 4, 8):
                out.append(f"{f}={getattr(self, f)} must be 1, 2, 4 or 8")
        if self.WPTM % self.VWM or self.PADA % self.VWM:
            out.append(f"WPTM={self.WPTM} and PADA={self.PADA} must be multiples of VWM={self.VWM}")
        if self.WPTN % self.VWN or self.PADB % self.VWN:
            out.append(f"WPTN={self.WPTN} and PADB={self.PADB} must be multiples of VWN={self.VWN}")
        if self.TSM % self.WPTM or self.TSN % self.WPTN:
            out.append("TSM and TSN must be multiples of WPTM and WPTN")
        return out

    def _shared_problems(self, itemsize, max_work_group_size, local_mem_size, broken: bool) -> list[str]:
        """Rules of the tile loading (tile_loads.cl) and the device's limits, common to both kernels."""
        out = []
        if self.WIDTH not in (1, 2, 4, 8):
            return out  # already reported
        for f in ("TSM", "TSN", "PADA", "PADB"):
            if getattr(self, f) % self.WIDTH:
                out.append(f"{f}={getattr(self, f)} must be a multiple of WIDTH={self.WIDTH}")
        if not out and not broken:
            for name, ts in (("A", self.TSM), ("B", self.TSN)):
                if (self.TSK * ts // self.WIDTH) % self.threads:
                    out.append(f"the {name} tile ({self.TSK}x{ts}, vectors of {self.WIDTH}) does not split "
                               f"evenly over {self.threads} work-items")
        return out + self._limits(itemsize, max_work_group_size, local_mem_size)

    def _limits(self, itemsize, max_work_group_size, local_mem_size) -> list[str]:
        """The device's limits: work-items per group and local memory."""
        out = []
        if max_work_group_size is not None and self.threads > max_work_group_size:
            out.append(f"{self.threads} work-items per group exceed the device's {max_work_group_size}")
        if local_mem_size is not None and self.local_mem_bytes(itemsize) > local_mem_size:
            out.append(f"{self.local_mem_bytes(itemsize)} bytes of local memory exceed the device's {local_mem_size}")
        return out

    def _wgmma_problems(self, itemsize) -> list[str]:
        """Rules of gemm_wgmma.cl (its #error lines, said before the build)."""
        out = []
        if itemsize != 4:
            out.append(f"the wgmma kernel (MMA={self.MMA}) is float32 only")
        if self.TSM != 64 * self.WARPSM:
            out.append(f"MMA={self.MMA}: TSM must be 64 * WARPSM ({64 * self.WARPSM}), not {self.TSM}")
        if self.WARPSN != 1:
            out.append(f"MMA={self.MMA}: WARPSN must be 1 (warpgroups stack along M), not {self.WARPSN}")
        if self.TSN % 8 or self.TSN > 256:
            out.append(f"MMA={self.MMA}: TSN={self.TSN} must be a multiple of 8 up to 256 (wgmma's n)")
        if self.TSK != 32:
            out.append(f"MMA={self.MMA}: TSK must be 32 (a 128-byte row of the swizzled tile), not {self.TSK}")
        if self.STAGES < 3:
            out.append(f"MMA={self.MMA}: STAGES={self.STAGES} must be at least 3")
        if (self.TSN * self.TSK // 4) % (128 * self.WARPSM):
            out.append(f"MMA={self.MMA}: the B tile ({self.TSK}x{self.TSN}) does not split in 16-byte copies over "
                       f"{128 * self.WARPSM} work-items")
        if self.GROUPM < 0:
            out.append("GROUPM must be non-negative")
        return out

    def _mma_problems(self, itemsize) -> list[str]:
        out = []
        kind = MMA_KINDS.get(self.MMA)
        if kind is None:
            out.append(f"MMA={self.MMA} must be one of " + ", ".join(
                f"{v} ({k.precision} {k.instruction})" for v, k in MMA_KINDS.items()))
            return out
        m_step, _, kstep = kind.shape
        if m_step == 16 and (self.TSM // self.WARPSM // 8) % 2:
            out.append(f"the m16 shapes (MMA={self.MMA}) need TSM/WARPSM to be a multiple of 16")
        if self.TSK % kstep:
            out.append(f"TSK={self.TSK} must be a multiple of the instruction's k={kstep}")
        if itemsize != np.dtype(kind.dtype).itemsize:
            out.append(f"the {kind.precision} kernels (MMA {', '.join(map(str, mma_values(kind.precision)))}) "
                       f"are {kind.dtype} only")
        if self.WIDTH not in (1, 2, 4, 8):
            out.append(f"WIDTH={self.WIDTH} must be 1, 2, 4 or 8")
        if self.TSM % (8 * self.WARPSM) or self.TSN % (8 * self.WARPSN) or self.TSK % 4:
            out.append("TSM, TSN must be multiples of 8*WARPSM, 8*WARPSN and TSK of 4")
        return out

    @property
    def kind(self) -> MmaKind:
        """The :data:`MMA_KINDS` entry of this kernel (raises KeyError for an MMA value there is none of)."""
        return MMA_KINDS[self.MMA]

    @property
    def min_compute_capability(self) -> int:
        """NVIDIA compute capability (10*major+minor) the kernel needs; 0 for the portable FMA kernel.

        A cp.async ring (STAGES >= 2) needs sm_80.
        """
        kind = MMA_KINDS.get(self.MMA)
        need = kind.compute_capability if kind is not None else 0
        return max(need, 80) if self.STAGES >= 2 else need

    @property
    def precision(self) -> str:
        """``"fma"``, ``"dmma"``, ``"tf32"`` or ``"3xtf32"``: the arithmetic this kernel does.

        >>> KernelParams(MMA=3).precision, KernelParams(MMA=6).precision
        ('dmma', '3xtf32')
        """
        kind = MMA_KINDS.get(self.MMA)
        return kind.precision if kind is not None else "invalid"   # problems() says why

    def defines(self) -> dict[str, int]:
        """The ``-D`` macros of the kernel (the wgmma kernel's are named as in gemm_wgmma.cl)."""
        if self.k_major:
            # ROUND 0: the engine rounds the operands to TF32 once, where it stages them (round_tf32)
            return {"WG": self.WARPSM, "BN": self.TSN, "BK": self.TSK, "STAGES": self.STAGES,
                    "GROUPM": self.GROUPM, "LAYOUT": 2, "ROUND": 0, "SPLIT": int(self.parts == 2),
                    "PROMOTE": self.PROMOTE}
        # STAGES 0 stays out: the programs built before the ring existed are built unchanged
        return {f: getattr(self, f) for f in _FIELDS
                if f != "PROMOTE" and not (f == "STAGES" and self.STAGES == 0)}

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "KernelParams":
        unknown = set(d) - set(_FIELDS)
        if unknown:
            raise ValueError(f"unknown kernel parameters: {sorted(unknown)}")
        return cls(**{k: int(v) for k, v in d.items()})


def lcm_tiles(params: list[KernelParams]) -> tuple[int, int, int]:
    """Tile sizes that every one of several parameter sets divides.

    >>> lcm_tiles([KernelParams(TSM=64), KernelParams(TSM=96, WPTM=6)])
    (192, 64, 16)
    """
    if not params:
        return KernelParams().tiles
    return tuple(math.lcm(*(p.tiles[i] for p in params)) for i in range(3))

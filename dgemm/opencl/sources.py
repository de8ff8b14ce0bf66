"""Where the OpenCL C sources are.

The ``.cl`` files live in ``dgemm/kernels/``, installed with the package as
data.  This is the one place that knows that.
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path

KERNEL_FILES = ("common.cl", "tile_loads.cl", "gemm.cl", "gemm_cpu.cl", "gemm_dmma.cl", "padding.cl",
                "transpose.cl", "lz4.cl", "zstd_encode.cl", "zstd_decode.cl")
# The translation units of the device program (the others are included by them).
PROGRAM_FILES = ("gemm.cl", "gemm_cpu.cl", "gemm_dmma.cl", "padding.cl", "transpose.cl")
# The codecs' translation units, each its own program (built once per device, apart from the GEMM
# program, which is built per dtype and parameters and need not carry them).
CODEC_FILES = ("lz4.cl", "zstd_encode.cl", "zstd_decode.cl")


def kernel_dir() -> Path:
    """Return the folder holding the ``.cl`` files.

    Examples
    --------
    >>> (kernel_dir() / "gemm.cl").is_file()
    True
    """
    path = Path(str(importlib.resources.files("dgemm"))) / "kernels"
    if (path / "gemm.cl").is_file():
        return path
    raise FileNotFoundError("dgemm's OpenCL kernels (gemm.cl) were not found")


def program_source() -> str:
    """The translation unit built for a device: every kernel, one program."""
    return "".join(f'#include "{name}"\n' for name in PROGRAM_FILES)


def codec_source(name: str) -> str:
    """The translation unit of one codec's program (a name in :data:`CODEC_FILES`)."""
    if name not in CODEC_FILES:
        raise ValueError(f"{name!r} is not one of the codec kernels {CODEC_FILES}")
    return f'#include "{name}"\n'

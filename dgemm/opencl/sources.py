"""Where the OpenCL C sources are.

The ``.cl`` files live in ``dgemm/kernels/``, installed with the package as
data.  This is the one place that knows that.
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path

KERNEL_FILES = ("common.cl", "tile_loads.cl", "gemm.cl", "gemm_cpu.cl", "gemm_dmma.cl", "padding.cl",
                "transpose.cl")
# The translation units of the device program (the others are included by them).
PROGRAM_FILES = ("gemm.cl", "gemm_cpu.cl", "gemm_dmma.cl", "padding.cl", "transpose.cl")


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

"""The wgmma kernel's finished PTX from the disk cache (NVIDIA sm_90 only: ``-m gpu``).

The cache's own logic (keys, atomic writes, damaged entries, concurrent
writers) is tested on plain bytes in tests/test_binaries.py; here a new
device (as in a new worker process) loads the kernel its first build kept,
without building it again, and computes the product numpy does; a damaged
entry is built again.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from _check import randn
from dgemm.accuracy import tolerance


def check_tf32(got, a, b):
    """Within TF32's bound of numpy's float64 product (the wgmma kernel rounds its operands to TF32)."""
    ref = a.astype(np.float64) @ b.astype(np.float64)
    e = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    assert got.shape == ref.shape and e < tolerance("float32", a.shape[1], "tf32"), e


def _engine(info, dtype=np.float32):
    from dgemm.opencl.device import Device
    from dgemm.opencl.engine import BlockEngine

    dev = Device(info)
    params = dev.choice(dtype, "tf32").params
    if not params.k_major:
        pytest.skip(f"{info.name}: no wgmma kernel here")
    engine = BlockEngine(dev, dtype, params)
    if not engine.params.k_major:
        pytest.skip(f"{info.name}: the wgmma kernel did not build here ({dev.failed})")
    return engine


@pytest.mark.gpu
def test_a_new_device_loads_the_wgmma_kernel_from_the_cache_and_a_damaged_entry_is_built_again(
        gpu_device, rng, tmp_path, monkeypatch):
    from dgemm.opencl import wgmma

    monkeypatch.setenv("DGEMM_PROGRAM_CACHE", str(tmp_path))
    a, b = randn(rng, (700, 300), np.float32), randn(rng, (300, 500), np.float32)
    built = []
    real = wgmma.build

    def counted(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(wgmma, "build", counted)

    first = _engine(gpu_device.info)
    check_tf32(first.product([(a, b)], 700, 500), a, b)
    assert built == [1]
    (entry,) = os.listdir(tmp_path)           # one whole entry, no temporary file
    assert entry.endswith(".bin")

    second = _engine(gpu_device.info)         # a new context, as a new worker process makes
    check_tf32(second.product([(a, b)], 700, 500), a, b)
    assert built == [1], "the cached kernel was built again"

    path = tmp_path / entry
    path.write_bytes(path.read_bytes()[:-4096])   # truncated
    third = _engine(gpu_device.info)
    check_tf32(third.product([(a, b)], 700, 500), a, b)
    assert built == [1, 1] and os.listdir(tmp_path) == [entry]
    assert path.stat().st_size > 4096

"""The codecs' OpenCL programs, each built once per device, kernel file and macros.

As pyopencl caches a program per source, includes and device, a codec's
program is built the first time a device needs it with given macros and kept
while the device lives (the cache holds devices weakly).  Its kernels are
retrieved once; their arguments are set, then they are enqueued, so
:attr:`Built.lock` keeps two threads from interleaving the two.
"""
from __future__ import annotations

import threading
import weakref

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class Built:
    """One codec's program built for one device: its kernels as attributes, and the lock their arguments need."""

    def __init__(self, device, source: str, defines: tuple, kernels: tuple, attrs: dict):
        import pyopencl as cl

        from dgemm.opencl import nogil, sources

        flags = [f"-D{name}={value}" for name, value in defines]
        with device.failing(f"building {source} ({' '.join(f[2:] for f in flags)})"):
            self.program = cl.Program(device.context, sources.codec_source(source)).build(
                options=flags + ["-I", str(sources.kernel_dir())])
        for attr, name in kernels:
            setattr(self, attr, nogil.Kernel(cl.Kernel(self.program, name)))   # (launched under ``lock``)
        for attr, value in attrs.items():
            setattr(self, attr, value)
        self.defines = dict(defines)
        self.lock = threading.Lock()


def program(device, source: str, defines, kernels, **attrs) -> Built:
    """``source`` (a name in ``sources.CODEC_FILES``) built for ``device`` with ``defines``, once per the three.

    ``defines``: (macro, value) pairs; ``kernels``: (attribute, kernel name)
    pairs; ``attrs``: other values kept on the result (what the launches
    need to know of the macros).
    """
    key = (source, tuple(defines))
    with _LOCK:
        built = _CACHE.setdefault(device, {})
        if key not in built:
            built[key] = Built(device, source, key[1], tuple(kernels), attrs)
        return built[key]


def built(device) -> dict:
    """The programs built for ``device`` so far, by (kernel file, macros)."""
    with _LOCK:
        return dict(_CACHE.get(device, {}))


def unsupported_reason(plan, unsupported: type, corrupt: type, frame, name: str) -> str | None:
    """Why a codec's device path leaves ``frame`` to the host decoder, or None when it takes it.

    ``plan(frame, name)`` reads the frame on the host; a frame it finds
    corrupt (``corrupt``) is taken, so that the device path raises for it as
    the host would; only a valid-looking frame it does not decode
    (``unsupported``) is left to the host.
    """
    return checked(plan, unsupported, corrupt, frame, name)[0]


def checked(plan, unsupported: type, corrupt: type, frame, name: str) -> tuple:
    """``(reason, plan)``: :func:`unsupported_reason`'s answer, and the frame's plan where it was made.

    The plan (None for a corrupt or unsupported frame) goes to the decode call
    (its ``plans``), so that the host reads each frame once.
    """
    try:
        return None, plan(frame, name)
    except unsupported as e:
        return str(e), None
    except corrupt:
        return None, None

"""Device codecs: chunk frames decoded (and encoded) on the device, one codec per module.

Each decoder module takes the frames of one codec, checks every frame on the
host (header and tables: a few bytes each), uploads them and decodes them with
a kernel from ``dgemm/kernels/`` into a device buffer, so that only compressed
bytes cross the bus.  A frame a module does not decode is left to the host
decoders (:mod:`dgemm.storage.chunks`), exactly as when no device codec is in use.

* :mod:`~dgemm.opencl.codecs.blosc`: Blosc frames with LZ4 (c-blosc 1.x, format
  version 2: Zarr v2's default compressor, zarr v3's ``BloscCodec`` with
  ``cname="lz4"``), any shuffle, split or not, memcpyed or not; other Blosc
  compressors are left to the host (``kernels/lz4.cl``);
* :mod:`~dgemm.opencl.codecs.zstd_decode`: zstd frames with their content size and no
  checksum (zarr v3's default ``ZstdCodec``, numcodecs' ``Zstd``), any level; the host reads
  the headers and entropy tables (``zstd_frames``, ``zstd_entropy``), ``kernels/zstd_decode.cl``
  decodes the literals and sequences and executes them;
* :mod:`~dgemm.opencl.codecs.zstd_encode`: regions of a device buffer written as zstd frames
  of literal-only blocks (``huffman`` builds their tables).

Every decoder exposes the same shape: ``unsupported_reason(frame, name)`` (None
where the device decodes the frame), ``supported(frame)`` and
``decode_<codec>(device, frames, out, offsets=None, names=None, events=None, queue=None,
plans=None, packed=None, keep=False)`` (``checked(frame, name)`` gives the reason and the plan
at once, so that the host reads a frame once; ``packed`` frames already in one page-locked array;
``keep`` device buffers kept per thread, :mod:`dgemm.opencl.scratch`)
which decodes into a pyopencl ``Buffer``, blocks until done and raises the
module's ``...FrameError`` (a :class:`~dgemm.errors.DgemmError`) whose message
starts with the frame's name (the caller passes the store key, array, rows and
columns there); a decoder whose :attr:`Decoder.defers` is set (zstd) also takes
``pending``, and then returns once its commands are enqueued, leaving a check
that raises the same error later.  Nothing here knows Zarr.

The ``device-codecs`` setting (:mod:`dgemm.config`) chooses whether workers use
this package: ``off`` keeps every chunk on the host, ``on`` sends the frames a
module decodes to the device, ``encode`` encodes C there alone, ``share`` shares the
inputs' chunks between the device's decoders and the host's readers (:func:`shares`),
``auto`` takes the device path where it was measured faster (:func:`enabled`: nowhere yet).
:data:`DECODERS` is the registry: which chunks' compressor each module decodes.
Nothing is imported at package import: ``import dgemm.opencl.codecs`` needs no pyopencl.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

MODES = ("auto", "on", "off", "encode", "share")


@dataclass(frozen=True)
class Decoder:
    """A device decoder: its module and function, and which chunks' compressors it takes."""

    module: str
    function: str                       # decode_<codec>(device, frames, out, offsets, names, events, queue)
    accepts: Callable[[dict], bool]     # the compressor's configuration (zarr's metadata) -> whether it decodes it
    what: str
    defers: bool = False                # the function takes ``pending`` (returns without waiting for its kernels)

    def load(self):
        """The decode function (imports its module, and so pyopencl, now)."""
        return getattr(importlib.import_module(self.module), self.function)

    def unsupported_reason(self, frame, name: str = "frame") -> str | None:
        """The module's ``unsupported_reason``: None where the device decodes this frame."""
        return importlib.import_module(self.module).unsupported_reason(frame, name)

    def checked(self, frame, name: str = "frame", light: bool = False) -> tuple:
        """The module's ``checked``: ``(unsupported_reason, plan or None)``, the plan for the decode's ``plans``.

        ``light``: where the module plans frames on the device (its ``headed``), the frame's header alone is
        read here; a frame that only the host decodes may then be found by the decode call, which raises
        one of :meth:`refused_light` before it writes anything, and the caller asks again without ``light``.
        """
        module = importlib.import_module(self.module)
        if light and hasattr(module, "headed"):
            return module.headed(frame, name)
        return module.checked(frame, name)

    def refused_light(self) -> tuple:
        """What a decode of frames checked with ``light`` raises where one of them needs the host's plan after all
        (the module's ``LIGHT_REFUSED``; none where it reads no frame lightly): the caller asks again without."""
        return getattr(importlib.import_module(self.module), "LIGHT_REFUSED", ())


# A chunk's compressor (numcodecs' codec id) -> its device decoder.  The configuration says which
# frames to expect; each frame is checked again (unsupported_reason) before it is decoded.
DECODERS = {
    "blosc": Decoder("dgemm.opencl.codecs.blosc", "decode_blosc",
                     lambda config: str(config.get("cname", "")).lower() == "lz4",
                     "Blosc frames with LZ4 (Zarr v2's default compressor, zarr v3's BloscCodec(cname='lz4'))"),
    # Frames with a checksum stay on the host: the device verifies XXH64 on one lane per frame.
    "zstd": Decoder("dgemm.opencl.codecs.zstd_decode", "decode_zstd",
                    lambda config: not config.get("checksum", False),
                    "zstd frames without a checksum (zarr v3's default ZstdCodec, numcodecs' Zstd)", defers=True),
}


def decoder(codec: str, config: dict | None = None) -> Decoder | None:
    """The device decoder of chunks whose compressor is ``codec`` with ``config``, or None (the host decodes).

    >>> decoder("blosc", {"cname": "lz4"}).function, decoder("blosc", {"cname": "zstd"}), decoder("gzip", {})
    ('decode_blosc', None, None)
    >>> decoder("zstd", {"level": 0, "checksum": False}).function, decoder("zstd", {"checksum": True})
    ('decode_zstd', None)
    """
    found = DECODERS.get(codec)
    return found if found is not None and found.accepts(config or {}) else None


# Device types where the device path was measured faster than the host's decoders, so that ``auto``
# takes it: none yet.  On one H200 (16 host cores), a 16384² float32 product of Blosc-LZ4 inputs (Zarr v2's
# default compressor, 4096² chunks) took 1.83 s with device-codecs on against 0.45 s off: lz4.cl decodes
# one stream per work-group, serially within it (bench/notes/issue-28/device_codecs_onoff.py).  With zstd
# in and out (Zarr v3's default), 32768² float32 on one H100 (16 cores) took 2.25-2.35 s on against
# 2.01-2.06 s off, 49152² on two H200s (32 cores) 4.2-4.3 s on against 3.5-3.7 s off and on one of them
# 6.6-6.8 s against 4.5-4.6 (bench/results/2026-11-26-*-device-codecs-onoff-*-850d91b.json): the
# decoder's kernels run at 37 GB/s, but share the device with the GEMM.  At 8fd0c39 (kernels 42 GB/s at
# level 3, 51 at level 1, four 64 MiB chunks a call) still 2.64-2.81 s on against 2.39-2.43 off on one H100;
# without Dask the device runs nothing of the product for 0.57-0.81 s of it, waiting on the host's part of
# each decode call (bench/NOTES.md, issue 28, eighth session).  Deferred decodes (53a28a3): 2.35-2.38 s on
# against 2.12-2.17 off; two H200s, 49152²: 3.70 s on against 3.54 off (on scales 1.95x from one GPU, off 1.23x).
# At 43a8855 (reader 5, the encoder's buffers kept, the next product in before the encode), same calls: one H100,
# 32768², 2.70-3.09 s on against 2.55-2.88 off; two H200s, 49152², 4.21-4.23 on against 3.90-4.02 off, and one
# of them 6.59-6.92 on against 4.56-4.61 off (on scales 1.60x: the one-GPU run is faster than at 53a28a3).
# `share` (b60cdf6: a reader finding every decode slot busy decodes on the host): one H100, 32768², 2.35-2.43 s
# against 2.44-2.62 off and 2.59-2.81 on (5 alternations, results/2026-11-27-nvidia-h100-share-zstd-32768-b60cdf6.json):
# faster than both there, not yet auto's (two GPUs, Blosc inputs and other hosts not measured).
# Thirteenth session (ef6d104-1caf166: C's encode on its own queue, blocks queued behind busy slots decoded in one
# call): one H100, 32768² zstd in and out, gemm-tasks 2, same call: share 1.79-1.94 s, on 2.02-2.31, off 2.19-2.62
# (raw 1.26-1.41); two H200s, 49152²: share 3.38-3.46 s against on 4.11-4.17 (off, another machine, 3.90-4.02),
# one of them share 5.27-5.34 against on 6.39-6.53 (results/2026-11-27-*-13th-*.json).  So auto shares on GPUs
# (AUTO), for the codecs measured so (AUTO_CODECS: Blosc's inputs stay on the host under auto).
# Twenty-second session (616372f: frames planned on the device, the readers reading headers alone): one H200,
# 32768² zstd, means of four runs, on 1.585 and 1.69 s against share 1.68 and 1.77 in two calls (results/2026-11-27-
# nvidia-h200-{devplan22,slots22}-*; with the plans kept instead, 1.52 against 1.73).  Twenty-third session
# (bdfdbd3, 70d2b1f): two H200s of one 32-core host, 49152², on 3.00 s against share 3.11 on both GPUs and 4.34
# against 4.04 on one of them; one H200 of 16 cores, on 4.06 against share 4.01 (49152²) and 1.56 against 1.61
# (32768²) (results/2026-11-28-nvidia-h200*).  No setting won everywhere, so auto stayed share.  Twenty-fourth
# session: on an 80 GB H100, 49152², on 4.15-4.20 s against share 4.28-4.43.  Twenty-eighth session (2db044c, the
# decode slots' buffers made at their names' sizes since fb5cc19), alternating in each cluster: one H200 of 16
# cores, 32768², on 1.383-1.461 s (mean 1.43) against share 1.519-1.670 (1.58), raw 1.21-1.28; 49152², on 3.78-3.82
# against share 4.04-4.06; two H200s of one 32-core host, 49152², on 2.29-2.37 against share 2.54-2.81 (raw 2.17-2.30)
# and on one of them 4.03-4.08 against 3.96-4.12 (results/2026-11-28-nvidia-h200*-28-2db044c.json).  `on` now
# leads or ties everywhere it was timed, so auto takes it.
# Device types where ``auto`` takes the device path for the inputs of the codecs AUTO_CODECS (their other
# codecs decoded on the host) and for C's chunks, and which way: "share" (a reader that finds every decode slot
# of its device busy decodes on the host) or "on" (it waits for one).  On a GPU, zstd's, on the device alone.
AUTO: dict = {"GPU": "on"}
AUTO_CODECS: frozenset = frozenset({"zstd"})
# Device types where C's chunks alone are encoded on the device under ``auto`` (the inputs decoded on the
# host): none until measured (bench/NOTES.md, issue 28).
AUTO_ENCODE: frozenset = frozenset()


def enabled(mode: str, device_type: str, work: str = "decode") -> bool:
    """Whether the ``device-codecs`` setting's ``mode`` has a device of ``device_type`` do ``work``.

    ``work`` is ``"decode"`` (the inputs' chunks) or ``"encode"`` (C's).
    ``on`` takes the device path for both on any device, ``encode`` for
    C's chunks alone (the inputs decoded on the host's cores), ``share``
    for both, the inputs' chunks shared with the host's readers
    (:func:`shares`), ``off`` for neither; ``auto`` takes it only where it
    was measured faster than the host (:data:`AUTO`, as ``share`` or ``on``
    for the inputs of :func:`codecs_of` and for C's chunks; :data:`AUTO_ENCODE`
    for C's chunks alone).

    >>> enabled("auto", "CPU"), enabled("on", "CPU"), enabled("off", "GPU"), enabled("auto", "GPU")
    (False, True, False, True)
    >>> enabled("encode", "CPU"), enabled("encode", "CPU", "encode")
    (False, True)
    >>> enabled("share", "GPU"), enabled("share", "GPU", "encode")
    (True, True)
    """
    if mode not in MODES:
        raise ValueError(f"device-codecs={mode!r} must be one of {', '.join(MODES)}")
    if work not in ("decode", "encode"):
        raise ValueError(f"internal: work={work!r}")
    if mode == "auto":
        return device_type in AUTO or (work == "encode" and device_type in AUTO_ENCODE)
    return mode in ("on", "share") or (mode == "encode" and work == "encode")


def codecs_of(mode: str, device_type: str) -> frozenset | None:
    """The inputs' codecs (:data:`DECODERS`' keys) whose chunks the device decodes under ``mode``, None for every
    one it can: ``auto`` takes only those it was measured faster for (:data:`AUTO_CODECS`).

    >>> sorted(codecs_of("auto", "GPU")), codecs_of("on", "GPU"), codecs_of("share", "CPU")
    (['zstd'], None, None)
    """
    if mode == "auto" and device_type in AUTO:
        return AUTO_CODECS
    return None


def shares(mode: str, device_type: str | None = None) -> bool:
    """Whether the ``device-codecs`` setting's ``mode`` shares the inputs' chunks between the device's decoders
    and the host's readers: a reader that finds every decode slot of the device busy
    (:meth:`~dgemm.opencl.scratch.Scratch.slot`) decodes its block on the host instead of waiting.

    ``auto`` shares on a device of ``device_type`` that :data:`AUTO` maps to ``"share"``.

    >>> shares("share"), shares("on"), shares("auto"), shares("auto", "GPU"), shares("auto", "CPU")
    (True, False, False, False, False)
    """
    if mode not in MODES:
        raise ValueError(f"device-codecs={mode!r} must be one of {', '.join(MODES)}")
    if mode == "auto":
        return AUTO.get(device_type) == "share"
    return mode == "share"

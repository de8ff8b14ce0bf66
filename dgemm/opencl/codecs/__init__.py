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
* ``zstd_decode`` and ``zstd_encode`` (beside this one, from other work on issue 28):
  zstd frames decoded, and regions of a device buffer written as zstd frames.

Every decoder exposes the same shape: ``unsupported_reason(frame, name)`` (None
where the device decodes the frame), ``supported(frame)`` and
``decode_<codec>(device, frames, out, offsets=None, names=None, events=None)``
which decodes into a pyopencl ``Buffer``, blocks until done and raises the
module's ``...FrameError`` (a :class:`~dgemm.errors.DgemmError`) whose message
starts with the frame's name (the caller passes the store key, array, rows and
columns there).  Nothing here knows Zarr.

The ``device-codecs`` setting (:mod:`dgemm.config`) chooses whether workers use
this package: ``off`` keeps every chunk on the host, ``on`` sends the frames a
module decodes to the device, ``auto`` decides per device.
Nothing is imported at package import: ``import dgemm.opencl.codecs`` needs no pyopencl.
"""

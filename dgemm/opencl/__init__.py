"""The devices: OpenCL alone, no Dask and no Zarr (``tests/test_imports.py`` holds it to that).

* :mod:`~dgemm.opencl.discovery`: platforms and devices, without a context;
* :mod:`~dgemm.opencl.params` and :mod:`~dgemm.opencl.database`: the kernels' compile-time
  parameters and the tuned values a device uses (``tuning.json``: data, kept apart from the tuner,
  :mod:`dgemm.tuning`, which sits above this package);
* :mod:`~dgemm.opencl.sources`: where the kernels' OpenCL C is (``dgemm/kernels/``);
* :mod:`~dgemm.opencl.device`: a context, its queues, programs built once per dtype and parameters,
  page-locked buffers;
* :mod:`~dgemm.opencl.engine`: the block product (read ahead, upload, pad or transpose, GEMM over
  k, one download) on blocks that read themselves;
* :mod:`~dgemm.opencl.panels`: staged blocks kept on the device for the next block products;
* :mod:`~dgemm.opencl.ptx` and :mod:`~dgemm.opencl.wgmma`: the PTX route, Hopper's ``wgmma``
  put into the PTX NVIDIA's OpenCL returns; :mod:`~dgemm.opencl.binaries`: its finished programs
  kept on disk;
* :mod:`~dgemm.opencl.codecs`: chunk frames decoded on the device, one codec per module
  (``codecs.blosc``: Blosc-LZ4; the host checks each frame and makes the stream table,
  ``kernels/lz4.cl`` decodes and unshuffles).

Nothing is imported here: ``import dgemm.opencl.params`` needs no pyopencl.
"""

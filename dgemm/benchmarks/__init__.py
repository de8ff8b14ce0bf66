"""Benchmarks and demonstrations behind ``dgemm bench``, ``dgemm demo`` and ``dgemm random``.

Everything here runs in the client's process (the benchmark's own), and
writes JSON records into ``bench/results/`` by default.

* :mod:`~dgemm.benchmarks.kernel`: the GEMM kernel alone, in device memory,
  against cuBLAS and numpy (``dgemm bench kernel``);
* :mod:`~dgemm.benchmarks.e2e`: Zarr to Zarr on a cluster, against
  dask.array + cupy, cuBLAS and dask.array + numpy, with the host's store and
  bus rates (``dgemm bench e2e``);
* :mod:`~dgemm.benchmarks.demo`: the self-checking demonstration (``dgemm demo``);
* :mod:`~dgemm.benchmarks.plots`: plots of records (``dgemm bench plot``);
* :mod:`~dgemm.benchmarks.peers`: cuBLAS, numpy and cupy as peers;
* :mod:`~dgemm.benchmarks.inputs`: random Zarr matrices (``dgemm random``);
* :mod:`~dgemm.benchmarks.records`: provenance, file names and JSON writing.

Every product these time is checked with :mod:`dgemm.accuracy`.
"""

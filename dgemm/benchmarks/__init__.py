"""Benchmarks and demonstrations behind ``dgemm bench``, ``dgemm demo`` and ``dgemm random``.

Everything here runs in the client's process (the benchmark's own), and
writes JSON records into ``bench/results/`` by default.

* :mod:`~dgemm.benchmarks.kernel`: the GEMM kernel alone, in device memory,
  against cuBLAS and numpy (``dgemm bench kernel``);
* :mod:`~dgemm.benchmarks.e2e`: Zarr to Zarr on a cluster, against
  dask.array + cupy, cuBLAS and dask.array + numpy (``dgemm bench e2e``):
  its options (:class:`~dgemm.benchmarks.e2e.E2EOptions`) and the runner
  whose stages use :mod:`~dgemm.benchmarks.inputs` (the Zarr inputs, encoded
  as users write them), :mod:`~dgemm.benchmarks.measure` (timed runs, the
  workers' counters, peak memory), :mod:`~dgemm.benchmarks.first_call` (a
  fresh script's first call), :mod:`~dgemm.benchmarks.floor` (the host's
  rates and ``dgemm plan``'s floor from them) and
  :mod:`~dgemm.benchmarks.report` (the record's name, ratios and table),
  with :mod:`~dgemm.benchmarks.rates`, :mod:`~dgemm.benchmarks.objectstore`
  and :mod:`~dgemm.benchmarks.pagecache` below them;
* :mod:`~dgemm.benchmarks.crossover`: where the devices beat numpy for
  in-memory operands (``dgemm bench crossover``);
* :mod:`~dgemm.benchmarks.demo`: the self-checking demonstration (``dgemm demo``);
* :mod:`~dgemm.benchmarks.plots`: plots of records (``dgemm bench plot``);
* :mod:`~dgemm.benchmarks.peers`: cuBLAS, numpy and cupy as peers;
* :mod:`~dgemm.benchmarks.inputs`: random Zarr matrices (``dgemm random``, the benchmarks' inputs);
* :mod:`~dgemm.benchmarks.records`: provenance, file names and JSON writing.

Every product these time is checked with :mod:`dgemm.accuracy`.
"""

"""Client side: what runs in the process that calls :func:`dgemm.matmul`.

A call is checked whole, then taken through its steps; no matrix data
passes through here (workers read and write Zarr themselves), except the
operands of a numpy-in, numpy-out call.

* :mod:`dgemm.client.request`: the checks, a frozen :class:`~dgemm.client.request.Request`
  built whole before any work;
* :mod:`dgemm.client.steps`: the order of a checked call's steps (resume check, plan, run,
  completion);
* :mod:`dgemm.client.plan`: block sizes, k splits, placement of C blocks on workers, the
  time floor (``dgemm plan``);
* :mod:`dgemm.client.graph`: the task graph's layers (``dgemm-gemm``, ``-reduce``, ``-store``,
  ``-done``);
* :mod:`dgemm.client.inmemory`: numpy in, numpy out;
* :mod:`dgemm.client.dataarrays`: xarray in, xarray out;
* :mod:`dgemm.client.results`: :func:`~dgemm.client.results.open_result`.

:mod:`dgemm.api` is the public face over these.  Nothing is imported here:
``import dgemm.client.plan`` costs no Dask or Zarr import beyond the module's own.
"""

"""Which kernel parameters a device uses, and how they are found.

* :mod:`~dgemm.tuning.params`: the kernel's compile-time parameters and their rules
  (:class:`~dgemm.tuning.params.KernelParams`; :data:`~dgemm.tuning.params.MMA_KINDS`, the
  tensor-core instructions);
* :mod:`~dgemm.tuning.database`: the tuning database and its lookup (device, architecture,
  vendor, default);
* :mod:`~dgemm.tuning.timing`: timing the kernel alone on device-resident data, checked;
* :mod:`~dgemm.tuning.search`: the autotuner behind ``dgemm tune``;
* :mod:`~dgemm.tuning.report`: what ``dgemm devices`` shows.
"""

"""The tuner: how kernel parameters are found (CLBlast's split: the tuner above the device, the tuned
values below it, as data the device reads).

What a device uses lives in :mod:`dgemm.opencl`: :mod:`~dgemm.opencl.params` (the kernels'
compile-time parameters and their rules) and :mod:`~dgemm.opencl.database` (the tuning database and
its lookup, with the shipped ``opencl/tuning.json``).  Here, above it:

* :mod:`~dgemm.tuning.timing`: timing the kernel alone on device-resident data, checked;
* :mod:`~dgemm.tuning.search`: the autotuner behind ``dgemm tune``;
* :mod:`~dgemm.tuning.report`: what ``dgemm devices`` shows.
"""

# The OpenCL C sources live here and ship inside the wheel as the package
# ``dgemm.kernels``; ``dgemm.sources`` finds them.

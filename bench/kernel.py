"""The kernel benchmark as a script: the same as `dgemm bench kernel` (try --help)."""
import os, sys  # noqa: E401
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dgemm.cli import bench_kernel  # noqa: E402
bench_kernel.main(prog_name=os.path.basename(sys.argv[0]))

"""``dgemm bench``: benchmarks that write JSON records."""
from __future__ import annotations

import contextlib
import os

import click

from dgemm.cli.common import InputError, cli, connect, one_device, one_line, user_errors
from dgemm.dtypes import DTYPES


def _csv(value: str, what: str, convert):
    items = [v.strip() for v in str(value).split(",") if v.strip()]
    if not items:
        raise InputError(f"--{what} needs at least one value")
    try:
        return [convert(v) for v in items]
    except ValueError as e:
        raise InputError(f"--{what} {value!r}: {one_line(e)}") from None


def _dtype_name(v: str) -> str:
    if v not in DTYPES:
        raise ValueError(f"{v!r} is not float32 or float64")
    return v


def _size(v: str) -> int:
    n = int(v)
    if n < 1:
        raise ValueError(f"{n} is not a positive size")
    return n


@cli.group()
def bench():
    """Benchmarks that write JSON records (by default into bench/results/)."""


@bench.command(name="kernel")
@click.option("--device", "device_spec", metavar="SPEC",
              help="The device (as for tune; default: the first device a local cluster would use).")
@click.option("--dtypes", default="float32,float64", show_default=True,
              help="Comma-separated dtypes (float64 is skipped on devices without it).")
@click.option("--sizes", default=None,
              help="Comma-separated square sizes, timed in this order (default: 1024,2048,4096,8192,16384,10000; "
                   "256,512,1024 on a CPU device).")
@click.option("--reps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed repetitions per size (the median counts).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench/results", show_default=True,
              help="Folder of the JSON record <date>-<device>-kernel.json.")
@click.option("--no-peers", is_flag=True, help="Time dgemm's kernel only, not cuBLAS and numpy.")
@click.pass_context
def bench_kernel(ctx, device_spec, dtypes, sizes, reps, out_dir, no_peers):
    """Time the GEMM kernel alone, with the parameters the tuning database chooses.

    Runs on device-resident inputs; every run is checked against numpy and
    one that fails is reported as FAILED (its time does not count).  Peers
    in the same run: cuBLAS (through torch or cupy; TF32 off except beside
    the tf32 path) where CUDA is available, and numpy in the same dtype for
    sizes up to 4096.
    """
    from dgemm.benchmarks.kernel import format_table, kernel_bench

    dts = _csv(dtypes, "dtypes", _dtype_name)
    size_list = _csv(sizes, "sizes", _size) if sizes is not None else None
    with user_errors(ctx):
        info = one_device(device_spec)
        record, path = kernel_bench(info, dtypes=dts, sizes=size_list, reps=reps, out_dir=out_dir,
                                    peers=not no_peers, log=click.echo)
    click.echo()
    click.echo(format_table(record))
    click.echo(f"record written to {path}")
    if record["failures"]:
        raise click.ClickException(f"{record['failures']} run(s) FAILED (see {path})")


@bench.command(name="e2e")
@click.option("--size", type=click.IntRange(min=1), default=None,
              help="Square product M = N = K (default: 32768 with a GPU, 1024 on CPU devices).")
@click.option("--shape", default=None, metavar="M,N,K",
              help="A non-square product instead of --size; with --op gram X's M,N (C = X^T X is N x N); with "
                   "--op projection M,N,K: X M x K @ W K x N.")
@click.option("--op", type=click.Choice(["matmul", "gram", "projection"]), default="matmul", show_default=True,
              help="What is timed: C = A @ B; a Gram matrix C = X^T X (X written once, dgemm.gemm(X, X, "
                   "trans_a=True) against dask.array's X.T @ X); a projection C = X @ W with a small W (with "
                   "--size S: W of 256 columns).  The read-and-decode floor of the inputs is printed beside "
                   "each figure.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--chunks", "--input-chunks", "chunks", type=click.IntRange(min=1), default=8192, show_default=True,
              help="Zarr chunk side of the inputs A and B (capped to the matrix); dgemm's blocks follow its own "
                   "plan (up to the default block size, they follow the chunks).")
@click.option("--devices", metavar="SPEC",
              help="Devices of dgemm's local cluster, one worker each: gpu, 0,1, cpu,cpu... (as for matmul).")
@click.option("--scheduler", metavar="ADDR",
              help="Time dgemm on the running cluster at ADDR instead of a local one.")
@click.option("--gpus", default=None, metavar="1,2,...",
              help="Also a scaling table: dgemm on the first 1, 2... devices of --devices, each its own cluster.")
@click.option("--store", default=None, metavar="PATH|s3://BUCKET/PREFIX",
              help="Where the Zarr files go, inputs and outputs: a folder, e.g. /dev/shm or a local disk (a "
                   "dgemm-e2e-* folder is made in it; default: the temporary folder), or an S3 prefix (see "
                   "--s3-server; the server's raw GET rate is recorded beside dgemm's figure).")
@click.option("--s3-server", default=None, metavar="local|URL",
              help="With an s3:// --store: 'local' (the default) starts moto's S3 server on 127.0.0.1 for the "
                   "run; a URL (http://host:port) names a running server, credentials from the environment.")
@click.option("--keep", is_flag=True, help="Keep the Zarr files (inputs and outputs).")
@click.option("--no-peers", is_flag=True, help="Time dgemm only, not dask.array + cupy, cuBLAS, dask.array + numpy.")
@click.option("--numpy-size", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Side cap of the dask.array + numpy comparison (dgemm runs at that size too).")
@click.option("--kernel-size", type=click.IntRange(min=1), default=None,
              help="Side of the in-memory kernel timing (default: the full size when its buffers fit "
                   "32-bit indexing, else sides capped at 32768).")
@click.option("--reps", type=click.IntRange(min=1), default=1, show_default=True,
              help="Timed repetitions of each end-to-end run (the median counts).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench/results", show_default=True,
              help="Folder of the JSON record <date>-<device>[-xN]-e2e-<size>-<dtype>.json.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--uncompressed", is_flag=True,
              help="Store C without compression (dgemm and the peers); default: Zarr's default codec.")
@click.option("--codec", "--input-codec", "input_codec", type=click.Choice(["raw", "default", "blosc-lz4"]),
              default="raw", show_default=True,
              help="How A and B are encoded: raw chunks, Zarr's default codec (zstd, as users' arrays are), "
                   "or Blosc with LZ4.")
@click.option("--input-zarr-format", type=click.Choice(["2", "3"]), default="3", show_default=True,
              help="The Zarr format of A and B.")
@click.option("--shards", type=click.IntRange(min=1), default=None, metavar="N",
              help="Write A and B sharded: shards of N x N holding inner chunks of --chunks (a multiple of "
                   "--chunks; Zarr v3).")
@click.option("--first-call", is_flag=True,
              help="Also time dgemm's first call from a fresh script (a new process that imports dgemm and "
                   "calls dgemm.matmul once with no cluster), from the process's start to the call's return.")
@click.option("--cold", is_flag=True,
              help="Drop the input files from the page cache before each timed run (posix_fadvise DONTNEED, "
                   "no root needed; the record says how many bytes were dropped); the store's read rates are "
                   "timed cold too.  Local stores only.")
@click.pass_context
def bench_e2e(ctx, size, shape, op, dtype, chunks, devices, scheduler, gpus, store, s3_server, keep, no_peers,
              numpy_size, kernel_size, reps, out_dir, seed, uncompressed, input_codec, input_zarr_format, shards,
              first_call, cold):
    """Time dgemm from Zarr to Zarr against dask.array + cupy, cuBLAS and dask.array + numpy.

    --op picks the product: C = A @ B (the default), a Gram matrix X^T X
    (--shape M,N: X of M x N written once), or a projection X @ W with a
    small W (--shape M,N,K); the peers compute the same thing on the same
    files, and the floor of reading and decoding the inputs once (rates
    measured in the same run) is printed and recorded beside each figure.

    Writes random A and B as Zarr arrays (raw chunks, or as --codec,
    --input-zarr-format, --input-chunks and --shards say, with zarr's API)
    in a local folder or on S3 (--store), then on those inputs times
    dgemm.matmul (kernels built first) with the workers' counters, peak
    memory and a sampled correctness check, dgemm's kernel in device
    memory, the peers that can run here, and the store's read and write
    rates (on S3: the server's raw GET and PUT rates) and a worker's
    host-device copy rates; dgemm plan's predicted floor for the run is
    printed beside its time.  With --first-call, also a fresh script's
    first dgemm.matmul; with --cold, every timed run starts with its inputs
    out of the page cache.  A wrong dgemm result makes the command fail.
    """
    from dgemm.benchmarks.e2e import E2EOptions, e2e_bench
    from dgemm.benchmarks.report import format_table

    if size is not None and shape is not None:
        raise InputError("give --size or --shape, not both")
    mnk = _csv(shape, "shape", _size) if shape is not None else None
    if mnk is not None and op == "gram" and len(mnk) != 2:
        raise InputError(f"--shape {shape!r}: with --op gram give X's two sizes M,N (C = X^T X is N x N)")
    if mnk is not None and op != "gram" and len(mnk) != 3:
        raise InputError(f"--shape {shape!r}: give three sizes M,N,K")
    if first_call and op == "gram":
        raise InputError("--first-call times a fresh script's dgemm.matmul(A, B): not with --op gram")
    gpu_counts = _csv(gpus, "gpus", _size) if gpus is not None else None
    if scheduler and (devices or gpu_counts):
        raise InputError("--devices and --gpus start local clusters; the workers of --scheduler have their own "
                         "devices")
    zarr_format = int(input_zarr_format)
    if shards is not None and zarr_format != 3:
        raise InputError("--shards needs --input-zarr-format 3 (Zarr v2 has no shards)")
    if shards is not None and shards % chunks:
        raise InputError(f"--shards {shards} must be a multiple of --chunks {chunks}")
    remote = store is not None and "://" in store
    if remote and not store.startswith("s3://"):
        raise InputError(f"--store {store!r}: give a local folder or an s3:// URL")
    if s3_server is not None and not remote:
        raise InputError("--s3-server needs an s3:// --store")
    if s3_server not in (None, "local") and not s3_server.startswith(("http://", "https://")):
        raise InputError(f"--s3-server {s3_server!r}: give 'local' or an http(s):// URL")
    if cold and remote:
        raise InputError("--cold drops local files from the page cache: not with an s3:// --store")
    if keep and remote and s3_server in (None, "local"):
        raise InputError("--keep: the local S3 server's objects go when it stops; give --s3-server URL")
    if store is not None and not remote and os.path.isfile(store):
        raise InputError(f"--store {store!r} is a file: give a folder")
    with user_errors(ctx), contextlib.ExitStack() as stack:
        options = E2EOptions(size=size, shape=mnk, dtype=dtype, chunks=chunks, devices=devices,
                             gpus=gpu_counts or (), store=store, s3_server=s3_server, keep=keep, peers=not no_peers,
                             numpy_size=numpy_size, kernel_size=kernel_size, reps=reps, out_dir=out_dir, seed=seed,
                             compressors=None if uncompressed else "auto", input_codec=input_codec,
                             input_zarr_format=zarr_format, shards=shards, first_call=first_call, cold=cold, op=op)
        client = connect(stack, scheduler)
        record, path = e2e_bench(options, client=client, log=click.echo)
    click.echo()
    click.echo(format_table(record))
    if keep:
        click.echo(f"Zarr files kept in {record['store']}")
    click.echo(f"record written to {path}")
    if record["failures"]:
        raise click.ClickException(f"{record['failures']} dgemm run(s) FAILED (see {path})")


@bench.command(name="crossover")
@click.option("--devices", metavar="SPEC", help="Devices of dgemm's local cluster (as for matmul).")
@click.option("--scheduler", metavar="ADDR", help="Time the running cluster at ADDR instead of a local one.")
@click.option("--dtypes", default="float32,float64", show_default=True, help="Comma-separated dtypes.")
@click.option("--sizes", default="128,256,512,1024,2048,4096,8192", show_default=True,
              help="Comma-separated square sizes.")
@click.option("--reps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed repetitions per size (the median counts).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench/results", show_default=True,
              help="Folder of the JSON record <date>-<device>-crossover.json.")
@click.pass_context
def bench_crossover(ctx, devices, scheduler, dtypes, sizes, reps, out_dir):
    """Where the devices beat numpy for numpy-in, numpy-out products (the small-flops setting).

    Times dgemm.matmul on numpy operands (always on the devices: scatter,
    compute, gather, on a warm cluster) against numpy's matmul in this
    process, on the same data, and records the smallest product from which
    the devices won at every larger size.
    """
    from dgemm.benchmarks.crossover import crossover_bench
    from dgemm.benchmarks.measure import bench_cluster

    dts = _csv(dtypes, "dtypes", _dtype_name)
    size_list = _csv(sizes, "sizes", _size)
    with user_errors(ctx), contextlib.ExitStack() as stack:
        client = connect(stack, scheduler) if scheduler else None
        client, _ = stack.enter_context(bench_cluster(devices, client))
        record, path = crossover_bench(client, dtypes=dts, sizes=size_list, reps=reps, out_dir=out_dir,
                                       log=click.echo)
    for dt, r in record["results"].items():
        x = r["crossover_flops"]
        click.echo(f"{dt}: the devices win from {x:.3g} flops (2·n³)" if x else f"{dt}: numpy won at every size")
    click.echo(f"record written to {path}")
    if record["failures"]:
        raise click.ClickException(f"{record['failures']} run(s) FAILED their check (see {path})")


@bench.command(name="plot")
@click.argument("records", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True, help="The PNG to write.")
@click.pass_context
def bench_plot(ctx, records, out_path):
    """Plot TFLOPS and parallel efficiency against GPU count from e2e records made with --gpus."""
    with user_errors(ctx):
        try:
            import matplotlib  # noqa: F401

            from dgemm.benchmarks.plots import load_records, scaling_plot
        except ImportError:
            raise InputError("dgemm bench plot needs matplotlib: pip install 'dgemm[plot]'") from None
        path = scaling_plot(load_records(records), out_path)
    click.echo(f"plot written to {path}")

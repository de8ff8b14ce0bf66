"""``dgemm random`` (a random test matrix in Zarr) and ``dgemm plan`` (how a product would be cut)."""
from __future__ import annotations

import time

import click
import numpy as np

from dgemm import config
from dgemm.cli.common import BlockParam, cli, storage_option, user_errors
from dgemm.dtypes import DTYPES


@cli.command()
@click.argument("path")
@click.option("--shape", nargs=2, type=click.IntRange(min=0), required=True, metavar="M N",
              help="Rows and columns.")
@click.option("--chunks", nargs=2, type=click.IntRange(min=1), required=True, metavar="R C",
              help="Zarr chunk shape.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--seed", type=int, default=None, help="Random seed (default: fresh entropy).")
@click.option("--overwrite", is_flag=True, help="Replace an existing array at PATH.")
@storage_option("a URL PATH", "zarr.create_array")
@click.pass_context
def random(ctx, path, shape, chunks, dtype, seed, overwrite, storage_options):
    """Write a random standard-normal matrix to the Zarr array PATH, chunks in parallel threads."""
    from dask.utils import format_bytes

    from dgemm.benchmarks.inputs import random_zarr

    t0 = time.perf_counter()
    with user_errors(ctx):
        arr = random_zarr(path, shape, chunks, dtype, seed=seed, overwrite=overwrite,
                          storage_options=storage_options)
    seconds = time.perf_counter() - t0
    nbytes = arr.size * arr.dtype.itemsize
    click.echo(f"wrote {path}: {arr.shape[0]} x {arr.shape[1]} {arr.dtype}, chunks {arr.chunks[0]} x "
               f"{arr.chunks[1]}, {format_bytes(nbytes)} in {seconds:.2f} s")


@cli.command()
@click.argument("a")
@click.argument("b")
@click.option("--block", type=BlockParam(), default=None,
              help="Preferred block size N, or M,N,K (default: 1024 on CPU devices, 4096 on GPUs under 24 GiB, 8192,8192,4096 otherwise).")
@click.option("--dtype", type=click.Choice(DTYPES), default=None,
              help="Plan for this dtype (default: the inputs' common dtype).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Devices to plan for (default: those a local cluster would use).")
@click.option("--hosts", type=click.IntRange(min=1), default=1, show_default=True,
              help="Hosts the workers are spread over (each with --cores cores).")
@click.option("--cores", type=click.IntRange(min=1), default=None,
              help="Cores per host, shared by its workers' decoding and encoding (default: this host's).")
@click.option("--read-gbps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Store read rate per host (GB/s of stored bytes), for a cold disk or an object store "
                   "(default: no bound beyond the cores, as from the page cache).")
@click.option("--write-gbps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Store write rate per host (GB/s of stored bytes; default: no bound beyond the cores).")
@click.option("--pcie-gbps", type=click.FloatRange(min=0, min_open=True), default=20.0, show_default=True,
              help="Host-device copy rate per device (GB/s).")
@click.option("--tflops", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Kernel rate per device (default: the tuning database's figure for the device, if any).")
@click.option("--decode-gbps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Decode rate of A and B per core (default: their codec's, measured with every core busy).")
@click.option("--encode-gbps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Encode rate of C per core (default: its codec's).")
@click.option("--out-codec", default="default", show_default=True,
              help="C's codec: default (Zarr's: zstd), raw, zstd, blosc-lz4.")
@click.option("--host-cache/--no-host-cache", default=False, show_default=True,
              help="The workers of a host share decoded blocks (dgemm's host-cache setting).")
@click.pass_context
def plan(ctx, a, b, block, dtype, workers, hosts, cores, read_gbps, write_gbps, pcie_gbps, tflops, decode_gbps,
         encode_gbps, out_codec, host_cache):
    """Show how A @ B (two Zarr arrays) would be cut into blocks, the bytes moved and the time floor.

    The floor is what binds: each host's cores decoding A and B and encoding
    C (at the codecs' per-core rates, every read counted, panels read by
    several workers or again on later rows included), the store, and each
    device's kernel and PCIe copies; plus the pipeline's fill and drain.
    Needs no cluster.  Uses the first local device's kernel tiles, memory and
    recorded kernel rate when there is one (else the default tiles), and counts
    the device memory its codecs would keep beside the panel cache under the
    ``device-codecs`` setting read here; a real run uses those of its workers'
    devices and settings, which may differ.
    """
    import os

    from dgemm.benchmarks.inputs import codec_dict
    from dgemm.client.estimate import Rates, codec_of
    from dgemm.client.plan import make_plan
    from dgemm.dtypes import check_dtype
    from dgemm.opencl import discovery
    from dgemm.opencl.database import lookup
    from dgemm.opencl.params import KernelParams
    from dgemm.sizes import default_target
    from dgemm.storage import Operand
    from dgemm.worker.state import device_memory

    try:
        selection = discovery.select_devices(None)
    except LookupError:  # planning needs no device; fall back to GPU-sized blocks
        selection = []
    with user_errors(ctx):
        A, B = Operand(a, "a"), Operand(b, "b")
        if A.ndim == 1:
            A.promote(0)
        if B.ndim == 1:
            B.promote(1)
        (m, k), (kb, n) = A.shape, B.shape
        if k != kb:
            raise ValueError(f"shapes do not match: a has shape {A.stored_shape} and b has shape "
                             f"{B.stored_shape}; the contracted dimensions differ ({k} != {kb})")
        dt = check_dtype(dtype or np.result_type(A.dtype, B.dtype), "the result")
        tiles, memory, rate = KernelParams().tiles, None, None
        if selection:
            choice = lookup(selection[0], dt.name)
            # (the memory a worker there would plan for: device-memory-limit read here, as the cache below)
            tiles, memory, rate = choice.params.tiles, device_memory(selection[0]), choice.tflops
        target = block if block is not None else default_target((d.type for d in selection), memory)
        n_workers = workers or max(len(selection), 1)
        p = make_plan(m, n, k, dt, tiles, a_chunks=A.chunks, b_chunks=B.chunks, target=target,
                      n_workers=n_workers, device_memory=memory, exact=block is not None)
        rates = Rates(read=read_gbps and read_gbps * 1e9, write=write_gbps and write_gbps * 1e9, pcie=pcie_gbps * 1e9,
                      flops=(tflops or rate or 0) * 1e12 or None, decode=decode_gbps and decode_gbps * 1e9,
                      encode=encode_gbps and encode_gbps * 1e9, cores=cores or os.cpu_count())
        cache, kept = _panel_cache(p, selection, A, B, host_cache)
        codecs = tuple(codec_of([codec_dict(c) for c in x.zarr.compressors]) for x in (A, B)) + (
            codec_of(out_codec),)
        chunks = (A.chunks, B.chunks) if None not in A.chunks + B.chunks else None
        how = {"codecs": codecs, "hosts": hosts, "shared_decode": host_cache, "chunks": chunks,
               "device_is_host": bool(selection) and selection[0].type == "CPU"}
        text = p.explain_estimate(n_workers, rates, cache, **how)
    click.echo(p.explain())
    if cache is not None:
        from dask.utils import format_bytes

        click.echo(f"panel cache: {format_bytes(cache)} a device, beside a block product's buffers and "
                   f"{format_bytes(kept)} its codecs keep (device-codecs: {config.get('device-codecs') or 'auto'}"
                   f"; C's encoder not counted)")
    click.echo(text)


def _panel_cache(plan, selection, a, b, host_cache: bool) -> tuple[float | None, int]:
    """``(cache, kept)``: the panel cache of the first local device while it runs ``plan``'s blocks of ``a`` and
    ``b`` and the bytes its codecs keep beside it, as a worker there would count them under the settings read
    here (:func:`dgemm.client.codecs_room.panel_cache_bytes`; C's encoder left out: there is no C yet); None
    without a local device."""
    from dgemm.client.codecs_room import codecs_bytes, panel_cache_bytes
    from dgemm.sizes import cache_budget
    from dgemm.worker.state import device_memory
    from dgemm.worker.tasks import codecs_described

    if not selection:
        return None, 0
    info = selection[0]
    memory = device_memory(info)
    codecs = codecs_described(info.type, cache_budget(memory, 0, info.type), host_cache)
    described = {"device": info, "memory": memory, "codecs": codecs}
    return panel_cache_bytes(plan, {"local": described}, a, b), codecs_bytes(plan, a, b, None, (), codecs)

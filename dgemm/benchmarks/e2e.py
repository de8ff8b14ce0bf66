"""The end-to-end benchmark behind ``dgemm bench e2e``: Zarr in, Zarr out, against its peers.

:class:`E2EOptions` says what one run does; :func:`e2e_bench` runs it, in
stages that each fill a part of the JSON record and save it:

* the inputs: A (m x k) and B (k x n) written as Zarr arrays, raw or as
  users write them (:func:`dgemm.benchmarks.inputs.make_inputs`), in a
  local folder or on S3 (moto's server started on 127.0.0.1 for the run,
  or a given endpoint: :mod:`dgemm.benchmarks.objectstore`);
* on the main cluster (one worker per device): dgemm's kernel in a
  worker's device memory, the host's rates that bound the run and
  ``dgemm plan``'s floor from them (:mod:`dgemm.benchmarks.floor`), and
  ``dgemm.matmul(A, B, out=C)`` with the workers' counters, peak memory and
  a sampled check of C (:mod:`dgemm.benchmarks.measure`): a wrong result
  fails the run;
* optionally a scaling table (dgemm on the first 1, 2, ... devices, each on
  its own cluster) and the first call from a fresh script
  (:mod:`dgemm.benchmarks.first_call`);
* the peers on the same inputs, once dgemm's clusters are gone:
  dask.array + cupy, cuBLAS in memory (:mod:`dgemm.benchmarks.peers`), and
  dask.array + numpy at a smaller size, with dgemm at that size too.  A
  peer that cannot run is recorded as ``None`` with the reason.

With ``cold``, every timed run starts with its input files out of the page
cache (:mod:`dgemm.benchmarks.pagecache`).  The record goes to
``bench/results/<date>-<device>[-xN]-e2e-<size>-<dtype>.json``
(:func:`dgemm.benchmarks.records.result_path`); :mod:`dgemm.benchmarks.report`
names it and prints it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dgemm.benchmarks import pagecache
from dgemm.benchmarks.first_call import first_call_script, time_first_call
from dgemm.benchmarks.floor import add_floor, time_host_rates
from dgemm.benchmarks.inputs import input_compressors, make_inputs
from dgemm.benchmarks.measure import (bench_cluster, flops, free_cupy, kernel_rate, kernel_shape, ready_workers,
                                      time_dask, time_dgemm, warm_up, worker_split)
from dgemm.benchmarks.objectstore import LocalS3, Location, new_location, s3_options, split_url
from dgemm.benchmarks.peers import cupy_status, time_cublas
from dgemm.benchmarks.records import DEFAULT_OUT, command_line, git_commit, result_path, utc_now, write_json
from dgemm.benchmarks.report import bytes_text, error_text, fmt, input_detail, inputs_text, ratios
from dgemm.benchmarks.shapes import add_io_floor, check_shape, describe, io_floor_lines, io_rates, op_detail, op_mnk
from dgemm.dtypes import DTYPES

DEFAULT_CHUNKS = 8192
E2E_GPU_SIZE = 32768              # default side with a GPU: inputs of 4 GiB each in float32
E2E_CPU_SIZE = 1024
NUMPY_SIZE = 4096                 # the dask.array + numpy peer is slow: it runs at most at this size


# -- the options ------------------------------------------------------------------------------
@dataclass(frozen=True)
class E2EOptions:
    """What one end-to-end run does: ``dgemm bench e2e``'s options, checked when made.

    Values that cannot go together are refused here, before any work:
    ``ValueError`` (``TypeError`` for a dtype dgemm does not multiply).
    What depends on this host (the devices ``gpus`` counts, whether the S3
    libraries are installed, whether files can leave the page cache) is
    checked by :func:`e2e_bench` before it writes anything.

    Parameters
    ----------
    size : int, optional
        Square side ``m = n = k``; default 32768 when a selected device is a
        GPU, 1024 otherwise.
    shape : (int, int, int) or (int, int), optional
        ``(m, n, k)`` instead of ``size``; for ``op="gram"`` X's ``(M, N)``
        (C = X^T X is N x N, summed over M).
    op : {"matmul", "gram", "projection"}
        What is timed (:mod:`dgemm.benchmarks.shapes`): ``C = A @ B``; a Gram
        product ``C = X^T X`` (X written once, ``dgemm.gemm(X, X,
        trans_a=True)``, dask.array's ``X.T @ X``); a projection ``C = X @ W``
        (X m x k, W k x n small; by ``size``, W of 256 columns).  Every op
        records the read-and-decode floor of its inputs beside its figures.
    dtype : {"float32", "float64"}
    chunks : int
        Zarr chunk side of the inputs (capped to the matrix).
    devices : str, optional
        Devices of the cluster dgemm runs on (as :class:`~dgemm.cluster.DeviceCluster`
        takes them); ignored for the main runs when :func:`e2e_bench` is given a client.
    gpus : sequence of int
        Scaling table: dgemm on the first 1, 2, ... devices of ``devices``,
        each on its own cluster; the count the main run used reuses its
        result.  Kept sorted, each count once.
    store : path or str, optional
        Folder for the Zarr files: a new ``dgemm-e2e-*`` folder is made in it
        (default: in the system's temporary folder).  Or ``s3://BUCKET/PREFIX``:
        inputs and outputs on an S3 server (``s3_server``), a new
        ``dgemm-e2e-*`` prefix under it; the server's raw GET and PUT rates
        (:func:`~dgemm.benchmarks.objectstore.object_get_rate`) are recorded
        in ``record["object_store"]`` in place of the local store's rates.
    s3_server : str, optional
        With an ``s3://`` store: ``"local"`` (the default) starts moto's
        server on 127.0.0.1 for the run (:class:`~dgemm.benchmarks.objectstore.LocalS3`);
        an ``http(s)://`` URL names a running server (credentials from the
        environment, as s3fs finds them).
    keep : bool
        Keep the Zarr files (inputs and outputs); otherwise they are removed.
        Not with the local S3 server (its objects go with it).
    peers : bool
        Time dask.array + cupy, cuBLAS and dask.array + numpy (and dgemm at
        the small size, which only the dask.array + numpy peer needs).
    numpy_size : int, optional
        Side cap of the dask.array + numpy comparison (default 4096); dgemm
        runs at that size too.
    kernel_size : int, optional
        Square side of the in-memory kernel timing (default: the full size
        when it fits 32-bit indexing, else sides capped at 32768).
    reps : int
        Timed repetitions of each end-to-end run (the median counts).
    out_dir : path, optional
        Folder of the record (:func:`dgemm.benchmarks.records.result_path`, detail
        :func:`~dgemm.benchmarks.report.result_detail`); ``None`` writes nothing.
    seed : int
        Seed of the inputs.
    command : str, optional
        The command line to record (default: :func:`dgemm.benchmarks.records.command_line`).
    compressors : "auto" or None or codecs
        dgemm's output codecs (:func:`dgemm.matmul`'s ``compressors``; the
        peers write with the same); ``None`` stores C uncompressed.
    input_codec : {"raw", "default", "blosc-lz4"}
        How A and B are encoded (:func:`~dgemm.benchmarks.inputs.input_compressors`):
        raw chunks, zarr's default codec (zstd), or Blosc with LZ4.
    input_zarr_format : {3, 2}
        The inputs' Zarr format.
    shards : int, optional
        Write the inputs sharded, shards of ``shards`` x ``shards`` (capped to
        the matrix) holding inner chunks of ``chunks``; a multiple of
        ``chunks``, Zarr v3 only.
    first_call : bool
        Also time dgemm's first call from a fresh script
        (:func:`~dgemm.benchmarks.first_call.time_first_call`), after the
        main cluster is closed, on the same inputs.
    cold : bool
        Before each timed run (dgemm's, the first call's, the peers'), drop
        its input files from the page cache (:func:`dgemm.benchmarks.pagecache.drop`;
        no root needed); each run's entry says how many bytes were cached
        before and after (``cold``).  The store's read rates are then
        measured cold too.  Local stores only.

    Examples
    --------
    >>> E2EOptions(size=256, gpus=[2, 1, 2]).gpus
    (1, 2)
    >>> E2EOptions(shards=24, chunks=16)
    Traceback (most recent call last):
    ...
    ValueError: shards (24) must be a multiple of chunks (16)
    """

    size: int | None = None
    shape: tuple[int, ...] | None = None
    dtype: str = "float32"
    chunks: int = DEFAULT_CHUNKS
    devices: str | None = None
    gpus: tuple[int, ...] = ()
    store: str | None = None
    s3_server: str | None = None
    keep: bool = False
    peers: bool = True
    numpy_size: int | None = None
    kernel_size: int | None = None
    reps: int = 1
    out_dir: str | os.PathLike | None = DEFAULT_OUT
    seed: int = 0
    command: str | None = None
    compressors: object = "auto"
    input_codec: str = "raw"
    input_zarr_format: int = 3
    shards: int | None = None
    first_call: bool = False
    cold: bool = False
    op: str = "matmul"

    def __post_init__(self):
        def norm(name, value):      # frozen: the checked values are set through object.__setattr__
            object.__setattr__(self, name, value)

        dtype = np.dtype(self.dtype).name
        if dtype not in DTYPES:
            raise TypeError(f"dgemm supports float32 and float64, not {dtype}")
        norm("dtype", dtype)
        if self.size is not None and self.shape is not None:
            raise ValueError("give size or shape, not both")
        norm("shape", check_shape(self.op, self.shape))
        if self.size is not None:
            norm("size", int(self.size))
        for name in ("size", "chunks", "reps", "numpy_size", "kernel_size", "shards"):
            v = getattr(self, name)
            if v is not None and int(v) < 1:
                raise ValueError(f"{name} must be positive, not {v}")
        input_compressors(self.input_codec, self.input_zarr_format)    # an unknown codec is refused here
        if self.input_zarr_format not in (2, 3):
            raise ValueError(f"input_zarr_format must be 2 or 3, not {self.input_zarr_format!r}")
        if self.shards and self.input_zarr_format != 3:
            raise ValueError("sharded inputs need Zarr v3 (input_zarr_format=3)")
        if self.shards and self.shards % self.chunks:
            raise ValueError(f"shards ({self.shards}) must be a multiple of chunks ({self.chunks})")
        if self.first_call:
            if self.op == "gram":
                raise ValueError("first_call times a fresh script's dgemm.matmul(A, B): not with op='gram'")
            first_call_script(self.compressors)   # codec objects cannot go into the script
        gpus = tuple(sorted({int(g) for g in self.gpus})) if self.gpus else ()
        if gpus and gpus[0] < 1:
            raise ValueError(f"gpus {list(gpus)}: device counts are positive")
        norm("gpus", gpus)
        norm("store", os.fspath(self.store) if self.store is not None else None)
        self._check_store()

    def _check_store(self) -> None:
        """Refuse store, server and ``cold`` options that do not go together."""
        if self.remote:
            if not self.store.startswith("s3://"):
                raise ValueError(f"store must be a local folder or an s3:// URL, not {self.store!r}")
            split_url(self.store)
            if self.cold:
                raise ValueError("cold drops local files from the page cache; an S3 store's objects are not "
                                 "local files (run without cold, or on a local store)")
            if self.keep and self.local_server:
                raise ValueError("keep: the local S3 server's objects go when it stops at the end of the run; "
                                 "give s3_server the URL of a server that stays")
        elif self.s3_server is not None:
            raise ValueError(f"s3_server {self.s3_server!r} needs a store on S3 (s3://BUCKET/PREFIX)")
        if self.s3_server not in (None, "local") and not str(self.s3_server).startswith(("http://", "https://")):
            raise ValueError(f"s3_server must be 'local' or an http(s):// endpoint URL, not {self.s3_server!r}")

    def mnk(self) -> tuple[int, int, int]:
        """``(m, n, k)`` of C (m x n) over k: ``shape``, or ``size`` cubed (:func:`dgemm.benchmarks.shapes.op_mnk`);
        by default 32768 with a GPU, 1024 on CPU devices.

        >>> E2EOptions(shape=(4, 5, 6)).mnk(), E2EOptions(size=7).mnk(), E2EOptions(shape=(9, 4), op="gram").mnk()
        ((4, 5, 6), (7, 7, 7), (4, 4, 9))
        """
        size = self.size
        if size is None and self.shape is None:
            from dgemm.opencl.discovery import select_devices
            size = E2E_GPU_SIZE if any(d.type == "GPU" for d in select_devices(self.devices)) else E2E_CPU_SIZE
        return op_mnk(self.op, self.shape, size)

    @property
    def remote(self) -> bool:
        """Whether the Zarr files go to object storage (a URL) rather than a local folder."""
        return bool(self.store) and "://" in self.store

    @property
    def local_server(self) -> bool:
        """Whether the run starts its own S3 server (moto on 127.0.0.1)."""
        return self.remote and self.s3_server in (None, "local")


def _check_host(opts: E2EOptions, selection) -> None:
    """Refuse what this host cannot do for ``opts``, before any work: a store that is a file, a missing S3
    library, a page cache files cannot leave, more devices in ``gpus`` than ``devices`` selects."""
    import importlib.util

    if opts.gpus and opts.gpus[-1] > len(selection):
        raise ValueError(f"gpus {list(opts.gpus)}: the devices {opts.devices!r} give {len(selection)} device(s)")
    if opts.store and os.path.isfile(opts.store):
        raise ValueError(f"store {opts.store!r} is a file: give a folder, or an s3:// URL")
    if opts.remote:
        for module, pip in (("s3fs", "s3fs"), ("boto3", "boto3")) + ((("moto", "'moto[server]'"),)
                                                                    if opts.local_server else ()):
            if importlib.util.find_spec(module) is None:
                raise ValueError(f"a store on S3 needs {module}: pip install {pip}")
    if opts.cold and pagecache.supported():
        raise ValueError(f"cold: {pagecache.supported()}")


# -- one run's state ---------------------------------------------------------------------------
@dataclass
class _Run:
    """What the stages of one run share: its options, its record, where its arrays live, how it reports."""

    opts: E2EOptions
    record: dict
    log: Callable[[str], None]
    mnk: tuple[int, int, int]
    small: tuple[int, int, int]
    folder: Location | None = None
    scratch: Path | None = None       # a local folder: staging for S3 inputs, the first-call script
    storage_options: dict | None = None
    path: Path | None = None          # the record's file, once the devices name it

    def save(self) -> None:
        if self.path is not None:
            write_json(self.path, self.record)

    def failed(self, stage: str, e: BaseException) -> None:
        """A dgemm run failed (wrong result, or raised): counted in ``failures``, named in ``errors``."""
        self.record["failures"] += 1
        self.record["errors"].append({"stage": stage, "error": error_text(e)})
        self.log(f"{stage}: ERROR {error_text(e)}")

    def error(self, stage: str, e: BaseException) -> None:
        """A peer or a rate could not be measured: named in ``errors``, not counted as a failure."""
        self.record["errors"].append({"stage": stage, "error": error_text(e)})

    def dropper(self, entry: dict):
        """``cold``: before each timed run, ``entry``'s inputs out of the page cache; else None."""
        if not self.opts.cold:
            return None
        paths = list(dict.fromkeys([entry["a"]["path"], entry["b"]["path"]]))   # X once for a Gram product
        return lambda: pagecache.drop(paths)

    @property
    def writes(self) -> dict:
        """How every timed dgemm run writes: the output's codecs, the store's options."""
        return {"storage_options": self.storage_options, "compressors": self.opts.compressors}


# -- the runner --------------------------------------------------------------------------------
def e2e_bench(options: E2EOptions | None = None, *, client=None,
              log: Callable[[str], None] | None = print) -> tuple[dict, Path | None]:
    """Time dgemm from Zarr to Zarr against its peers on the same inputs, and write the JSON record.

    The stages, each saving the record as it goes: the inputs; on the main
    cluster, dgemm's kernel in memory, the host's rates, dgemm end to end
    with ``dgemm plan``'s floor beside it, and dgemm at the small size; the
    scaling table, each count of devices on its own cluster; the first call
    from a fresh script; the peers, once dgemm's clusters are gone.

    Parameters
    ----------
    options : E2EOptions, optional
        What to run (default: ``E2EOptions()``).
    client : distributed.Client, optional
        Run the main dgemm timings on this cluster instead of starting one;
        it is not closed.
    log : callable, optional
        Called with one line per step; None says nothing.

    Returns
    -------
    (dict, Path or None)
        The record and its file.  ``record["failures"]`` counts dgemm runs
        (end to end or kernel) that failed their check or raised; peers'
        problems go to ``record["errors"]`` only.
    """
    from dgemm.opencl.discovery import select_devices

    opts = options if options is not None else E2EOptions()
    log = log or (lambda line: None)
    mnk = opts.mnk()
    small = tuple(min(x, opts.numpy_size or NUMPY_SIZE) for x in mnk)
    selection = select_devices(opts.devices) if opts.gpus else None  # a given client's workers may be elsewhere
    _check_host(opts, selection)
    run = _Run(opts, _new_record(opts, mnk, small), log, mnk, small)
    record = run.record

    with contextlib.ExitStack() as stack:
        _open_store(run, stack)
        try:
            _write_inputs(run)
            with bench_cluster(opts.devices, client) as (c, start_seconds):
                _on_the_main_cluster(run, c, start_seconds)
            record["scaling"] = _scaling(run, selection) if opts.gpus else None
            run.save()
            # its own cluster, after ours are gone
            record["first_call"] = _first_call(run) if opts.first_call else None
            run.save()
            # after dgemm's clusters are gone: the GPU to themselves
            record["peers"] = _peers(run)
            record["ratios"] = ratios(record)
            record["io_floor"] = add_io_floor(record)
            for line in io_floor_lines(record):
                log(line)
            record["ok"] = record["failures"] == 0
            run.save()
        finally:
            record["kept"] = bool(opts.keep)
            # a local S3 server's objects go with it; elsewhere only the folder this run made is removed
            if not opts.keep and not opts.local_server and run.folder is not None:
                with contextlib.suppress(Exception):
                    run.folder.remove(run.folder.root)
            if run.path is not None and run.path.exists():
                run.save()
    return record, run.path


def _versions() -> dict:
    import dask
    import zarr
    out = {"python": sys.version.split()[0], "numpy": np.__version__, "dask": dask.__version__,
           "zarr": zarr.__version__}
    with contextlib.suppress(Exception):
        import pyopencl
        out["pyopencl"] = pyopencl.VERSION_TEXT
    return out


def _new_record(opts: E2EOptions, mnk, small) -> dict:
    """The record before anything is timed: provenance and the options."""
    import dgemm

    m, n, k = mnk
    commit, dirty = git_commit()
    compressors = opts.compressors
    return {
        "benchmark": "e2e", "date": utc_now(), "commit": commit, "commit_dirty": dirty,
        "command": opts.command or command_line(), "dgemm_version": dgemm.__version__, **_versions(),
        "host": os.uname().nodename, "cpus": os.cpu_count(),
        "devices_spec": opts.devices, **describe(opts.op, m, n, k), "m": m, "n": n, "k": k, "dtype": opts.dtype, "chunks": opts.chunks,
        "reps": opts.reps, "flops": flops(m, n, k), "small": {"m": small[0], "n": small[1], "k": small[2]},
        "compressors": compressors if isinstance(compressors, str) or compressors is None else repr(compressors),
        "input_codec": opts.input_codec, "input_zarr_format": opts.input_zarr_format, "shards": opts.shards,
        "cold": bool(opts.cold), "store_kind": "s3" if opts.remote else "local",
        "failures": 0, "errors": [],
    }


def _open_store(run: _Run, stack: contextlib.ExitStack) -> None:
    """The run's folder (a new ``dgemm-e2e-*`` one), its scratch folder, and on S3 the server (closed by ``stack``)."""
    opts, record = run.opts, run.record
    if not opts.remote:
        run.folder = new_location(opts.store)
        run.scratch = Path(run.folder.root)
        record["store"] = str(run.folder)
        return
    # the staging of the inputs, the first-call script and the server's log: a local folder
    run.scratch = Path(tempfile.mkdtemp(prefix="dgemm-e2e-local-"))
    stack.callback(shutil.rmtree, run.scratch, True)
    bucket = split_url(opts.store)[0]
    if opts.local_server:
        run.log("starting a local S3 server (moto) on 127.0.0.1")
        server = stack.enter_context(LocalS3(run.scratch / "moto.log"))
        server.make_bucket(bucket)
        so, about = server.storage_options, server.describe()
    else:
        so, about = s3_options(opts.s3_server), {"server": "given (--s3-server)", "endpoint": opts.s3_server}
    folder = new_location(opts.store, so)
    if not opts.local_server and not folder.fs().exists(bucket):
        raise ValueError(f"bucket {bucket!r} not found at {opts.s3_server} (or not readable with the "
                         "environment's credentials)")
    run.folder, run.storage_options = folder, so
    record["object_store"] = {"server": about, "prefix": folder.root}
    record["store"] = str(folder)


def _input_form(run: _Run) -> dict:
    opts = run.opts
    return dict(codec=opts.input_codec, zarr_format=opts.input_zarr_format, shards=opts.shards, staging=run.scratch,
                op=opts.op)


def _write_inputs(run: _Run) -> None:
    """A and B at the full size, and at the small size where the dask.array + numpy peer needs them."""
    opts, record = run.opts, run.record
    m, n, k = run.mnk
    run.log(f"{record['expression']}: writing " + " and ".join(f"{s.upper()} ({' x '.join(map(str, x))})" for s, x in
                                                             record["operands"].items())
            + f" {opts.dtype}, chunks {opts.chunks}, {inputs_text(record)}, to {run.folder}")
    record["inputs"] = make_inputs(run.folder, m, n, k, opts.chunks, opts.dtype, opts.seed, **_input_form(run))
    ins = record["inputs"]
    run.log(f"inputs: {bytes_text(sum({ins[x]['path']: ins[x]['bytes'] for x in 'ab'}.values()))} "
            f"in {ins['seconds']:.1f} s")
    if run.small != run.mnk and opts.peers:
        record["inputs_small"] = make_inputs(run.folder, *run.small, opts.chunks, opts.dtype, opts.seed + 2,
                                             tag="_small", **_input_form(run))


def _on_the_main_cluster(run: _Run, c, start_seconds) -> None:
    """dgemm on the main cluster: its kernel in memory, the host's rates, end to end, the small size."""
    opts, record = run.opts, run.record
    ins = record["inputs"]
    workers, names, usable = ready_workers(c, opts.dtype)
    detail = "-".join(x for x in (op_detail(opts.op, *run.mnk, opts.dtype),
                                  input_detail(opts.input_codec, opts.input_zarr_format, opts.shards),
                                  "s3" if opts.remote else "", "cold" if opts.cold else "") if x)
    if opts.out_dir is not None:
        run.path = result_path(opts.out_dir, record["date"], names, "e2e", detail)
    info = usable[workers[0]]["device"]
    record.update(device=", ".join(dict.fromkeys(names)), devices=names, workers=len(workers),
                  device_type=info.type, driver=info.driver, platform=info.platform,
                  cluster_start_seconds=start_seconds)
    record["warmup_seconds"] = warm_up(c, workers, opts.dtype, run.folder,
                                       block_bytes=opts.chunks * opts.chunks * np.dtype(opts.dtype).itemsize,
                                       copy=opts.input_codec == "raw", op=opts.op)
    run.log(f"cluster: {len(workers)} worker(s) on {record['device']}; warm-up {record['warmup_seconds']:.1f} s")
    record["kernel"] = _time_kernel(run, c, workers[0])
    run.save()
    record["host_rates"] = time_host_rates(c, workers[0], record, run.folder, run.log)
    try:
        record["io_rates"] = io_rates(record, run.storage_options, run.log)
    except Exception as e:  # a layout the rates cannot read...: the benchmark goes on without them
        run.error("io_rates", e)
    run.save()
    record["dgemm"] = _run_dgemm(run, "dgemm", c, workers, ins, run.folder / "c_dgemm.zarr", run.mnk,
                                 keep=opts.keep, before_each=run.dropper(ins))
    add_floor(record, usable, ins, run.storage_options, run.log)    # a Gram's: X read once, one triangle
    run.save()
    # at the full size already, the main run is the one to compare with dask.array + numpy
    record["small_is_full"] = run.small == run.mnk
    ins_small = record.get("inputs_small", ins)
    record["dgemm_small"] = None if record["small_is_full"] or not opts.peers else _run_dgemm(
        run, "dgemm small", c, workers, ins_small, run.folder / "c_dgemm_small.zarr", run.small, keep=opts.keep,
        before_each=run.dropper(ins_small))
    run.save()


def _time_kernel(run: _Run, client, addr) -> dict:
    """dgemm's kernel in memory, as a task on ``addr`` (it holds the GPU resource, like a GEMM task)."""
    opts = run.opts
    kshape = kernel_shape(*run.mnk, opts.kernel_size)
    try:
        fut = client.submit(kernel_rate, opts.dtype, *kshape, max(opts.reps, 3), opts.seed, workers=[addr],
                            allow_other_workers=False, resources={"GPU": 1}, pure=False,
                            key=f"dgemm-e2e-kernel-{uuid.uuid4().hex[:8]}")
        r = fut.result()
    except Exception as e:
        run.failed("kernel", e)
        return {"m": kshape[0], "n": kshape[1], "k": kshape[2], "status": "ERROR", "ok": False,
                "error": error_text(e), "seconds": None, "tflops": None}
    if not r["ok"]:
        run.failed("kernel", RuntimeError(f"wrong result: rel_err {r['rel_err']:.3g} > {r['tolerance']:.3g}"))
    run.log(f"kernel in memory {'x'.join(map(str, kshape))}: {fmt(r['tflops'], '.4g')} TFLOPS ({r['status']})")
    return r


def _run_dgemm(run: _Run, stage: str, client, workers, ins, out, mnk, keep: bool = False,
               before_each=None) -> dict:
    """:func:`~dgemm.benchmarks.measure.time_dgemm` as a stage: an error or a wrong result is a failure."""
    m, n, k = mnk
    try:
        r = time_dgemm(client, workers, ins["a"]["path"], ins["b"]["path"], out, m, n, k, run.opts.reps, keep,
                       before_each=before_each, op=run.opts.op, **run.writes)
    except Exception as e:
        run.failed(stage, e)
        return {"m": m, "n": n, "k": k, "status": "ERROR", "ok": False, "error": error_text(e), "seconds": None,
                "tflops": None}
    if not r["ok"]:
        run.failed(stage, RuntimeError(f"wrong result: max relative error {r['check']['max_rel_err']:.3g} > "
                                       f"{r['check']['tolerance']:.3g}"))
    run.log(f"{stage} {m}x{n}x{k}: {r['seconds']:.3f} s, {fmt(r['tflops'], '.4g')} TFLOPS, "
            f"max rel err {r['check']['max_rel_err']:.2g} ({r['status']})")
    return r


def _scaling(run: _Run, selection) -> list[dict]:
    """dgemm on the first g devices of ``selection``, for each g; speed-up and efficiency against g = 1.

    Each row keeps its run's wall times, time split, bytes and each worker's
    counters (:func:`~dgemm.benchmarks.measure.worker_split`), so a row that
    scales badly shows where its time went.
    """
    record, ins = run.record, run.record["inputs"]
    rows = []
    for g in run.opts.gpus:
        ids = [d.id for d in selection[:g]]
        if g == record["workers"] and record["dgemm"].get("seconds") is not None:
            r, reused = record["dgemm"], True
        else:
            reused = False
            try:
                with bench_cluster(",".join(ids)) as (c, _):
                    workers, _, _ = ready_workers(c, run.opts.dtype)
                    warm_up(c, workers, run.opts.dtype, run.folder, op=run.opts.op)
                    r = _run_dgemm(run, f"dgemm on {g} device(s)", c, workers, ins, run.folder / f"c_dgemm_{g}.zarr",
                                   run.mnk, before_each=run.dropper(ins))
            except Exception as e:
                run.failed(f"scaling {g}", e)
                r = {"seconds": None, "tflops": None, "ok": False, "error": error_text(e)}
        rows.append({"gpus": g, "devices": [d.name for d in selection[:g]], "device_ids": ids,
                     "seconds": r.get("seconds"), "times": r.get("times"),
                     "best_seconds": min(r["times"]) if r.get("times") else None,
                     "tflops": r.get("tflops"), "ok": r.get("ok"), "reused_main_run": reused, "error": r.get("error"),
                     "split": r.get("split"), "bytes": r.get("bytes"), "workers": worker_split(r)})
    base = rows[0] if rows and rows[0]["gpus"] == 1 else None
    for row in rows:
        speedup = (base["seconds"] / row["seconds"]) if base and base["seconds"] and row["seconds"] else None
        row["speedup"] = speedup
        row["efficiency"] = speedup / row["gpus"] if speedup is not None else None
    return rows


def _first_call(run: _Run) -> dict:
    """:func:`~dgemm.benchmarks.first_call.time_first_call` on the main inputs, beside the warm run's time."""
    opts, record, ins = run.opts, run.record, run.record["inputs"]
    m, n, k = run.mnk
    try:
        r = time_first_call(ins["a"]["path"], ins["b"]["path"], run.folder / "c_first_call.zarr", m, n, k,
                            opts.devices, opts.compressors, opts.keep, storage_options=run.storage_options,
                            workdir=run.scratch, before=run.dropper(ins))
    except Exception as e:
        run.failed("first call", e)
        return {"m": m, "n": n, "k": k, "status": "ERROR", "ok": False, "error": error_text(e), "seconds": None,
                "tflops": None}
    if not r["ok"]:
        run.failed("first call", RuntimeError(f"wrong result: max relative error {r['check']['max_rel_err']:.3g} > "
                                              f"{r['check']['tolerance']:.3g}"))
    warm = (record.get("dgemm") or {}).get("seconds")
    r["minus_warm_seconds"] = r["seconds"] - warm if warm else None
    run.log(f"first call from a fresh script: {r['seconds']:.3f} s from process start ({fmt(r['tflops'], '.4g')} "
            f"TFLOPS; import {r['import_seconds']:.2f} s, matmul {r['matmul_seconds']:.2f} s"
            + (f"; warm + {r['minus_warm_seconds']:.2f} s" if warm else "") + f") ({r['status']})")
    return r


def _peers(run: _Run) -> dict:
    """dask.array + cupy and cuBLAS at the full size, dask.array + numpy at the small one; each skipped with why."""
    opts, record = run.opts, run.record
    out: dict = {}
    if not opts.peers:
        for name in ("dask_cupy", "cublas", "dask_numpy"):
            out[name], out[f"{name}_skipped"] = None, "--no-peers"
        return out
    ins = record["inputs"]
    ins_small = record.get("inputs_small", ins)
    # dgemm's output codec, so that the peers' writes cost the same (zarr's default if dgemm left none)
    compressors = (record.get("dgemm") or {}).get("output_compressors", "auto")
    out["output_compressors"] = compressors
    writes = dict(compressors=compressors, keep=opts.keep, storage_options=run.storage_options)
    cupy, why = cupy_status()
    out["dask_cupy"], out["dask_cupy_skipped"] = None, why
    if cupy is not None:
        try:
            out["dask_cupy"] = time_dask(ins["a"]["path"], ins["b"]["path"], run.folder / "c_cupy.zarr", opts.reps,
                                         cupy=cupy, before_each=run.dropper(ins), op=opts.op, **writes)
            run.log(f"dask.array + cupy: {out['dask_cupy']['seconds']:.3f} s, "
                    f"{fmt(out['dask_cupy']['tflops'], '.4g')} TFLOPS")
        except Exception as e:
            out["dask_cupy_skipped"] = error_text(e)
            run.error("dask_cupy", e)
            run.log(f"dask.array + cupy: ERROR {error_text(e)}")
        finally:
            with contextlib.suppress(Exception):
                free_cupy(cupy)
    else:
        run.log(f"dask.array + cupy: not timed ({why})")
    try:
        block = (record.get("dgemm") or {}).get("attrs", {}).get("run", {}).get("block")
        out["cublas"], out["cublas_skipped"] = time_cublas(opts.dtype, *run.mnk, block, opts.reps,
                                                           gram=opts.op == "gram")
    except Exception as e:  # out of CUDA memory...
        out["cublas"], out["cublas_skipped"] = None, error_text(e)
        run.error("cublas", e)
    run.log(f"cuBLAS: {fmt((out['cublas'] or {}).get('tflops'), '.4g')} TFLOPS"
            if out["cublas"] else f"cuBLAS: not timed ({out['cublas_skipped']})")
    try:
        out["dask_numpy"], out["dask_numpy_skipped"] = time_dask(
            ins_small["a"]["path"], ins_small["b"]["path"], run.folder / "c_numpy.zarr", opts.reps,
            before_each=run.dropper(ins_small), op=opts.op, **writes), None
        run.log(f"dask.array + numpy {'x'.join(str(record['small'][x]) for x in 'mnk')}: "
                f"{out['dask_numpy']['seconds']:.3f} s, {fmt(out['dask_numpy']['tflops'], '.4g')} TFLOPS")
    except Exception as e:
        out["dask_numpy"], out["dask_numpy_skipped"] = None, error_text(e)
        run.error("dask_numpy", e)
    return out


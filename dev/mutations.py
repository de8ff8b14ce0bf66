"""The mutation pass: small deliberate bugs, each run against the tests that should catch it.

Each mutation names a file, an exact piece of its text (the anchor) and what
replaces it, and the tests that must fail once it is in.  The pass copies the
repository (its tracked files and untracked files git does not ignore; never
``.venv`` or build outputs) to a temporary folder, and for each mutation
edits the copy, runs its tests there (``python -m pytest -x -q -p
no:cacheprovider ...`` in the copy, with the copy first on ``PYTHONPATH``, so
the test process and the cluster workers it starts import the mutated
``dgemm``), and puts the file back.  The working tree is never touched.

Outcomes: ``caught`` (a selected test failed, the first is named; or its process died of a signal, as when a
mutation makes a kernel read out of bounds on PoCL: "crashed (signal 11) in ..."),
``SURVIVED`` (they all passed), ``not run`` (all skipped, e.g. GPU-only tests
here), ``anchor not found`` (the file has changed since the mutation was
written: update its ``original``), ``no tests selected``, ``error`` (pytest
could not run them, e.g. a missing test file), ``timeout``, ``baseline
failed`` (the selection fails on the unmutated copy too, so a failure would
prove nothing; by default each distinct selection is first run unmutated).

Usage, from the repository root with the project's environment active::

    python dev/mutations.py --list                # the mutations and their tests
    python dev/mutations.py                       # the full pass (tens of minutes on 2 cores)
    python dev/mutations.py pad-zeros check-safety-looser   # some of them
    python dev/mutations.py --no-baseline --timeout 900 ...

It prints one line per mutation and writes a JSON record (date, commit,
per mutation: outcome, the failing test, seconds) to
``bench/results/<date>-mutations.json`` (``...-mutations-partial.json`` when
only some mutations ran; ``--out`` to choose).  The exit status is 1 when a
mutation survived, else 2 when one could not be checked (anything but
``caught`` or ``not run``), else 0.  Add a mutation to :data:`MUTATIONS`
when a gap is closed, with the narrowest selection that should catch it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    """One deliberate bug: ``original`` (exactly once in ``file``) becomes ``replacement``."""

    name: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]     # pytest arguments: files, node ids, -k/-m expressions
    what: str


# The store task's order (dgemm/worker/tasks.py): the block, then its marker; and the bug that swaps them.
_WRITE_THEN_MARK = ("    store_block(array, rows, cols, block, drop)\n"
                    "    if fence is not None:\n"
                    "        fence.check(i, j, stored=True)\n"
                    "    markers.mark(i, j)\n")
_MARK_THEN_WRITE = ("    markers.mark(i, j)\n"
                    "    store_block(array, rows, cols, block, drop)\n"
                    "    if fence is not None:\n"
                    "        fence.check(i, j, stored=True)\n")

T_REPL = "tests/test_output_run.py::test_replacing_an_output_never_lets_go_of_its_lease"
T_EVERY = "tests/test_output_run.py::test_replacing_an_output_keeps_its_lease_through_every_delete_and_write"
T_LATE = "tests/test_output_run.py::test_a_marker_that_lands_after_the_run_completed_is_taken_back"
T_STRAG = "tests/test_output_run.py::test_a_straggler_of_an_earlier_run_leaves_no_marker_in_the_output_a_later_run_holds"
T_KILL = "tests/test_output_run.py::test_a_marker_whose_writer_was_killed_mid_write_goes_with_the_markers"
T_CHUNK = "tests/test_output_run.py::test_a_chunk_whose_writer_was_killed_mid_write_does_not_stop_a_replacement"
T28 = "tests/test_decoding.py"
TE = "tests/test_encoding.py"
T27S = "tests/test_e2e_shapes.py"
TB = "tests/test_blosc_device.py"
TZ = "tests/test_zstd_decode_device.py"
TDP = "tests/test_zstd_devplan.py"

MUTATIONS = [
    # -- the kernels ----------------------------------------------------------------
    Mutation("kernel-drops-alpha", "dgemm/kernels/gemm.cl",
             "real r = alpha * acc[wm][wn];", "real r = acc[wm][wn];",
             ("tests/test_engine.py", "-k", "alpha_beta_c"),
             "the FMA GEMM kernel stores acc without alpha"),
    Mutation("tensor-core-drops-alpha", "dgemm/kernels/gemm_dmma.cl",
             "real r = alpha * acc[i][j][h];", "real r = acc[i][j][h];",
             ("tests/test_engine.py", "-m", "gpu", "-k", "tensor_core"),
             "the tensor-core kernel stores acc without alpha (GPU only: 'not run' without one)"),
    # -- padding --------------------------------------------------------------------
    Mutation("pad-zeros-unwritten", "dgemm/kernels/padding.cl",
             "        real v = ZERO;\n"
             "        if (r < rows && c < cols) {\n"
             "            v = src[(size_t)r * ld_src + c];\n"
             "        }\n"
             "        dst[(size_t)r * cols_xl + c] = v;\n",
             "        if (r < rows && c < cols) {\n"
             "            dst[(size_t)r * cols_xl + c] = src[(size_t)r * ld_src + c];\n"
             "        }\n",
             ("tests/test_engine.py", "-k", "test_shapes or test_transposes_with_k_blocks"),
             "pad_zeros leaves the padding of a block unwritten (caught only where new memory is poisoned)"),
    Mutation("transpose-pad-unwritten", "dgemm/kernels/transpose.cl",
             "    if (dr < drows && dc < dcols) {", "    if (dr < cols && dc < rows) {",
             ("tests/test_engine.py", "-k", "test_shapes or test_transposes_with_k_blocks"),
             "transpose_pad writes the transposed block but not its padding"),
    # -- the reduction of k segments ------------------------------------------------
    Mutation("reduce-drops-a-segment", "dgemm/worker/tasks.py",
             "    for p in parts[1:]:", "    for p in parts[2:]:",
             ("tests/test_graph.py", "-k", "k_split"),
             "reduce_blocks leaves out the second k segment"),
    # -- completion markers ---------------------------------------------------------
    Mutation("marker-before-block", "dgemm/worker/tasks.py",
             _WRITE_THEN_MARK, _MARK_THEN_WRITE,
             ("tests/test_storage.py", "-k", "marks_its_block_after_writing"),
             "the store task marks its block done before writing it (unit test)"),
    Mutation("marker-before-block-faults", "dgemm/worker/tasks.py",
             _WRITE_THEN_MARK, _MARK_THEN_WRITE,
             ("tests/test_faults.py", "-k", "write_fails or missing_a_marker"),
             "the same, against the fault tests alone (a store that fails mid-block; issue 18 item 2)"),
    Mutation("missing-markers-guard-removed", "dgemm/storage/output_run.py",
             "        if missing:  # never mark complete what is not",
             "        if False:  # never mark complete what is not",
             ("tests/test_faults.py", "-k", "missing_a_marker"),
             "the output is marked complete even when blocks have no completion marker"),
    # -- resume -----------------------------------------------------------------------
    Mutation("resume-trusts-every-block", "dgemm/storage/output_run.py",
             "sorted(_all_blocks(grid) - done)", "[]",
             ("tests/test_faults.py", "-k", "resume"),
             "a resumed run computes none of the missing blocks"),
    Mutation("resume-reruns-every-block", "dgemm/storage/output_run.py",
             "sorted(_all_blocks(grid) - done)", "sorted(_all_blocks(grid))",
             ("tests/test_faults.py", "-k", "resume"),
             "a resumed run recomputes the blocks already stored"),
    Mutation("resume-other-product", "dgemm/storage/output_run.py",
             "    diff = _differences(stored, fingerprint)\n    if diff:",
             "    diff = _differences(stored, fingerprint)\n    if False:",
             ("tests/test_faults.py", "-k", "resume"),
             "resume accepts an output written by a different product"),
    # -- the panel cache ----------------------------------------------------------------
    Mutation("cache-ignores-scope", "dgemm/opencl/engine.py",
             "key = (scope, ref.key(), transpose,",
             "key = (None, ref.key(), transpose,",
             ("tests/test_panels.py", "-k", "rewritten or two_runs"),
             "cached blocks are shared between runs: an input rewritten in between is served stale (end to end "
             "the runs' other guards mask it, PanelCache.enter and the release at a run's end: two_runs checks "
             "the key itself)"),
    # -- the result check (dgemm.accuracy) ------------------------------------------------
    Mutation("check-safety-looser", "dgemm/accuracy.py",
             "SAFETY = 16 ", "SAFETY = 16 * 10_000 ",
             ("tests/test_accuracy.py",),
             "the tolerance of every result check 10,000 times looser"),
    Mutation("check-sample-looser", "dgemm/accuracy.py",
             '"passed": bool(err <= tol)', '"passed": bool(err <= 1e4 * tol)',
             ("tests/test_accuracy.py",),
             "check_sample (demo, bench e2e) passes what is 10,000 times its tolerance"),
    Mutation("check-tf32-term-dropped", "dgemm/accuracy.py",
             'return tol + TF32_INPUT_ERROR if precision == "tf32" else tol', "return tol",
             ("tests/test_accuracy.py",),
             "the tf32 tolerance forgets TF32's input rounding: correct TF32 products are refused"),
    # -- options --------------------------------------------------------------------------
    Mutation("progress-ignored", "dgemm/client/steps.py",
             "            if req.progress:", "            if False:",
             ("tests/test_api.py", "-k", "progress"),
             "progress=True shows nothing"),
    # -- the lease's renewal (issue 30, item 1) ------------------------------------------
    Mutation("lease-never-renewed", "dgemm/storage/lease.py",
             "                    if not self.renew():\n                        return\n",
             "                    if not self.interval:   # sleeps, never renews\n                        return\n",
             ("tests/test_lease_renewal.py",),
             "the lease's renewal thread only sleeps: a run longer than 3 lease-intervals holds a stale lease "
             "that a second overwrite=True or resume=True takes over"),
    # -- the tuner's check (issue 30, item 2) ---------------------------------------------
    Mutation("tuner-check-looser", "dgemm/tuning/timing.py",
             "bool(err <= tolerance(self.dtype, self.k, params.precision))",
             "bool(err <= 100 * tolerance(self.dtype, self.k, params.precision))",
             ("tests/test_tuning_check.py::test_tune_command_refuses_subtly_wrong_kernels_and_stores_the_correct_one",),
             "the tuner's check passes 100 times the tolerance: a bfloat16-precision kernel is stored as the fastest"),
    Mutation("tuner-stores-fastest-unchecked", "dgemm/tuning/search.py",
             "correct = sorted((t for t in results if t.ok), key=lambda t: t.seconds)",
             "correct = sorted(results, key=lambda t: t.seconds)",
             ("tests/test_tuning_check.py::test_tune_command_refuses_subtly_wrong_kernels_and_stores_the_correct_one",),
             "tune() stores the fastest candidate whether or not it passed the check"),
    Mutation("tuner-best-unchecked", "dgemm/tuning/search.py",
             "if t.ok and (best is None or t.seconds < best.seconds):",
             "if best is None or t.seconds < best.seconds:",
             ("tests/test_tuning_check.py::test_tune_command_refuses_subtly_wrong_kernels_and_stores_the_correct_one",),
             "search() reports the fastest candidate as best without its check"),
    Mutation("tuner-check-random-rows", "dgemm/tuning/timing.py",
             "        rows = sample_indices(self.m, SAMPLES, self.rng)\n        cols = sample_indices(self.n, SAMPLES, self.rng)\n",
             "        rows = self.rng.choice(self.m, size=min(SAMPLES, self.m), replace=False)\n"
             "        cols = self.rng.choice(self.n, size=min(SAMPLES, self.n), replace=False)\n",
             ("tests/test_tuning_check.py", "-k", "CORNER"),
             "the tuner's check samples rows and columns at random only: a kernel wrong in its edge tile passes"),
    Mutation("tuner-check-sample-only", "dgemm/tuning/timing.py",
             'err = sampled_error(self.a, self.b, out, rows, cols) if np.isfinite(out).all() else float("inf")',
             "err = sampled_error(self.a, self.b, out, rows, cols)",
             ("tests/test_tuning_check.py", "-k", "SKIP_TILE"),
             "the tuner's check reads the sample only: a tile the kernel never wrote (still NaN) passes"),
    # -- dgemm's own chunk paths (issue 30, item 3), counted by dgemm.storage.fastpaths -----
    Mutation("write-edge-chunks-to-zarr", "dgemm/storage/chunks.py",
             "if s.start > i * c or s.stop < min((i + 1) * c, n):",
             "if s.start > i * c or s.stop < (i + 1) * c:",
             ("tests/test_fast_paths.py", "-k", "writes_of_whole_chunks or matmul_on_workers"),
             "write_region declines every region holding an edge chunk: zarr writes the same values, slower"),
    Mutation("small-zstd-chunks-left-to-zarr", "dgemm/storage/chunks.py",
             "    steps = tuple(_step(c) for c in reversed(codecs[1:]))\n",
             "    steps = tuple(_step(c) for c in reversed(codecs[1:]))\n"
             "    if steps and int(np.prod(inner)) * np.dtype(array.dtype).itemsize < 4096:\n"
             "        raise Unsupported('compressed chunks under 4 KiB')\n",
             ("tests/test_fast_paths.py", "-k", "reads_take_the_fast_path and small"),
             "why_not says compressed v3 chunks under 4 KiB are unsupported: zarr reads them"),
    Mutation("small-zstd-frames-not-decoded-into", "dgemm/storage/chunks.py",
             "if out is not None and self.name in _INTO and _content_size(self.name, buf) == out.nbytes:",
             "if out is not None and self.name in _INTO and _content_size(self.name, buf) == out.nbytes >= 4096:",
             ("tests/test_fast_paths.py", "-k", "reads_take_the_fast_path and small"),
             "frames under 4 KiB are decoded aside and copied instead of straight into the staging buffer"),
    Mutation("s3-writes-not-batched", "dgemm/storage/chunks.py",
             "if items and remote.put_many(array.store, items) is None:",
             "if items and None in [remote.put_many(array.store, [item]) for item in items]:",
             ("tests/test_fast_paths.py", "-k", "one_batch_of_puts"),
             "write_region sends one PUT batch per chunk instead of one per region"),
    Mutation("s3-writes-left-to-zarr", "dgemm/storage/chunks.py",
             "or (src.root is None and not remote.handles(array.store)):",
             "or src.root is None:",
             ("tests/test_fast_paths.py", "-k", "one_batch_of_puts"),
             "write_region declines every S3 array: zarr writes each chunk itself"),
    Mutation("raw-local-reads-copied", "dgemm/storage/chunks.py",
             "    for outer, idxs in per_key.items():\n        idx = idxs[0]\n        key = lay.key(outer)\n"
             "        inside, outs, whole = _cover(idx, lay, shape, region)\n",
             "    for outer, idxs in per_key.items():\n        idx = idxs[0]\n        key = lay.key(outer)\n"
             "        inside, outs, whole = _cover(idx, lay, shape, region)\n        whole = False\n",
             ("tests/test_fast_paths.py", "-k", "reads_take_the_fast_path and raw"),
             "raw local chunks are read into scratch and copied, never straight into the staging buffer"),
    Mutation("edge-chunk-reads-left-to-zarr", "dgemm/storage/chunks.py",
             "    if len(region) != arr.ndim:\n        return _declined(\"read_zarr\", out)\n",
             "    if len(region) != arr.ndim or any(s.stop == n and n % c for s, n, c in zip(region, arr.shape, lay.chunk)):\n"
             "        return _declined(\"read_zarr\", out)\n",
             ("tests/test_fast_paths.py", "-k", "reads_take_the_fast_path or matmul_on_workers"),
             "read_into declines every block touching the array's edge (zarr reads it)"),
    Mutation("zstd-encoder-buffer-sent-uncopied", "dgemm/storage/chunks.py",
             'reused = not lay.steps or getattr(lay.steps[0], "transient", False)',
             "reused = not lay.steps",
             ("tests/test_fast_paths.py", "-k", "one_batch_of_puts"),
             "an S3 batch keeps each zstd chunk's view of the thread's reused encoder buffer: every chunk "
             "of a region is sent as the last one encoded"),
    # -- test_chunks' reference is zarr's own indexing (issue 30, item 5) ------------------
    Mutation("fill-value-read-as-zero", "dgemm/storage/chunks.py",
             "        dest[...] = lay.fill\n        fastpaths.record(\"read_fill\", dest.nbytes)\n        return\n",
             "        dest[...] = 0\n        fastpaths.record(\"read_fill\", dest.nbytes)\n        return\n",
             ("tests/test_chunks.py", "-k", "special_fill_values"),
             "the reader fills a chunk never written with 0, not the fill value (zarr, the reference, does not)"),
    # -- the first-call benchmark (issue 30, item 4) ---------------------------------------
    Mutation("first-call-ignores-devices", "dgemm/benchmarks/first_call.py",
             '    if devices:\n        env["DGEMM_DEVICES"] = devices\n',
             '    if False:\n        env["DGEMM_DEVICES"] = devices\n',
             ("tests/test_first_call.py", "-k", "devices_reach"),
             "bench e2e --first-call's script ignores --devices (it starts the host's default devices)"),
    # -- the plan's floor (issue 27) --------------------------------------------------------
    Mutation("floor-ignores-decode", "dgemm/client/estimate.py",
             'cpu = {"decode": (a_read / dec_a + b_read / dec_b) / cores, "encode": written / enc / cores}',
             'cpu = {"decode": 0.0, "encode": written / enc / cores}',
             ("tests/test_estimate.py::test_a_compressed_input_costs_its_decode_on_the_hosts_cores",),
             "the plan's floor counts no decoding of compressed inputs"),
    Mutation("floor-one-read-per-host", "dgemm/client/estimate.py",
             "        if shared_decode:   # one decode per block per host",
             "        if True:   # one decode per block per host",
             ("tests/test_estimate.py::test_workers_of_one_host_read_their_overlapping_panels_each",
              "tests/test_estimate.py::test_two_workers_of_one_host_each_decode_the_panels_of_their_share"),
             "workers of one host are taken to decode their overlapping panels once"),
    Mutation("bench-floor-gram-as-matmul", "dgemm/benchmarks/floor.py",
             'shared_decode=bool(total.get("host_cache_misses")), gram=record.get("op") == "gram")',
             'shared_decode=bool(total.get("host_cache_misses")), gram=False)',
             ("tests/test_e2e_shapes.py::test_gram_record_names_the_op_and_every_product_is_x_transpose_x",),
             "the e2e bench plans a Gram's floor as A @ B of X and X"),
    Mutation("decode-slots-not-reserved", "dgemm/worker/tasks.py",
             "        reserve += decoding.reserve(state.device, a_refs + b_refs, memory)",
             "        reserve += 0",
             ("tests/test_memory.py::test_the_panel_cache_leaves_the_decode_slots_and_the_encoder_room",),
             "the panel cache takes the device memory the decode slots need under device-codecs on"),
    Mutation("floor-gram-reads-x-twice", "dgemm/client/estimate.py",
             "                a, b = max(a, b), 0.0\n", "                a, b = a, b\n",
             ("tests/test_estimate.py::test_a_gram_decodes_each_chunk_of_x_once_for_both_operands",
              "tests/test_estimate.py::test_a_gram_whose_k_blocks_cut_its_chunks_decodes_each_chunk_once_per_block"),
             "the floor of a Gram decodes X twice, once per operand"),
    Mutation("floor-gram-whole-square", "dgemm/client/estimate.py",
             "    tri = _triangle(plan) if gram else 1.0\n", "    tri = 1.0\n",
             ("tests/test_estimate.py::test_a_gram_computes_one_triangle_of_c_and_writes_all_of_it",),
             "the floor of a Gram computes every block of C, not one triangle"),
    Mutation("floor-fill-on-cores", "dgemm/client/estimate.py",
             "            ends = {**times, **device}\n",
             '            ends = {**{k: v + d["fill"] for k, v in times.items()}, **device}\n',
             ("tests/test_estimate.py::test_the_fill_delays_the_device_not_the_hosts_cores",),
             "the floor adds the device's fill to the host's cores, counting the first panels' decode twice"),
    Mutation("scratch-kept-after-run", "dgemm/opencl/device.py",
             "        self.scratch.release(busy)\n", "        pass\n",
             ("tests/test_memory.py::test_memory_comes_back_with_device_codecs",),
             "the reader threads' device-codec buffers outlive the run"),
    Mutation("fastplan-end-mark", "dgemm/opencl/codecs/zstd_fastplan.py",
             "        if (lengths < 1).any() or (buf[s_src + lengths - 1] == 0).any():",
             "        if (lengths < 1).any():",
             ("tests/test_zstd_fastplan.py::test_streams_of_no_bytes_or_without_an_end_mark_are_left_to_the_block_by_block_read",),
             "a Huffman stream ending in a 0 byte gets a fast plan instead of the block-by-block refusal"),
    Mutation("fastplan-empty-stream", "dgemm/opencl/codecs/zstd_fastplan.py",
             "        if (lengths < 1).any() or (buf", "        if (lengths < 0).any() or (buf",
             ("tests/test_zstd_fastplan.py::test_streams_of_no_bytes_or_without_an_end_mark_are_left_to_the_block_by_block_read",),
             "a Huffman stream of no bytes gets a fast plan"),
    Mutation("fastplan-treeless-x2", "dgemm/opencl/codecs/zstd_fastplan.py",
             "        x2 = x2_here[tree_blocks][tree].astype(np.int64)", "        x2 = x2_here.astype(np.int64)",
             ("tests/test_zstd_fastplan.py::test_fast_plans_are_the_block_by_block_plans",),
             "a treeless block takes its own sizes' Huffman decoder choice, not its tree's block's (libzstd's)"),
    Mutation("floor-b-read-per-task", "dgemm/client/estimate.py",
             "    return a, min(load.b_each * item, b + (rows - 1) * again)",
             "    return a, load.b_each * item",
             ("tests/test_estimate.py::test_a_short_device_cache_reads_b_again_on_later_rows_and_no_more",),
             "a short device cache re-reads every B panel on every task (the 117 s floor)"),
    Mutation("floor-drops-kernel", "dgemm/client/estimate.py",
             '            if rates.flops:\n                times["kernel"] = flops / rates.flops',
             '            if False:\n                times["kernel"] = flops / rates.flops',
             ("tests/test_estimate.py::test_the_kernel_counts_when_its_rate_is_known",),
             "the floor leaves out the kernel"),
    Mutation("floor-chunks-decoded-once", "dgemm/client/estimate.py",
             "    return (block + chunk - math.gcd(block, chunk)) / block", "    return 1.0",
             ("tests/test_estimate.py::test_blocks_that_cut_chunks_decode_them_whole",),
             "blocks that cut chunks are taken to decode only their part"),
    Mutation("plan-prints-megabytes", "dgemm/client/plan.py",
             "output bytes written {format_bytes(self.m * self.n * self.dtype.itemsize)}",
             "output bytes written {self.m * self.n * self.dtype.itemsize / 1e6:.1f} MB",
             ("tests/test_estimate.py::test_dgemm_plan_prints_sizes_as_dask_does_and_what_binds",),
             "dgemm plan prints MB, not dask's format_bytes"),
    Mutation("host-rates-skip-encode", "dgemm/benchmarks/rates.py",
             '    if compressors is None or compressors == "auto" or isinstance(compressors, list):',
             "    if False:",
             ("tests/test_estimate.py::test_the_host_rates_time_cs_codec_encoding",),
             "the e2e host rates do not time C's encoding"),
    # -- a worker's block order (issue 27) ---------------------------------------------------
    Mutation("grow-order-never-used", "dgemm/client/graph.py",
             "order = [grow(mine, panel_bytes(plan, mine), cache_bytes)",
             "order = [grow(mine, panel_bytes(plan, mine), None)",
             ("tests/test_order.py",),
             "every worker runs its blocks row by row even where its panels fit its device cache"),
    # -- the PTX route's disk cache and the first call's fork server (issue 27) ----------------
    Mutation("program-cache-written-in-place", "dgemm/opencl/binaries.py",
             "        os.replace(tmp, path)",
             "        path.write_bytes(Path(tmp).read_bytes()); os.unlink(tmp)",
             ("tests/test_binaries.py", "-k", "two_processes"),
             "a cached program written in place: another process reads half an entry"),
    Mutation("program-cache-trusts-damaged-entry", "dgemm/opencl/binaries.py",
             'and _header(data) == head + b"\\n":', "and True:",
             ("tests/test_binaries.py", "-k", "damaged"),
             "a truncated or changed cache entry is returned as the program"),
    Mutation("workers-spawned-not-forked", "dgemm/cluster/local.py",
             "        with _start_method(start_method):   # read by each nanny as it starts its worker",
             "        with _start_method(None):   # read by each nanny as it starts its worker",
             ("tests/test_prestart.py", "-k", "forks"),
             "the local cluster ignores the early fork server"),
    Mutation("fork-server-not-begun-early", "dgemm/client/prestart.py",
             "    if out is None or client is not None or _has_cluster():", "    if True:",
             ("tests/test_prestart.py", "-k", "forks"),
             "no fork server before the call's checks"),
    Mutation("forked-workers-miss-new-environment", "dgemm/client/prestart.py",
             "    if _own_environment() != _environment_at_start:", "    if False:",
             ("tests/test_prestart.py", "-k", "environment"),
             "workers forked from a server older than a variable do not see it"),
    Mutation("ptx-cache-never-used", "dgemm/opencl/ptx.py",
             "    return binaries.cached(entry, make, load)", "    return make()[0], False",
             ("tests/test_ptx_cache.py", "-m", "gpu"),
             "the PTX route rebuilt in every process (GPU only: 'not run' without one)"),
    # -- a Gram product: each chunk of X read once, one triangle computed (issue 27) ----------
    Mutation("engine-twin-padding-ignored", "dgemm/opencl/engine.py",
             "            tm = tn = math.lcm(tm, tn)", "            pass",
             ("tests/test_gram.py::test_engine_stages_a_gram_block_once_for_both_sides",),
             "a Gram's A and B sides padded to TSM and TSN apart: edge blocks read twice"),
    Mutation("gram-shared-read-disabled", "dgemm/client/graph.py",
             "*((True,) if symmetric else ())", "*()",
             ("tests/test_gram.py::test_gram_reads_each_chunk_of_x_once_and_computes_one_triangle",),
             "the Gram's GEMM tasks not told twin: 16 reads for 12 blocks"),
    Mutation("gram-triangle-skipped", "dgemm/client/graph.py",
             "grid = sorted({(min(i, j), max(i, j)) for i, j in wanted}) if symmetric else wanted", "grid = wanted",
             ("tests/test_gram.py::test_gram_reads_each_chunk_of_x_once_and_computes_one_triangle",),
             "every block of a Gram built as a GEMM task"),
    Mutation("gram-mirror-untransposed", "dgemm/client/graph.py",
             "else (mirror, (src, j, i))", "else (src, j, i)",
             ("tests/test_gram.py::test_gram_results_into_a_nan_prefilled_out",),
             "a block below the diagonal stored untransposed"),
    Mutation("gram-mirror-not-stored", "dgemm/client/graph.py",
             "_add_mirror(graph, token, wanted)", "_add_mirror(graph, token, grid)",
             ("tests/test_gram.py::test_gram_results_into_a_nan_prefilled_out",),
             "triangle computed, blocks below the diagonal not mirrored"),
    Mutation("gram-diagonal-not-mirrored", "dgemm/client/graph.py",
             "(mirror, (src, i, i), True) if i == j else", "(src, i, i) if i == j else",
             ("tests/test_gram.py::test_the_mirror_layer_makes_c_exactly_symmetric_whatever_the_devices_return",),
             "a diagonal block stored as the device returned it (not exactly symmetric)"),
    Mutation("gram-diagonal-lower-from-device", "dgemm/worker/tasks.py",
             "    out += np.triu(block, 1).T", "    out += np.tril(block, -1)",
             ("tests/test_gram.py::test_a_mirrored_block_is_the_transpose_and_a_diagonal_one_its_upper_triangle_mirrored",),
             "a diagonal block's lower triangle kept from the device"),
    Mutation("gram-mirrored-with-beta", "dgemm/client/request.py",
             "if beta != 0 or a.trans == b.trans", "if a.trans == b.trans",
             ("tests/test_gram.py::test_dask_and_numpy_grams_read_x_transposed_and_others_compute_everything",),
             "X^T X + beta C mirrored although C need not be symmetric"),
    Mutation("gram-mirrored-cut-apart", "dgemm/client/graph.py",
             "return is_gram(a, b, beta) and plan.rows == plan.cols", "return is_gram(a, b, beta)",
             ("tests/test_gram.py::test_a_gram_whose_rows_and_columns_are_cut_apart_computes_every_block",),
             "a Gram mirrored although its rows and columns are cut differently"),
    Mutation("gram-dask-transpose-not-seen", "dgemm/client/request.py",
             "return y if x.ndim == y.ndim == 2 and x.name == y.T.name else None", "return None",
             ("tests/test_gram.py::test_dask_and_numpy_grams_read_x_transposed_and_others_compute_everything",),
             "matmul(X.T, X) on dask: X.T computed as its own array, no triangle"),
    Mutation("gram-numpy-transpose-not-seen", "dgemm/client/request.py",
             "return y if _same_memory(x.T, y) else None", "return None",
             ("tests/test_gram.py::test_numpy_grams_are_one_operand_read_transposed",),
             "gemm(x.T, x) on numpy not seen as one operand"),
    # -- command line and scripts (issue 29) -------------------------------------------------------
    Mutation("progress-counts-tasks", "dgemm/client/progress.py",
             'return 1.0 if m["state"] == "done" else float(m["work_done"])',
             'return 1.0 if m["state"] == "done" else m["blocks_done"] / max(1, m["blocks_total"])',
             ("tests/test_cli_habits.py::test_progress_bar_shows_the_share_of_flops_the_dashboard_counts",),
             "the progress bar counts finished blocks, not flops"),
    Mutation("port-warning-shown", "dgemm/cluster/local.py",
             'warnings.filterwarnings("ignore", r"Port \\d+ is already in use", UserWarning)', "pass",
             ("tests/test_cli_habits.py::test_matmul_prints_the_dashboard_it_took_and_no_port_warning",),
             "distributed's raw port warning reaches the user"),
    Mutation("dashboard-line-missing", "dgemm/cluster/local.py",
             'logger.info("local cluster of %d worker%s; dashboard: %s"',
             'logger.debug("local cluster of %d worker%s; dashboard: %s"',
             ("tests/test_cli_habits.py::test_matmul_prints_the_dashboard_it_took_and_no_port_warning",),
             "dgemm matmul never says which dashboard address it took"),
    Mutation("random-default-float64", "dgemm/cli/data.py",
             'default="float32", show_default=True)', 'default="float64", show_default=True)',
             ("tests/test_cli_habits.py::test_random_writes_float32_by_default_and_says_its_size_as_dask_does",),
             "dgemm random writes float64 unless told"),
    Mutation("random-first-panel-unwritten", "dgemm/benchmarks/inputs.py",
             "        arr[r0:r1, c0:c1] = block", "        if r0 or c0:\n            arr[r0:r1, c0:c1] = block",
             ("tests/test_cli_habits.py::test_random_writes_float32_by_default_and_says_its_size_as_dask_does",),
             "dgemm random leaves its first panel of chunks unwritten (zeros, the fill value)"),
    Mutation("random-drops-storage-options", "dgemm/cli/data.py",
             "storage_options=storage_options)", "storage_options=None)",
             ("tests/test_cli_habits.py::test_random_writes_to_s3_through_storage_options",),
             "dgemm random --storage-option never reaches the store"),
    Mutation("memory-limit-fraction-refused", "dgemm/config.py",
             "        if 0 < f <= 1:\n            return f\n",
             "        if 0 < f <= 1:\n            return _positive_bytes(value, name)\n",
             ("tests/test_config.py", "-k", "fraction"),
             "--device-memory-limit 0.8 read as bytes (refused)"),
    Mutation("memory-limit-fraction-unresolved", "dgemm/worker/state.py",
             "limit = int(limit * info.global_mem) if isinstance(limit, float) else limit", "limit = limit",
             ("tests/test_config.py::test_a_fraction_is_resolved_against_each_device",
              "tests/test_cli_habits.py::test_worker_device_memory_limit_fraction_is_that_share_of_its_device"),
             "a fraction of the device's memory taken as that many bytes"),
    # -- Blosc-LZ4 decoded on the device (issue 28) ----------------------------------------------
    Mutation("lz4-unshuffle-wide4-order", "dgemm/kernels/lz4.cl", "as_uint((uchar4)(a.s0, c.s0, d.s0, e.s0))",
             "as_uint((uchar4)(c.s0, a.s0, d.s0, e.s0))", (TB, "-k", "round_trips and table-4-wide and not apart"),
             "LZ4_UNSHUFFLE 2 puts a 4-byte element's first two bytes the wrong way round"),
    Mutation("lz4-unshuffle-wide8-order", "dgemm/kernels/lz4.cl",
             "o[2 * g + 1] = (uint4)(as_uint((uchar4)(q[0].s2, q[1].s2, q[2].s2, q[3].s2)),",
             "o[2 * g + 1] = (uint4)(as_uint((uchar4)(q[0].s3, q[1].s2, q[2].s2, q[3].s2)),",
             (TB, "-k", "round_trips and table-4-wide and not apart"),
             "LZ4_UNSHUFFLE 2 takes an 8-byte element's first byte from the next element"),
    Mutation("lz4-unshuffle-wide-tail", "dgemm/kernels/lz4.cl",
             "        for (uint p = n * ts + get_global_id(0); p < size; p += get_global_size(0)) dst[off + p] = in[p];\n"
             "        return;", "        return;", (TB, "-k", "table-4-wide and not apart"),
             "LZ4_UNSHUFFLE 2 leaves the bytes after a block's whole elements unwritten"),
    Mutation("lz4-match-before-start", "dgemm/kernels/lz4.cl",
             "if (err == LZ4_OK && offset > op) err = LZ4_E_BEFORE;",
             "if (err == LZ4_OK && offset > op + 1) err = LZ4_E_BEFORE;",
             ("tests/test_blosc_device.py", "-k", "crafted"), "an LZ4 match may start a byte before the output"),
    Mutation("lz4-last-literals-inexact", "dgemm/kernels/lz4.cl",
             "if (ip + lit != n_in || lit_end > n_out) err = LZ4_E_LITERALS;",
             "if (ip + lit > n_in || lit_end > n_out) err = LZ4_E_LITERALS;",
             ("tests/test_blosc_device.py", "-k", "crafted"), "bytes after an LZ4 stream's last literals are let through"),
    Mutation("lz4-match-end-rule", "dgemm/kernels/lz4.cl",
             "if (err == LZ4_OK && op + len > n_out - 5) err = LZ4_E_MATCH_END;",
             "if (err == LZ4_OK && op + len > n_out) err = LZ4_E_MATCH_END;",
             ("tests/test_blosc_device.py", "-k", "crafted"), "a match into the last 5 output bytes is accepted (lz4 refuses)"),
    Mutation("lz4-no-barrier", "dgemm/kernels/lz4.cl",
             "            barrier(CLK_GLOBAL_MEM_FENCE);\n            synced = op;", "            synced = op;",
             ("tests/test_blosc_device.py", "-k", "round_trips"), "matches read bytes other lanes have not written yet"),
    Mutation("lz4-wide-flags-unread", "dgemm/kernels/lz4.cl", "(f == 0 && lit_end + 12 <= n_out", "(lit_end + 12 <= n_out",
             (TB, "-k", "refuses and wide"), "the wide parser's common case skips the sequence's input-side rules"),
    Mutation("lz4-wide-no-cap", "dgemm/kernels/lz4.cl", "m = (uint)min(len, (long)cap);", "m = (uint)len;",
             (TB, "-k", "crafted and wide"), "the wide parser keeps a match length's low 32 bits"),
    Mutation("lz4-wide-matchlen-ignored", "dgemm/kernels/lz4.cl", "else if (f & F_MATCHLEN) code = STOP_IN | LZ4_E_MATCHLEN;", "else if (0) code = STOP_IN | LZ4_E_MATCHLEN;",
             (TB, "-k", "(refuses or crafted) and wide"), "the wide parser lets a match length past the input through"),
    Mutation("lz4-wide-walk-step", "dgemm/kernels/lz4.cl", "        const uint tq = in[q];  ", "        const uint tq = in[q + 1];",
             (TB, "-k", "round_trips and wide"), "the wide parser's walk reads the next token a byte late"),
    Mutation("lz4-wide-scan-offset", "dgemm/kernels/lz4.cl", "sc[(from ^ LZ4_BATCH) + k] = k >= d ?", "sc[(from ^ LZ4_BATCH) + k] = k > d ?",
             (TB, "-k", "round_trips and wide"), "the wide parser's scan leaves out one sequence in each round"),
    Mutation("lz4-wide-match-end-reason", "dgemm/kernels/lz4.cl", "            else code = STOP_IN | LZ4_E_MATCH_END;", "            else code = STOP_IN | LZ4_E_BEFORE;",
             (TB, "-k", "refuses and wide"), "the wide parser calls a match into the last 5 output bytes one that starts before the output"),
    Mutation("lz4-wide-independent-too-soon", "dgemm/kernels/lz4.cl", "            if (src_end <= start) {\n                if (len > LZ4_LONG) tab[T_LONG + atomic_inc", "            if (src_end <= lit_end) {\n                if (len > LZ4_LONG) tab[T_LONG + atomic_inc",
             (TB, "-k", "round_trips and wide"), "the wide parser copies a match that reads the batch's own output in phase 1"),
    Mutation("lz4-wide-walk-extra-length", "dgemm/kernels/lz4.cl", "if (t < 0xF0 && (t & 15) != 15 && q + 6 <= n_in) {  ", "if ((t & 15) != 15 && q + 6 <= n_in) {  ",
             (TB, "-k", "round_trips and wide"), "the wide parser's walk ignores a literal length's extra bytes"),
    Mutation("unshuffle-tail", "dgemm/kernels/lz4.cl", "        if (p >= shuffled) {", "        if (p > shuffled) {",
             ("tests/test_blosc_device.py", "-k", "hand_built"), "the first tail byte of a shuffled block is read from the planes"),
    Mutation("bitunshuffle-odd-counts", "dgemm/kernels/lz4.cl",
             "const uint shuffled = (mode == 2 && n % 8 != 0) ? 0 : n * ts;", "const uint shuffled = n * ts;",
             ("tests/test_blosc_device.py", "-k", "hand_built"), "blocks whose element count is not a multiple of 8 are bit-unshuffled"),
    Mutation("bitunshuffle-bit-order", "dgemm/kernels/lz4.cl",
             "v |= ((rows[k * (n / 8)] >> bit) & 1) << k;", "v |= ((rows[k * (n / 8)] >> (7 - bit)) & 1) << k;",
             ("tests/test_blosc_device.py", "-k", "round_trips and float32"), "bit unshuffle reads elements' bits MSB first"),
    Mutation("blosc-stream-length-unchecked", "dgemm/opencl/codecs/blosc.py",
             "wrong = (length < 0) | (length > cbytes - off)", "wrong = length < 0",
             ("tests/test_blosc_device.py", "-k", "forged"), "a stream may run past the frame's cbytes"),
    Mutation("blosc-memcpyed-size-unchecked", "dgemm/opencl/codecs/blosc.py",
             "        if nbytes + HEADER != cbytes:\n            raise bad(f\"stored uncompressed",
             "        if nbytes + HEADER > cbytes:\n            raise bad(f\"stored uncompressed",
             ("tests/test_blosc_device.py", "-k", "forged"), "a memcpyed frame bigger than its output is accepted"),
    Mutation("blosc-split-rule", "dgemm/opencl/codecs/blosc.py", "blocksize // ts >= MIN_SPLIT", "blocksize // ts > MIN_SPLIT",
             ("tests/test_blosc_device.py", "-k", "hand_built"), "blocks of exactly 128 bytes a split are read unsplit"),
    Mutation("blosc-offset-check", "dgemm/opencl/codecs/blosc.py",
             "outside = (off < 0) | (off > cbytes - 4)", "outside = off < 0",
             ("tests/test_blosc_device.py", "-k", "forged"), "block starts past the frame are not refused"),
    # -- outputs as to_zarr writes them (issue 29) -----------------------------------------------
    Mutation("layout-zero-chunk", "dgemm/storage/layout.py",
             "return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and v > 0",
             "return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and v >= 0",
             ("tests/test_output_options.py::test_bad_options_are_refused_before_any_work",),
             "chunks=(0, 10) taken (zarr itself takes it)"),
    Mutation("layout-shards-not-multiple", "dgemm/storage/layout.py",
             "bad = [ax for ax, (s, c) in enumerate(zip(shards, chunks)) if s % c]", "bad = []",
             ("tests/test_output_options.py::test_bad_options_are_refused_before_any_work",),
             "shards that are not multiples of chunks left to zarr's message, which names neither argument"),
    Mutation("layout-v2-shards", "dgemm/storage/layout.py",
             '        if zarr_format == 2:\n            raise ValueError(f"shards={shards!r} needs zarr_format=3',
             '        if False:\n            raise ValueError(f"shards={shards!r} needs zarr_format=3',
             ("tests/test_output_options.py::test_bad_options_are_refused_before_any_work",),
             "zarr_format=2 with shards not refused by name"),
    Mutation("layout-dimension-names-length", "dgemm/storage/layout.py",
             "if len(dimension_names) != ndim or not all(", "if not all(",
             ("tests/test_output_options.py::test_bad_options_are_refused_before_any_work",),
             "dimension_names of the wrong length not refused by name"),
    Mutation("layout-dgemm-attribute", "dgemm/storage/layout.py",
             "if COMPLETE_ATTR in attributes:", "if False:",
             ("tests/test_output_options.py::test_bad_options_are_refused_before_any_work",),
             "attributes= may set dgemm's own record (it would be overwritten, or fake completion)"),
    Mutation("layout-not-recorded", "dgemm/storage/outputs.py",
             'config={"write_empty_chunks": True}, **layout.create_kwargs())',
             'config={"write_empty_chunks": True})',
             ("tests/test_output_options.py::test_layout_options_are_recorded_as_zarr_records_them",),
             "shards, zarr_format and dimension_names checked but not given to zarr"),
    Mutation("layout-attributes-dropped", "dgemm/storage/outputs.py",
             "attributes={**(layout.attributes or {}), **attrs}", "attributes=attrs",
             ("tests/test_output_options.py::test_layout_options_are_recorded_as_zarr_records_them",),
             "the user's attributes not written"),
    Mutation("layout-blocks-ignore-shards", "dgemm/client/steps.py",
             "    if req.out_unit is not None:\n        counts", "    if False:\n        counts",
             ("tests/test_output_options.py::test_layout_options_are_recorded_as_zarr_records_them",),
             "blocks not multiples of the given shards: a store task writes parts of shards"),
    Mutation("layout-existing-out-takes-them", "dgemm/client/request.py",
             '    if not spec.resume:\n        raise ValueError(f"{names} applies to a new out',
             '    if False:\n        raise ValueError(f"{names} applies to a new out',
             ("tests/test_output_options.py::test_options_apply_to_a_new_out_only",),
             "layout options silently ignored for an existing out"),
    Mutation("layout-resume-other-options", "dgemm/client/request.py",
             "    diff = differences(spec.array, layout)\n    if diff:",
             "    diff = differences(spec.array, layout)\n    if False:",
             ("tests/test_output_options.py::test_a_finished_output_keeps_no_records_and_resume_keeps_them_until_done",),
             "resume accepts options other than the interrupted call's"),
    Mutation("layout-dataarray-dims-overridden", "dgemm/api.py",
             "    if tuple(dimension_names) != dims:", "    if False:",
             ("tests/test_output_options.py::test_dimension_names_with_dataarrays_must_be_their_dims",),
             "dimension_names other than the DataArrays' dims not refused (the run would go on, then overwrite them)"),
    Mutation("default-chunks-are-blocks", "dgemm/storage/layout.py",
             "full[ax] = c if c and (b % c == 0 or b >= extents[ax]) else b", "full[ax] = b",
             ("tests/test_output_options.py::test_default_chunks_follow_the_inputs_as_dask_matmul",),
             "C chunked by the plan's blocks (1024² from 512² inputs), not as dask.array.matmul"),
    Mutation("default-chunks-cut-by-blocks", "dgemm/storage/layout.py",
             "full[ax] = c if c and (b % c == 0 or b >= extents[ax]) else b", "full[ax] = c or b",
             ("tests/test_output_options.py::test_default_chunks_where_the_blocks_need_otherwise",),
             "C takes the inputs' chunks even where the blocks cut them (store tasks write parts of chunks)"),
    Mutation("resume-plans-with-chunks", "dgemm/client/request.py",
             "if spec.resume else None\n", "if False else None\n",
             ("tests/test_output_options.py::test_a_finished_output_keeps_no_records_and_resume_keeps_them_until_done",),
             "resume plans with out's chunks, not the recorded blocks: refused as another product"),
    Mutation("lazy-ignores-input-chunks", "dgemm/client/steps.py",
             "    if req.spec is not None or req.block is not None:", "    if True:",
             ("tests/test_output_options.py::test_a_slice_of_a_lazy_result_computes_only_the_blocks_it_touches",
              "tests/test_output_options.py::test_a_lazy_slice_under_dask_local_scheduler_culls_to_its_blocks"),
             "a lazy result's blocks are the plan's (1024² on a CPU, 4096² unplaced): a slice computes all of one"),
    Mutation("markers-kept-after-complete", "dgemm/storage/output_run.py",
             "                self.markers.remove()", "                pass",
             ("tests/test_output_options.py::test_a_finished_output_keeps_no_records_and_resume_keeps_them_until_done",),
             "a finished output keeps its block markers (4 extra objects for 4 blocks)"),
    Mutation("markers-remove-deletes-foreign", "dgemm/storage/markers.py",
             "        if len(ours) == len(found):", "        if True:",
             ("tests/test_output_options.py::test_a_finished_output_keeps_no_records_and_resume_keeps_them_until_done",),
             "removing the markers deletes a file dgemm did not write"),
    Mutation("dgemm-folder-left", "dgemm/storage/markers.py",
             '\n        keys.prune(self.store, self.prefix.rstrip("/"))\n', '\n        pass\n',
             ("tests/test_output_options.py::test_a_finished_output_keeps_no_records_and_resume_keeps_them_until_done", T_LATE),
             "a finished local output keeps an empty .dgemm folder"),
    Mutation("matmul-progress-distributed-bar", "dgemm/client/steps.py",
             "show_progress(client, future, token)",
             "from distributed import progress; progress(future, scheduler=address)",
             ("tests/test_cli_habits.py::test_matmul_progress_bar_runs_to_100_percent_of_the_flops",),
             "progress=True shows distributed's bar, which counts tasks"),
    # -- the dashboard in Bokeh (issue 29) -----------------------------------------------------------
    Mutation("dashboard-cpu-rate-in-tflops", "dgemm/scheduler/plots.py",
             '"rate_busy": format_rate(w["flops_busy"]), "rate_kernel": format_rate(w["flops_kernel"]),',
             '"rate_busy": f\'{w["flops_busy"] / 1e12:.3g} TFLOPS\', "rate_kernel": f\'{w["flops_kernel"] / 1e12:.3g} TFLOPS\',',
             ("tests/test_dashboard.py::test_pages_show_the_figures",),
             "a CPU device's rate printed as 0.00833 TFLOPS"),
    Mutation("dashboard-page-not-listed", "dgemm/scheduler/page.py",
             "        server._applications[route] = context   # app_paths: what /individual-plots.json lists\n",
             "",
             ("tests/test_dashboard.py::test_pages_are_listed_for_jupyterlab",),
             "the dgemm pages are served but missing from /individual-plots.json (no JupyterLab panels)"),
    Mutation("dashboard-matmul-named-by-hash", "dgemm/scheduler/dashboard.py",
             'return f"{what} {self.token[:6]}"', "return self.token",
             ("tests/test_dashboard.py::test_pages_show_the_figures",),
             "matmuls named only by a hash"),
    Mutation("dashboard-worker-blue-is-transfer-blue", "dgemm/scheduler/plots.py",
             'WORKER_COLOURS = ("#d62728", ', 'WORKER_COLOURS = ("#1f77b4", ',
             ("tests/test_dashboard.py::test_pages_show_the_figures",),
             "a worker's line in the same blue as 'waiting for transfers'"),
    Mutation("dashboard-bytes-in-si", "dgemm/scheduler/plots.py",
             '"uploaded": format_bytes(w.get("bytes_up", 0)),', '"uploaded": format_rate(w.get("bytes_up", 0), "B"),',
             ("tests/test_dashboard.py::test_pages_show_the_figures",),
             "bytes in SI units where the rest of dask uses format_bytes"),
    Mutation("dashboard-no-page-without-bokeh", "dgemm/scheduler/dashboard.py",
             "        if not bokeh:\n            routes.append((ROUTE, NoBokehHandler, kw))\n",
             "        if False:\n            routes.append((ROUTE, NoBokehHandler, kw))\n",
             ("tests/test_dashboard.py::test_without_the_bokeh_dashboard_the_figures_stay_served",),
             "/dgemm 404s on a scheduler started without the Bokeh dashboard"),
    # -- the lease's conditional writes on S3 (issue 29) -------------------------------------------
    Mutation("s3-lease-refused-write-held", "dgemm/storage/lease.py",
             "        return (held is not None and held.id == self.id), held\n",
             "        return True, held\n",
             ("tests/test_lease_s3.py", "-k", "read_the_same_lease"),
             "a writer whose conditional write the server refused believes it holds the lease"),
    Mutation("s3-lease-renewal-unconditional", "dgemm/storage/lease.py",
             "            ok, now = self._write(tag)     # refused if another call took it since the read\n",
             "            ok, now = keys.put(self.store, self.key, self._record().dumps()) or True, None\n",
             ("tests/test_lease_s3.py", "-k", "renewal"),
             "the renewal is a read then a plain write: a run overwrites the lease of the run that took it over"),
    Mutation("s3-lease-release-unconditional", "dgemm/storage/lease.py",
             "                    self._cond.delete(self.key, tag)   # kept if another call took it since the read\n",
             "                    keys.delete(self.store, self.key)\n",
             ("tests/test_lease_s3.py", "-k", "release"),
             "a run ending deletes the lease another run took over meanwhile"),
    Mutation("s3-lease-stop-unconditional", "dgemm/storage/lease.py",
             "                elif not self._write(tag)[0]:\n",
             "                elif keys.put(self.store, self.key, self._record().dumps()):\n",
             ("tests/test_lease_s3.py", "-k", "stop"),
             "a stopped run replaces the lease another run took over meanwhile"),
    # -- device codecs wired to the reader (issue 28) -------------------------------------------
    Mutation("decoding-direct-offset", "dgemm/worker/decoding.py", "run(direct, out, [r[0].offset for r in direct])", "run(direct, out, None)", (T28, "-k", "arrays_values"), "chunks decoded in place all start at the block's first byte"),
    Mutation("decoding-rect-origin", "dgemm/worker/decoding.py", "src_origin=(piece.inside[1] * itemsize, first + piece.inside[0], 0)", "src_origin=(piece.inside[1] * itemsize, first, 0)", (T28, "-k", "arrays_values"), "a chunk cut by the region is copied from its first row"),
    Mutation("decoding-batch-in-place-only", "dgemm/worker/decoding.py", "    if not all(frame is not None and start is not None for frame, start in zip(data, starts)):", "    if not all(p.direct and frame is not None and start is not None for p, frame, start in zip(found.pieces, data, starts)):", (T28, "-k", "copied_into_place"), "blocks whose chunks are copied into place never share a decode call"),
    Mutation("decoding-batch-offsets-unaligned", "dgemm/worker/decoding.py", "                    offsets.append(-(-end // pitch) * pitch)", "                    offsets.append(end)", (T28, "-k", "copied_into_place"), "a shared call's chunk starts within a row of its scratch, and its rows are copied from the wrong place"),
    Mutation("decoding-batch-fault-silent", "dgemm/worker/decoding.py", "        if not isinstance(e, DgemmError):   # (neither", "        if False:   # (neither", (T28, "-k", "no_fault_of_its_data"), "a shared call that fails by a fault of the code or the driver falls back to calls of their own unseen"),
    Mutation("decoding-batch-alone-not-in-place", "dgemm/worker/decoding.py", "        alone = len(batch) == 1 and all(piece.direct for piece in batch[0].found.pieces)", "        alone = len(batch) == 1", (T28, "-k", "copied_into_place"), "a block alone in its call is decoded straight into its buffer though its chunks are not in place there"),
    Mutation("decoding-fill-zero", "dgemm/worker/decoding.py", "fill = np.asarray(found.fill, found.dtype).reshape(1)", "fill = np.zeros(1, found.dtype)", (T28, "-k", "arrays_values"), "chunks never written read as 0, not the fill value"),
    Mutation("decoding-call-bytes-per-block-only", "dgemm/worker/decoding.py", "    return int(CALL_BYTES_PER_BYTE * chunk + max(1, -(-chunk // BLOCK_MAX)) * CALL_BYTES_PER_BLOCK)", "    return int(CALL_BYTES_PER_BYTE * chunk)", (T28, "-k", "holds_no_more or counts_the_whole"), "small chunks' tables (a Huffman table and FSE tables each) not reserved"),
    Mutation("decoding-call-bytes-block-sized", "dgemm/worker/decoding.py", "    chunks = (-(-r1 // rows) - r0 // rows) * (-(-c1 // cols) - c0 // cols)", "    chunks = -(-(r1 - r0) // rows) * -(-(c1 - c0) // cols)", (T28, "-k", "holds_no_more or counts_the_whole"), "a block off the chunk grid reserves for its own extent, not the whole chunks it decodes"),
    Mutation("decoding-reserve-model-only", "dgemm/worker/decoding.py", "    return max(device_bytes(refs, share), device.scratch.nbytes())", "    return device_bytes(refs, share)", (T28, "-k", "reserve_follows"), "the panel cache takes what the decode slots hold beyond the model"),
    Mutation("decoding-reserve-for-host-blocks", "dgemm/worker/decoding.py", "if type(r) is DeviceDecoded and _may_take(r) and (dec := _decoder(r.block))]", "if type(r) is DeviceDecoded and _may_take(r) and (dec := _decoder(r.block) or codecs.DECODERS['zstd'])]", (T28, "-k", "slots_room"), "the decode slots are given room for blocks of arrays the device never decodes (raw, sharded, a checksum)"),
    Mutation("decoding-call-cap-ignored", "dgemm/worker/decoding.py", "        if n and (total + size > BATCH_BYTES or (cap is not None and held + holds > cap)):", "        if n and total + size > BATCH_BYTES:", (T28, "-k", "its_part_of"), "a shared decode call takes BATCH blocks past its part of the device's memory"),
    Mutation("decoding-reserve-uncapped", "dgemm/worker/decoding.py", "    batch = BATCH * shared if share is None else min(BATCH * shared, call_cap(share))", "    batch = BATCH * shared", (T28, "-k", "slots_room or its_part_of"), "the panel cache leaves the decode slots BATCH blocks a call whatever the device's memory"),
    Mutation("tasks-decode-share-unpassed", "dgemm/worker/tasks.py", "        decoding.limit_calls(state.device, memory)\n", "", ("tests/test_memory.py", "-k", "small_devices_memory"), "the worker's decode slots take BATCH blocks a call on a device too small for them beside the panels"),
    Mutation("decoding-blosc-counted-shared", "dgemm/worker/decoding.py", "for r, dec in mine if not r.share and dec.defers), default=0)", "for r, dec in mine if not r.share), default=0)", (T28, "-k", "slots_room"), "the panel cache leaves Blosc blocks, whose calls take one block, BATCH blocks' room a call"),
    Mutation("decoding-reserve-uncapped-share", "dgemm/worker/tasks.py", "        reserve += decoding.reserve(state.device, a_refs + b_refs, memory)", "        reserve += decoding.reserve(state.device, a_refs + b_refs, None)", ("tests/test_memory.py", "-k", "small_devices_memory"), "the panel cache leaves the decode slots BATCH blocks a call though their calls keep to the cap"),
    Mutation("decoding-take-first-over-cap", "dgemm/worker/decoding.py", "        if n and (total + size > BATCH_BYTES or (cap is not None and held + holds > cap)):", "        if (n and total + size > BATCH_BYTES) or (cap is not None and held + holds > cap):", (T28, "-k", "first_block_whatever"), "a block whose call alone passes the cap is never taken (its reader waits for ever)"),
    Mutation("floor-cache-without-codecs", "dgemm/benchmarks/floor.py", "    cache = panel_cache_bytes(p, usable, A, B, out)", "    cache = panel_cache_bytes(p, usable)", ("tests/test_memory.py", "-k", "leaves_the_decode_slots"), "dgemm bench e2e's floor counts a panel cache the workers' codecs leave smaller"),
    Mutation("floor-gram-untransposed", "dgemm/benchmarks/floor.py", "    if gram:\n        A.transpose()\n", "", ("tests/test_floor.py", "tests/test_e2e_shapes.py", "-k", "gram"), "dgemm bench e2e's floor plans a Gram product with X untransposed"),
    Mutation("client-codecs-room-ignored", "dgemm/client/codecs_room.py", "    held = 0 if a is None else max(", "    held = 0 if True else max(", ("tests/test_memory.py", "-k", "leaves_the_decode_slots or small_devices_memory"), "the client's plan sees a panel cache the workers' codecs leave smaller"),
    Mutation("codecs-for-plan-decode-off", "dgemm/worker/tasks.py", '    return {"decode": not host_cache and _decodes(kind, lambda: siblings),', '    return {"decode": False,', ("tests/test_memory.py", "-k", "leaves_the_decode_slots"), "a worker tells the client its device decodes nothing while it does"),
    Mutation("codecs-described-host-cache-ignored", "dgemm/worker/tasks.py", '{"decode": not host_cache and _decodes(', '{"decode": _decodes(', ("tests/test_cli.py", "-k", "codecs_keep"), "a device said to decode the blocks a host cache serves"),
    Mutation("codecs-described-never-shared", "dgemm/worker/tasks.py", ' "share": codecs.shares(mode, kind),', ' "share": False,', ("tests/test_cli.py", "-k", "codecs_keep"), "a device under auto said to keep calls of several blocks, which share's readers never queue for"),
    Mutation("plan-cli-codecs-uncounted", "dgemm/cli/data.py", '    return panel_cache_bytes(plan, {"local": described}, a, b),', '    return panel_cache_bytes(plan, {"local": described}),', ("tests/test_cli.py", "-k", "codecs_keep"), "dgemm plan counts a panel cache the device's codecs leave smaller"),
    Mutation("codecs-room-encode-uncounted", "dgemm/client/codecs_room.py", "            held += encoding.device_bytes(found, ENCODE_SLOTS)", "            held += 0", ("tests/test_codecs_room.py",), "the client counts no room for C's chunks encoded on the device"),
    Mutation("codecs-room-first-block", "dgemm/client/codecs_room.py", "    return ref(i, j)\n", "    return ref(0, 0)\n", ("tests/test_codecs_room.py",), "the client counts the first block's room, where a later block touches more chunks"),
    Mutation("codecs-room-encode-when-reduced", "dgemm/client/codecs_room.py", " and len(plan.segments) == 1 and not mirrored(plan, a, b, beta):", ":", ("tests/test_codecs_room.py",), "the client counts encoder room for C reduced or mirrored, which the GEMM tasks never encode"),
    Mutation("decoding-size-unchecked", "dgemm/worker/decoding.py", "            if size != n:", "            if size > n:", (T28, "-k", "corrupt"), "a frame that decodes to less than a chunk is taken"),
    Mutation("decoding-error-unwrapped", "dgemm/worker/decoding.py", "            raise unreadable(self.block, e) from e", "            raise", (T28, "-k", "corrupt"), "a bad chunk raises the decoder's error, not the reader's naming array, rows and columns"),
    Mutation("decoding-host-fallback", "dgemm/worker/decoding.py", "        if reason is not None:      # (decoded below", "        if False:      # (decoded below", (T28, "-k", "does_not_decode"), "a frame the device does not decode is sent to it anyway"),
    Mutation("decoding-device-uncounted", "dgemm/worker/decoding.py", 'fastpaths.codec("device_decoded_bytes", decoded)', 'fastpaths.codec("device_decoded_bytes", 0)', (T28, "-k", "arrays_values"), "bytes decoded on the device are not counted"),
    Mutation("frames-direct-rule", "dgemm/storage/frames.py", "whole and size[1] == width", "whole", (T28, "-k", "arrays_values"), "a whole chunk narrower than the block is decoded in place"),
    Mutation("codecs-blosc-any-cname", "dgemm/opencl/codecs/__init__.py", 'lambda config: str(config.get("cname", "")).lower() == "lz4"', "lambda config: True", (T28, "-k", "left_to_the_host"), "Blosc arrays of any compressor go to the device path"),
    Mutation("codecs-on-ignored", "dgemm/opencl/codecs/__init__.py", 'return mode in ("on", "share") or (mode == "encode" and work == "encode")', 'return mode == "share" or (mode == "encode" and work == "encode")', (T28, "-k", "where_the_setting_says"), "device-codecs=on does nothing on a CPU device"),
    Mutation("codecs-auto-unmeasured", "dgemm/opencl/codecs/__init__.py", 'AUTO: dict = {"GPU": "on"}', 'AUTO: dict = {"GPU": "on", "CPU": "on"}', (T28, "dgemm/opencl/codecs/__init__.py", "-k", "enabled or where_the_setting_says"), "auto takes the device path where it was measured slower"),
    Mutation("tasks-not-wired", "dgemm/worker/tasks.py", "    elif decodes_on_device(state, scope):", "    elif False and decodes_on_device(state, scope):", (T28, "-k", "where_the_setting_says"), "the GEMM tasks never hand the engine device-decoded blocks"),
    Mutation("engine-decoded-not-padded", "dgemm/opencl/engine.py", "ev = padded = self._pad(q, raw, rows, cols, transpose, drows, dcols, out, wait=done or None)", "ev = padded = None", (T28, "-k", "engine_stages"), "a device-decoded block that needs padding or a transpose is never staged"),
    Mutation("config-device-codecs-lenient", "dgemm/config.py", '    if word is None:\n        raise ValueError(f"{name}={value!r} must be auto, on, off, encode or share")', '    if word is None:\n        return "auto"', (T28, "-k", "bad_setting"), "a bad device-codecs value is taken as auto"),
    Mutation("readiness-device-codecs-unchecked", "dgemm/cluster/readiness.py", '        config.get("device-codecs")   # read by', '        pass   # read by', (T28, "-k", "bad_setting"), "a bad device-codecs value is found only by the GEMM tasks, after work began"),
    Mutation("host-decoded-uncounted", "dgemm/storage/chunks.py", 'fastpaths.codec("host_decoded_bytes", got.nbytes)', 'fastpaths.codec("host_decoded_bytes", 0)', (T28, "-k", "zstd_inputs"), "bytes decoded on the host are not counted"),
    Mutation("metrics-codec-counters-missing", "dgemm/metrics.py", '    ("device_decoded_bytes", "dgemm_device_decoded_bytes",', '    ("device_decoded_bytez", "dgemm_device_decoded_bytes",', (T28, "-k", "collector"), "the device's decoded bytes read from the wrong snapshot key"),
    Mutation("dashboard-decoded-host-only", "dgemm/scheduler/plots.py", 'for k in ("device_decoded_bytes", "host_decoded_bytes"))\n', 'for k in ("host_decoded_bytes", "host_decoded_bytes"))\n', (T28, "-k", "dashboard"), "the dashboard shows the host's decoded bytes as the device's"),
    # -- zstd encoded on the device (issue 28, item 3) ----------------------------------------------
    Mutation("zstd-encode-shared-word-plain-store", "dgemm/kernels/zstd_encode.cl",
             "if (first) atomic_or(&words[w], (uint)acc);", "if (first) words[w] = (uint)acc;",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"),
             "a run's lowest word, shared with the run below, is stored over the other run's bits"),
    Mutation("zstd-encode-vector-byte-order", "dgemm/kernels/zstd_encode.cl",
             "            PUT4(v.w);\n            PUT4(v.z);\n", "            PUT4(v.z);\n            PUT4(v.w);\n",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"),
             "an aligned run's uint4 loads put their words' literals in the wrong order"),
    Mutation("zstd-encode-scalar-order", "dgemm/kernels/zstd_encode.cl",
             "for (uint i = i1; i-- > iv;) PUT(in[i]);", "for (uint i = iv; i < i1; i++) PUT(in[i]);",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"),
             "an unaligned run's literals written first to last (a stream is read backwards)"),
    Mutation("zstd-encode-marker-bit", "dgemm/kernels/zstd_encode.cl",
             "1u << ((shift + total) & 31)", "1u << ((shift + total + 1) & 31)",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"), "a stream's closing 1 bit a bit too high"),
    Mutation("zstd-encode-edge-bytes", "dgemm/kernels/zstd_encode.cl",
             "if (lo >= b0 && lo + 4 <= b1) {", "if (lo + 4 <= b1) {",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"),
             "a stream's first word stored whole, over the bytes before the stream"),
    Mutation("zstd-encode-histogram-last-byte", "dgemm/kernels/zstd_encode.cl",
             "for (ulong i = lid; i < n; i += ZE_WG) atomic_inc", "for (ulong i = lid; i + 1 < n; i += ZE_WG) atomic_inc",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"), "a stream's last byte left out of its histogram"),
    Mutation("zstd-encode-histogram-one-copy", "dgemm/kernels/zstd_encode.cl",
             "for (uint k = 0; k < ZE_HIST_COPIES; k++) c += h[k * 256 + s];", "c = h[s];",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"), "a stream's histogram from its first sub-histogram only"),
    Mutation("zstd-encode-rle-one-byte", "dgemm/opencl/codecs/zstd_encode.py",
             "rle = single & (top == low) & (lay.size >= 2)", "rle = single & (lay.size >= 2)",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"),
             "a block whose 4 streams each repeat a different byte becomes an RLE block"),
    Mutation("zstd-encode-table-every-block", "dgemm/opencl/codecs/zstd_encode.py",
             "carries = lay.index == first_table[region]", "carries = ok_first",
             ("tests/test_zstd_encode_device.py", "-k", "block_types"),
             "every block carries the region's Huffman table (valid, larger frames)"),
    Mutation("zstd-encode-jump-table", "dgemm/opencl/codecs/zstd_encode.py",
             "sbytes[lay.first[four][:, None] + np.arange(3)]", "sbytes[lay.first[four][:, None] + np.arange(1, 4)]",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"), "the jump table gives streams 2-4's sizes"),
    Mutation("zstd-encode-content-size-2-bytes", "dgemm/opencl/codecs/zstd_encode.py",
             "(nbytes - 256).to_bytes(2, \"little\")", "nbytes.to_bytes(2, \"little\")",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"), "a 2-byte content size without its 256 offset"),
    Mutation("zstd-encode-literals-header-10-bit", "dgemm/opencl/codecs/zstd_encode.py",
             "[most < 1024, most < 16384]", "[most <= 1024, most < 16384]",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"), "a size of 1024 put in a 10-bit literals header field"),
    Mutation("zstd-encode-last-block-flag", "dgemm/opencl/codecs/zstd_encode.py",
             "last = lay.index == np.bincount(region, minlength=nregions)[region] - 1",
             "last = lay.index == np.bincount(region, minlength=nregions)[region] - 2",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"), "the last block flag on the one before the last"),
    Mutation("huffman-no-length-limit", "dgemm/opencl/codecs/huffman.py",
             "    if lens.max() > max_bits:\n", "    if lens.max() > 64:\n",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"), "Huffman codes longer than 11 bits"),
    Mutation("huffman-ncount-short-values", "dgemm/opencl/codecs/huffman.py",
             "bits.put(count, nbits - (count < most))", "bits.put(count, nbits)",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"),
             "an FSE table description's small values written a bit too wide"),
    Mutation("huffman-fse-spread-step", "dgemm/opencl/codecs/huffman.py",
             "(size >> 1) + (size >> 3) + 3, size - 1", "(size >> 1) + (size >> 3) + 1, size - 1",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"), "FSE symbols spread with another step than the decoder's"),
    Mutation("huffman-codes-order", "dgemm/opencl/codecs/huffman.py",
             "    for weight in range(1, top + 1):\n", "    for weight in range(top, 0, -1):\n",
             ("tests/test_zstd_encode_device.py", "-k", "decodes"),
             "canonical codes assigned from the heaviest weight down (the decoder starts at weight 1)"),
    # -- bench e2e --op gram / projection (issue 27) -------------------------------------------
    Mutation("e2e-gram-is-x-x-transpose", "dgemm/benchmarks/shapes.py",
             "dgemm.gemm(os.fspath(a_path), os.fspath(a_path), trans_a=True,",
             "dgemm.gemm(os.fspath(a_path), os.fspath(a_path), trans_b=True,",
             (T27S, "-k", "gram_record_names_the_op"), "bench e2e --op gram times X X^T instead of X^T X"),
    Mutation("e2e-gram-check-ignores-symmetry", "dgemm/benchmarks/shapes.py",
             '"passed": bool(err <= tol and sym <= tol)}', '"passed": bool(err <= tol)}',
             (T27S, "-k", "symmetry_check_catches"), "the Gram check passes a C whose mirrored entries are wrong"),
    Mutation("e2e-gram-check-reads-rows", "dgemm/benchmarks/shapes.py",
             "    xs = _columns(x, both)\n", "    xs = np.asarray(x[both], dtype=np.float64).T\n",
             (T27S, "-k", "symmetry_check_catches or gram_record_names_the_op"), "the Gram check takes rows of X for its columns"),
    Mutation("e2e-dask-gram-transposed", "dgemm/benchmarks/shapes.py",
             "        return A.T @ A\n", "        return A @ A.T\n",
             (T27S, "-k", "gram_record_names_the_op"), "the dask.array peers of --op gram compute X X^T"),
    Mutation("e2e-io-floor-drops-decode", "dgemm/benchmarks/shapes.py",
             '"decode": input_bytes / (decode * 1e9) if decode else 0.0,', '"decode": 0.0,',
             (T27S, "-k", "gram_record_names_the_op or projection_record"), "the read-and-decode floor leaves out the decode"),
    Mutation("e2e-gram-bytes-count-x-twice", "dgemm/benchmarks/measure.py",
             "    inputs = input_elements(op, m, n, k) * itemsize * reps",
             "    inputs = (m * k + k * n) * itemsize * reps",
             (T27S, "-k", "gram_record_names_the_op"), "a Gram run's input bytes count X twice"),
    Mutation("e2e-numpy-peer-ignores-op", "dgemm/benchmarks/e2e.py",
             "            before_each=run.dropper(ins_small), op=opts.op, **writes), None",
             "            before_each=run.dropper(ins_small), **writes), None",
             (T27S, "-k", "gram_record_names_the_op"), "the dask.array + numpy peer computes A @ B whatever --op says"),
    Mutation("e2e-gram-check-skips-shape", "dgemm/benchmarks/shapes.py",
             "    if tuple(c.shape) != want:\n", "    if False:\n",
             (T27S, "-k", "wrong_shape"), "a C of the wrong shape is checked as if right"),
    Mutation("e2e-gram-check-always-passes", "dgemm/benchmarks/shapes.py",
             "        return check_gram(a, c, n_samples, n_samples)\n",
             '        return {**check_gram(a, c, n_samples, n_samples), "passed": True}\n',
             (T27S, "-k", "wrong_gram"), "bench e2e --op gram passes whatever C it checks"),
    Mutation("e2e-projection-check-always-passes", "dgemm/benchmarks/shapes.py",
             "    return check_sample(a, b, c, n_rows=n_samples, n_cols=n_samples)\n",
             '    return {**check_sample(a, b, c, n_rows=n_samples, n_cols=n_samples), "passed": True}\n',
             (T27S, "-k", "wrong_projection"), "bench e2e --op projection (and matmul) passes whatever C it checks"),
    Mutation("plan-k-cuts-tall-chunks", "dgemm/client/plan.py",
             "block_size(k, gk, tk, kchunk, _k_slack(slack, kchunk, tk, bm + bn, targets))",
             "block_size(k, gk, tk, kchunk, slack)",
             ("tests/test_gram.py", "-k", "tall"), "K blocks cut X's tall chunks: each chunk decoded once per K block touching it"),
    # -- the first call (issue 27) ---------------------------------------------------------------
    Mutation("prestart-server-without-the-nannys-environment", "dgemm/client/prestart.py",
             "pre_spawn = _pre_spawn_environment(_distributed_defaults())", "pre_spawn = _pre_spawn_environment({})",
             ("tests/test_prestart.py::test_a_first_call_forks_its_workers_from_a_server_begun_before_its_checks",),
             "the fork server starts without the nanny's pre-spawn environment"),
    Mutation("prestart-configuration-not-checked", "dgemm/client/prestart.py",
             "    if _pre_spawn_environment(dask.config.get(ENVIRON_KEY, {})) != _pre_spawn:", "    if False:",
             ("tests/test_prestart.py::test_the_server_starts_with_distributeds_defaults_and_the_configuration_is_checked_later",),
             "a configured pre-spawn environment that differs still forks from the server"),
    Mutation("prestart-preload-names-a-missing-module", "dgemm/client/prestart.py",
             '"dgemm.worker.tasks", "pyopencl", "zarr"', '"dgemm.worker.task", "pyopencl", "zarr"',
             ("tests/test_prestart.py::test_the_preload_names_modules_that_exist",), "a misspelt preload module is silently skipped"),
    Mutation("discovery-helper-lets-the-platforms-go", "dgemm/client/prestart.py",
             '            "sys.stdin.read()\\n")', '            "")',
             ("tests/test_prestart.py::test_a_helper_that_cannot_list_the_devices_leaves_it_to_the_cluster",),
             "the device helper exits at once: each worker starts the driver again"),
    Mutation("local-cluster-lists-the-devices-itself", "dgemm/client/steps.py",
             "    client = get_client(req.client, req.devices, dtype=req.dtype, start_method=prestart.start_method(),\n                        device_infos=prestart.devices())",
             "    client = get_client(req.client, req.devices, dtype=req.dtype, start_method=prestart.start_method(),\n                        device_infos=None)",
             ("tests/test_prestart.py::test_a_first_call_forks_its_workers_from_a_server_begun_before_its_checks",),
             "the call opens OpenCL itself after its checks"),
    Mutation("dashboard-pages-added-before-the-bokeh-dashboard", "dgemm/scheduler/dashboard.py",
             "        if not getattr(scheduler, DASHBOARD_PENDING, False):", "        if True:",
             ("tests/test_dashboard.py::test_pages_show_the_figures",), "dgemm's page is routed before Bokeh exists"),
    Mutation("local-cluster-dashboard-never-connected", "dgemm/cluster/local.py",
             "            connect(s.http_application, s.http_server, s, prefix=prefix)", "            pass",
             ("tests/test_dashboard.py::test_pages_show_the_figures",), "the late dashboard is never connected"),
    Mutation("store-helpers-while-products-pending", "dgemm/worker/tasks.py",
             "    if plugin is None or plugin.products_pending():", "    if plugin is None:",
             ("tests/test_worker.py::test_a_store_task_gets_helpers_only_once_its_worker_has_no_block_product_left",),
             "stores take every idle thread while the device still has blocks to read"),
    Mutation("write-region-never-helped", "dgemm/storage/chunks.py",
             "    done = threads_mod.shared(put, idxs, threads)", "    done = threads_mod.shared(put, idxs, 1)",
             ("tests/test_threads.py", "-k", "helped_writes"), "a run's last blocks are encoded on one thread"),
    Mutation("shared-raises-before-the-helpers-finish", "dgemm/storage/threads.py",
             "    except BaseException as e:\n        error = e\n    theirs = []",
             "    except BaseException:\n        raise\n    theirs = []",
             ("tests/test_threads.py", "-k", "once_every_other"), "the caller learns of a failed chunk while helpers still write"),
    Mutation("zstd-encode-ignores-its-workers", "dgemm/storage/zstd.py",
             "cctx = ctx.compressor(self.level, self.checksum, max(0, int(workers)))",
             "cctx = ctx.compressor(self.level, self.checksum, 0)",
             ("tests/test_threads.py", "-k", "lone_chunk"), "a block of one chunk is encoded on one thread"),
    Mutation("queue-priority-setting-ignored", "dgemm/opencl/device.py",
             'return "cl_khr_priority_hints" in extensions.split() and config.get("queue-priority") == "on"',
             'return "cl_khr_priority_hints" in extensions.split()',
             ("tests/test_device.py", "-k", "priority"), "queue-priority off still asks for high priority"),
    Mutation("queue-priority-without-the-extension", "dgemm/opencl/device.py",
             'return "cl_khr_priority_hints" in extensions.split() and config.get("queue-priority") == "on"',
             'return config.get("queue-priority") == "on"',
             ("tests/test_device.py", "-k", "priority"), "a driver without the hint is asked for it (and refuses)"),
    Mutation("inline-feeding-ignored-by-the-engine", "dgemm/opencl/device.py",
             "        return self.queue if self.inline_feeding else queue",
             "        return queue",
             ("tests/test_engine.py", "-k", "feeding_kernels"), "queue-priority inline leaves the padding kernels on the transfer queue"),
    Mutation("inline-feeding-ignored-by-the-decoders", "dgemm/opencl/scratch.py",
             '        if getattr(self._device, "inline_feeding", False):',
             "        if False:",
             ("tests/test_decoding.py", "-k", "stages_device_decoded"), "queue-priority inline leaves the decoders on their slots' queues"),
    Mutation("assign-picks-by-count", "dgemm/client/plan.py",
             "        return imbalance(max(load), total, n_workers), panels * unit",
             "        return max(load) and sum(1 for o in candidate[1] if o == load.index(max(load))), panels * unit",
             ("tests/test_balance.py",), "an edge row leaves one of two GPUs 1.35x the other's work"),
    Mutation("loads-forget-the-runs-cut-by-work", "dgemm/client/plan.py",
             "        candidates.append([run(at[p], at[p + 1]) for p in range(W)])\n", "        pass\n",
             ("tests/test_balance.py", "-k", "loads"), "the estimate's shares differ from the placed ones"),
    Mutation("first-call-cluster-waits-for-bokeh", "dgemm/cluster/local.py",
             "wait_for_dashboard=False, **more)", "wait_for_dashboard=True, **more)",
             ("tests/test_cluster.py::test_a_first_calls_cluster_runs_before_its_dashboard_is_imported",),
             "a script's first call waits for Bokeh's import before its product starts"),
    Mutation("background-dashboard-connects-a-closed-cluster", "dgemm/cluster/local.py",
             'if self.status.name in ("created", "starting", "running"):', "if True:",
             ("tests/test_cluster.py::test_a_cluster_closed_before_its_dashboard_came_up_closes_cleanly",),
             "a cluster closed before its dashboard came up is connected all the same"),
    Mutation("first-call-phases-miss-the-checks", "dgemm/benchmarks/first_call.py",
             '"dgemm.client.request": [("Request.check", "checks")],', '"dgemm.client.request": [],',
             ("tests/test_first_call.py::test_the_devices_reach_the_script_and_the_record_says_what_it_ran_on",),
             "the first-call record loses the checks phase"),
    # -- the LZ4 token table (issue 28) ------------------------------------------------------------
    Mutation("lz4-table-independent-too-soon", "dgemm/kernels/lz4.cl", "    if (src_end <= start) {\n        if (len > LZ4_LONG) tab[T_LONG + (*nlong)++]", "    if (src_end <= m) {\n        if (len > LZ4_LONG) tab[T_LONG + (*nlong)++]",
             (TB, "-k", "round_trips and table"), "a match that reads the batch's own output is copied in phase 1, beside the bytes it reads"),
    Mutation("lz4-table-no-group-fence", "dgemm/kernels/lz4.cl", "const int fence = src_end > *dirty;", "const int fence = 0;",
             (TB, "-k", "round_trips and table"), "phase 2 groups never wait for the matches before them"),
    Mutation("lz4-table-fence-unused", "dgemm/kernels/lz4.cl", "            if (flags & G_BARRIER) barrier(CLK_GLOBAL_MEM_FENCE);\n", "",
             (TB, "-k", "round_trips and table"), "phase 2 drops the barrier its groups ask for"),
    Mutation("lz4-table-match-before-start", "dgemm/kernels/lz4.cl", "if (!err && off > op) err = LZ4_E_BEFORE;", "if (!err && off > op + 1) err = LZ4_E_BEFORE;",
             (TB, "-k", "crafted and table"), "the token table lets a match start a byte before the output"),
    Mutation("lz4-table-match-end-rule", "dgemm/kernels/lz4.cl", "if (!err && op + len > n_out - 5) err = LZ4_E_MATCH_END;", "if (!err && op + len > n_out) err = LZ4_E_MATCH_END;",
             (TB, "-k", "crafted and table"), "the token table accepts a match into the last 5 output bytes"),
    Mutation("lz4-table-last-literals", "dgemm/kernels/lz4.cl", "            if (ip + lit != n_in || lit_end > n_out) {", "            if (ip + lit > n_in || lit_end > n_out) {",
             (TB, "-k", "crafted and table"), "the token table lets bytes after the last literals through"),
    Mutation("lz4-table-short-copy-past", "dgemm/kernels/lz4.cl", "        for (uint k = 0; k < 8; k++) if (i + k < n) d[i + k] = v[k];", "        for (uint k = 0; k < 8; k++) if (i + k <= n) d[i + k] = v[k];",
             (TB, "-k", "table and (round_trips or hostile or offsets)"), "a one-lane copy writes a byte past its end"),
    Mutation("lz4-table-parse-into-current-slot", "dgemm/kernels/lz4.cl", "tabs + (cur ^ 1) * T_WORDS, counts + C_WORDS * (cur ^ 1));", "tabs + cur * T_WORDS, counts + C_WORDS * (cur ^ 1));",
             (TB, "-k", "round_trips and apart"), "the parser writes the next batch over the one being copied"),
    Mutation("lz4-table-long-literal-lanes", "dgemm/kernels/lz4.cl", "for (uint i = c; i < lit; i += N_COPY) out[o + i] = l[i];", "for (uint i = c; i < lit; i += LZ4_WG) out[o + i] = l[i];",
             (TB, "-k", "round_trips and apart"), "a long literal copy strides by all lanes while only the copying ones copy"),
    Mutation("lz4-table-window-bound", "dgemm/kernels/lz4.cl", "#define IN_BYTE(i) ((ulong)((i) - wbase) < LZ4_STAGE ?", "#define IN_BYTE(i) ((ulong)((i) - wbase) <= LZ4_STAGE ?",
             (TB, "-k", "round_trips and staged"), "the parser reads one byte past the staged window"),
    Mutation("lz4-table-window-misplaced", "dgemm/kernels/lz4.cl", "win[i_] = wbase + i_ < n_in ? in[wbase + i_] : 0;", "win[i_] = wbase + i_ < n_in ? in[i_] : 0;",
             (TB, "-k", "round_trips and staged"), "the window holds the stream's first bytes wherever the next batch starts"),
    Mutation("lz4-table-litlen-code", "dgemm/kernels/lz4.cl", "            err = LZ4_E_LITLEN;\n            break;", "            err = LZ4_E_LITERALS;\n            break;",
             (TB, "-k", "refuses"), "the token table calls a literal length past the end bad last literals"),
    Mutation("unshuffle-words-plane-order", "dgemm/kernels/lz4.cl", "as_uint((uchar4)(in[e], in[n + e], in[2 * n + e], in[3 * n + e]))", "as_uint((uchar4)(in[e], in[n + e], in[3 * n + e], in[2 * n + e]))",
             (TB, "-k", "round_trips and table-4"), "the element-wise unshuffle swaps two planes of 4-byte elements"),
    Mutation("unshuffle-elements-tail", "dgemm/kernels/lz4.cl", "for (uint p = n * ts + get_global_id(0); p < size; p += get_global_size(0)) out[p]", "for (uint p = n * ts + 1 + get_global_id(0); p < size; p += get_global_size(0)) out[p]",
             (TB, "-k", "hand_built and table-4"), "the element-wise unshuffle leaves a block's first tail byte unwritten"),
    Mutation("unshuffle-elements-unaligned", "dgemm/kernels/lz4.cl", "const int words = (ts == 4 || ts == 8) && ((size_t)out & (ts - 1)) == 0;", "const int words = (ts == 4 || ts == 8) && ((size_t)out & (ts - 1)) == 0 || ts == 3;",
             (TB, "-k", "hand_built and table-4"), "3-byte elements written as 8-byte words"),
    Mutation("blosc-tuned-params-ignored", "dgemm/opencl/codecs/blosc.py", "        return dict(tuned[2])\n", "        return {}\n",
             (TB, "-k", "measured"), "the measured parameters for a device are not used"),
    Mutation("blosc-tuned-name-not-matched", "dgemm/opencl/codecs/blosc.py", "next((t for t in TUNED if t[0] in name), None)", "next((t for t in TUNED if t[0] == name), None)",
             (TB, "-k", "measured"), "a TUNED entry must spell the device's whole name"),
    # -- zstd decoded on the device (issue 28, item 2) -----------------------------------------------
    Mutation("zstd-offset-before-start", "dgemm/kernels/zstd_decode.cl", "if ((long)off > pos + bpos + ll) {", "if ((long)off > pos + bpos + ll + 1) {", (TZ, "-k", "crafted"), "a match may start a byte before the frame's output"),
    Mutation("zstd-huffman-leftover-bits", "dgemm/kernels/zstd_decode.cl", "    return h->r - h->off != 0 ? E_LEFTOVER : 0;", "    return 0;", (TZ, "-k", "other_huffman or split_among"), "Huffman streams with bits left over are taken (reader 5)"),
    Mutation("zstd-sequence-leftover-bits", "dgemm/kernels/zstd_decode.cl", "    if (b.pos != 0) code = E_LEFTOVER;\ndone:", "    if (b.pos > 7) code = E_LEFTOVER;\ndone:", (TZ, "-k", "crafted"), "sequence bitstreams with bits left over are taken"),
    Mutation("zstd-huffman-table-log-12-cut", "dgemm/kernels/zstd_decode.cl", "        const int size = log > 0 && log <= 12 ? 1 << log : 0;", "        const int size = log > 0 && log <= 12 ? 1 << min(log, 11) : 0;", (TZ, "-k", "other_huffman_readers"), "a Huffman table of log 12 is loaded into local memory only in part (reader 5's kernel, built by the test of the other readers)"),
    Mutation("zstd-huffman-late-refill", "dgemm/kernels/zstd_decode.cl", "    if (h->r - 12 < h->lo) {", "    if (h->r - 4 < h->lo) {", (TZ, "-k", "other_huffman"), "the Huffman streams' window is refilled too late"),
    Mutation("zstd-huffman-pair-refill-late", "dgemm/kernels/zstd_decode.cl", "    const bool need = h->r - h->lo < 24;", "    const bool need = h->r - h->lo < 12;", (TZ, "-k", "other_huffman"), "the window holds too few bits for the next two unchecked symbols"),
    Mutation("zstd-split-count-uncorrected", "dgemm/kernels/zstd_decode.cl", "count[lid] += ma - mb;", "count[lid] += ma;", (TZ, "-k", "every_level"), "reader 6: a part's count keeps the symbols its first read took before it met the true read"),
    Mutation("zstd-split-stuck-counted", "dgemm/kernels/zstd_decode.cl", "ma += ka >= 0; }", "ma++; }", (TZ, "-k", "split_among"), "reader 6: a re-read that reaches below the stream's start counts a symbol there"),
    Mutation("zstd-split-one-round", "dgemm/kernels/zstd_decode.cl", "if (ka != exit_at[lid]) atomic_or(&moved, 1);", "moved = 0;", (TZ, "-k", "split_among"), "reader 6: a part whose exit moved is not followed by a round that re-reads the next part"),
    Mutation("zstd-split-error-at-stuck", "dgemm/kernels/zstd_decode.cl", "total == dlen && end == 0 ? 0", "total == dlen ? 0", (TZ, "-k", "split_among"), "reader 6: a stream whose last code reaches below its start is taken"),
    Mutation("zstd-split-place-window", "dgemm/kernels/zstd_decode.cl", "    huf_take(h);            // 24 bits or more", "    // 24 bits or more", (TZ, "-k", "every_level"), "reader 6: unchecked pairs start with 12 bits in the window"),
    Mutation("zstd-plan-no-sequences", "dgemm/kernels/zstd_decode.cl", "if (!bad && (seq + 1 != p + bs || src[min(seq, end - 1)] != 0)) {", "if (0) {", (TDP, "-k", "fast_plans"), "zstd_plan: a block's sequences section is not marked for the host to read"),
    Mutation("zstd-plan-end-mark", "dgemm/kernels/zstd_decode.cl", "bad |= len[k] < 1 || (!bad && src[from + len[k] - 1] == 0);", "bad |= len[k] < 1;", (TDP, "-k", "end_mark"), "zstd_plan: a stream whose last byte (its end mark) is 0 is planned"),
    Mutation("zstd-plan-x2-own", "dgemm/kernels/zstd_decode.cl", "const long x2 = scratch[(base + owner) * PLAN_SCRATCH + 1];", "const long x2 = scratch[(base + b) * PLAN_SCRATCH + 1];", (TDP, "-k", "fast_plans"), "zstd_plan: a treeless block's streams take libzstd's decoder choice from their own sizes, not their tree's block"),
    Mutation("zstd-plan-frame-end", "dgemm/kernels/zstd_decode.cl", "ok = good && pos + (fr[3] ? 4 : 0) == end;", "ok = good;", (TDP, "-k", "only_the_host or gives_up"), "zstd_plan: bytes after the frame's last block (another frame) go unnoticed"),
    Mutation("zstd-plan-first-treeless", "dgemm/kernels/zstd_decode.cl", "if (!any && !sc[0]) { ok = 0; break; }", "any = 1;", (TDP, "-k", "gives_up"), "zstd_plan: a frame whose first compressed block repeats a tree it does not have is planned"),
    Mutation("zstd-devplan-raw-block-streams", "dgemm/opencl/codecs/zstd_devplan.py", "    if not compressed.all():", "    if False:", (TDP, "-k", "fast_plans"), "zstd_devplan: raw and RLE blocks keep stream rows"),
    Mutation("zstd-zero-offset-taken", "dgemm/kernels/zstd_decode.cl", "        if (off == 0) { *detail = i; return E_ZERO_OFFSET; }", "        if (off == 0) off = 1;", (TZ, "-k", "up_to_1_5_5"), "an offset of 0 is taken as 1 (libzstd up to 1.5.5), a corrupt chunk decoded where zarr refuses it"),
    Mutation("zstd-reserved-bits-ignored", "dgemm/opencl/codecs/zstd_frames.py", "    if modes & 3:", "    if False:", (TZ, "-k", "up_to_1_5_5"), "the sequence modes' reserved bits are ignored (libzstd up to 1.5.5), a corrupt chunk decoded where zarr refuses it"),
    Mutation("zstd-devplan-no-fallback", "dgemm/worker/decoding.py", "    except dec.refused_light():\n        return _decode_planned", "    except KeyError:\n        return _decode_planned", (TDP, "-k", "only_the_host"), "a frame only the host decodes, found by the device-planned call, fails its block"),
    Mutation("zstd-devplan-kernel-waited-first", "dgemm/opencl/codecs/zstd_devplan.py", "    read = cl.enqueue_copy(queue, back, bufs[1], is_blocking=False)\n", "    wait([done])\n    read = cl.enqueue_copy(queue, back, bufs[1], is_blocking=False)\n", (TDP, "-k", "rows_read"), "zstd_devplan: the host waits for the plan kernel's end before it asks for the rows (NVIDIA shows a kernel's end late)"),
    Mutation("zstd-devplan-kernel-failure-unchecked", "dgemm/opencl/codecs/zstd_devplan.py", "    if done.command_execution_status < 0:", "    if False:", (TDP, "-k", "kernel_that_failed"), "zstd_devplan: a failed plan kernel's rows (whatever the read found) are planned from"),
    Mutation("zstd-devplan-read-unreported", "dgemm/opencl/codecs/zstd_devplan.py", '        events.append(("plan_read", read))', "        pass", (TDP, "-k", "reports_its_plan_kernel"), "zstd_devplan: the rows' read is left out of the call's commands (the timelines and counters miss it)"),
    Mutation("zstd-devplan-prefix-kept", "dgemm/opencl/codecs/zstd_devplan.py", "        zf._prefix_positions(blocks)    #", "        pass    #", (TDP, "-k", "continues_the_prefix"), "zstd_devplan: a sequences section of no sequences ends the prefix (the kernel's guess kept)"),
    Mutation("zstd-host-plans-out-of-order", "dgemm/opencl/codecs/zstd_decode.py", "                for k in range(i):\n                    if isinstance(plans[k], zstd_devplan.FrameHead):\n                        zstd_fastplan.plan(frames[k], names[k])\n                raise", "                raise", (TDP, "-k", "frames_order"), "a frame corrupt in its header raises before an earlier frame corrupt in its blocks"),
    Mutation("zstd-split-quad-stays", "dgemm/kernels/zstd_decode.cl", "    if (k == 0) {\n        h->cur = h->nxt;", "    if (k == 4) {\n        h->cur = h->nxt;", (TZ, "-k", "every_level"), "reader 6: the window keeps taking words from a used quad"),
    Mutation("zstd-split-tree-stride", "dgemm/kernels/zstd_decode.cl", "nstreams > 0 ? trees[tree * TREE_INFO] : 0;", "nstreams > 0 ? trees[tree] : 0;", (TZ, "-k", "round_trips"), "reader 6: streams read another tree's log"),
    Mutation("zstd-split-direct-one-off", "dgemm/kernels/zstd_decode.cl", "global uchar* o = (row[5] ? out : lit) + row[2];", "global uchar* o = (row[5] ? out + 1 : lit) + row[2];", (TZ, "-k", "every_level"), "reader 6: a prefix block's Huffman literals land a byte past their place in the output"),
    Mutation("zstd-split-writes-unbounded", "dgemm/kernels/zstd_decode.cl", "min((long)count[lid], dlen - before)", "(long)count[lid]", (TZ, "-k", "split_among"), "reader 6: a stream with more symbols than literals writes them all, past its literals"),
    Mutation("zstd-reader1-late-refill", "dgemm/kernels/zstd_decode.cl", "        if (r - 12 < lo) {", "        if (r - 4 < lo) {", (TZ, "-k", "other_huffman"), "reader 1's window (a bench's build) is refilled too late"),
    Mutation("zstd-huffman-word-skipped", "dgemm/kernels/zstd_decode.cl", "    h->wi -= need ? 1 : 0;", "    h->wi -= 1;", (TZ, "-k", "other_huffman"), "the word loaded ahead moves on without being taken"),
    Mutation("zstd-direct-literals-one-off", "dgemm/kernels/zstd_decode.cl", "huf_finish(&h[0], table, log, (row[5] ? out : lit) + row[2], 0, row[3])", "huf_finish(&h[0], table, log, (row[5] ? out + 1 : lit) + row[2], 0, row[3])", (TZ, "-k", "other_huffman"), "a prefix block's Huffman literals land a byte past their place in the output"),
    Mutation("zstd-direct-literals-copied-too", "dgemm/opencl/codecs/zstd_decode.py", "np.flatnonzero((pre >= 0) & ~self.direct)", "np.flatnonzero(pre >= 0)", (TZ, "-k", "every_level"), "the copy kernel also copies the blocks whose literals went straight to the output (from literals never written)"),
    Mutation("scratch-slot-not-waited", "dgemm/opencl/scratch.py", "                _wait(last)", "                pass", ("tests/test_scratch.py",), "a slot is handed on while the deferred decode that left it is still in flight"),
    Mutation("deferred-decode-unchecked", "dgemm/opencl/engine.py", "        for check in checks.values():   # every block decoded cleanly, or the product fails here\n            check()\n", "", ("tests/test_decoding.py", "-k", "only_a_kernel"), "a product gives its result without checking its device-decoded blocks' error rows"),
    Mutation("deferred-decode-not-waited", "dgemm/opencl/engine.py", "            ev = done[-1] if direct and done else None", "            ev = None", ("tests/test_decoding.py", "-k", "deferred_decode_is_waited"), "the GEMM does not wait for a deferred decode of an aligned block"),
    Mutation("deferred-decode-padding-not-waited", "dgemm/opencl/engine.py", "ev = padded = self._pad(q, raw, rows, cols, transpose, drows, dcols, out, wait=done or None)", "ev = padded = self._pad(q, raw, rows, cols, transpose, drows, dcols, out)", ("tests/test_decoding.py", "-k", "deferred_decode_is_waited"), "the padding kernel does not wait for a deferred decode"),
    Mutation("zstd-repeat-offset-no-swap", "dgemm/kernels/zstd_decode.cl", "if (s.z) { off = rep1; rep1 = rep0; rep0 = off; } else off = rep0;", "off = rep0;", (TZ, "-k", "crafted"), "repeat offset 1 after no literals is not repeat offset 2"),
    Mutation("zstd-block-scan-no-swap", "dgemm/kernels/zstd_decode.cl", "                if (s.z) { long t = f0; f0 = f1; f1 = t; }", "                if (0) { long t = f0; f0 = f1; f1 = t; }", (TZ, "-k", "across_blocks or many_blocks"), "a block's repeat-offset function misses repeat offset 2's swap"),
    Mutation("zstd-rep-less-symbolic", "dgemm/kernels/zstd_decode.cl", "    return f + 1;\n}", "    return f;\n}", (TZ, "-k", "across_blocks"), "offset 1 less 1 stays offset 1 in a block's repeat-offset function"),
    Mutation("zstd-frame-scan-reps", "dgemm/kernels/zstd_decode.cl", "            r2 = rep_apply(st[ST_F + 2], r0, r1, r2);", "            r2 = rep_apply(st[ST_F + 1], r0, r1, r2);", (TZ, "-k", "across_blocks"), "a block's third incoming repeat offset is its second"),
    Mutation("zstd-waits-not-transitive", "dgemm/kernels/zstd_decode.cl", "        const uint waits = dep_any(dep, d - (long)off, d - (long)off + min((long)off, ml));", "        const uint waits = d < (long)off;", (TZ, "-k", "across_blocks or many_blocks"), "a match reading a waiting match's bytes does not wait"),
    Mutation("zstd-waits-never", "dgemm/kernels/zstd_decode.cl", "        const uint waits = dep_any(dep, d - (long)off, d - (long)off + min((long)off, ml));", "        const uint waits = 0;", (TZ, "-k", "across_blocks"), "matches reaching into earlier blocks run before those are written"),
    Mutation("zstd-origin-jump-once", "dgemm/kernels/zstd_decode.cl", "        while ((wait[q >> 5] >> (q & 31)) & 1) q = org[q];", "        if ((wait[q >> 5] >> (q & 31)) & 1) q = org[q];", (TZ, "-k", "across_blocks or many_blocks"), "one step of an origin's chain followed leaves origins on waiting bytes"),
    Mutation("zstd-gather-frame-search", "dgemm/kernels/zstd_decode.cl", "if (fstate[mid * FSTATE_COLUMNS + FS_ORG] <= (long)(w * 32)) lo = mid;", "if (fstate[mid * FSTATE_COLUMNS + FS_ORG] < (long)(w * 32)) lo = mid;", (TZ, "-k", "across_blocks or many_blocks"), "a frame's first word of waiting bytes is gathered into the frame before it"),
    Mutation("zstd-wait-bits-unshifted", "dgemm/kernels/zstd_decode.cl", "                if (sh) atomic_or(wait + (g >> 5) + 1, bits >> (32 - sh));", "", (TZ, "-k", "across_blocks or many_blocks"), "waiting bits spilling into the next word are lost"),
    Mutation("zstd-serial-frame-gathered", "dgemm/kernels/zstd_decode.cl", "        serial |= st[ST_SIZE] > DEP_BITS;", "        serial |= 0;", (TZ, "-k", "past_128"), "a block past 128 KiB + 64 takes origins its bitmap cannot hold"),
    Mutation("zstd-execute-ignores-prefix-error", "dgemm/kernels/zstd_decode.cl", "    int code = (int)fs[FS_CODE];", "    int code = 0;", (TZ, "-k", "first_failing"), "a copied-prefix block's error is lost"),
    Mutation("zstd-execute-first-failing-block", "dgemm/kernels/zstd_decode.cl", "if (state[(first + k) * STATE_COLUMNS + ST_CODE]) { atomic_min(&bad, (int)k); break; }", "if (state[(first + k) * STATE_COLUMNS + ST_CODE]) { atomic_max(&bad, (int)k); break; }", (TZ, "-k", "first_failing"), "a later block's error is lost"),
    Mutation("zstd-prefix-first-failing-block", "dgemm/kernels/zstd_decode.cl", "atomic_min(&bad, (int)k); break; }   // (later ones lose)", "bad = (int)k; }   // (later ones lose)", (TZ, "-k", "first_failing"), "the copied prefix's last failing block gives the error"),
    Mutation("zstd-short-match-overlap", "dgemm/kernels/zstd_decode.cl", "for (long k = 0; k < ml; k++) t[k] = m[(uint)k % off];", "for (long k = 0; k < ml; k++) t[k] = m[k];", (TZ, "-k", "round_trips"), "a short overlapping match reads bytes not yet written"),
    Mutation("zstd-long-match-overlap", "dgemm/kernels/zstd_decode.cl", "for (long k = lane; k < ml; k += ZSTD_LANES) d[k] = m[(uint)k % off];", "for (long k = lane; k < ml; k += ZSTD_LANES) d[k] = m[k];", (TZ, "-k", "round_trips"), "a long overlapping match reads bytes other lanes have not written"),
    Mutation("zstd-sequence-past-output", "dgemm/kernels/zstd_decode.cl", "if (ll + ml > limit - bpos) {", "if (ll + ml > limit - bpos + 1) {", (TZ, "-k", "crafted or first_failing"), "a sequence may write a byte past the frame's output"),
    Mutation("zstd-checksum-ignored", "dgemm/kernels/zstd_decode.cl", "if (!code && fr[4]) {", "if (!code && fr[4] && 0) {", (TZ, "-k", "crafted"), "frame checksums are not verified"),
    Mutation("zstd-huffman-too-few-longest-codes", "dgemm/opencl/codecs/zstd_entropy.py", "if ones < 2 or ones & 1:", "if ones & 1:", (TZ, "-k", "crafted or device_trees"), "a Huffman tree with no longest codes is taken (on the host: the fallback and the device tables' reference)"),
    Mutation("zstd-raw-block-past-content", "dgemm/kernels/zstd_decode.cl", "if (n > size - pos) {", "if (n > size - pos + 1) {", (TZ, "-k", "crafted"), "a raw block may write a byte past the frame's output"),
    Mutation("zstd-copy-blocks-past-output", "dgemm/kernels/zstd_decode.cl", "if (at < 0 || n > fr[1] - at) return;", "if (at < 0 || n > fr[1] - at + 1) return;", (TZ, "-k", "crafted"), "blocks copied at once may write past the frame's output"),
    Mutation("zstd-copied-block-unchecked", "dgemm/kernels/zstd_decode.cl", "    if (rest > limit - bpos) { *detail = rest; return E_LAST_PAST; }\n", "", (TZ, "-k", "crafted"), "last literals past the block's output bound are written"),
    Mutation("codecs-zstd-not-registered", "dgemm/opencl/codecs/__init__.py", 'lambda config: not config.get("checksum", False)', "lambda config: False", (T28, "-k", "zstd"), "zstd chunks never go to the device"),
    Mutation("codecs-zstd-checksum-to-device", "dgemm/opencl/codecs/__init__.py", 'lambda config: not config.get("checksum", False)', "lambda config: True", (T28, "-k", "checksum"), "zstd frames with a checksum go to the device (verified there on one lane)"),
    # -- S3 through obstore (issue 29) -------------------------------------------------------------
    Mutation("s3-lease-create-unconditional", "dgemm/storage/remote.py",
             'mode = "overwrite" if not self.atomic else "create" if match is None else {"e_tag": match}',
             'mode = "overwrite" if not self.atomic else "overwrite" if match is None else {"e_tag": match}',
             ("tests/test_lease_s3.py", "-k", "no_lease"),
             "a lease is created without If-None-Match: two writers that both found none both hold the output"),
    Mutation("s3-lease-takeover-unconditional", "dgemm/storage/remote.py",
             'mode = "overwrite" if not self.atomic else "create" if match is None else {"e_tag": match}',
             'mode = "overwrite" if not self.atomic else "create" if match is None else "overwrite"',
             ("tests/test_lease_s3.py", "-k", "stale_lease or renewal or release"),
             "a lease is replaced without If-Match: two takers of one stale lease both win"),
    Mutation("s3-lease-no-fallback", "dgemm/storage/remote.py",
             '                if mode == "overwrite" or _code(e) not in _NO_CONDITIONS:\n',
             "                if True:\n",
             ("tests/test_lease_s3.py", "-k", "refuses"),
             "a server without conditional writes (501) makes every run on it fail to take its lease"),
    Mutation("s3-delete-unconditional", "dgemm/storage/remote.py",
             '            if "DeleteObject" not in self.s3.refused:\n', "            if False:\n",
             ("tests/test_remote.py::test_conditional_writes_succeed_only_on_the_object_as_read",),
             "the lease's delete goes without If-Match: a run ending deletes the lease another run took over"),
    Mutation("s3-delete-unsigned", "dgemm/storage/remote.py",
             "            if self.creds is not None:\n", "            if False:\n",
             ("tests/test_remote.py", "-k", "conditional_writes or endpoint_with"),
             "the conditional DELETE goes unsigned: refused by S3, the lease is never released"),
    Mutation("s3-region-dropped", "dgemm/storage/remote.py",
             'self.config = dict(settings["extra"], region=region,',
             'self.config = dict(settings["extra"], region="us-east-1",',
             ("tests/test_remote.py", "-k", "endpoint_with"),
             "client_kwargs' region_name is not given to obstore: requests signed for us-east-1"),
    Mutation("s3-payer-dropped", "dgemm/storage/remote.py",
             'request_payer=settings["payer"]', "request_payer=False",
             ("tests/test_remote.py", "-k", "endpoint_with"),
             "requester_pays is not given to obstore: a requester-pays bucket refuses every GET"),
    Mutation("s3-anon-signed", "dgemm/storage/remote.py",
             'skip_signature=settings["anon"]', "skip_signature=False",
             ("tests/test_remote.py", "-k", "anon"),
             "anon=True requests are signed with whatever credentials the environment has"),
    Mutation("s3-env-credentials", "dgemm/storage/remote.py",
             "credential_provider=None if self.creds is None else self._credentials)", "credential_provider=None)",
             ("tests/test_remote.py", "-k", "environment or profile"),
             "the storage options' keys are not given to obstore: it signs with the environment's AWS_* ones"),
    Mutation("s3-env-overrides", "dgemm/storage/remote.py",
             '                           request_payer=settings["payer"], conditional_put="etag",\n'
             "                           virtual_hosted_style_request=False)\n",
             '                           conditional_put="etag")\n',
             ("tests/test_remote.py", "-k", "environment"),
             "AWS_REQUEST_PAYER / AWS_VIRTUAL_HOSTED_STYLE_REQUEST of the environment change the requests"),
    Mutation("s3-missing-raises", "dgemm/storage/remote.py",
             "            if isinstance(error, allowed):\n", "            if False:\n",
             ("tests/test_remote.py", "-k", "zarr_reads_them or missing_bucket"),
             "a missing chunk raises instead of reading as missing (zarr's fill value)"),
    Mutation("s3-refusal-reads-as-missing", "dgemm/storage/remote.py",
             "        return PermissionError(errno.EACCES, message)\n",
             "        return FileNotFoundError(errno.ENOENT, message)\n",
             ("tests/test_remote.py", "-k", "wrong_credentials"),
             "refused credentials read as a missing chunk: zeros where the data is"),
    Mutation("s3-range-past-end-raises", "dgemm/storage/remote.py",
             "                return b\"\"                # as zarr's FsspecStore: a range past the end reads as nothing\n",
             "                raise\n",
             ("tests/test_remote.py", "-k", "zarr_reads_them"),
             "a range past an object's end raises (416) instead of reading as nothing, as zarr does"),
    Mutation("s3-retries-unbounded", "dgemm/storage/remote.py",
             '"max_retries": self.retries,', '"max_retries": 10,',
             ("tests/test_remote.py", "-k", "dropped"), "the retries' bound in the storage options is ignored"),
    Mutation("s3-no-retries", "dgemm/storage/remote.py",
             '"max_retries": self.retries,', '"max_retries": 0,',
             ("tests/test_remote.py", "-k", "dropped"), "a dropped connection or a 503 fails the read at once"),
    Mutation("s3-put-read-timeout", "dgemm/storage/remote.py",
             '        self.put_client = {k: v for k, v in self.client.items() if k != "read_timeout"}\n',
             "        self.put_client = self.client\n",
             ("tests/test_remote.py", "-k", "slower_than"),
             "PUTs keep reqwest's read timeout (from the request's start): a slow PUT times out and is sent again"),
    Mutation("s3-put-cache-stale", "dgemm/storage/remote.py",
             "        with _LOCK:          # as s3fs after a PUT: its listings (zarr's list) see the new object\n"
             "            fs.invalidate_cache(path)\n", "",
             ("tests/test_remote.py", "-k", "put_many_writes"),
             "s3fs's listing cache does not hear of a chunk written: zarr's listing misses it"),
    # -- outputs: the lease through a replacement, markers after killed workers ------------------
    Mutation("replace-by-zarr-overwrite", "dgemm/storage/output_run.py",
             "array = create_output(spec, chunks, attrs, over=emptied)", "array = create_output(spec, chunks, attrs)",
             (T_REPL, T_EVERY), "the new output is created by zarr's overwrite, which deletes the lease just claimed"),
    Mutation("markers-reset-deletes-lease", "dgemm/storage/markers.py",
             "keys.clear_except(self.store, self.root, set(keep), aside=False)", "keys.delete_dir(self.store, self.root)",
             (T_REPL, T_EVERY), "resetting the markers deletes .dgemm whole, the replacing run's lease with it"),
    Mutation("replace-keeps-old-format-metadata", "dgemm/storage/outputs.py",
             "        if raw is None:\n            keys.delete(", "        if False:\n            keys.delete(",
             (T_EVERY,), "a v2 output replaced by a v3 one keeps its .zarray/.zattrs (or a v3 one its zarr.json)"),
    Mutation("clear-except-keeps-object-store-folders", "dgemm/storage/keys.py",
             "            delete(store, path)\n        if not (aside",
             "            delete(store, path)\n            continue\n        if not (aside",
             (T_EVERY,), "on S3 a folder of keys is 'deleted' as one key: the old chunks and markers stay"),
    Mutation("late-marker-not-taken-back", "dgemm/storage/markers.py",
             "            self.fence.check(i, j, stored=True)\n        except Exception:", "            pass\n        except Exception:",
             (T_LATE, T_STRAG), "a marker written after the run lost its lease (completed, taken over) stays"),
    Mutation("markers-without-fence", "dgemm/storage/output_run.py",
             "BlockMarkers(array, owner, fence=self.lease.fence())", "BlockMarkers(array, owner)",
             (T_LATE, T_STRAG), "the run's store tasks' markers are never checked once written"),
    Mutation("markers-removed-while-held", "dgemm/storage/output_run.py",
             '            completed = True\n        finally:   # given up even where the store refuses to delete it (a full disk): see abandon\n            self.lease.give_up()\n        if completed:\n            # Removed once the lease is given up: a store task still running (dask re-runs a task whose\n            # worker died) whose marker lands after this finds the lease gone and takes it back\n            # (BlockMarkers.mark), so nothing is left under .dgemm.\n            try:   # marked complete already: a marker left here (a store refusing deletes) is never read again\n                self.markers.remove()\n            except Exception:\n                pass\n',
             '            completed = True\n            try:   # marked complete already: a marker left here (a store refusing deletes) is never read again\n                self.markers.remove()\n            except Exception:\n                pass\n        finally:   # given up even where the store refuses to delete it (a full disk): see abandon\n            self.lease.give_up()\n        if completed:\n',
             (T_LATE,), "complete removes the markers before it gives up the lease: a straggler's marker then stays"),
    Mutation("killed-markers-temp-file-kept", "dgemm/storage/markers.py",
             r'_MARKER = re.compile(r"\d+\.(\d+|[0-9a-f]{32}\.partial)")', r'_MARKER = re.compile(r"\d+\.\d+")',
             (T_KILL,), "a marker's temporary file left by a worker killed mid-write keeps .dgemm in the finished output"),
    Mutation("killed-chunk-temp-file-foreign", "dgemm/storage/outputs.py",
             "if pattern is not None and half and (", "if False and half and (",
             (T_CHUNK,), "a chunk's temporary file left by a killed worker makes overwrite=True refuse the output"),
    Mutation("killed-zarr-v2-chunk-temp-file-foreign", "dgemm/storage/outputs.py",
             'pattern.fullmatch(half[1]) or pattern.fullmatch(half[1] + ".0")', "pattern.fullmatch(half[1])",
             (T_CHUNK,), "zarr's temporary file of a v2 chunk (<i>.<hex>.partial) is taken for the user's"),
    Mutation("zstd-tree-ncount-no-padding", "dgemm/kernels/zstd_decode.cl", "    const int size = size0 < 8 ? 8 : size0;", "    const int size = size0;", (TZ, "-k", "device_trees"), "an FSE table description under 8 bytes is read without libzstd's zero-padded copy of 8"),
    Mutation("zstd-tree-overread-end", "dgemm/kernels/zstd_decode.cl", "if (b->consumed > 64) return 3;", "if (b->consumed >= 64) return 3;", (TZ, "-k", "device_trees"), "the weights' stream ends a read early"),
    Mutation("zstd-tree-too-few-longest-codes", "dgemm/kernels/zstd_decode.cl", "if (ones < 2 || (ones & 1)) code = T_ONES;", "if (ones & 1) code = T_ONES;", (TZ, "-k", "device_trees or crafted"), "a device tree with no longest codes is taken"),
    Mutation("zstd-tree-code-length", "dgemm/kernels/zstd_decode.cl", "run_entry[runs] = (ushort)(s | (log + 1 - wt) << 8);", "run_entry[runs] = (ushort)(s | (log - wt) << 8);", (TZ, "-k", "round_trips"), "device tables' code lengths one short"),
    Mutation("zstd-tree-fill-search", "dgemm/kernels/zstd_decode.cl", "if (run_start[mid] <= e) lo = mid;", "if (run_start[mid] < e) lo = mid;", (TZ, "-k", "device_trees"), "each run's first entry gets the run before it"),
    Mutation("zstd-tree-fills-whole-slot", "dgemm/kernels/zstd_decode.cl", "for (int e = lane; e < (1 << log); e += ZSTD_TREE_LANES) {", "for (int e = lane; e < HUF_SLOT; e += ZSTD_TREE_LANES) {", (TZ, "-k", "device_trees"), "a table is written past its 2**log entries"),
    Mutation("zstd-tree-reads-past-description", "dgemm/kernels/zstd_decode.cl", "d[i] = i < len ? src[at + i] : 0;", "d[i] = src[at + i];", (TZ, "-k", "device_trees"), "a description's reader takes the bytes after it for libzstd's zeros"),
    Mutation("zstd-stream-tree-stride", "dgemm/kernels/zstd_decode.cl", "    const long tree = streams[first * STREAM_COLUMNS + 4];\n    const int log = trees[tree * TREE_INFO];", "    const long tree = streams[first * STREAM_COLUMNS + 4];\n    const int log = trees[tree];", (TZ, "-k", "other_huffman"), "streams read another tree's log (reader 5)"),
    Mutation("zstd-reader1-tree-stride", "dgemm/kernels/zstd_decode.cl", "const int log = trees[row[4] * TREE_INFO];", "const int log = trees[row[4]];", (TZ, "-k", "other_huffman"), "streams read another tree's log (readers 0-2)"),
    Mutation("zstd-batch-tree-offset", "dgemm/opencl/codecs/zstd_decode.py", "        s[:, zf.S_TABLE] += tree_base[fs]", "        s[:, zf.S_TABLE] += 0", (TZ, "-k", "treeless"), "a call's second frame reads the first frame's trees"),
    Mutation("zstd-treeless-first-tree", "dgemm/opencl/codecs/zstd_frames.py", "f.streams.append((src, length, base + dst, dlen, tree, 0, x2, len(f.blocks)))", "f.streams.append((src, length, base + dst, dlen, 0, 0, x2, len(f.blocks)))", (TZ, "-k", "treeless"), "every block reads its frame's first tree"),
    Mutation("zstd-tree-error-ignored", "dgemm/opencl/codecs/zstd_decode.py", "    for k in np.nonzero(tree_info[:, 1])[0]:", "    for k in np.nonzero(tree_info[:0, 1])[0]:", (TZ, "-k", "refused_tree"), "a tree the device refuses is not an error"),
    Mutation("zstd-host-tree-check-skipped", "dgemm/opencl/codecs/zstd_frames.py", "        f.check_trees()\n        raise", "        raise", (TZ, "-k", "refused_tree"), "a host error in a later block hides an earlier refused tree"),
    Mutation("zstd-tree-size-from-head", "dgemm/opencl/codecs/zstd_entropy.py", "return (head - 127 + 1) // 2 + 1 if head >= 128 else head + 1", "return (head - 127) // 2 + 1 if head >= 128 else head + 1", (TZ, "-k", "round_trips or device_trees"), "direct descriptions of an odd weight count a byte short"),
    # -- C encoded on the device (issue 28, item 3 wiring) -------------------------------------------
    Mutation("encode-tasks-not-wired", "dgemm/worker/tasks.py", "    found = encoding.target(state.device, engine.dtype, out)\n", "    found = None\n", (TE, "-k", "zstd_outputs"), "the GEMM tasks never ask the engine to encode C's chunks on the device"),
    Mutation("encode-graph-out-not-passed", "dgemm/client/graph.py", '    if graph.result_name == f"{names.GEMM}-{token}":\n', "    if False:\n", (TE, "-k", "zstd_outputs"), "add_store never names the output block to the GEMM tasks: C always comes down"),
    Mutation("encode-engine-finish-ignored", "dgemm/opencl/engine.py", '        if finish is not None:\n            with self.device.failing(f"unpadding', '        if False:\n            with self.device.failing(f"unpadding', (TE, "-k", "engine_hands_back"), "the engine downloads C whatever finish says"),
    Mutation("encode-edge-not-filled", "dgemm/worker/encoding.py", "                if p.size != found.shape:", "                if False:", (TE, "-k", "engine_hands_back"), "an edge chunk's part outside the array is left as the scratch held it, not the fill value"),
    Mutation("encode-copy-source-pitch", "dgemm/worker/encoding.py", "src_pitches=(width * itemsize, 0)", "src_pitches=(cols * itemsize, 0)", (TE, "-k", "engine_hands_back"), "chunks copied out of the C block with the chunk's row pitch, not the block's"),
    Mutation("encode-direct-offsets", "dgemm/worker/encoding.py", "[p.at[0] * width * itemsize for p in found.pieces]", "[0 for p in found.pieces]", (TE, "-k", "engine_hands_back and whole-row"), "whole-row chunks encoded where they lie all from the block's start"),
    Mutation("encode-scratch-kept-after-run", "dgemm/opencl/device.py", "        self.encode_scratch.release()\n", "        pass\n", ("tests/test_zstd_encode_device.py", "-k", "kept_buffers"), "the encoder's kept buffers outlive the run"),
    Mutation("encode-keep-ignored", "dgemm/opencl/codecs/zstd_encode.py", "        if keep:\n            return device.encode_scratch.buffer(what, nbytes)\n", "", ("tests/test_zstd_encode_device.py", "-k", "kept_buffers"), "keep=True allocates and releases every buffer as before"),
    Mutation("encode-reserve-uncounted", "dgemm/worker/tasks.py", "        reserve += max(encoding.device_bytes(found, state.device.encode_scratch.slots()),\n                       state.device.encode_scratch.nbytes())", "        pass", ("tests/test_memory.py", "-k", "encoder_room"), "the panel cache fills the room the encoder's kept buffers hold"),
    Mutation("encode-no-room-kept", "dgemm/worker/encoding.py", "            device.encode_scratch.release()     # what it did get goes too: the next block tries afresh\n", "", (TE, "-k", "no_room"), "after the encoder had no room, what it did get of its kept buffers stays held"),
    Mutation("batch-check-all-frames", "dgemm/worker/decoding.py", "r.check = functools.partial(check, only=range(first, first + n))", "r.check = check", ("tests/test_decoding.py", "-k", "refuses_fails_only_its_block"), "a block of a shared call raises another block's chunk error"),
    Mutation("batch-copy-to-offset-0", "dgemm/worker/decoding.py", "return cl.enqueue_copy(queue, out, scratch, src_offset=at, dst_offset=piece.offset,", "return cl.enqueue_copy(queue, out, scratch, src_offset=at, dst_offset=0,", ("tests/test_decoding.py", "-k", "share_one_decode_call"), "every chunk of a shared call copied to its block's start"),
    Mutation("batch-one-block-a-call", "dgemm/worker/decoding.py", "    while n < min(BATCH, len(queue)):", "    while n < min(1, len(queue)):", ("tests/test_decoding.py", "-k", "share_one_decode_call"), "blocks queued behind busy slots each get a call of their own"),
    Mutation("batch-failure-not-alone", "dgemm/worker/decoding.py", "            r.alone = not ok\n", "            r.alone = False\n", ("tests/test_decoding.py", "-k", "leaves_each_block_to_a_call"), "a shared call that fails fails (or hangs) every block in it"),
    Mutation("auto-shares-every-codec", "dgemm/opencl/codecs/__init__.py", "        return AUTO_CODECS\n", "        return None\n", ("tests/test_decoding.py", "-k", "auto_on_a_gpu"), "auto on a GPU decodes Blosc inputs on the device too"),
    Mutation("only-ignored-in-fill", "dgemm/worker/decoding.py", "if found is None or not _may_take(self, found.codec):", "if found is None:", ("tests/test_decoding.py", "-k", "auto_leaves_to_the_host_is_declined or codec_auto"), "a block of a codec auto leaves to the host is decoded on the device"),
    Mutation("auto-not-shared-on-gpu", "dgemm/opencl/codecs/__init__.py", '        return AUTO.get(device_type) == "share"\n', "        return False\n", ("tests/test_decoding.py", "-k", "auto_on_a_gpu"), "auto on a GPU waits for a decode slot instead of sharing the inputs with the host"),
    Mutation("batch-bytes-uncapped", "dgemm/worker/decoding.py", "        if n and (total + size > BATCH_BYTES or (cap", "        if n and (False or (cap", ("tests/test_decoding.py", "-k", "bytes_cap"), "a shared call takes blocks past BATCH_BYTES (its execution then walks the frames one by one)"),
    Mutation("room-batched-under-share", "dgemm/worker/decoding.py", "for r, dec in mine if not r.share and dec.defers), default=0)", "for r, dec in mine if dec.defers), default=0)", ("tests/test_decoding.py", "-k", "slots_room"), "the panel cache leaves room for shared calls that share never makes"),
    Mutation("room-counts-declined-codecs", "dgemm/worker/decoding.py", "    return codec in ref.only\n", "    return True\n", ("tests/test_decoding.py", "-k", "slots_room or auto_leaves_to_the_host_is_declined"), "blocks auto leaves to the host are counted and taken by the device"),
    Mutation("encode-histogram-no-wait", "dgemm/opencl/codecs/zstd_encode.py", "region_hists, wait_for=wait_for))", "region_hists))", ("tests/test_zstd_encode_device.py", "-k", "another_queue"), "an encode on its own queue reads its buffer before what writes it has run"),
    Mutation("encode-layout-no-wait", "dgemm/worker/encoding.py", "dst_pitches=(cols * itemsize, 0), wait_for=after))", "dst_pitches=(cols * itemsize, 0)))", (TE, "-k", "waits_for_the_events"), "the chunks are laid out from the C block before the unpadding has written it"),
    Mutation("engine-finish-after-dropped", "dgemm/opencl/engine.py", "result, down, *freed = finish(dense, done, [unpad])", "result, down, *freed = finish(dense, done, None)", ("tests/test_engine.py", "-k", "finish_on_another_queue"), "the finish reads the result buffer on another queue without waiting for the unpadding"),
    Mutation("scratch-grow-keeps-released", "dgemm/opencl/scratch.py", "            if held is not None:    # out before it is released: should the larger one fail, none is left\n                del self._buffers[key]\n", "", ("tests/test_scratch.py", "-k", "failed_grow"), "a buffer the scratch released before a failed larger allocation stays in it"),
    Mutation("engine-finish-not-handed-over", "dgemm/opencl/engine.py", "            try:\n                if handoff is not None:\n                    handoff()\n                done: list = []", "            try:\n                done: list = []", ("tests/test_engine.py", "-k", "before_its_finish"), "a product holds the engine through its finish (the device encode): the next product waits"),
    Mutation("engine-finish-buffer-unguarded", "dgemm/opencl/engine.py", "            self._downloads[slot] = read\n", "", ("tests/test_engine.py", "-k", "before_its_finish"), "the product after next reuses a result buffer a finish still reads"),
    Mutation("engine-release-under-finish", "dgemm/opencl/engine.py", "            if not wait and not all(d.done() for d in pending):\n                return False\n", "", ("tests/test_engine.py", "-k", "before_its_finish"), "release(wait=False) frees the result buffers under a finish still running"),
    Mutation("encode-device-bytes-uncounted", "dgemm/worker/encoding.py", 'fastpaths.codec("device_encoded_bytes", n * len(found.pieces))', 'fastpaths.codec("device_encoded_bytes", 0)', (TE, "-k", "zstd_outputs"), "bytes encoded on the device are not counted"),
    Mutation("encode-checksum-taken", "dgemm/storage/encoded.py", ' or getattr(step.codec, "checksum", False):', ":", (TE, "-k", "other_output_codecs or chunks_of"), "a zstd output with a checksum gets frames without one from the device"),
    Mutation("encode-cut-chunk-taken", "dgemm/storage/encoded.py", "                return None     # a part of a chunk", "                pass     # a part of a chunk", (TE, "-k", "chunks_of"), "a block that cuts a chunk is encoded as whole chunks (the chunk's other part lost)"),
    Mutation("encode-local-keys-unprefixed", "dgemm/storage/encoded.py", "chunks._write_file(src.file(piece.key), frame)", 'chunks._write_file(src.root + "/" + piece.key, frame)', (TE, "-k", "group"), "an output inside a group gets its chunk files at the store's root"),
    Mutation("encode-s3-through-set", "dgemm/storage/encoded.py", "    if remote.put_many(array.store, items) is None:", "    if True:", (TE, "-k", "s3_output"), "S3 frames written one store.set at a time through zarr, not in a batch of PUTs"),
    Mutation("encode-marker-before-block", "dgemm/worker/tasks.py", _WRITE_THEN_MARK, _MARK_THEN_WRITE, (TE, "-k", "resume"), "the store task marks a device-encoded block done before writing its frames"),
    Mutation("encode-frames-misassigned", "dgemm/storage/encoded.py", "return [view[e - n:e] for e, n in zip(ends, self.sizes)]", "return [view[e - n:e] for e, n in zip(ends, self.sizes)][::-1]", (TE, "-k", "engine_hands_back"), "each chunk gets another chunk's frame"),
    Mutation("encode-no-room-fails-the-block", "dgemm/worker/encoding.py", "        except DeviceMemoryError:\n            job.exception()", "        except ZeroDivisionError:\n            job.exception()", (TE, "-k", "no_room"), "a block whose encoder buffers do not fit on the device fails instead of coming down"),
    Mutation("encode-no-room-in-job-fails-the-block", "dgemm/worker/encoding.py", "        except DeviceMemoryError:   # the copy comes down as values", "        except ZeroDivisionError:   # the copy comes down as values", (TE, "-k", "no_room"), "a block whose frames do not fit beside its copy fails instead of coming down"),
    Mutation("host-shared-every-block", "dgemm/client/graph.py", "if isinstance(ref, ZarrBlock) and shared.get(ref.key(), 1) > 1:", "if isinstance(ref, ZarrBlock) and shared.get(ref.key(), 1) >= 1:", ("tests/test_graph.py", "-k", "marked_shared"), "blocks read by workers of different hosts (or one worker) are marked for the host cache"),
    Mutation("host-cache-every-block", "dgemm/storage/hostcache.py", " or not isinstance(ref, ZarrBlock) or not ref.host_shared:", " or not isinstance(ref, ZarrBlock):", ("tests/test_hostcache.py", "-k", "reads_through"), "every Zarr block goes through the host cache, shared with another worker or not"),
    Mutation("host-cache-waiter-polls", "dgemm/storage/hostcache.py", "            _wait_released(lock, deadline - time.monotonic())", "            time.sleep(0.005)", ("tests/test_hostcache.py", "-k", "woken"), "a waiter sleeps and looks again instead of waiting on the claim"),
    Mutation("host-cache-tally-never-trusted", "dgemm/storage/hostcache.py", "            if used is None or used + nbytes > self.limit or not 0 <= now - counted <= RESCAN:", "            if True:", ("tests/test_hostcache.py", "-k", "tally"), "every block shared scans the whole folder under the host's space lock"),
    Mutation("host-cache-tally-not-added-to", "dgemm/storage/hostcache.py", "            os.pwrite(fd, _TALLY.pack(used + nbytes, counted), 0)", "            os.pwrite(fd, _TALLY.pack(used, counted), 0)", ("tests/test_hostcache.py", "-k", "tally"), "the tally misses the blocks reserved since the last scan: the cache grows past its limit"),
    Mutation("host-cache-tally-never-stale", "dgemm/storage/hostcache.py", "            if used is None or used + nbytes > self.limit or not 0 <= now - counted <= RESCAN:", "            if used is None or used + nbytes > self.limit:", ("tests/test_hostcache.py", "-k", "tally or being_written"), "bytes the tally never saw are never counted: the cache stays over its limit"),
    Mutation("failed-product-kernels-in-the-split", "dgemm/worker/state.py", "            run.gemms.clear()\n            raise", "            raise", ("tests/test_worker.py", "-k", "failed_products"), "a failed product's kernels make the busy split's kernel part exceed the kernel seconds"),
    Mutation("gemm-tasks-ignored", "dgemm/client/graph.py", '    return 1 / (config.get("gemm-tasks") or 1)', "    return 1", ("tests/test_cluster.py", "-k", "gemm_tasks_setting"), "gemm-tasks: 2 still runs one GEMM task at a time per device"),
    Mutation("gemm-tasks-unchecked", "dgemm/client/request.py", '        config.get("gemm-tasks")   #', "        pass   #", ("tests/test_cluster.py", "-k", "bad_gemm_tasks"), "a bad gemm-tasks value is found only after the cluster has started"),
    Mutation("download-waited-in-the-lock", "dgemm/opencl/engine.py", "        if handoff is not None:\n            handoff()\n", "", ("tests/test_engine.py", "-k", "lets_the_next"), "the next product waits out this one's download"),
    Mutation("encoder-read-in-the-driver", "dgemm/opencl/codecs/zstd_encode.py", 'record("download", nogil.copied(queue, counts, region_hists))', 'record("download", cl.enqueue_copy(queue, counts, region_hists))', ("tests/test_encoding.py", "-k", "outside_the_driver"), "the encoder's read of the histograms blocks inside the driver, behind the block's last GEMMs"),
    Mutation("decode-check-in-the-driver", "dgemm/opencl/codecs/zstd_decode.py", "                    nogil.wait(kept)", "                    cl.wait_for_events(kept)", ("tests/test_decoding.py", "-k", "outside_the_driver"), "a deferred decode's check waits in clWaitForEvents, which spins a core on NVIDIA"),
    Mutation("download-not-waited", "dgemm/opencl/engine.py", "            nogil.wait(down)\n", "            pass\n", ("tests/test_engine.py", "-k", "two_threads or shapes"), "a result returned before its download is done"),
    Mutation("product-tally-shared-by-threads", "dgemm/opencl/engine.py", "self._mine = threading.local()", "self._mine = __import__('types').SimpleNamespace()", ("tests/test_worker.py", "-k", "at_once"), "overlapping products record each other's flops: the dashboard's series exceeds the totals"),
    Mutation("encode-mode-decodes-on-the-device", "dgemm/opencl/codecs/__init__.py", 'return mode in ("on", "share") or (mode == "encode" and work == "encode")', 'return mode in ("on", "share", "encode")', ("tests/test_encoding.py", "-k", "encode_alone"), "device-codecs encode also decodes the inputs on the device"),
    Mutation("result-buffer-reused-before-its-download", "dgemm/opencl/engine.py", "        free = [last] if last is not None else None", "        free = None", ("tests/test_engine.py", "-k", "still_coming_down"), "the next product's unpadding overwrites a result still coming down"),
    Mutation("host-cache-wait-unbounded", "dgemm/storage/hostcache.py", "    return released.wait(max(timeout, 0.0))", "    return released.wait()", ("tests/test_hostcache.py", "-k", "never_finishes"), "a waiter waits for a hung claimer for ever"),
    Mutation("sharing-off-in-one-process", "dgemm/worker/tasks.py", "    elif scope is not None and state.siblings():", "    elif False:", ("tests/test_siblings.py", "-k", "decodes_each"), "two devices of one process each decode the blocks both read"),
    Mutation("sharing-process-counters-per-worker", "dgemm/worker/state.py", "        if not self._reports_process():", "        if False:", ("tests/test_siblings.py", "-k", "decodes_each"), "each worker of a process reports the process's chunk counters: their sum counts them twice"),
    Mutation("sharing-readers-decode-again", "dgemm/storage/sharing.py", "        if data is None:              # not kept", "        if True:              # not kept", ("tests/test_sharing.py",), "the other readers decode a block again instead of copying the first one's"),
    Mutation("sharing-waiter-does-not-wait", "dgemm/storage/sharing.py", "        if not entry.ready.wait(WAIT):", "        if not entry.ready.is_set():", ("tests/test_sharing.py", "-k", "waits"), "a reader arriving during the decode decodes the block again"),
    Mutation("sharing-last-reader-keeps-it", "dgemm/storage/sharing.py", "            if entry.left <= 0 and", "            if entry.left < 0 and", ("tests/test_sharing.py", "-k", "freed_by_the_last"), "a block stays on the board after its last reader took it"),
    Mutation("sharing-run-kept-after-its-end", "dgemm/worker/plugin.py", "                sharing.drop(scope if self.runs or any(running) else None)", "                pass", ("tests/test_siblings.py", "-k", "decodes_each"), "a run's shared blocks stay in the process after it ends"),
    Mutation("leading-tasks-not-asked", "dgemm/client/steps.py", "[Delayed(done_key, hlg)] + [Delayed(k, hlg, layer=k[0]) for k in g.leading]", "[Delayed(done_key, hlg)]", ("tests/test_steps.py", "-k", "first_gemm_tasks_first"), "the scheduler sends a worker's GEMM tasks in no order: it starts one of its last first"),
    Mutation("leading-one-task", "dgemm/client/graph.py", "    leading = max(1, round(1 / gpu_share()))", "    leading = 1", ("tests/test_steps.py", "-k", "first_gemm_tasks_first"), "with gemm-tasks 2, only a worker's first task is sent first"),
    Mutation("encoder-threads-outlive-device", "dgemm/worker/encoding.py", "        weakref.finalize(device, self._pool.shutdown, wait=False)     # (its threads end with the device)\n", "", ("tests/test_encoding.py", "-k", "end_with_it"), "a device's encoder threads stay idle after the device is gone"),
    Mutation("nogil-release-not-retained", "dgemm/opencl/nogil.py", "        if ptr and lib.clRetainMemObject(ptr) != 0:\n            ptr = None\n", "", ("tests/test_nogil.py",), "pyopencl's release frees the buffer with Python's lock held, and the foreign release frees it again"),
    Mutation("nogil-release-held-skipped", "dgemm/opencl/nogil.py", "        release_held()\n", "        pass\n", ("tests/test_nogil.py",), "pyopencl's object is never marked released: it frees the buffer again when collected"),
    Mutation("nogil-marker-by-pyopencl", "dgemm/opencl/nogil.py", "    if lib is None:\n        return cl.enqueue_marker(queue)", "    if True:\n        return cl.enqueue_marker(queue)", ("tests/test_nogil.py", "-k", "marker"), "markers enqueued with Python's lock held (NVIDIA's driver may wait in them)"),
    Mutation("nogil-kernel-by-pyopencl", "dgemm/opencl/nogil.py", "        if kw:      # (an offset, pyopencl's flags: its own launch)", "        if True:      # (an offset, pyopencl's flags: its own launch)", ("tests/test_nogil.py", "-k", "kernel"), "kernels launched with Python's lock held (NVIDIA's driver may wait in a launch)"),
    Mutation("nogil-kernel-waits-for-nothing", "dgemm/opencl/nogil.py", "    waits = [e.int_ptr for e in (wait_for or ()) if e is not None]", "    waits = []", ("tests/test_nogil.py", "-k", "kernel"), "a kernel launched without the lock runs before what it was to wait for"),
    Mutation("nogil-wait-unflushed", "dgemm/opencl/nogil.py", "        if queue.value:     # (a user event has none)\n            _check(lib.clFlush(queue.value), \"clFlush\")\n", "", ("tests/test_nogil.py", "-k", "copied or wait"), "a wait polls a command its queue never submitted (NVIDIA: it never completes)"),
    Mutation("nogil-wait-returns-at-once", "dgemm/opencl/nogil.py", "            if status.value <= 0:\n                break", "            if True:\n                break", ("tests/test_nogil.py", "-k", "copied or wait"), "a wait returns before its command has run (a reader refills staging memory the copy still reads)"),
    Mutation("nogil-wait-hides-failure", "dgemm/opencl/nogil.py", "        _check(min(status.value, 0), \"a command waited for\")", "        pass", ("tests/test_nogil.py", "-k", "failed"), "a failed command's wait returns as if it had run"),
    Mutation("nogil-copied-unwaited", "dgemm/opencl/nogil.py", "    event = cl.enqueue_copy(queue, dest, src, is_blocking=False, **kw)\n    wait(event)", "    event = cl.enqueue_copy(queue, dest, src, is_blocking=False, **kw)", ("tests/test_nogil.py", "-k", "copied"), "an upload returns before it has copied its staging memory"),
    Mutation("packed-frames-unaligned", "dgemm/storage/source.py", "            start, pos = pos, (pos + n + align - 1) // align * align", "            start, pos = pos, pos + n", ("tests/test_source.py",), "a frame packed at an unaligned start (the decode kernels' wide reads assume 16-byte alignment)"),
    Mutation("packed-frames-overrun", "dgemm/storage/source.py", "            if pos + n > host.nbytes:\n                return None", "            if False:\n                return None", ("tests/test_source.py",), "a frame past the staging's room is cut short instead of read apart"),
    Mutation("device-buffer-release-held", "dgemm/opencl/device.py", "                nogil.release(self, super().release)", "                super().release()", ("tests/test_nogil.py", "-k", "device_buffer"), "a device buffer's release made with Python's lock held (NVIDIA's driver waits in it for the device)"),
    Mutation("engine-freed-ignored", "dgemm/opencl/engine.py", "                read.set_result(freed[0] if freed else None)", "                read.set_result(None)", ("tests/test_encoding.py", "-k", "written_again_only_after"), "the product after next writes a result buffer before the encoder has copied it"),
    Mutation("finish-no-copy-wait", "dgemm/worker/encoding.py", "            event = copied.result()\n", "            event = None\n", ("tests/test_encoding.py", "-k", "written_again_only_after or no_room"), "the product goes on before the encoder thread has enqueued its copy of the block"),
    Mutation("store-pending-unresolved", "dgemm/worker/tasks.py", "    if isinstance(block, encoding.PendingBlock):    # (its chunks being encoded on the device still, maybe)\n        block = block.result()\n", "", ("tests/test_encoding.py", "-k", "test_matmul_encodes_zstd_outputs_on_the_device"), "a store task writes a block still being encoded as values"),
    Mutation("encoders-never-release", "dgemm/worker/encoding.py", "        if last and device is not None:\n            device.encode_scratch.release()\n", "", ("tests/test_encoding.py", "-k", "still_encoded_at_a_runs_end"), "the encoder's buffers stay after a run whose last blocks were still being encoded at its end"),
    Mutation("pending-pickles-its-future", "dgemm/worker/encoding.py", "    def __reduce__(self):\n        return _as_it_is, (self.result(),)\n", "", ("tests/test_encoding.py", "-k", "pickles_as"), "a pending block moved or spilled pickles its future (which fails) instead of its frames"),
    Mutation("engine-returns-after-encode", "dgemm/worker/encoding.py", "        return PendingBlock((rows, cols), job, rows * cols * found.dtype.itemsize), 0, event", "        job.result()\n        return PendingBlock((rows, cols), job, rows * cols * found.dtype.itemsize), 0, event", ("tests/test_encoding.py", "-k", "returns_before"), "the product waits for its block's encode (the GEMMs wait out each encode again)"),
    Mutation("share-waits-for-a-slot", "dgemm/worker/decoding.py", "        with device.scratch.slot(wait=False) as held:", "        with device.scratch.slot() as held:", (T28, "-k", "share_leaves"), "device-codecs share: a reader waits for a decode slot instead of leaving the block to the host"),
    Mutation("share-no-check-before-buffers", "dgemm/opencl/engine.py", "        if getattr(ref, \"declines\", None) is not None and ref.declines(self.device):", "        if False:", (T28, "-k", "share_in_the_engine"), "device-codecs share: the engine allocates a declined block's device buffers before the decline"),
    Mutation("share-is-on", "dgemm/opencl/codecs/__init__.py", "    return mode == \"share\"", "    return False", (T28, "-k", "workers_slots_are_busy"), "device-codecs share decodes every block on the device, waiting for slots"),
    Mutation("tasks-share-not-passed", "dgemm/worker/tasks.py", "share, only = decoding.shared(state.device), decoding.only(state.device)", "share, only = False, decoding.only(state.device)", (T28, "-k", "workers_slots_are_busy"), "the workers' blocks never learn of device-codecs share: their readers wait for busy slots"),
    Mutation("share-decodes-inputs-on-host", "dgemm/opencl/codecs/__init__.py", 'return mode in ("on", "share") or (mode == "encode" and work == "encode")', 'return mode == "on" or (mode in ("encode", "share") and work == "encode")', (T28, "-k", "decodes_each_chunk_once"), "device-codecs share decodes every input on the host (as encode)"),
    Mutation("slot-failed-call-raises", "dgemm/opencl/scratch.py", "    except (cl.Error, RuntimeError):\n        pass\n", "    except ZeroDivisionError:\n        pass\n", ("tests/test_scratch.py", "-k", "last_call_failed"), "a slot whose last call failed raises at its next holder and is lost (the room shrinks)"),
    Mutation("slot-nowait-takes-one-in-flight", "dgemm/opencl/scratch.py", "                key = next((k for k in self._free if _ran(self._busy.get(k))), None)", "                key = next(iter(self._free), None)", ("tests/test_scratch.py", "-k", "without_waiting"), "slot(wait=False) takes a slot whose last call is still in flight (and waits for it)"),
    Mutation("slot-nowait-leaks-room", "dgemm/opencl/scratch.py", "        if key is None:     # (not waiting) every free slot's last call still in flight\n            self._room.release()\n", "        if key is None:     # (not waiting) every free slot's last call still in flight\n", ("tests/test_scratch.py", "-k", "without_waiting"), "a refused slot(wait=False) keeps its place in the room: the slots run out"),
    # -- the slots' buffers made as large as their names have been (issue 28, twenty-seventh session) -----------
    Mutation("scratch-sizes-forgotten", "dgemm/opencl/scratch.py",
             "                sizes[what] = max(sizes.get(what, 0), fresh.size)", "                pass",
             ("tests/test_scratch.py", "-k", "as_large"), "a slot's new buffer made as asked, grown again in each run"),
    Mutation("scratch-sizes-past-budget", "dgemm/opencl/scratch.py",
             "        if sum(max(held.get(n, 0), sizes.get(n, 0)) for n in held.keys() | sizes.keys()) > budget:",
             "        if sum(held.values()) > budget:", ("tests/test_scratch.py", "-k", "all_of_them"),
             "a name made large where the names taken after it then pass the slot's budget (a helper's review)"),
    Mutation("scratch-sizes-one-table", "dgemm/opencl/scratch.py", "        sizes = self._sizes.get(budget)\n",
             "        sizes = next(iter(self._sizes.values()), None)\n", ("tests/test_scratch.py", "-k", "as_large"),
             "the sizes of blocks of another kind (float64's for float32's) taken"),
    Mutation("scratch-sizes-for-threads", "dgemm/opencl/scratch.py",
             "            if key[0] < 0 and budget:      # a slot's:", "            if budget:      # a slot's:",
             ("tests/test_scratch.py", "-k", "as_asked"), "a reader thread's own buffers (no budget counts them) made large"),
    Mutation("scratch-sizes-short-no-retry", "dgemm/opencl/scratch.py",
             "            fresh = self._device.buffer(asked, what)   # (the device short", "            raise  # (",
             ("tests/test_scratch.py", "-k", "short_of_device"), "a slot refused the larger size fails its call"),
    Mutation("size-slots-whole-room", "dgemm/worker/decoding.py", "    device.scratch.budget = slot_bytes(refs, share)",
             "    device.scratch.budget = device_bytes(refs, share)", ("tests/test_decoding.py", "-k", "slots_room"),
             "each decode slot told it may hold the room of all of them"),
    Mutation("encoder-release-kept-for-a-later-run", "dgemm/worker/encoding.py",
             "            self._release = False\n        try:\n            return self._pool.submit(",
             "        try:\n            return self._pool.submit(",
             ("tests/test_encoding.py", "-k", "later_runs"),
             "the encoder's buffers released in the middle of a run, where its encodes in flight run out"),
    Mutation("encoded-frames-written-alone", "dgemm/worker/tasks.py",
             "        encoded.write(block, threads=encode_threads())", "        encoded.write(block)",
             ("tests/test_encoding.py", "-k", "last_block"),
             "a run's last block's frames written one after another on the store task's thread (the run waits for them)"),
    Mutation("encoded-write-threads-ignored", "dgemm/storage/encoded.py",
             "        threads_mod.shared(put, list(zip(found.pieces, frames)), threads)",
             "        threads_mod.shared(put, list(zip(found.pieces, frames)), 1)",
             ("tests/test_encoding.py", "-k", "helpers or helped"), "the threads asked for the frames' writes not used"),
    Mutation("auto-shares-on-gpus", "dgemm/opencl/codecs/__init__.py", 'AUTO: dict = {"GPU": "on"}',
             'AUTO: dict = {"GPU": "share"}', ("tests/test_cli.py", "-k", "plan_counts"),
             "auto back to share on GPUs, which this session's runs put behind on"),
    Mutation("spares-handed-out-before-their-kernel-ran", "dgemm/opencl/spares.py",
             "            if event is not self.UNREAD and nogil.status(event) > 0:", "            if False:",
             ("tests/test_spares.py",), "a source buffer taken again while the padding kernel may still read it"),
    Mutation("spares-kept-past-the-run", "dgemm/opencl/device.py", "        self.spares.release()\n", "",
             ("tests/test_spares.py", "-k", "trim"), "the blocks' free source buffers outlive the run (memory not idle)"),
    Mutation("spares-not-poisoned", "dgemm/opencl/spares.py",
             "            return poison.fill(self._device.transfer_queue, buf)    # (as Device.buffer",
             "            return buf    # (as Device.buffer",
             ("tests/test_spares.py", "-k", "poisoned"), "a reused source buffer keeps the last block's values in tests"),
    Mutation("spares-bytes-unbounded", "dgemm/opencl/spares.py", " or self._bytes() > self._kept_bytes):", "):",
             ("tests/test_spares.py", "-k", "oldest"), "the blocks' free source buffers kept past their share of the device"),
    Mutation("device-buffer-spares-kept-when-short", "dgemm/opencl/device.py",
             "            if not self.spares.release():   # (the blocks'", "            if True:   # (the blocks'",
             ("tests/test_spares.py", "-k", "cannot_make"), "a buffer the device has no room for fails while spares hold it"),
    Mutation("nogil-status-wrong", "dgemm/opencl/nogil.py", "    return out.value\n", "    return 0\n",
             ("tests/test_nogil.py", "-k", "status"), "an event's status read as ran whatever it is"),
    Mutation("declined-source-buffer-released", "dgemm/opencl/engine.py",
             "                padded = self.device.spares.UNREAD     # declined", "                padded = None     # declined",
             ("tests/test_decoding.py", "-k", "declined_after"),
             "a block declined after its source buffer was taken releases it beside the GEMMs"),
    Mutation("decode-source-buffers-released", "dgemm/opencl/engine.py",
             "                self.device.spares.give(raw, padded)    # free once", "                raw.release()    # free once",
             ("tests/test_decoding.py", "-k", "engine_stages"),
             "a device decode's source buffer released beside the GEMMs again (NVIDIA's driver waits in it)"),
    Mutation("engine-source-buffers-released", "dgemm/opencl/engine.py",
             "            self.device.spares.give(raw, ev)    # (a failed upload's", "            raw.release()    # (",
             ("tests/test_engine.py", "-k", "reuse_the_source"),
             "an upload's source buffer released beside the GEMMs again (NVIDIA's driver waits in it)"),
    Mutation("decode-slots-budget-unsaid", "dgemm/worker/tasks.py",
             "        decoding.size_slots(state.device, a_refs + b_refs, memory)\n", "",
             ("tests/test_memory.py", "-k", "with_device_codecs"), "the decode slots never told what they may hold"),
    Mutation("encode-slots-budget-unsaid", "dgemm/worker/tasks.py",
             "        state.device.encode_scratch.budget = encoding.device_bytes(found)", "        pass",
             ("tests/test_memory.py", "-k", "with_device_codecs"), "the encode slots never told what they may hold"),
    Mutation("gpu-target-4096", "dgemm/sizes.py", "GPU_TARGET = (8192, 8192, 4096)", "GPU_TARGET = 4096", ("tests/test_plan.py", "-k", "by_default"), "GPU products back to 4096-cube blocks, whose GEMMs are shorter than their host work"),
    Mutation("small-gpu-large-blocks", "dgemm/sizes.py", "    return 4096 if memory is not None and memory < LARGE_BLOCKS_MEMORY else GPU_TARGET", "    return GPU_TARGET", ("tests/test_plan.py", "-k", "by_default"), "a GPU under 24 GiB a worker gets 8192-wide blocks (and staging) too"),
    Mutation("plan-never-cuts-chunks", "dgemm/client/plan.py", "            cut.add(d)\n", "            pass\n", ("tests/test_plan.py", "-k", "cut_the_chunks"), "a plan that only fits by cutting chunks halves its target forever"),
    Mutation("kernels-read-as-attributes", "dgemm/opencl/device.py",
             '        self.pad_zeros, self.unpad, self.transpose_pad = (cl.Kernel(program, n) for n in\n'
             '                                                          ("pad_zeros", "unpad", "transpose_pad"))\n',
             "        self.pad_zeros, self.unpad, self.transpose_pad = "
             "program.pad_zeros, program.unpad, program.transpose_pad\n",
             ("tests/test_device.py", "-k", "retrieval"),
             "the padding kernels read as the program's attributes again (pyopencl's RepeatedKernelRetrieval on GPUs)"),
    Mutation("switch-interval-ignored", "dgemm/worker/plugin.py", "                sys.setswitchinterval(interval)\n", "                pass\n", ("tests/test_worker.py", "-k", "switch_interval"), "the switch-interval setting is read and not applied"),
]

# -- the copy ----------------------------------------------------------------------------
def copy_repository(dest: Path) -> int:
    """Copy the tracked and the untracked, not ignored files of the working tree to ``dest``; returns how many."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    count = 0
    for name in filter(None, names):
        src = ROOT / name
        if not src.is_file():       # tracked but deleted in the working tree
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name, follow_symlinks=False)
        count += 1
    return count


def environment(copy: Path) -> dict:
    """The test processes' environment: the copy's dgemm first, no bytecode written (a mutation and its
    undoing may share a size and a second, and Python would then run stale bytecode)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(copy), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_from(copy: Path, env: dict) -> None:
    where = subprocess.run([sys.executable, "-c", "import dgemm; print(dgemm.__file__)"], cwd=copy, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"the copy's tests would import dgemm from {where}, not from the copy {copy}")


# -- running ----------------------------------------------------------------------------
def run_tests(copy: Path, env: dict, tests: tuple[str, ...], timeout: float) -> dict:
    """Run ``tests`` in the copy; returns ``rc``, ``counts``, ``failed`` (first failing test), ``seconds``, ``tail``."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--timeout", "600", *tests]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = None, e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    seconds = time.perf_counter() - t0
    failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", out, re.M)   # test ids may hold spaces
    if rc is not None and rc < 0:       # the test process died of a signal: the mutation made a kernel fault
        where = re.findall(r'File "[^"]*?(tests/[^"]+)", line \d+ in (test_\w+)', out)
        failed = [f"crashed (signal {-rc})" + (f" in {where[-1][0]}::{where[-1][1]}" if where else "")]
    counts = {}
    summary = [line for line in out.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    if summary:
        for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)", summary[-1]):
            counts[what.rstrip("s") if what.startswith("error") else what] = int(n)
    return {"rc": rc, "counts": counts, "failed": failed[0] if failed else None, "seconds": round(seconds, 1),
            "tail": out.strip().splitlines()[-15:]}


def outcome(result: dict) -> str:
    rc, counts = result["rc"], result["counts"]
    if rc is None:
        return "timeout"
    if rc == 1 or (rc < 0 and result.get("failed")):    # a failed test, or a crash (a faulting kernel) in one
        return "caught"
    if rc == 0:
        return "SURVIVED" if counts.get("passed") or counts.get("xpassed") else "not run"
    if rc == 5:
        return "no tests selected"
    return "error"


def anchor_problem(copy: Path, m: Mutation) -> str | None:
    """Why ``m`` cannot be put into the copy (its file or anchor is not there as written), or None."""
    path = copy / m.file
    if not path.is_file():
        return "file not found"
    n = path.read_text().count(m.original)
    return None if n == 1 else "anchor not found" if n == 0 else f"anchor ambiguous ({n} matches)"


def apply(copy: Path, m: Mutation) -> str:
    """Put ``m`` into the copy (checked by :func:`anchor_problem` first); returns the file's original text."""
    path = copy / m.file
    text = path.read_text()
    path.write_text(text.replace(m.original, m.replacement, 1))
    return text


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutations to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutations and their tests, run nothing")
    ap.add_argument("--no-baseline", action="store_true", help="do not first run each selection unmutated")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run (default 1800)")
    ap.add_argument("--out", type=Path, help="the JSON record (default bench/results/<date>-mutations[-partial].json)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    args = ap.parse_args(argv)

    known = {m.name: m for m in MUTATIONS}
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:32} {m.file:28} {' '.join(m.tests)}\n{'':32} {m.what}")
        return 0
    unknown = [n for n in args.names if n not in known]
    if unknown:
        ap.error(f"unknown mutation(s) {', '.join(unknown)}; --list shows them")
    chosen = [known[n] for n in args.names] or MUTATIONS

    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="dgemm-mutations-"))
    copy = tmp / "repo"
    records = []
    try:
        print(f"copying the working tree to {copy} ({copy_repository(copy)} files)", flush=True)
        env = environment(copy)
        check_imports_from(copy, env)
        baseline = {}
        for m in chosen:
            problem = anchor_problem(copy, m)
            record = {"name": m.name, "file": m.file, "what": m.what, "tests": " ".join(m.tests)}
            if problem:
                record.update(outcome=problem, caught=False, failed_test=None, seconds=0.0)
            else:
                if not args.no_baseline and m.tests not in baseline:
                    base = run_tests(copy, env, m.tests, args.timeout)
                    baseline[m.tests] = base
                    print(f"  baseline of {' '.join(m.tests)}: {outcome(base).replace('SURVIVED', 'passed')} "
                          f"{base['counts']} in {base['seconds']:.0f} s", flush=True)
                base = baseline.get(m.tests)
                if base is not None and outcome(base) == "caught":
                    record.update(outcome="baseline failed", caught=False, failed_test=base["failed"],
                                  seconds=0.0, tail=base["tail"])
                else:
                    original = apply(copy, m)
                    try:
                        result = run_tests(copy, env, m.tests, args.timeout)
                    finally:
                        (copy / m.file).write_text(original)
                    out = outcome(result)
                    record.update(outcome=out, caught=out == "caught", failed_test=result["failed"],
                                  seconds=result["seconds"], counts=result["counts"])
                    if out != "caught":
                        record["tail"] = result["tail"]
            records.append(record)
            print(f"{m.name:32} {record['outcome']:18} {record['seconds']:7.1f} s  {record['failed_test'] or ''}",
                  flush=True)
    finally:
        if args.keep:
            print(f"the copy is kept in {copy}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    date = datetime.date.today().isoformat()
    full = len(chosen) == len(MUTATIONS)
    path = args.out or ROOT / "bench" / "results" / f"{date}-mutations{'' if full else '-partial'}.json"
    ran = [r for r in records if r["outcome"] in ("caught", "SURVIVED")]
    summary = {"benchmark": "mutations", "date": date, "commit": git("rev-parse", "HEAD"),
               "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
               "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
               "cpus": os.cpu_count(), "baseline": not args.no_baseline, "complete": full,
               "caught": sum(r["caught"] for r in records), "ran": len(ran), "total": len(records),
               "survivors": [r["name"] for r in records if r["outcome"] == "SURVIVED"],
               "not_checked": {r["name"]: r["outcome"] for r in records if r["outcome"] not in ("caught", "SURVIVED")},
               "seconds": round(sum(r["seconds"] for r in records), 1),   # the mutated runs
               "wall_seconds": round(time.perf_counter() - started, 1),    # with the copy and baselines
               "mutations": records}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{summary['caught']} of {len(records)} caught; survivors: {summary['survivors'] or 'none'}; "
          f"not checked: {summary['not_checked'] or 'none'}; record: {path}")
    unchecked = [n for n, why in summary["not_checked"].items() if why != "not run"]
    return 1 if summary["survivors"] else 2 if unchecked else 0


if __name__ == "__main__":
    sys.exit(main())

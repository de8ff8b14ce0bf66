"""Names the client, the scheduler and the workers share: plugins, the worker metric, counters, task prefixes.

A leaf module (it imports no other dgemm module), so that each process's
code can agree on these names without importing the others' code.

>>> TASK_SECONDS["store_seconds"] == STORE
True
>>> [f"dgemm-{kind}" for kind in KINDS] == [GEMM, REDUCE, STORE, DONE]
True
"""
from __future__ import annotations

# Plugins, by the name they are registered under.
WORKER_PLUGIN = "dgemm"                 # dgemm.worker.DgemmPlugin, in Worker.plugins
DASHBOARD_PLUGIN = "dgemm-dashboard"    # dgemm.scheduler.dashboard.DgemmDashboard, in Scheduler.plugins
PLACEMENT_PLUGIN = "dgemm-placement"    # dgemm.scheduler.placement.PlacementPlugin, in Scheduler.plugins

# Key of the worker metric (a worker's device snapshot) in the scheduler's WorkerState.metrics.
WORKER_METRIC = "dgemm"

# Prefixes of the task keys of one matmul's graph (dgemm.client.graph), followed by its token.
GEMM = "dgemm-gemm"        # one block product on a device
REDUCE = "dgemm-reduce"    # adds the k segments of a C block
STORE = "dgemm-store"      # writes one C block to the output store
DONE = "dgemm-done"        # depends on every store
LOAD = "dgemm-load"        # an input held by dask or numpy (dgemm-load-a, dgemm-load-b, dgemm-load-c)
# The kinds of task whose progress the dashboard follows (a key starts with f"dgemm-{kind}-").
KINDS = ("gemm", "reduce", "store", "done")

# Counters of one device, summed over its engines (one per dtype): what a
# worker's snapshot reports, the dashboard shows and the Prometheus series count.
COUNTERS = ("flops", "bytes_up", "bytes_down", "kernel_seconds", "busy_seconds", "blocks",
            "transfer_seconds", "read_wait_seconds", "bytes_read", "read_seconds", "upload_seconds",
            "download_seconds", "host_cache_hits", "host_cache_misses", "host_cache_bytes_served",
            "host_cache_bytes_decoded")
# kept in Stats.extra, the others are Stats fields (host_cache_*: dgemm.storage.hostcache, where it is on)
EXTRA = ("transfer_seconds", "read_wait_seconds", "host_cache_hits", "host_cache_misses",
         "host_cache_bytes_served", "host_cache_bytes_decoded")
# How a process read and wrote chunks, by path (dgemm.storage.fastpaths): its snapshot's keys are
# storage_<path> (a count) and storage_<path>_bytes, in a worker's snapshot beside the counters above.
STORAGE_PATHS = ("read_direct", "read_decoded_into", "read_copied", "read_fill", "read_zarr",
                 "write_direct", "write_batched", "write_zarr", "s3_put_batch", "write_helped")
# Bytes of chunks decoded and encoded, by where (dgemm.storage.fastpaths counts them per process; the
# device's from dgemm.worker.decoding): keys of a worker's snapshot beside the counters above.
CODEC_COUNTERS = ("device_decoded_bytes", "host_decoded_bytes", "device_encoded_bytes", "host_encoded_bytes")
# Seconds of the other dgemm tasks (from the worker's Fine Performance Metrics), by the task prefix they sum.
TASK_SECONDS = {"store_seconds": STORE, "load_seconds": LOAD, "reduce_seconds": REDUCE}

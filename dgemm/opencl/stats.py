"""An engine's running figures (:class:`Stats`), apart from the engine that adds to them."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    """What an engine has done: the figures the dashboard and benchmarks read.

    Seconds named ``read``/``upload`` are summed over the threads that read
    and upload in the background, so they can exceed the wall time;
    ``wait_seconds`` is what the product itself spent waiting for its
    inputs, the part of reading and uploading that was not hidden.
    """

    flops: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    bytes_read: int = 0
    reads: int = 0          # blocks read from their store (or handed over as arrays): bytes_read's count
    kernel_seconds: float = 0.0
    read_seconds: float = 0.0
    upload_seconds: float = 0.0
    download_seconds: float = 0.0
    wait_seconds: float = 0.0
    blocks: int = 0
    busy_seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def seconds(event) -> float:
    """How long a finished command ran on the device (from the queue's profiling)."""
    return (event.profile.end - event.profile.start) * 1e-9

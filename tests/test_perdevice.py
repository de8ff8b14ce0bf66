"""dgemm.worker.perdevice: one object per device, made once, gone with its device."""
from __future__ import annotations

import gc
import threading

from dgemm.worker.perdevice import PerDevice


class _Device:
    """A stand-in for a device: anything a weak reference can point at."""


def test_one_object_per_device_made_on_first_use_and_gone_with_it():
    made = []
    registry = PerDevice(lambda device: made.append(id(device)) or object())
    first, second = _Device(), _Device()
    assert registry.get(first) is None and made == []
    a = registry(first)
    assert registry(first) is a and registry.get(first) is a and made == [id(first)]
    assert registry(second) is not a and made == [id(first), id(second)]
    del first
    gc.collect()
    assert len(registry._found) == 1, "an entry outlived its device"


def test_threads_asking_at_once_share_one_object():
    registry = PerDevice(lambda device: object())
    device, got, start = _Device(), [], threading.Barrier(8)

    def ask():
        start.wait(10)
        got.append(registry(device))
    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 8 and len({id(g) for g in got}) == 1


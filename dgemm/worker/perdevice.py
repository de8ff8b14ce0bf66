"""One object per device of this worker process, made on first use and gone with the device (weak keys)."""
from __future__ import annotations

import threading
import weakref


class PerDevice:
    """``registry(device)``: the object ``make(device)`` made for ``device`` (made now where there is none)."""

    def __init__(self, make):
        self._make = make
        self._found: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, device):
        with self._lock:
            found = self._found.get(device)
            if found is None:
                found = self._found[device] = self._make(device)
            return found

    def get(self, device):
        """The object made for ``device``, or None (none is made)."""
        with self._lock:
            return self._found.get(device)

"""A small thread-safe LRU cache for immutable stored answers (encoded plans), bounded in
bytes: one plan of a 20,000-GPU cluster is megabytes, so a count bound bounds nothing."""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["LruCache"]


class LruCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: str, value: bytes) -> None:
        """Keep `value`, dropping the least recently used values until all fit; a value
        larger than the whole cache is not kept."""
        if len(value) > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            self.size_bytes += len(value) - (0 if old is None else len(old))
            self._items[key] = value
            while self.size_bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self.size_bytes -= len(dropped)

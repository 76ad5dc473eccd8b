"""A small thread-safe LRU cache for immutable stored answers (encoded plans, a profile
version's points), bounded in bytes: one plan of a 20,000-GPU cluster is megabytes, so a
count bound bounds nothing."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["LruCache"]

V = TypeVar("V")


class LruCache(Generic[V]):
    """`size_of(value)` is a value's size in bytes (its length, for bytes)."""

    def __init__(self, max_bytes: int,
                 size_of: Callable[[V], int] = len) -> None:  # type: ignore[assignment]
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self._size_of = size_of
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, value: V) -> None:
        """Keep `value`, dropping the least recently used values until all fit; a value
        larger than the whole cache is not kept."""
        size = self._size_of(value)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            self.size_bytes += size - (0 if old is None else old[1])
            self._items[key] = (value, size)
            while self.size_bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.size_bytes -= dropped

"""An LRU map bounded by the bytes its values hold, not by their count: one large entry (a
compiled 30k-string enum holds ~220 MB in xgrammar) costs what it costs, and many small ones
stay cheap. Each entry's size is given by the caller; the least recently used entries go until
the total is under the bound again. Not thread safe: its owner uses it from one thread (or under
its own lock).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Optional


class ByteLRU:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.total = 0  # the sum of the entries' sizes, always <= max_bytes after a call returns
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> Optional[Any]:
        """The value (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Keep ``value`` as the most recently used; an entry larger than the whole bound is not kept."""
        self.pop(key)
        self._entries[key] = (value, nbytes)
        self.total += nbytes
        self._evict()

    def pop(self, key: Hashable) -> Optional[Any]:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.total -= entry[1]
        return entry[0]

    def _evict(self) -> None:
        while self.total > self.max_bytes and self._entries:
            _, (_, nbytes) = self._entries.popitem(last=False)
            self.total -= nbytes

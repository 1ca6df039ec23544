"""A directory of KV block entries (layout: entry.py), shared by any number of engine processes.

- Names: ``<block hash hex>-<layout tag>.kv``. A reader opens exactly the name it wants, so
  temporary and foreign files are never read.
- Writes are atomic: the entry is written to a temporary file in the same directory, then
  renamed over its name. A reader sees either no file or a whole one; a writer killed mid-way
  leaves only a temporary file, which eviction removes once it is stale.
- Any failure to read (missing, truncated, corrupt, mismatched, unreadable) is a miss, and any
  failure to write (a full disk) is logged and skipped: the store never fails a request.
- Size bound: least recently used entries (by mtime; a hit touches its file) are deleted when
  the directory's entries exceed ``max_bytes``, down to 90% of it. Only writers evict: each
  scans the directory at its first write and again after writing a sixteenth of the bound, so
  with W writers the directory exceeds the bound by at most about W/16 of it between scans.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Optional

from engine.kv_transfer.entry import HEADER_SIZE, EntryLayout, decode_entry, encode_header

logger = logging.getLogger(__name__)

_SUFFIX = ".kv"
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 60.0  # a temporary file older than this belongs to a writer that died


class BlockStore:
    def __init__(self, path: str, layout: EntryLayout, max_bytes: int, fsync: bool = False) -> None:
        self.path = path
        self.layout = layout
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.entry_size = HEADER_SIZE + layout.payload_size
        self._suffix = f"-{layout.tag}{_SUFFIX}"
        self._written_since_scan = 0
        self._bytes_at_scan: Optional[int] = None  # scanned at the first save: readers never evict
        self._warned = False

    def entry_path(self, block_hash: bytes) -> str:
        return os.path.join(self.path, block_hash.hex() + self._suffix)

    def contains(self, block_hash: bytes) -> bool:
        return os.path.exists(self.entry_path(block_hash))

    def load(self, block_hash: bytes) -> Optional[memoryview]:
        """The payload stored for ``block_hash``, or None (a miss, whatever the reason)."""
        path = self.entry_path(block_hash)
        data = bytearray(self.entry_size + 1)  # one byte more: a longer file is not an entry
        try:
            with open(path, "rb", buffering=0) as f:
                size = _read_full(f, data)
        except OSError:
            return None
        payload = decode_entry(memoryview(data)[:size], self.layout, block_hash)
        if payload is not None:
            self._touch(path)
        return payload

    def touch(self, block_hash: bytes) -> None:
        """Mark an entry as recently used (it will be evicted last)."""
        self._touch(self.entry_path(block_hash))

    def save(self, block_hash: bytes, payload: memoryview) -> None:
        """Publish an entry (atomically replacing any entry of the same name)."""
        path = self.entry_path(block_hash)
        header = encode_header(self.layout, block_hash, payload)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_SUFFIX, dir=self.path)
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(payload)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.rename(tmp, path)
        except OSError as e:
            if tmp is not None:
                _unlink(tmp)
            if not self._warned:
                logger.warning("KV store %s: could not write an entry (%s); going on without it", self.path, e)
                self._warned = True
            return
        self._written_since_scan += self.entry_size
        if (self._bytes_at_scan is None or self._bytes_at_scan + self._written_since_scan > self.max_bytes
                or self._written_since_scan * 16 > self.max_bytes):
            self._bytes_at_scan = self.evict()

    def evict(self) -> int:
        """Delete stale temporary files, then the least recently used entries while the
        directory holds more than ``max_bytes``; returns the bytes of entries that remain."""
        self._written_since_scan = 0
        entries: list[tuple[float, int, str]] = []
        now = time.time()
        try:
            with os.scandir(self.path) as it:
                for e in it:
                    if not e.name.endswith(_SUFFIX):
                        continue  # not ours: never counted, never deleted
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue  # deleted meanwhile by another engine
                    if e.name.startswith(_TMP_PREFIX):
                        if now - st.st_mtime > _STALE_TMP_S:
                            _unlink(e.path)
                        continue
                    entries.append((st.st_mtime, st.st_size, e.path))
        except OSError as e:
            logger.warning("KV store %s: cannot scan (%s)", self.path, e)
            return 0
        total = sum(size for _, size, _ in entries)
        if total > self.max_bytes:
            entries.sort()
            target = self.max_bytes * 9 // 10
            for _, size, path in entries:
                if total <= target:
                    break
                _unlink(path)
                total -= size
        return total

    @staticmethod
    def _touch(path: str) -> None:
        try:
            os.utime(path)
        except OSError:
            pass  # read-only store (a consumer) or evicted meanwhile: recency is a hint only


def _read_full(f, buf: bytearray) -> int:
    """Read until ``buf`` is full or the file ends; returns the bytes read."""
    view, got = memoryview(buf), 0
    while got < len(buf):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

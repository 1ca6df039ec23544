"""A directory of KV block entries (layout: entry.py), shared by the engine processes of one user.

- The directory and every file operation in it go through ``StoreDir`` (store_dir.py): private
  to this user or refused, entries opened without following symlinks or waiting on FIFOs.
- Names: ``<HMAC-SHA256(name key, layout identity || block hash), 128 bits, hex>.kv``, the name
  key derived from the store's secret. A block hash can be computed from a prompt by anyone
  (kv_cache.hash_block is unkeyed, as the prefix cache needs), so a name made from it alone
  would tell whoever can list the directory which prompts were sent, and tell a forger where to
  write; keyed, a name says nothing without the secret. A reader opens exactly the name it
  wants, so temporary and foreign files are never read.
- Writes are atomic: the entry is written to a private temporary file in the same directory,
  then renamed over its name. A reader sees either no file or a whole one; a writer killed
  mid-way leaves only a temporary file, which eviction removes once it is stale.
- Any failure to read (missing, truncated, corrupt, forged, mismatched, unreadable, not a regular
  file of ours) is a miss, and any failure to write (a full disk) is logged and skipped: the
  store never fails a request.
- Size bound: least recently used entries (by mtime; a hit touches its file) are deleted when
  the directory's entries exceed ``max_bytes``, down to 90% of it. Only writers evict: each
  scans the directory at its first write and again after writing a sixteenth of the bound, so
  with W writers the directory exceeds the bound by at most about W/16 of it between scans.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from typing import Optional

from engine.kv_transfer.entry import HEADER_SIZE, EntryLayout, decode_entry, encode_header, mac_key
from engine.kv_transfer.store_dir import TMP_PREFIX, StoreDir

logger = logging.getLogger(__name__)

_SUFFIX = ".kv"
_STALE_TMP_S = 60.0  # a temporary file older than this belongs to a writer that died


class BlockStore:
    """Entries of one layout in a store directory (created or checked here: StoreDirError)."""

    def __init__(self, path: str, layout: EntryLayout, max_bytes: int, fsync: bool = False) -> None:
        self.dir = StoreDir(path)
        self.path = path
        self.layout = layout
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.entry_size = HEADER_SIZE + layout.payload_size
        self._mac_key = mac_key(self.dir.secret)
        self._name_key = hmac.digest(self.dir.secret, b"ringllm kv entry names", "sha256")
        self._written_since_scan = 0
        self._bytes_at_scan: Optional[int] = None  # scanned at the first save: readers never evict
        self._warned = False

    def close(self) -> None:
        self.dir.close()

    def entry_name(self, block_hash: bytes) -> str:
        digest = hmac.digest(self._name_key, self.layout.identity + b"\0" + block_hash, "sha256")
        return digest[:16].hex() + _SUFFIX

    def entry_path(self, block_hash: bytes) -> str:
        """Where the entry of ``block_hash`` is (for people and tests: the store itself works
        relative to the directory it opened)."""
        return os.path.join(self.path, self.entry_name(block_hash))

    def contains(self, block_hash: bytes) -> bool:
        return self.dir.is_file(self.entry_name(block_hash))

    def load(self, block_hash: bytes) -> Optional[memoryview]:
        """The payload stored for ``block_hash``, or None (a miss, whatever the reason)."""
        name = self.entry_name(block_hash)
        data = self.dir.read_file(name, self.entry_size)
        if data is None:
            return None
        payload = decode_entry(memoryview(data)[: self.entry_size], self.layout, block_hash, self._mac_key)
        if payload is not None:
            self.dir.touch(name)
        return payload

    def touch(self, block_hash: bytes) -> None:
        """Mark an entry as recently used (it will be evicted last)."""
        self.dir.touch(self.entry_name(block_hash))

    def save(self, block_hash: bytes, payload: memoryview) -> None:
        """Publish an entry (atomically replacing whatever had its name)."""
        header = encode_header(self.layout, block_hash, payload, self._mac_key)
        try:
            self.dir.publish(self.entry_name(block_hash), (header, payload), self.fsync)
        except OSError as e:
            if not self._warned:
                logger.warning("KV store %s: could not write an entry (%s); going on without it", self.path, e)
                self._warned = True
            return
        self._written_since_scan += self.entry_size
        if (
            self._bytes_at_scan is None
            or self._bytes_at_scan + self._written_since_scan > self.max_bytes
            or self._written_since_scan * 16 > self.max_bytes
        ):
            self._bytes_at_scan = self.evict()

    def evict(self) -> int:
        """Delete stale temporary files, then the least recently used entries while the
        directory holds more than ``max_bytes``; returns the bytes of entries that remain.
        Only regular files of ours named like an entry are counted or deleted."""
        self._written_since_scan = 0
        entries: list[tuple[float, int, str]] = []
        now = time.time()
        try:
            for name, st in self.dir.scan(_SUFFIX):
                if name.startswith(TMP_PREFIX):
                    if now - st.st_mtime > _STALE_TMP_S:
                        self.dir.unlink(name)
                    continue
                entries.append((st.st_mtime, st.st_size, name))
        except OSError as e:
            logger.warning("KV store %s: cannot scan (%s)", self.path, e)
            return 0
        total = sum(size for _, size, _ in entries)
        if total > self.max_bytes:
            entries.sort()
            target = self.max_bytes * 9 // 10
            for _, size, name in entries:
                if total <= target:
                    break
                self.dir.unlink(name)
                total -= size
        return total

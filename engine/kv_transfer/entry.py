"""The layout of one KV store entry: one file per full block of KV, drawn once here.

Every engine that shares a store directory reads and writes this layout; an entry is trusted
only when every header field matches what the reader expects and the payload's checksum holds.

```
offset  size  field          (little endian, no implicit padding: _pack_ = 1)
     0     8  magic          b"RLLMKVB\\0"
     8     4  version        ENTRY_VERSION
    12     4  header_size    HEADER_SIZE (96)
    16    16  block_hash     the prefix cache's chained digest of the block (engine/core/kv_cache.py)
    32    16  model_digest   blake2b-128 of the model's identity (EntryLayout.model_id)
    48    12  dtype          the KV cache dtype's name, NUL padded ("float32", "bfloat16", ...)
    60     4  block_size     tokens per block
    64     4  num_layers
    68     4  num_kv_heads
    72     4  head_dim
    76     4  payload_crc32  zlib.crc32 of the payload
    80     8  payload_size   num_layers * block_size * 2 * num_kv_heads * head_dim * itemsize
    88     8  reserved       zero
    96     -  payload        KV as [num_layers][block_size][K | V][num_kv_heads][head_dim] in dtype
                             (one block of the runner's paged cache, layer by layer)
```

A file whose size is not exactly ``HEADER_SIZE + payload_size`` (truncated, or appended to),
whose header differs in any field, or whose payload fails the checksum, is a miss. The
checksum guards against corruption, not against a writer who means harm: a store directory
must be writable only by engines that are trusted with each other's prompts (it is created
mode 0700).
"""
from __future__ import annotations

import ctypes
import hashlib
import zlib
from dataclasses import dataclass
from typing import Optional

MAGIC = b"RLLMKVB\0"
ENTRY_VERSION = 1
DTYPE_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


class EntryHeader(ctypes.LittleEndianStructure):
    _pack_ = 1
    _fields_ = [
        ("magic", ctypes.c_ubyte * 8),
        ("version", ctypes.c_uint32),
        ("header_size", ctypes.c_uint32),
        ("block_hash", ctypes.c_ubyte * 16),
        ("model_digest", ctypes.c_ubyte * 16),
        ("dtype", ctypes.c_ubyte * 12),
        ("block_size", ctypes.c_uint32),
        ("num_layers", ctypes.c_uint32),
        ("num_kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32),
        ("payload_crc32", ctypes.c_uint32),
        ("payload_size", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64),
    ]


HEADER_SIZE = ctypes.sizeof(EntryHeader)
# The offsets of the diagram above, checked as csrc/ring.h checks its own with _Static_assert.
assert HEADER_SIZE == 96
assert (EntryHeader.block_hash.offset, EntryHeader.dtype.offset, EntryHeader.block_size.offset,
        EntryHeader.payload_crc32.offset, EntryHeader.payload_size.offset) == (16, 48, 60, 76, 80)


@dataclass(frozen=True)
class EntryLayout:
    """What an entry must have been written for: the model and the shape of one KV block."""

    model_id: str  # identity of the weights (path, load format, overrides; see shared_storage.py)
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def payload_size(self) -> int:
        return (self.num_layers * self.block_size * 2 * self.num_kv_heads * self.head_dim
                * DTYPE_ITEMSIZE[self.dtype])

    @property
    def model_digest(self) -> bytes:
        return hashlib.blake2b(self.model_id.encode(), digest_size=16).digest()

    @property
    def tag(self) -> str:
        """A short digest of the whole layout, put in file names so that engines with different
        models or geometries can share one directory without overwriting each other's entries."""
        text = f"{self.model_id}|{self.dtype}|{self.block_size}|{self.num_layers}|{self.num_kv_heads}|{self.head_dim}"
        return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()

    def header(self, block_hash: bytes, payload_crc32: int = 0) -> EntryHeader:
        h = EntryHeader()
        h.magic[:] = MAGIC
        h.version, h.header_size = ENTRY_VERSION, HEADER_SIZE
        h.block_hash[:] = block_hash
        h.model_digest[:] = self.model_digest
        h.dtype[:] = self.dtype.encode().ljust(12, b"\0")
        h.block_size, h.num_layers, h.num_kv_heads, h.head_dim = (
            self.block_size, self.num_layers, self.num_kv_heads, self.head_dim)
        h.payload_crc32, h.payload_size = payload_crc32, self.payload_size
        return h


def encode_header(layout: EntryLayout, block_hash: bytes, payload: memoryview) -> bytes:
    if payload.nbytes != layout.payload_size:
        raise ValueError(f"payload of {payload.nbytes} bytes, the layout needs {layout.payload_size}")
    return bytes(layout.header(block_hash, zlib.crc32(payload)))


def decode_entry(data: memoryview, layout: EntryLayout, block_hash: bytes) -> Optional[memoryview]:
    """The payload of ``data`` if it is a sound entry for ``block_hash`` under ``layout``; else None."""
    if len(data) != HEADER_SIZE + layout.payload_size:
        return None
    got = EntryHeader.from_buffer_copy(data, 0)
    want = layout.header(block_hash, got.payload_crc32)
    if bytes(got) != bytes(want):  # magic, version, hash, model, dtype, geometry, size, reserved
        return None
    payload = data[HEADER_SIZE:]
    if zlib.crc32(payload) != got.payload_crc32:
        return None
    return payload

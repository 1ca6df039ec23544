"""The layout of one KV store entry: one file per full block of KV, drawn once here.

Every engine that shares a store directory reads and writes this layout; an entry is trusted
only when every header field matches what the reader expects and its MAC, keyed with the
store's secret (store_dir.py), holds.

```
offset  size  field          (little endian, no implicit padding: _pack_ = 1)
     0     8  magic          b"RLLMKVB\\0"
     8     4  version        ENTRY_VERSION (2)
    12     4  header_size    HEADER_SIZE (128)
    16    16  block_hash     the prefix cache's chained digest of the block (engine/core/kv_cache.py)
    32    16  model_digest   blake2b-128 of the model's identity (EntryLayout.model_id)
    48    12  dtype          the KV cache dtype's name, NUL padded ("float32", "bfloat16", ...)
    60     4  block_size     tokens per block
    64     4  num_layers
    68     4  num_kv_heads
    72     4  head_dim
    76     4  reserved0      zero
    80     8  payload_size   num_layers * block_size * 2 * num_kv_heads * head_dim * itemsize
    88     8  reserved       zero
    96    32  mac            HMAC-SHA256(mac key, bytes 0..95 of the header || payload)
   128     -  payload        KV as [num_layers][block_size][K | V][num_kv_heads][head_dim] in dtype
                             (one block of the runner's paged cache, layer by layer)
```

A file whose size is not exactly ``HEADER_SIZE + payload_size`` (truncated, or appended to),
whose header differs in any field, or whose MAC fails, is a miss. The MAC is keyed (the key is
derived from the store's secret, ``mac_key``), so it guards against a writer who means harm as
well as against corruption: without the secret no one can make an entry that passes, even
knowing the prompt, the model and this layout. HMAC-SHA256 rather than a keyed BLAKE2b because
OpenSSL's SHA-256 uses the CPU's SHA extensions: about twice BLAKE2b's speed here
(benchmarks/RESULTS.md, "Kernel choices").
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
from dataclasses import dataclass
from typing import Optional

MAGIC = b"RLLMKVB\0"
ENTRY_VERSION = 2
MAC_SIZE = 32
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
        ("reserved0", ctypes.c_uint32),
        ("payload_size", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64),
        ("mac", ctypes.c_ubyte * MAC_SIZE),
    ]


HEADER_SIZE = ctypes.sizeof(EntryHeader)
# The offsets of the diagram above, checked as csrc/ring/ring.h checks its own with _Static_assert.
assert HEADER_SIZE == 128
assert (
    EntryHeader.block_hash.offset,
    EntryHeader.dtype.offset,
    EntryHeader.block_size.offset,
    EntryHeader.payload_size.offset,
    EntryHeader.mac.offset,
) == (16, 48, 60, 80, 96)
_MACED = EntryHeader.mac.offset  # the header bytes the MAC covers, with the payload


def mac_key(secret: bytes) -> bytes:
    """The entries' MAC key, derived from the store's secret (the names use another: store.py)."""
    return hmac.digest(secret, b"ringllm kv entry mac", "sha256")


def entry_mac(key: bytes, header: bytes | memoryview, payload: memoryview) -> bytes:
    m = hmac.new(key, header[:_MACED], "sha256")
    m.update(payload)
    return m.digest()


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
        return self.num_layers * self.block_size * 2 * self.num_kv_heads * self.head_dim * DTYPE_ITEMSIZE[self.dtype]

    @property
    def model_digest(self) -> bytes:
        return hashlib.blake2b(self.model_id.encode(), digest_size=16).digest()

    @property
    def identity(self) -> bytes:
        """The whole layout, put into file names (store.py) so that engines with different models
        or geometries can share one directory without overwriting each other's entries."""
        return (
            f"{self.model_id}|{self.dtype}|{self.block_size}|{self.num_layers}|{self.num_kv_heads}|{self.head_dim}"
        ).encode()

    def header(self, block_hash: bytes) -> EntryHeader:
        """The header an entry of ``block_hash`` has, MAC zeroed."""
        h = EntryHeader()
        h.magic[:] = MAGIC
        h.version, h.header_size = ENTRY_VERSION, HEADER_SIZE
        h.block_hash[:] = block_hash
        h.model_digest[:] = self.model_digest
        h.dtype[:] = self.dtype.encode().ljust(12, b"\0")
        h.block_size, h.num_layers, h.num_kv_heads, h.head_dim = (
            self.block_size,
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
        )
        h.payload_size = self.payload_size
        return h


def encode_header(layout: EntryLayout, block_hash: bytes, payload: memoryview, key: bytes) -> bytes:
    """The header of an entry holding ``payload``, its MAC made with ``key`` (``mac_key``)."""
    if payload.nbytes != layout.payload_size:
        raise ValueError(f"payload of {payload.nbytes} bytes, the layout needs {layout.payload_size}")
    h = layout.header(block_hash)
    h.mac[:] = entry_mac(key, bytes(h), payload)
    return bytes(h)


def decode_entry(data: memoryview, layout: EntryLayout, block_hash: bytes, key: bytes) -> Optional[memoryview]:
    """The payload of ``data`` if it is a sound entry for ``block_hash`` under ``layout`` whose MAC
    was made with ``key``; else None."""
    if len(data) != HEADER_SIZE + layout.payload_size:
        return None
    want = bytes(layout.header(block_hash))
    if data[:_MACED] != want[:_MACED]:  # magic, version, hash, model, dtype, geometry, size, reserved
        return None
    payload = data[HEADER_SIZE:]
    if not hmac.compare_digest(entry_mac(key, data, payload), data[_MACED:HEADER_SIZE]):
        return None
    return payload

"""Paged KV cache bookkeeping: which physical block holds which tokens of which request.

The KV tensors live in the model runner (``num_blocks`` blocks of ``block_size`` slots per
layer); this module only hands out block ids and writes them into ``Request.block_ids``.

Ownership: a block belongs to every request whose block table lists it; ``ref_cnt`` counts
them. A block with ``ref_cnt == 0`` sits on the free queue. With prefix caching, a *full*
block whose KV has been computed is registered under a digest of its tokens chained with the
digest of the block before it, so two requests with the same first ``k`` blocks of tokens share
those ``k`` physical blocks. A freed block keeps its registration while it waits on the free
queue, so a later request with the same prefix can revive it; it loses the registration only
when it is handed out again (eviction, least recently freed first).

The digest is blake2b, not Python's ``hash``: a crafted prompt must not be able to collide with
another user's prefix and read its KV. A request's ``cache_salt`` (vLLM's) is the parent of its
first block, so every digest of a salted request depends on the salt: requests with different
salts (or one salted, one not) never share a block. A request's LoRA adapter enters the same
parent digest (its id, name and path): blocks computed with one adapter never serve another
adapter or the base model.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Optional, Sequence

from engine.core import kv_events
from engine.core.request import Request
from engine.lora.request import LoRARequest


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev", "next")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: Optional[bytes] = None  # set while registered in the prefix cache
        self.prev: Optional[KVCacheBlock] = None  # free-queue links (None when not free)
        self.next: Optional[KVCacheBlock] = None

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list of free blocks: O(1) pop from the head, push at either end, and
    removal from the middle (a cache hit revives a free block wherever it sits)."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)  # sentinels: no None checks on the hot path
        self._tail = KVCacheBlock(-1)
        self._head.next, self._tail.prev = self._tail, self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next
        if block is self._tail or block is None:  # None: never (a sentinel's link), said for the type checker
            raise RuntimeError("no free KV cache block")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        before, after = block.prev, block.next
        assert before is not None and after is not None, f"{block} is not in the free queue"
        before.next, after.prev = after, before
        block.prev = block.next = None
        self.num_free -= 1

    def append(self, block: KVCacheBlock) -> None:
        before = self._tail.prev
        assert before is not None  # the tail sentinel always has a predecessor
        self._link(block, before, self._tail)

    def appendleft(self, block: KVCacheBlock) -> None:
        after = self._head.next
        assert after is not None  # the head sentinel always has a successor
        self._link(block, self._head, after)

    def _link(self, block: KVCacheBlock, before: KVCacheBlock, after: KVCacheBlock) -> None:
        block.prev, block.next = before, after
        before.next = after.prev = block
        self.num_free += 1

    def __iter__(self):
        block = self._head.next
        while block is not self._tail:
            yield block
            block = block.next


def hash_block(parent: bytes, token_ids: list[int]) -> bytes:
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()


def salt_digest(cache_salt: Optional[str], lora: Optional[LoRARequest] = None) -> bytes:
    """The parent of a request's first block: empty without a salt or an adapter, else a digest
    of them in a domain of its own (it can equal no block digest but by a 128-bit collision)."""
    if cache_salt is None and lora is None:
        return b""
    key = b"" if cache_salt is None else b"cache_salt\0" + cache_salt.encode()
    if lora is not None:
        key += b"\0lora\0" + f"{lora.lora_int_id}\0{lora.lora_name}\0{lora.lora_path}".encode()
    return hashlib.blake2b(key, digest_size=16).digest()


class KVCacheManager:
    """Allocates blocks to requests, with optional prefix caching.

    The digests of a request's full blocks live on the request (they depend only on its
    tokens, so they survive preemption); here is only how many of its blocks are registered.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        enable_kv_cache_events: bool = False,
        event_contents: bool = False,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, KVCacheBlock] = {}
        self._num_registered: dict[str, int] = {}
        # With KV events: what entered and left the cache since take_events (engine/core/kv_events.py).
        self.events: Optional[list] = [] if enable_kv_cache_events and enable_caching else None
        # BlockStored carries what the blocks hold, tokens and cache salt (else token_ids empty, no extra_keys)
        self._event_contents = event_contents

    def take_events(self) -> list:
        """The events since the last call (the core publishes them once per step)."""
        events = self.events
        if not events:
            return []
        self.events = []
        return events

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    @property
    def usage(self) -> float:
        return 1.0 - self.free_queue.num_free / self.num_blocks

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached full blocks that prefixes the request's tokens, and the
        number of tokens they hold. At least one token is always left to compute, since the
        model must run on the last token to sample the next one. Nothing is reserved yet."""
        params = request.sampling_params
        if not self.enable_caching or params.prompt_logprobs is not None or params.skip_reading_prefix_cache:
            return [], 0  # prompt logprobs need every prompt position computed
        hashes = self.block_hashes(request, request.num_tokens)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in hashes[:max_blocks]:
            block = self.cached.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVCacheBlock] = ()
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the computed ones (plus the cache
        hits in ``new_computed_blocks``, which are appended first). False, changing nothing,
        when the free blocks do not suffice."""
        block_ids = request.block_ids
        num_hit = len(new_computed_blocks)
        total = request.num_computed_tokens + num_hit * self.block_size + num_new_tokens
        needed = -(-total // self.block_size) - len(block_ids) - num_hit
        if needed <= 0 and not num_hit:
            return True  # the common decode step: the last block still has room
        revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if needed > self.free_queue.num_free - revived:
            return False
        for block in new_computed_blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1
            block_ids.append(block.block_id)
        if num_hit:
            self._num_registered[request.request_id] = len(block_ids)
        for _ in range(needed):
            block_ids.append(self._pop_free().block_id)
        return True

    def cache_blocks(self, request: Request) -> None:
        """Register the request's full blocks whose KV is now computed."""
        if not self.enable_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        req_id = request.request_id
        start = self._num_registered.get(req_id, 0)
        if num_full <= start:
            return
        hashes = self.block_hashes(request, num_full * self.block_size)
        cached = self.cached
        run: Optional[list[int]] = None if self.events is None else []  # indices of this call's new registrations
        for i in range(start, num_full):
            block = self.blocks[request.block_ids[i]]
            # A concurrent request may have registered the same tokens first: keep that block.
            if block.block_hash is None and hashes[i] not in cached:
                block.block_hash = hashes[i]
                cached[hashes[i]] = block
                if run is not None:
                    run.append(i)
        self._num_registered[req_id] = num_full
        if run:
            self._stored(request, hashes, run)

    def _stored(self, request: Request, hashes: list[bytes], registered: list[int]) -> None:
        """One BlockStored per run of consecutive newly registered blocks, each chained to the
        block before it (None before the first block)."""
        bs, tokens, events = self.block_size, request.all_token_ids, self.events
        assert events is not None  # called only with events on
        begin = 0
        for k in range(1, len(registered) + 1):
            if k == len(registered) or registered[k] != registered[k - 1] + 1:
                first, last = registered[begin], registered[k - 1]
                token_ids, salt = (
                    (tokens[first * bs : (last + 1) * bs], request.cache_salt) if self._event_contents else ([], None)
                )
                events.append(
                    kv_events.stored(
                        hashes[first : last + 1],
                        hashes[first - 1] if first else None,
                        token_ids,
                        bs,
                        salt,
                        request.lora_request,
                    )
                )
                begin = k

    def free(self, request: Request) -> None:
        """Release the request's blocks (registering its computed full blocks first). Blocks go
        back in reverse so a request's tail, the part least likely shared, is evicted first;
        unregistered blocks go to the front, to be reused before any cached one."""
        self.cache_blocks(request)
        blocks = self.blocks
        for block_id in reversed(request.block_ids):
            block = blocks[block_id]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)
        request.block_ids.clear()
        self._num_registered.pop(request.request_id, None)

    def trim(self, request: Request, num_tokens: int) -> None:
        """Give back the request's blocks past those ``num_tokens`` tokens need (slots allocated
        for speculative drafts that were rejected). They hold no computed full block, so none is
        registered: they go to the front of the free queue."""
        keep = -(-num_tokens // self.block_size)
        block_ids = request.block_ids
        while len(block_ids) > keep:
            block = self.blocks[block_ids.pop()]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.appendleft(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block. Refused (False) while any block is in use, as in vLLM: a
        running request would go on registering blocks computed before the reset."""
        if self.free_queue.num_free != self.num_blocks:
            return False
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
        if self.events is not None:
            self.events.append(kv_events.AllBlocksCleared())
        return True

    def _removed(self, block_hash: bytes) -> None:
        events = self.events
        assert events is not None  # called only with events on
        last = events[-1] if events else None
        if type(last) is kv_events.BlockRemoved:  # evictions in a row: one event
            last.block_hashes.append(block_hash)
        else:
            events.append(kv_events.removed(block_hash))

    def _pop_free(self) -> KVCacheBlock:
        block = self.free_queue.popleft()
        if block.block_hash is not None:  # evict: its old contents are about to be overwritten
            del self.cached[block.block_hash]
            if self.events is not None:
                self._removed(block.block_hash)
            block.block_hash = None
        block.ref_cnt = 1
        return block

    def block_hashes(self, request: Request, num_tokens: int) -> list[bytes]:
        """Digests of the full blocks among the first ``num_tokens`` tokens, extended lazily."""
        hashes = request.block_hashes
        bs = self.block_size
        tokens = request.all_token_ids
        for i in range(len(hashes), num_tokens // bs):
            parent = hashes[-1] if hashes else salt_digest(request.cache_salt, request.lora_request)
            hashes.append(hash_block(parent, tokens[i * bs : (i + 1) * bs]))
        return hashes

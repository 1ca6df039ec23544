"""SharedStorageConnector (vLLM's name and config): KV blocks shared through a directory.

    kv_transfer_config={"kv_connector": "SharedStorageConnector", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"shared_storage_path": "/dev/shm/kv-$USER"}}

A producer (``kv_producer``, ``kv_both``) saves the KV of every full prompt block it computes,
one entry per block (store.py, entry.py), named by the chained block digest the prefix cache
uses (engine/core/kv_cache.py): an entry stands for its block *and every token before it*.
A consumer (``kv_consumer``, ``kv_both``), when it admits a request, loads the longest run of
entries that follows the blocks its own prefix cache already holds, and computes only the rest.
On /dev/shm the directory is shared memory between the engines of one host: a prefill
instance and a decode instance, or the data-parallel ranks of one server, all run by one user
(the directory is private to its owner, or refused: store_dir.py).

The EngineCore holds one connector, used from both of its sides, as in vLLM's split:
- scheduler side (``get_num_new_matched_tokens``, ``update_state_after_alloc``,
  ``build_connector_meta``, ``request_finished``): decides what is loaded and saved this step.
  Entries are read and verified here, when the request is admitted, so the number of tokens
  promised to the scheduler is exactly the number that will be loaded: a missing or corrupt
  entry just ends the run there.
- worker side (``start_load_kv`` before the forward pass, ``save_kv`` after it): copies between
  the entries and the paged KV cache, following ``KVConnectorMetadata``.

Both sides do their file work through one ``IOWorker`` thread with a deadline (io_worker.py), so
a stalled filesystem costs the step loop at most ``io_timeout_s`` once, never a hang.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from engine.kv_transfer.config import DEFAULT_MAX_BYTES, KVTransferConfig
from engine.kv_transfer.entry import EntryLayout
from engine.kv_transfer.io_worker import IOWorker
from engine.kv_transfer.store import BlockStore

logger = logging.getLogger(__name__)

BlockHashes = Callable[[Any, int], list]  # (request, num_tokens) -> digests of its full blocks


@dataclass
class KVConnectorMetadata:
    """What the runner does with the connector in one step (built by the scheduler side)."""

    loads: list[tuple[int, memoryview]] = field(default_factory=list)  # (block id, payload), before
    saves: list[tuple[int, bytes]] = field(default_factory=list)  # (block id, block digest), after


class SharedStorageConnector:
    def __init__(self, config: KVTransferConfig, layout: EntryLayout) -> None:
        params = config.connector_params()
        path = params.shared_storage_path
        max_bytes = params.max_bytes or default_max_bytes(path)
        self.store = BlockStore(path, layout, max_bytes, params.fsync)
        self.io = IOWorker(path, params.io_timeout_s)
        self.block_size = layout.block_size
        self.is_producer = config.is_kv_producer
        self.is_consumer = config.is_kv_consumer
        # Entries read for the request at the head of the waiting queue, kept while it waits for
        # room (request id, first block, payloads): one request's worth at most.
        self._pending: Optional[tuple[str, int, list[memoryview]]] = None
        self._loads: list[tuple[int, memoryview]] = []
        logger.info(
            "KV connector: SharedStorageConnector, %s, %s (bound %.0f MiB)", config.kv_role, path, max_bytes / 2**20
        )

    # ------------------------------------------------------------------ scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int, block_hashes: BlockHashes) -> int:
        """Tokens after the first ``num_computed_tokens`` (a whole number of blocks) whose KV the
        store holds, read and verified now. At least one prompt token is always left to compute."""
        if not self.is_consumer or request.sampling_params.prompt_logprobs is not None:
            return 0
        bs = self.block_size
        first = num_computed_tokens // bs
        if self._pending is None or self._pending[:2] != (request.request_id, first):
            max_blocks = (request.num_tokens - 1) // bs
            wanted = block_hashes(request, max_blocks * bs)[first:max_blocks]
            payloads = self.io.call(lambda: self._load_run(wanted), default=[]) if wanted else []
            self._pending = (request.request_id, first, payloads)
        return len(self._pending[2]) * bs

    def _load_run(self, block_hashes: list[bytes]) -> list[memoryview]:
        """The payloads of the leading blocks of ``block_hashes`` that the store holds (on the IO thread)."""
        payloads = []
        for block_hash in block_hashes:
            payload = self.store.load(block_hash)
            if payload is None:
                break
            payloads.append(payload)
        return payloads

    def update_state_after_alloc(self, request: Any, num_external_tokens: int) -> None:
        """The request was admitted with ``num_external_tokens`` from the store: its blocks are
        allocated, so the loads can be queued for this step."""
        if num_external_tokens:
            _, first, payloads = self._pending
            count = num_external_tokens // self.block_size
            self._loads.extend(zip(request.block_ids[first : first + count], payloads[:count]))
        self._pending = None

    def build_connector_meta(
        self, requests: list, num_scheduled_tokens: list[int], block_hashes: BlockHashes
    ) -> Optional[KVConnectorMetadata]:
        """This step's loads, and the full prompt blocks it completes (to save); None if neither."""
        meta = KVConnectorMetadata(self._loads)
        self._loads = []
        if self.is_producer:
            bs = self.block_size
            for req, n in zip(requests, num_scheduled_tokens):
                start = req.num_computed_tokens
                end = min(start + n, req.num_prompt_tokens) // bs  # full prompt blocks after this step
                if end > start // bs:
                    hashes = block_hashes(req, end * bs)
                    meta.saves.extend((req.block_ids[j], hashes[j]) for j in range(start // bs, end))
        return meta if meta.loads or meta.saves else None

    def request_finished(self, request: Any) -> None:
        if self._pending is not None and self._pending[0] == request.request_id:
            self._pending = None

    # ------------------------------------------------------------------ worker side
    def start_load_kv(self, kv_caches: torch.Tensor, meta: KVConnectorMetadata) -> None:
        """Copy the loaded entries into their blocks of the paged cache [layers, blocks, slots, 2*kv]."""
        shape = (kv_caches.shape[0], kv_caches.shape[2], kv_caches.shape[3])
        for block_id, payload in meta.loads:
            src = torch.frombuffer(payload, dtype=torch.uint8).view(kv_caches.dtype).view(shape)
            kv_caches[:, block_id].copy_(src)

    def save_kv(self, kv_caches: torch.Tensor, meta: KVConnectorMetadata) -> None:
        """Save this step's completed prompt blocks: copied out here, written on the IO thread."""
        if not meta.saves:
            return
        blocks = [
            (block_hash, kv_caches[:, block_id].to("cpu", copy=True).contiguous())
            for block_id, block_hash in meta.saves
        ]
        self.io.call(lambda: self._save_blocks(blocks), default=None)

    def _save_blocks(self, blocks: list[tuple[bytes, torch.Tensor]]) -> None:
        for block_hash, block in blocks:
            if self.store.contains(block_hash):
                self.store.touch(block_hash)
            else:
                self.store.save(block_hash, memoryview(block.view(torch.uint8).reshape(-1).numpy()))


def model_identity(config: Any) -> str:
    """What makes two engines' KV interchangeable beyond the block geometry: the weights (path
    and load format; dummy weights also depend on the seed) and any config overrides."""
    mc = config.model_config
    overrides = mc.hf_overrides or {}
    seed = f"|seed={mc.seed}" if mc.load_format == "dummy" else ""
    return (
        f"{os.path.realpath(mc.model_path)}|{mc.load_format}{seed}|{json.dumps(overrides, sort_keys=True, default=str)}"
    )


def layout_for(config: Any, model: Any) -> EntryLayout:
    return EntryLayout(
        model_id=model_identity(config),
        dtype=str(model.dtype).removeprefix("torch."),
        block_size=config.cache_config.block_size,
        num_layers=len(model.layers),
        num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
    )


def default_max_bytes(path: str) -> int:
    """The smaller of DEFAULT_MAX_BYTES and half the filesystem (a container's /dev/shm is small)."""
    try:
        st = os.statvfs(path)
        return max(1, min(DEFAULT_MAX_BYTES, st.f_blocks * st.f_frsize // 2))
    except OSError:
        return DEFAULT_MAX_BYTES

"""CUDA graphs for decode-only steps of the Triton forward (vLLM's ``cudagraph_capture_sizes``).

A decode step of a small model is mostly kernel launches; replaying a captured graph
issues them all at once. One graph is captured per batch size of the ladder, over static
input buffers; a step of D decodes runs the smallest captured size B >= D, its inputs
copied into the first D rows and the B - D padded rows made harmless: slot -1 (the cache
write skips it), context length 0 (it attends to key 0 of block 0 and its output is
dropped), ``cu_seqlens = arange(B + 1)`` (one query per sequence, fixed at capture).
Prefill and mixed steps, and larger decode batches, run eagerly. ``enforce_eager=True``
gives an empty ladder (no graphs).

Not exercised by the CPU suite (graphs need a GPU); covered by the ``gpu`` tests.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from engine.models.attention import AttentionMetadata

logger = logging.getLogger(__name__)


def default_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's ladder: 1, 2, 4, then every multiple of 8, up to max_num_seqs (at most 512)."""
    limit = min(max_num_seqs, 512)
    sizes = [s for s in (1, 2, 4) if s <= limit] + list(range(8, limit + 1, 8))
    if sizes[-1] < limit:
        sizes.append(limit)
    return sizes


def capture_decode_graphs(config, model, kv_caches: torch.Tensor) -> Optional["DecodeGraphs"]:
    """The runner's graphs: on CUDA with a forward that takes them (Triton's) and a non-empty
    ladder, else None."""
    sizes = config.compilation_config.cudagraph_capture_sizes
    if sizes is None:
        sizes = default_capture_sizes(config.scheduler_config.max_num_seqs)
    if kv_caches.device.type != "cuda" or not model.uses_cuda_graphs or not sizes:
        return None
    max_blocks = -(-config.model_config.max_model_len // config.cache_config.block_size)
    graphs = DecodeGraphs(model, kv_caches, sizes, max_blocks)
    graphs.capture()
    return graphs


class DecodeGraphs:
    """Captured decode steps of one model over one KV cache (capture after the cache exists)."""

    def __init__(self, model, kv_caches: torch.Tensor, sizes: list[int], max_blocks: int) -> None:
        self.model, self.kv_caches = model, kv_caches
        self.sizes = sorted(sizes)
        device, top = kv_caches.device, self.sizes[-1]
        self.input_ids = torch.zeros(top, dtype=torch.long, device=device)
        self.positions = torch.zeros(top, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(top, max_blocks, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(top, dtype=torch.int32, device=device)
        self.cu_seqlens = torch.arange(top + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def inputs(self, size: int) -> tuple:
        """The forward's arguments for a step of ``size`` rows, views of the static buffers."""
        md = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            num_decodes=size,
            block_tables=self.block_tables[:size],
            cu_seqlens=self.cu_seqlens[: size + 1],
            context_lens=self.context_lens[:size],
            max_query_len=1,
        )
        return self.input_ids[:size], self.positions[:size], self.kv_caches, md

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        pool = None
        for size in reversed(self.sizes):  # largest first, so the smaller ones reuse its memory pool
            args = self.inputs(size)
            self.model(*args)  # warm-up: compiles the kernels outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.model(*args)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info(
            "captured %d decode CUDA graphs (batch 1..%d) in %.1f s",
            len(self.sizes),
            self.sizes[-1],
            time.perf_counter() - start,
        )

    def stage(self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata) -> Optional[int]:
        """Copy a decode-only step into the static buffers, padded; returns the captured size
        to run, or None (nothing copied) when the step does not fit any."""
        num = input_ids.shape[0]
        if md.max_query_len != 1 or num > self.sizes[-1] or md.block_tables.shape[1] > self.block_tables.shape[1]:
            return None
        size = next(s for s in self.sizes if s >= num)
        width = md.block_tables.shape[1]
        self.input_ids[:num].copy_(input_ids)
        self.positions[:num].copy_(positions)
        self.slot_mapping[:num].copy_(md.slot_mapping)
        self.block_tables[:num, :width].copy_(md.block_tables)
        self.context_lens[:num].copy_(md.context_lens)
        if size > num:  # padded rows: write nothing, attend to one key, dropped by the caller
            self.slot_mapping[num:size].fill_(-1)
            self.context_lens[num:size].zero_()
            self.input_ids[num:size].zero_()
            self.positions[num:size].zero_()
        return size

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata) -> Optional[torch.Tensor]:
        """Hidden states of a decode-only step through a graph, or None when no size fits."""
        size = self.stage(input_ids, positions, md)
        if size is None:
            return None
        self.graphs[size].replay()
        return self.outputs[size][: input_ids.shape[0]]

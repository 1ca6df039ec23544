"""Runs one SchedulerOutput through the model and the sampler (contract: engine/core/sched_output.py).

Each step flattens the batch into one token sequence, decodes first, then each
prefill chunk (the order ``AttentionMetadata`` expects), runs the model once,
and sends only the rows that are sampled (or need prompt logprobs) through the
LM head. Everything the layers share (slots, block table, masks, RoPE angles)
is computed once per step here, never per layer.

Per-request state kept across steps (dropped when an id appears in
``finished_req_ids``): the seeded generator and the prompt's token mask for the
repetition penalty. A preempted request comes back without state; its generator
is rebuilt and fast-forwarded one draw per token already sampled, so a seeded
request yields the same tokens whether or not it was preempted.
"""

from __future__ import annotations

import logging
import math
import mmap
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch

from engine.core.request import Request
from engine.core.sched_output import MAX_PROMPT_LOGPROBS_ROWS, ModelRunnerOutput, SchedulerOutput
from engine.kv_transfer import make_kv_connector
from engine.lora.manager import LoRAManager
from engine.models.attention import AttentionMetadata, to_device
from engine.sampling_params import SamplingType
from engine.spec_decode.verify import accepted_tokens, rejection_sample
from engine.wire_messages import LogprobsLists
from engine.worker.cuda_graphs import DecodeGraphs, capture_decode_graphs
from engine.worker.loader import load_model
from engine.worker.logit_controls import LogitControls, has_logit_controls, has_penalties
from engine.worker.thread_tuner import ThreadTuner
from engine.worker.sampler import (
    Sampler,
    SamplingMetadata,
    gather_logprobs,
    random_probs,
    replay_draws,
    to_logprobs_lists,
)

if TYPE_CHECKING:
    from engine.config import EngineConfig  # annotations only: the config does not import the worker back

logger = logging.getLogger(__name__)


class _RequestState:
    __slots__ = ("generator", "prompt_mask", "pool_sum")

    def __init__(self) -> None:
        self.generator: Optional[torch.Generator] = None
        self.prompt_mask: Optional[torch.Tensor] = None
        self.pool_sum: Optional[torch.Tensor] = None  # MEAN pooling: the normed rows of earlier chunks, summed


@dataclass
class _Batch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata
    sampled: list[Request]  # in batch order
    sample_rows: torch.Tensor  # row of each sampled request's last token (and of each of its drafts)
    prompt_lp: list[tuple[Request, int, list[int]]]  # (request, first row, next prompt tokens)
    # Pooling requests with rows to pool this step: (request, first row, rows, prompt completed).
    pooling: list[tuple[Request, int, int, bool]] = field(default_factory=list)


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        mc = config.model_config
        torch.set_num_threads(config.num_threads)
        # The engine's own thread count adapts to the host per step (thread_tuner.py); one given
        # by the user is kept.
        self.thread_tuner = ThreadTuner(config.num_threads, torch.set_num_threads) if config.adapt_threads else None
        if mc.seed is not None:
            torch.manual_seed(mc.seed)  # unseeded random sampling repeats from run to run
        self.device = torch.device(config.device)
        self.block_size = config.cache_config.block_size
        self.vocab_size = mc.vocab_size
        self.model = load_model(config)
        self.attn_builder = self.model.attention_builder(self.block_size)  # the forward's own
        self.sampler = Sampler()
        self.kv_caches: Optional[torch.Tensor] = None
        self.decode_graphs: Optional[DecodeGraphs] = None  # captured once the KV cache exists (CUDA)
        self.kv_connector = make_kv_connector(config, self.model)  # None without kv_transfer_config
        # With enable_lora: the adapters and their slots in the projections (engine/lora/manager.py)
        self.lora = LoRAManager(self.model, config.lora_config) if config.lora_config is not None else None
        self._states: dict[str, _RequestState] = {}
        # speculative_config's draft model (engine/spec_decode/draft_model.py): loaded and run here,
        # its KV cache sized with the target's; the scheduler asks it for drafts. None otherwise.
        self.drafter = None
        spec = config.speculative_config
        if spec is not None and spec.method == "draft_model" and mc.runner_type != "pooling":
            from engine.spec_decode.draft_model import DraftModelProposer

            self.drafter = DraftModelProposer(config, self._sampling_metadata)

    # ------------------------------------------------------------------ KV cache
    def kv_cache_block_bytes(self) -> int:
        """One block's bytes: the target's, plus the draft model's own block of the same id."""
        shape = self.model.kv_cache_shape(1, self.block_size)
        draft = self.drafter.kv_cache_block_bytes() if self.drafter is not None else 0
        return math.prod(shape) * self.model.dtype.itemsize + draft

    def initialize_kv_cache(self) -> int:
        """Allocate the paged cache; returns its number of blocks."""
        per_block = self.kv_cache_block_bytes()
        given = self.config.cache_config.kv_cache_memory  # always set on CPU
        budget = given if given is not None else self._cuda_kv_budget()
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise ValueError(
                f"kv_cache_memory: {budget} bytes cannot hold one KV block "
                f"({per_block} bytes for {self.block_size} tokens)"
            )
        self.kv_caches = _zeros(self.model.kv_cache_shape(num_blocks, self.block_size), self.model.dtype, self.device)
        if self.drafter is not None:
            self.drafter.allocate(num_blocks, _zeros)
        logger.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB)", num_blocks, self.block_size, num_blocks * per_block / 2**20
        )
        if self.lora is None:  # a graph would freeze one step's rows of each adapter
            self.decode_graphs = capture_decode_graphs(self.config, self.model, self.kv_caches)
        return num_blocks

    def _cuda_kv_budget(self) -> int:
        """What gpu_memory_utilization leaves after the weights and a worst-case step."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        outside = total - free - torch.cuda.memory_reserved(self.device)
        self._profile_run()
        peak = torch.cuda.max_memory_allocated(self.device)
        torch.cuda.empty_cache()
        return int(total * self.config.cache_config.gpu_memory_utilization) - outside - peak

    @torch.inference_mode()
    def _profile_run(self) -> None:
        sc, max_len = self.config.scheduler_config, self.config.model_config.max_model_len
        tokens = sc.max_num_batched_tokens
        blocks = -(-min(tokens, max_len) // self.block_size)
        self.kv_caches = torch.zeros(
            self.model.kv_cache_shape(blocks, self.block_size), dtype=self.model.dtype, device=self.device
        )
        lens = [min(max_len, tokens - start) for start in range(0, tokens, max_len)]
        positions = torch.cat([torch.arange(n) for n in lens]).to(self.device)
        md = self.attn_builder.profile(lens, blocks)
        hidden = self.model.forward(torch.zeros_like(positions), positions, self.kv_caches, md)
        rows = hidden[: min(sc.max_num_seqs, tokens)]
        if self.model.score is None:  # a classification model has no LM head to sample with
            self.model.compute_logits(rows).softmax(dim=-1)
        self.kv_caches = None

    # ------------------------------------------------------------------ step
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        if self.thread_tuner is None or not so.requests:
            return self._execute(so)
        self.thread_tuner.before_step(so.total_num_scheduled_tokens)
        start = time.perf_counter()
        out = self._execute(so)
        self.thread_tuner.after_step(time.perf_counter() - start)
        return out

    def _execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in so.finished_req_ids:
            self._states.pop(req_id, None)
        if not so.requests:
            return ModelRunnerOutput()
        batch = self._prepare(so)
        kv_meta = so.kv_connector_metadata
        if kv_meta is not None:
            self.kv_connector.start_load_kv(self.kv_caches, kv_meta)
        hidden = None
        if self.decode_graphs is not None and batch.attn.num_decodes == batch.input_ids.shape[0]:
            hidden = self.decode_graphs.run(batch.input_ids, batch.positions, batch.attn)
        if hidden is None:
            hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.attn)
        if kv_meta is not None:
            self.kv_connector.save_kv(self.kv_caches, kv_meta)
        out = ModelRunnerOutput()
        if batch.sampled:
            # One row per sampled request, and one per draft token of those with drafts (spec_decode/)
            row_reqs = [r for r in batch.sampled for _ in range(1 + len(r.spec_token_ids))]
            logits = self.model.compute_logits(hidden.index_select(0, batch.sample_rows))
            if so.grammar_bitmask is not None:  # structured outputs: what each grammar forbids is -inf
                from engine.structured_output.bitmask import apply_grammar_bitmask

                apply_grammar_bitmask(logits, so.grammar_bitmask, {r.request_id: j for j, r in enumerate(row_reqs)})
            drafted = self._draft_distributions(batch.sampled, logits)  # before the sampler changes logits
            result = self.sampler(logits, self._sampling_metadata(row_reqs))
            sampled = result.sampled.tolist()
            out.req_ids = [r.request_id for r in batch.sampled]
            starts, j = [], 0
            for req in batch.sampled:
                starts.append(j)
                out.sampled_token_ids.append(sampled[j])
                if req.spec_token_ids:
                    emitted = accepted_tokens(sampled[j : j + 1 + len(req.spec_token_ids)], req.spec_token_ids)
                    if req.request_id in drafted:
                        emitted = rejection_sample(
                            drafted[req.request_id][0], req.spec_state.draft_probs, req.spec_token_ids
                        )
                        out.sampled_token_ids[-1] = emitted[0]
                    out.accepted_token_ids[req.request_id] = emitted
                j += 1 + len(req.spec_token_ids)
            if result.logprobs is not None:  # copied back once for the batch, not per request
                ids, lps, ranks = (t.cpu() for t in (result.logprob_token_ids, result.logprobs, result.ranks))
                for j, req in zip(starts, batch.sampled):
                    num = req.sampling_params.logprobs
                    if num is not None:
                        end = j + len(out.accepted_token_ids.get(req.request_id, (0,)))
                        out.logprobs[req.request_id] = to_logprobs_lists(ids[j:end], lps[j:end], ranks[j:end], num)
                        if req.request_id in drafted:  # the emitted tokens are not the sampler's
                            raw = drafted[req.request_id][1][: end - j]
                            emitted = torch.tensor(out.accepted_token_ids[req.request_id], device=self.device)
                            out.logprobs[req.request_id] = to_logprobs_lists(*gather_logprobs(raw, emitted, num), num)
        for req, row, n, last in batch.pooling:
            pooled = self._pool(req, hidden[row : row + n], last)
            if pooled is not None:
                out.pooler_output[req.request_id] = pooled
        for req, row, targets in batch.prompt_lp:
            out.prompt_logprobs[req.request_id] = self._prompt_logprobs(
                hidden, row, targets, req.sampling_params.prompt_logprobs
            )
        return out

    def _draft_distributions(self, sampled: list[Request], logits: torch.Tensor) -> dict[str, tuple]:
        """For each request whose drafts came with a draft model's distributions (random
        sampling): the target's distributions at its 1 + k rows, for the rejection sampling
        (spec_decode/verify.py), and the rows' raw logprobs if it asked for logprobs."""
        out, j = {}, 0
        for req in sampled:
            k = len(req.spec_token_ids)
            if k and req.spec_state.draft_probs is not None:
                rows = logits[j : j + 1 + k].clone()
                raw = torch.log_softmax(rows, dim=-1) if req.sampling_params.logprobs is not None else None
                out[req.request_id] = (random_probs(rows, self._sampling_metadata([req] * (1 + k))), raw)
            j += 1 + k
        return out

    def _pool(self, req: Request, rows: torch.Tensor, last: bool) -> Optional[bytes]:
        """A pooling request's vector once its prompt is complete (None before): the final normed
        hidden state of its last token (LAST) or their mean over the prompt (MEAN, summed chunk by
        chunk), L2-normalised unless the request says otherwise; float32 bytes for the wire."""
        pooler = self.config.model_config.pooler_config
        if self.model.score is not None:  # classification: always the last token (resolve_runner)
            return _bytes(
                classify_activation(self.model.classify_rows(rows[-1:])[0], req.pooling_params.use_activation)
            )
        if pooler.pooling_type == "LAST":
            vec = self.model.norm_rows(rows[-1:])[0]
        else:
            state = self._state(req)
            part = self.model.norm_rows(rows).sum(dim=0)
            state.pool_sum = part if state.pool_sum is None else state.pool_sum + part
            if not last:
                return None
            vec = state.pool_sum / req.num_prompt_tokens
        normalize = req.pooling_params.normalized
        if normalize if normalize is not None else pooler.normalize:
            vec = torch.nn.functional.normalize(vec, dim=0)
        return _bytes(vec)

    def _prompt_logprobs(self, hidden: torch.Tensor, row: int, targets: list[int], num: int) -> LogprobsLists:
        """In slices of rows, so a long prompt never holds all its [rows, vocab] logits at once
        (a scheduler that chunks prefill hands at most one slice a step: sched_output.py)."""
        rows = LogprobsLists([], [], [])
        for start in range(0, len(targets), MAX_PROMPT_LOGPROBS_ROWS):
            chunk = targets[start : start + MAX_PROMPT_LOGPROBS_ROWS]
            logits = self.model.compute_logits(hidden[row + start : row + start + len(chunk)])
            part = to_logprobs_lists(
                *gather_logprobs(torch.log_softmax(logits, dim=-1), torch.tensor(chunk, device=self.device), num), num
            )
            rows.token_ids += part.token_ids
            rows.logprobs += part.logprobs
            rows.ranks += part.ranks
        return rows

    def _prepare(self, so: SchedulerOutput) -> _Batch:
        reqs, counts = so.requests, so.num_scheduled_tokens
        step_rows = self.attn_builder.build(reqs, counts)
        first_row, md = step_rows.first_row, step_rows.md
        if self.lora is not None:
            self.lora.set_batch(reqs, counts, first_row)

        sampled, rows, prompt_lp, pooling = [], [], [], []
        mean_pooling = getattr(self.config.model_config.pooler_config, "pooling_type", None) == "MEAN"
        for i, r in enumerate(reqs):
            n, p0 = counts[i], r.num_computed_tokens
            if r.pooling_params is not None:  # never sampled: pooled once its prompt is computed
                last = p0 + n == r.num_tokens
                if last or mean_pooling:
                    pooling.append((r, first_row[i], n, last))
                continue
            drafts = len(r.spec_token_ids)
            if p0 + n == r.num_tokens + drafts:  # with drafts: sampled at the last known token and each draft
                sampled.append(r)
                rows.extend(range(first_row[i] + n - 1 - drafts, first_row[i] + n))
            if r.sampling_params.prompt_logprobs is not None:
                end = min(p0 + n, r.num_prompt_tokens - 1)  # the last prompt token has no next one
                if end > p0:
                    prompt_lp.append((r, first_row[i], r.prompt_token_ids[p0 + 1 : end + 1]))
        return _Batch(
            to_device(step_rows.ids, torch.long, self.device),
            to_device(step_rows.positions, torch.long, self.device),
            md,
            sampled,
            to_device(rows, torch.long, self.device),
            prompt_lp,
            pooling,
        )

    # ------------------------------------------------------------------ sampling inputs
    def _sampling_metadata(self, reqs: list[Request]) -> SamplingMetadata:
        md = SamplingMetadata(len(reqs))
        params = [r.sampling_params for r in reqs]
        types = [p.sampling_type for p in params]
        if any(t != SamplingType.GREEDY for t in types):
            greedy = [t == SamplingType.GREEDY for t in types]
            md.temperature = self._floats([1.0 if g else p.temperature for g, p in zip(greedy, params)])
            if any(greedy):
                md.greedy_rows = torch.tensor(greedy, device=self.device)
            if any(p.top_k for p in params):
                md.top_k = torch.tensor([p.top_k or self.vocab_size for p in params], device=self.device)
            if any(p.top_p < 1.0 for p in params):
                md.top_p = self._floats([p.top_p for p in params])
            if any(p.min_p > 0.0 for p in params):
                md.min_p = self._floats([p.min_p for p in params])
            for row, (r, t) in enumerate(zip(reqs, types)):
                if t == SamplingType.RANDOM_SEED:
                    md.generators[row] = self._generator(r)
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        if logprobs:
            md.max_num_logprobs = max(logprobs)
        self._penalties(md, reqs)
        self._min_tokens(md, reqs)
        return md

    def _floats(self, values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=self.device)

    def _state(self, req: Request) -> _RequestState:
        state = self._states.get(req.request_id)
        if state is None:
            state = self._states[req.request_id] = _RequestState()
        return state

    def _generator(self, req: Request) -> torch.Generator:
        state = self._state(req)
        if state.generator is None:
            gen = torch.Generator(device=self.device).manual_seed(req.sampling_params.seed)
            replay_draws(gen, req.num_output_tokens)  # the draws made before a preemption
            state.generator = gen
        return state.generator

    def _penalties(self, md: SamplingMetadata, reqs: list[Request]) -> None:
        rows = [j for j, r in enumerate(reqs) if has_penalties(r.sampling_params)]
        if not rows:
            return
        picked = [reqs[j] for j in rows]
        md.penalty_rows = torch.tensor(rows, device=self.device)
        md.presence = self._floats([r.sampling_params.presence_penalty for r in picked])
        md.frequency = self._floats([r.sampling_params.frequency_penalty for r in picked])
        md.repetition = self._floats([r.sampling_params.repetition_penalty for r in picked])
        md.prompt_masks = torch.stack([self._prompt_mask(r) for r in picked])
        width = max(1, max(r.num_output_tokens for r in picked))
        md.output_tokens = torch.tensor(
            [r.output_token_ids + [self.vocab_size] * (width - r.num_output_tokens) for r in picked],
            dtype=torch.long,
            device=self.device,
        )

    def _prompt_mask(self, req: Request) -> torch.Tensor:
        state = self._state(req)
        if state.prompt_mask is None:
            mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
            mask[torch.tensor(req.prompt_token_ids, device=self.device)] = True
            state.prompt_mask = mask
        return state.prompt_mask

    def _min_tokens(self, md: SamplingMetadata, reqs: list[Request]) -> None:
        rows, tokens = [], []
        for j, r in enumerate(reqs):
            p = r.sampling_params
            if r.num_output_tokens >= p.min_tokens:
                continue
            stop = set(p.all_stop_token_ids) | set(p.stop_token_ids)
            if not p.ignore_eos and r.eos_token_id is not None:
                stop.add(r.eos_token_id)
            stop = [t for t in stop if t < self.vocab_size]
            rows.extend([j] * len(stop))
            tokens.extend(stop)
        if any(has_logit_controls(r.sampling_params) for r in reqs):  # bad words join the bans
            md.logit_controls = LogitControls.build(
                [r.sampling_params for r in reqs], [r.output_token_ids for r in reqs], (rows, tokens)
            )
        if rows:
            md.banned_rows = torch.tensor(rows, device=self.device)
            md.banned_tokens = torch.tensor(tokens, device=self.device)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed KV cache, resident from the start. Zeroed, not empty: padded decode rows read
    never-written slots, and garbage there (NaN * a zero attention weight) would leak into the
    output. On CPU it is a private anonymous mapping populated at once (MAP_POPULATE: the kernel
    hands out zeroed pages about twice as fast as a memset touches them). Committing it all now,
    as vLLM does, means a cache the machine cannot hold is refused at start-up rather than found
    by the OOM killer under load, and the core's RSS does not creep up for minutes as the
    least-recently-freed block queue works its way through every block."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = max(1, math.prod(shape) * dtype.itemsize)
    available = _available_memory()
    if available is not None and nbytes > available:
        raise ValueError(
            f"kv_cache_memory_bytes: a {nbytes / 2**30:.2f} GiB KV cache does not fit in the "
            f"{available / 2**30:.2f} GiB of memory available; give a smaller kv_cache_memory_bytes"
        )
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return torch.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype=dtype).view(shape)


def _available_memory() -> Optional[int]:
    """MemAvailable from /proc/meminfo (Linux), in bytes; None where there is no such file."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _bytes(vec: torch.Tensor) -> bytes:
    """A pooled vector as float32 bytes for the wire."""
    return vec.to(device="cpu", dtype=torch.float32).numpy().astype("<f4").tobytes()


def classify_activation(logits: torch.Tensor, use_activation: Optional[bool]) -> torch.Tensor:
    """vLLM's classification activation: probabilities (softmax over the labels; a sigmoid for a
    one-label head, a cross-encoder's relevance) unless ``use_activation`` is False (the logits)."""
    if use_activation is False:
        return logits
    return logits.sigmoid() if logits.shape[-1] == 1 else logits.softmax(dim=-1)

"""What the scheduler hands the model runner each step, and what comes back.

Contract (stated once, here):
- ``SchedulerOutput.requests[i]`` computes ``num_scheduled_tokens[i]`` tokens taken from
  ``req.all_token_ids[req.num_computed_tokens : req.num_computed_tokens + n]`` at positions
  starting at ``req.num_computed_tokens``; their KV goes into the slots given by
  ``req.block_ids`` (block ``p // block_size``, offset ``p % block_size``). The scheduler has
  allocated every block needed before returning.
- A pooling request (``req.pooling_params``) is never sampled: when its scheduled tokens reach
  the end of its prompt, its pooled vector is in ``ModelRunnerOutput.pooler_output``.
- Any other request is sampled this step iff its scheduled tokens reach the end of its known tokens
  (``num_computed_tokens + n == num_tokens``): a final prefill chunk or a decode. Otherwise
  (an intermediate prefill chunk) only its KV and, if asked, its prompt logprobs are produced.
- With chunked prefill, one step computes at most ``MAX_PROMPT_LOGPROBS_ROWS`` prompt positions of
  requests that asked for ``prompt_logprobs``, over all of them, and with a time budget per step
  (``max_num_prefill_tokens="auto"``) as many as fit it, as measured: each such position is a
  full-vocabulary row (LM head, log-softmax, rank, top-k), many times a prompt token's own cost
  on a small model, so a long prompt's logprobs come over many short steps.
- Speculative decoding: a decode may carry draft tokens (``req.spec_token_ids``, k of them); it
  then computes its last known token followed by the drafts (n = 1 + k, ending at
  ``num_tokens + k``), is sampled at all 1 + k positions, and its emitted tokens are in
  ``ModelRunnerOutput.accepted_token_ids``.
- The runner does not modify any Request; the scheduler applies ``ModelRunnerOutput`` in
  ``update_from_output`` (appends tokens, advances ``num_computed_tokens``, checks stops).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from engine.core.request import Request
from engine.wire_messages import LogprobsLists

# Prompt positions with prompt logprobs one step computes (see the contract above). 256 rows of
# the default model's 49152-token vocabulary are ~50 MB of float32 logits; the runner also computes
# a whole prompt (chunked prefill off) in slices of this many.
MAX_PROMPT_LOGPROBS_ROWS = 256
MIN_PROMPT_LOGPROBS_ROWS = 16  # the paced floor: one KV block's worth


@dataclass
class SchedulerOutput:
    requests: list[Request] = field(default_factory=list)  # batch order
    num_scheduled_tokens: list[int] = field(default_factory=list)  # aligned with requests
    total_num_scheduled_tokens: int = 0
    # Requests that ended or were preempted since the previous batch: the runner drops
    # whatever per-request state it keeps for them (a preempted one comes back from scratch)
    # *before* setting up this batch, where the same id may already be back as a new request.
    finished_req_ids: set[str] = field(default_factory=set)
    # The KV connector's loads (into the paged cache, before the forward pass) and saves (after
    # it) for this step: engine/kv_transfer/shared_storage.py KVConnectorMetadata, or None.
    kv_connector_metadata: Optional[Any] = None
    # The token masks of this step's sampled requests that have a grammar (structured outputs):
    # engine/structured_output/bitmask.py GrammarBitmask, applied to their logits before sampling.
    grammar_bitmask: Optional[Any] = None

    @property
    def is_empty(self) -> bool:
        return not self.requests


@dataclass
class ModelRunnerOutput:
    # One entry per sampled request (see the contract above), in batch order.
    req_ids: list[str] = field(default_factory=list)
    sampled_token_ids: list[int] = field(default_factory=list)
    # Requests that ran draft tokens (``req.spec_token_ids``): every token the step emits for them,
    # the accepted drafts then the target's own (engine/spec_decode/verify.py); their entry in
    # sampled_token_ids is the first of these.
    accepted_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # Only for requests that asked for logprobs: one row (the sampled position).
    logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    # Only for requests that asked for prompt_logprobs and ran prompt tokens this step:
    # one row per prompt position p computed this step that has a next prompt token
    # (the logprob of prompt token p + 1). Concatenated across chunks they give len(prompt) - 1 rows.
    prompt_logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    # Pooling requests whose prompt was completed this step: the pooled vector as float32 bytes.
    # They are never sampled (not in req_ids).
    pooler_output: dict[str, bytes] = field(default_factory=dict)

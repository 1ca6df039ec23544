"""The mock core of ``ringllm bench api-servers``: an EngineCore with no model behind it.

``MockWorker`` replaces the Worker (``--worker-cls benchmarks.mock_core.MockWorker``): no weights,
no torch, no KV tensors; every step answers at once, one token for each request whose scheduled
tokens reach its end (the scheduler's sampling rule, engine/core/sched_output.py). Everything
else is the real thing: the EngineCore process, its scheduler and busy loop, the rings, the API
servers. So what a benchmark of it measures is the serving path around a model: HTTP, input and
output processing, detokenizing, SSE, the transport, and the core's own bookkeeping.
"""

from __future__ import annotations

from engine.core.sched_output import ModelRunnerOutput
from engine.worker.worker import Worker

_FIRST_TEXT_TOKEN = 256  # below: the tokenizer's special and byte tokens
_SPAN = 20000  # ordinary words of the default tokenizer, so detokenizing does real work


class MockWorker(Worker):
    """A worker that samples without a model (see the module docstring)."""

    NUM_KV_BLOCKS = 1 << 16

    def load_model(self) -> None:
        pass

    def initialize_kv_cache(self) -> int:
        return self.NUM_KV_BLOCKS

    def execute_model(self, scheduler_output) -> ModelRunnerOutput:
        ids, tokens = [], []
        for req, n in zip(scheduler_output.requests, scheduler_output.num_scheduled_tokens):
            if req.num_computed_tokens + n == req.num_tokens:
                ids.append(req.request_id)
                tokens.append(_FIRST_TEXT_TOKEN + (req.num_tokens * 7919) % _SPAN)
        return ModelRunnerOutput(req_ids=ids, sampled_token_ids=tokens)

    @property
    def kv_connector(self):
        return None

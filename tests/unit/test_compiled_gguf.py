"""torch.compile with the C kernels: the default model's own Q4_1 file, compiled (mode 3), keeps
its GGUF blocks (the projections run in the graphs as ``ringllm::quant_matmul``) and answers
with eager's greedy tokens, without breaking or multiplying its graphs."""

from __future__ import annotations

import pytest
from torch._dynamo.utils import counters

from engine.models.default_model import default_gguf_path
from tests.helpers.runner_utils import generate, make_request, make_runner

# chat-free token ids from the default tokenizer's range, of several lengths (prefill chunks and decodes)
_PROMPTS = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 2], [1, 4093, 28, 2], [1, 19556, 1083, 4489, 30]]


@pytest.mark.model
@pytest.mark.slow
def test_compiled_gguf_model_matches_eager_greedy_tokens():
    kwargs = dict(max_model_len=256, kv_cache_memory=32 << 20, block_size=4)
    eager = make_runner(default_gguf_path(), **kwargs)
    compiled = make_runner(default_gguf_path(), compilation_config=3, **kwargs)
    assert compiled.model.backend == "torch-compiled"
    assert {p.method.format for layer in compiled.model.layers for p in layer.linears()} == {"Q4_1"}
    breaks = sum(counters["graph_break"].values())
    outs = []
    for runner in (eager, compiled):
        reqs = [make_request(str(i), p) for i, p in enumerate(_PROMPTS)]
        generate(runner, reqs[:1], 2, chunk=4)  # prefill chunks, then a mixed batch
        graphs = counters["stats"]["unique_graphs"]
        generate(runner, reqs, 12, chunk=5)
        if runner is compiled:
            assert counters["stats"]["unique_graphs"] == graphs  # one graph per block serves all 30 layers
        outs.append([r.output_token_ids for r in reqs])
    assert sum(counters["graph_break"].values()) == breaks  # the kernels traced as ops, not around
    assert all(len(o) >= 12 for o in outs[0])
    assert outs[1] == outs[0]

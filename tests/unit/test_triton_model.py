"""The decoder's Triton forward (engine/models/triton_forward.py) against its torch forward.

Without a GPU the Triton kernels run on CPU tensors through Triton's interpreter, forced
with ``backend="triton"`` (see tests/integration/test_triton_kernels.py for why ``TRITON_INTERPRET=1``
must be set while the kernels are imported and run). Two runners step the same schedule,
built so the attention kernel sees every case the runner produces: prefill chunks of two
prompts in one step, a chunk continuing after cached context, a prefill whose first blocks
are another request's (a prefix-cache hit), and decodes mixed with a prefill. The tiny
dummy-weight Llama keeps the interpreter's cost (every program in Python) to seconds.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from engine.core.sched_output import SchedulerOutput
from engine.models.default_model import write_tiny_model
from engine.worker.cuda_graphs import DecodeGraphs
from engine.worker.loader import load_model
from tests.helpers.runner_utils import make_request, make_runner, step

ON_GPU = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")


def _interpreted(module) -> bool:
    return type(module).__name__ == "InterpretedFunction"


def _import_kernels_for_the_interpreter() -> None:
    """Without a GPU, decorate triton's own library functions and the kernels for the
    interpreter now, at collection, as tests/integration/test_triton_kernels.py does: a triton first
    imported without ``TRITON_INTERPRET=1`` (torch.compile imports it) cannot interpret them."""
    if ON_GPU:
        return
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import engine.kernels.triton as kernels
        import triton.language.standard

        for name in kernels.__all__:
            getattr(kernels, name)
        if not (
            _interpreted(triton.language.standard.max)
            and _interpreted(sys.modules["engine.kernels.triton.norm"]._rms_norm_kernel)
        ):
            raise RuntimeError(
                "triton or its kernels were imported before this module could set "
                "TRITON_INTERPRET=1; without a GPU they cannot run"
            )
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


_import_kernels_for_the_interpreter()


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    if not ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # read again at launch; restored after the test


@pytest.fixture(scope="module", params=["llama", "sliding", "qwen3", "phi4-mini"])
def model_dir(request, tmp_path_factory):
    extra = {
        "llama": {},
        "sliding": dict(architectures=["MistralForCausalLM"], sliding_window=7, tie_word_embeddings=False),
        "qwen3": dict(architectures=["Qwen3ForCausalLM"], head_dim=32),
    }.get(request.param)
    if request.param == "phi4-mini":  # longrope (its switch at 16 positions crossed) and 3/4 rotary dims
        from transformers import Phi3Config

        path = str(tmp_path_factory.mktemp(request.param))
        Phi3Config(
            vocab_size=1024,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            original_max_position_embeddings=16,
            architectures=["Phi3ForCausalLM"],
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                partial_rotary_factor=0.75,
                short_factor=[1.0, 1.2, 1.5, 2.0, 3.0, 4.0],
                long_factor=[1.0, 2.0, 4.0, 8.0, 12.0, 16.0],
            ),
        ).save_pretrained(path)
        return path
    path = write_tiny_model(str(tmp_path_factory.mktemp(request.param)), vocab_size=1024, **extra)
    if request.param == "qwen3":  # the per-head q/k norms: a Qwen3 config, as Qwen3Config writes it
        config_file = os.path.join(path, "config.json")
        with open(config_file) as f:
            config = json.load(f)
        with open(config_file, "w") as f:
            json.dump({**config, "model_type": "qwen3"}, f)
    return path


def _runner(path: str, dtype: str, backend: str):
    device = "cuda" if ON_GPU else "cpu"
    runner = make_runner(path, load_format="dummy", dtype=dtype, device=device, block_size=4, seed=0, max_model_len=256)
    if backend != "torch":
        runner.model = load_model(runner.config, backend=backend)
        runner.attn_builder = runner.model.attention_builder(runner.block_size)
        runner.kv_caches = None
        assert runner.initialize_kv_cache() == runner.num_blocks  # the same cache size for both forwards
    assert (runner.model.backend == "triton") == (backend == "triton" or (backend == "auto" and ON_GPU))
    return runner


def _schedule(runner) -> tuple[list[list[int]], list[float]]:
    """Greedy tokens of three requests and every logprob the steps returned, in order."""
    a = make_request(
        "a",
        [5, 17, 300, 111, 77, 9, 12, 400, 3, 256, 31, 7, 99, 100, 101, 64, 65, 66, 67, 8, 9],
        logprobs=3,
        prompt_logprobs=2,
    )
    b = make_request("b", [44, 45, 46], logprobs=3)
    outs = [step(runner, [a, b], chunk=8), step(runner, [a, b], chunk=8)]  # two prefills; chunk after context + decode
    c = make_request("c", a.prompt_token_ids[:8] + [600, 601, 602, 603, 604, 605], logprobs=3, prompt_logprobs=1)
    c.block_ids = a.block_ids[:2]  # a's first two full blocks, as a prefix-cache hit leaves them
    c.num_computed_tokens = 8
    outs.append(step(runner, [a, b, c], chunk=8))  # a's last chunk, b's decode, c's cached-prefix prefill
    for _ in range(5):
        outs.append(step(runner, [a, b, c]))  # decodes only
    lps = []
    for o in outs:
        for req_id in sorted(o.logprobs):
            lps += [x for row in o.logprobs[req_id].logprobs for x in row]
        for req_id in sorted(o.prompt_logprobs):
            lps += [x for row in o.prompt_logprobs[req_id].logprobs for x in row]
    return [r.output_token_ids for r in (a, b, c)], lps


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 0.05)])
def test_triton_forward_matches_torch_forward(model_dir, dtype, tol):
    """The same schedule through both forwards: the same logprobs within the dtype's error,
    and in float32 the same greedy tokens (bf16 rounds differently in each: the torch
    path on CPU multiplies in float32)."""
    torch_tokens, torch_lps = _schedule(_runner(model_dir, dtype, "torch"))
    triton_tokens, triton_lps = _schedule(_runner(model_dir, dtype, "triton"))
    assert len(triton_lps) == len(torch_lps) > 100
    assert triton_lps == pytest.approx(torch_lps, abs=tol)
    if dtype == "float32":
        assert triton_tokens == torch_tokens
    assert [len(t) for t in triton_tokens] == [6, 8, 6]


def test_triton_forward_is_chosen_once_by_device(tiny_model_dir):
    """ "auto" picks Triton only on CUDA with triton importable; "torch" keeps the CPU forward."""
    auto = _runner(tiny_model_dir, "float32", "auto")
    assert (auto.model.backend == "triton") == ON_GPU
    if not ON_GPU:  # the CPU path, unchanged: C kernels, float32 tall projections input-major
        assert auto.model.backend == "cpu-kernels" and auto.decode_graphs is None
        assert type(auto.model.layers[0].qkv.method).__name__ == "InputMajorLinear"
    with pytest.raises(ValueError, match="backend must be one of"):
        load_model(auto.config, backend="cuda")


@gpu
@needs_gpu
def test_cuda_runner_uses_triton_and_sizes_the_cache_from_free_memory(tiny_model_dir):
    """On a GPU the default runner runs the Triton forward in bf16 with the cache on the device,
    sized from free memory (gpu_memory_utilization) when kv_cache_memory is not given."""
    runner = make_runner(
        tiny_model_dir,
        load_format="dummy",
        dtype="auto",
        device="cuda",
        block_size=16,
        kv_cache_memory=None,
        gpu_memory_utilization=0.3,
    )
    assert runner.model.backend == "triton" and runner.kv_caches.is_cuda
    assert runner.kv_caches.numel() * runner.kv_caches.element_size() > 16 << 20
    assert runner.model.dtype in (torch.bfloat16, torch.float16)
    reqs = [make_request(f"r{i}", list(range(3 + i, 40 + 7 * i))) for i in range(3)]
    for _ in range(4):
        out = step(runner, reqs)
        assert len(out.sampled_token_ids) == 3


def test_decode_graph_ladder_and_enforce_eager(tiny_model_dir):
    """vLLM's ladder by default (1, 2, 4, multiples of 8 up to max_num_seqs); enforce_eager: none."""
    from engine.config import EngineArgs
    from engine.worker.cuda_graphs import default_capture_sizes

    assert default_capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert default_capture_sizes(1024)[-3:] == [496, 504, 512]
    args = dict(model=tiny_model_dir, load_format="dummy", device="cpu")
    assert EngineArgs(**args).create_engine_config().compilation_config.cudagraph_capture_sizes is None
    eager = EngineArgs(**args, enforce_eager=True).create_engine_config()
    assert eager.compilation_config.cudagraph_capture_sizes == []
    with pytest.raises(ValueError, match="cudagraph_capture_sizes"):
        EngineArgs(**args, compilation_config={"cudagraph_capture_sizes": [0]}).create_engine_config()


@gpu
@needs_gpu
def test_decode_steps_through_cuda_graphs_match_eager(tiny_model_dir):
    """Decode batches of 3 (padded to the captured 4) and 1 replay graphs; tokens and logprobs
    equal the eager forward's."""
    results = []
    for eager in (False, True):
        runner = make_runner(
            tiny_model_dir,
            load_format="dummy",
            dtype="float32",
            device="cuda",
            block_size=16,
            enforce_eager=eager,
            compilation_config=None if eager else {"cudagraph_capture_sizes": [1, 4]},
        )
        assert (runner.decode_graphs is None) == eager
        reqs = [make_request(f"r{i}", list(range(3 + i, 30 + 5 * i)), logprobs=2) for i in range(3)]
        lps = []
        for n in range(8):
            out = step(runner, reqs if n < 5 else reqs[:1])
            lps += [x for r in sorted(out.logprobs) for row in out.logprobs[r].logprobs for x in row]
        results.append(([r.output_token_ids for r in reqs], lps))
    assert results[0][0] == results[1][0]
    assert results[0][1] == pytest.approx(results[1][1], abs=1e-4)


def test_padded_decode_rows_change_nothing(tiny_model_dir):
    """What a captured decode graph runs: a step of 3 decodes staged into the static buffers
    padded to 4 (slot -1, context 0) gives the unpadded forward's hidden states and cache."""
    runner = _runner(tiny_model_dir, "float32", "triton")
    reqs = [make_request(f"r{i}", list(range(3 + i, 9 + 3 * i))) for i in range(3)]
    step(runner, reqs)  # the prompts, into the cache
    for r in reqs:
        if len(r.block_ids) * runner.block_size <= r.num_computed_tokens:
            r.block_ids.append(runner.next_block)
            runner.next_block += 1
    so = SchedulerOutput(requests=reqs, num_scheduled_tokens=[1, 1, 1], total_num_scheduled_tokens=3)
    batch = runner._prepare(so)
    cache = runner.kv_caches.clone()
    with torch.inference_mode():
        eager = runner.model(batch.input_ids, batch.positions, cache, batch.attn)
        graphs = DecodeGraphs(runner.model, runner.kv_caches, [2, 4], max_blocks=64)
        assert graphs.stage(batch.input_ids, batch.positions, batch.attn) == 4
        padded = runner.model(*graphs.inputs(4))
    torch.testing.assert_close(padded[:3], eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runner.kv_caches, cache)  # the padded rows wrote nothing


def test_a_family_beyond_llamas_layer_is_refused_by_the_triton_forward(tmp_path):
    """Gemma's soft-caps, extra norms and gelu MLP are the torch forwards' alone: forcing Triton
    on it is an error naming why (on CUDA, "auto" picks the torch forward for it)."""
    from transformers import Gemma2Config

    Gemma2Config(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        architectures=["Gemma2ForCausalLM"],
    ).save_pretrained(str(tmp_path))
    runner = make_runner(str(tmp_path), load_format="dummy", block_size=4, max_model_len=256)
    assert runner.model.backend != "triton"
    with pytest.raises(ValueError, match="Triton forward runs Llama's layer only"):
        load_model(runner.config, backend="triton")

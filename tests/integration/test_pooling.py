"""runner="pooling": a Llama-family *ForCausalLM served as an embedding model (vLLM's convert
"embed"). The pooled vectors come from a real EngineCore process over the ring (and from a real
``ringllm serve --runner pooling`` through the ``openai`` client) and must match transformers'
final hidden states; the runner check refuses calls and routes that need the other runner."""

from __future__ import annotations

import asyncio
import math

import openai
import pytest
import torch

from engine import (
    LLM,
    AsyncEngineArgs,
    AsyncLLM,
    EmbeddingRequestOutput,
    PoolingParams,
    PoolingRequestOutput,
    SamplingParams,
)
from engine.config import EngineArgs
from engine.sampling_params import BeamSearchParams
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer

SHARED = "You are a careful assistant. Answer briefly and precisely, and never make anything up. "
PROMPTS = ["Hello", SHARED + "What is two plus two?", SHARED * 2 + "Name a color.", "Hello"]


def write_real_tiny_model(dst: str) -> str:
    """The tiny Llama with random (seeded) weights saved as safetensors, so transformers and the
    engine load the same numbers; the final norm's weight is not all ones, so a missing norm shows."""
    from transformers import AutoConfig, LlamaForCausalLM

    from engine.models.default_model import write_tiny_model

    write_tiny_model(dst, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(AutoConfig.from_pretrained(dst))
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 1.5)
        for layer in model.model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
    model.save_pretrained(dst, safe_serialization=True)
    return dst


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_real_tiny_model(str(tmp_path_factory.mktemp("tiny-real")))


@pytest.fixture(scope="module")
def hf_states(model_dir):
    """prompt -> transformers' last hidden states (final norm applied), [tokens, hidden], float32."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = {}
    with torch.no_grad():
        for prompt in set(PROMPTS):
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            out[prompt] = (ids[0].tolist(), model(ids).last_hidden_state[0])
    return out


def pooling_llm(model_dir, **kwargs):
    # A tiny step budget: the longer prompts are computed in several chunks (chunked prefill).
    kwargs.setdefault("max_num_batched_tokens", 16)
    return LLM(
        model=model_dir,
        runner="pooling",
        dtype="float32",
        device="cpu",
        max_model_len=256,
        kv_cache_memory=16 << 20,
        **kwargs,
    )


@pytest.fixture(scope="module")
def last_llm(model_dir):
    llm = pooling_llm(model_dir)
    yield llm
    llm.shutdown()


def close(a, b):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), b, atol=1e-4, rtol=1e-4)


def test_embed_is_the_normalised_last_hidden_state_of_transformers(last_llm, hf_states):
    outputs = last_llm.embed(PROMPTS, use_tqdm=False)
    assert len(outputs) == len(PROMPTS)
    for prompt, output in zip(PROMPTS, outputs):
        ids, states = hf_states[prompt]
        assert isinstance(output, EmbeddingRequestOutput) and output.finished
        assert output.prompt_token_ids == ids
        embedding = output.outputs.embedding
        assert isinstance(embedding, list) and len(embedding) == 64 == output.outputs.hidden_size
        assert close(embedding, torch.nn.functional.normalize(states[-1], dim=0))
        assert math.isclose(sum(x * x for x in embedding), 1.0, rel_tol=1e-5)
    assert len({o.request_id for o in outputs}) == len(PROMPTS)
    # The repeated prompt was answered from the prefix cache the second time, with the same vector.
    assert outputs[0].outputs.embedding == pytest.approx(outputs[3].outputs.embedding, abs=1e-6)


def test_encode_without_normalisation_and_kv_blocks_are_freed(last_llm, hf_states):
    prompt = PROMPTS[2]
    (output,) = last_llm.encode(prompt, PoolingParams(normalize=False), pooling_task="embed", use_tqdm=False)
    assert isinstance(output, PoolingRequestOutput) and output.finished
    assert isinstance(output.outputs.data, torch.Tensor) and output.outputs.data.dtype == torch.float32
    assert close(output.outputs.data, hf_states[prompt][1][-1])
    stats = last_llm.llm_engine.get_stats()
    assert stats["num_running_reqs"] == stats["num_waiting_reqs"] == 0
    assert stats["kv_cache_usage"] == 0.0


def test_mean_pooling_over_chunks_matches_transformers(model_dir, hf_states):
    llm = pooling_llm(model_dir, pooler_config={"pooling_type": "MEAN"})
    try:
        outputs = llm.encode(
            PROMPTS[:3], [PoolingParams(normalize=False), PoolingParams(), PoolingParams()], use_tqdm=False
        )
        means = [hf_states[p][1].mean(dim=0) for p in PROMPTS[:3]]
        assert close(outputs[0].outputs.data, means[0])
        for output, mean in zip(outputs[1:], means[1:]):
            assert close(output.outputs.data, torch.nn.functional.normalize(mean, dim=0))
        # Not the last-token vector: the mean really covers every chunk of the long prompt.
        assert not close(outputs[2].outputs.data, torch.nn.functional.normalize(hf_states[PROMPTS[2]][1][-1], dim=0))
    finally:
        llm.shutdown()


def test_pooling_llm_refuses_generation_calls(last_llm):
    for call in (
        lambda: last_llm.generate("Hi", SamplingParams(max_tokens=2)),
        lambda: last_llm.chat([{"role": "user", "content": "Hi"}]),
        lambda: last_llm.beam_search(["Hi"], BeamSearchParams(beam_width=2, max_tokens=2)),
    ):
        with pytest.raises(ValueError, match=r"only supported for generative models.*--runner generate"):
            call()


def test_pooling_params_that_do_not_apply_are_refused(last_llm):
    with pytest.raises(ValueError, match="dimensions"):
        last_llm.embed("Hi", pooling_params=PoolingParams(dimensions=8), use_tqdm=False)
    with pytest.raises(ValueError, match="pooling_task"):
        last_llm.encode("Hi", pooling_task="classify", use_tqdm=False)
    assert last_llm.embed("Hi", use_tqdm=False)[0].finished  # and it keeps serving


def test_generating_llm_refuses_embed_and_encode(model_dir):
    llm = LLM(model=model_dir, dtype="float32", device="cpu", max_model_len=256, kv_cache_memory=16 << 20)
    try:
        assert llm.llm_engine.config.model_config.runner_type == "generate"  # "auto" on a *ForCausalLM
        for call in (lambda: llm.embed("Hi"), lambda: llm.encode("Hi", pooling_task="embed")):
            with pytest.raises(
                ValueError, match=r"LLM\.e\w+\(\) is only supported for pooling models.*--runner pooling"
            ):
                call()
        assert llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)[0].finished
    finally:
        llm.shutdown()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(runner="embedding"), "runner"),
        (dict(convert="classify"), "convert"),
        (dict(runner="pooling", convert="none"), "convert"),
        (dict(runner="generate", convert="embed"), "convert"),
        (dict(pooler_config={"pooling_type": "MEAN"}), "pooler_config"),
        (dict(runner="pooling", pooler_config={"pooling_type": "CLS"}), "pooler_config.pooling_type"),
        (dict(runner="pooling", pooler_config={"pooling": "MEAN"}), "pooler_config"),
    ],
)
def test_bad_runner_settings_name_their_field(model_dir, kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        EngineArgs(model=model_dir, device="cpu", **kwargs).create_engine_config()


def test_convert_embed_resolves_auto_runner_to_pooling(model_dir):
    config = EngineArgs(model=model_dir, device="cpu", convert="embed").create_engine_config()
    mc = config.model_config
    assert (mc.runner_type, mc.convert_type, mc.pooler_config.pooling_type, mc.pooler_config.normalize) == (
        "pooling",
        "embed",
        "LAST",
        True,
    )
    assert config.cache_config.enable_prefix_caching
    mean = EngineArgs(
        model=model_dir, device="cpu", runner="pooling", pooler_config={"pooling_type": "mean"}
    ).create_engine_config()
    assert not mean.cache_config.enable_prefix_caching  # MEAN needs every prompt row computed


def test_async_llm_encode_yields_one_final_output(model_dir, hf_states):
    async def run():
        engine = AsyncLLM.from_engine_args(
            AsyncEngineArgs(
                model=model_dir,
                runner="pooling",
                dtype="float32",
                device="cpu",
                max_model_len=256,
                kv_cache_memory=16 << 20,
                max_num_batched_tokens=16,
            )
        )
        try:
            outputs = [o async for o in engine.encode(PROMPTS[1], PoolingParams(), "r1")]
            with pytest.raises(ValueError, match="--runner generate"):
                async for _ in engine.generate("Hi", SamplingParams(max_tokens=2), "r2"):
                    pass
            return outputs
        finally:
            engine.shutdown()

    outputs = asyncio.run(run())
    assert len(outputs) == 1 and outputs[0].finished and outputs[0].request_id == "r1"
    assert close(outputs[0].outputs.data, torch.nn.functional.normalize(hf_states[PROMPTS[1]][1][-1], dim=0))


API_KEY = "sk-pool"


@pytest.fixture(scope="module")
def pooling_server(model_dir):
    with RemoteServer(
        model_dir,
        "--runner",
        "pooling",
        "--dtype",
        "float32",
        "--num-threads",
        "1",
        "--kv-cache-memory",
        str(16 << 20),
        "--max-num-batched-tokens",
        "16",
        "--served-model-name",
        "tiny-embed",
        "--api-key",
        API_KEY,
    ) as remote:
        yield remote


def test_openai_client_embeddings_match_transformers(pooling_server, hf_states):
    client = openai.OpenAI(base_url=pooling_server.base_url, api_key=API_KEY, max_retries=0)
    prompts = PROMPTS[:3]
    expected = [torch.nn.functional.normalize(hf_states[p][1][-1], dim=0) for p in prompts]
    # The client asks for base64 unless told otherwise; then the plain float lists.
    for fmt in (openai.NOT_GIVEN, "float"):
        response = client.embeddings.create(input=prompts, model="tiny-embed", encoding_format=fmt)
        assert response.object == "list" and response.model == "tiny-embed"
        assert [d.index for d in response.data] == [0, 1, 2] and all(d.object == "embedding" for d in response.data)
        for data, want in zip(response.data, expected):
            assert close(data.embedding, want)
        tokens = sum(len(hf_states[p][0]) for p in prompts)
        assert response.usage.prompt_tokens == response.usage.total_tokens == tokens
    ids = hf_states[prompts[1]][0]
    one = client.embeddings.create(input=ids, model="tiny-embed", encoding_format="float")
    many = client.embeddings.create(input=[ids, hf_states[prompts[0]][0]], model="tiny-embed", encoding_format="float")
    assert close(one.data[0].embedding, expected[1]) and close(many.data[1].embedding, expected[0])
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(input="Hi", model="tiny-embed", dimensions=8)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(input="Hi", model="other")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=pooling_server.base_url, api_key="wrong", max_retries=0).embeddings.create(
            input="Hi", model="tiny-embed"
        )


def test_pooling_server_refuses_generation_routes(pooling_server):
    client = openai.OpenAI(base_url=pooling_server.base_url, api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="does not support Completions API.*--runner generate"):
        client.completions.create(model="tiny-embed", prompt="Hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="does not support Chat Completions API"):
        client.chat.completions.create(model="tiny-embed", messages=[{"role": "user", "content": "Hi"}])
    assert client.embeddings.create(input="Hi", model="tiny-embed").data  # and it keeps serving


def test_generating_server_refuses_embeddings(tiny_model_dir):
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS) as remote:
        client = openai.OpenAI(base_url=remote.base_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="does not support Embeddings API.*--runner pooling"):
            client.embeddings.create(input="Hi", model=tiny_model_dir)
        assert client.completions.create(model=tiny_model_dir, prompt="Hi", max_tokens=2).choices


@pytest.mark.model
def test_default_model_embeddings_match_transformers_in_float32():
    from transformers import AutoModel, AutoTokenizer

    from engine.models.default_model import default_model_path

    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    hf = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    prompts = ["The capital of France is Paris.", SHARED * 2 + "Embed this sentence, please."]
    llm = LLM(runner="pooling", dtype="float32", device="cpu", max_model_len=512, max_num_batched_tokens=32)
    try:
        outputs = llm.embed(prompts, use_tqdm=False)
    finally:
        llm.shutdown()
    with torch.no_grad():
        for prompt, output in zip(prompts, outputs):
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            assert output.prompt_token_ids == ids[0].tolist()
            want = torch.nn.functional.normalize(hf(ids).last_hidden_state[0, -1], dim=0)
            got = torch.tensor(output.outputs.embedding)
            assert torch.allclose(got, want, atol=2e-4), (got - want).abs().max()


def test_mean_pooling_refuses_a_kv_connector(model_dir, tmp_path):
    kv = {
        "kv_connector": "SharedStorageConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
    }
    with pytest.raises(ValueError, match="^kv_transfer_config: MEAN pooling"):
        EngineArgs(
            model=model_dir,
            device="cpu",
            runner="pooling",
            pooler_config={"pooling_type": "MEAN"},
            kv_transfer_config=kv,
        ).create_engine_config()
    config = EngineArgs(model=model_dir, device="cpu", runner="pooling", kv_transfer_config=kv).create_engine_config()
    assert config.kv_transfer_config is not None  # LAST pooling always computes the last token: allowed

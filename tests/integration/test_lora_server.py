"""LoRA over HTTP with a real ``ringllm serve``: adapters from ``--lora-modules`` listed by
/v1/models with their parent and selected by ``model=<adapter>`` (the ``openai`` client),
answers equal to transformers with the adapter merged (float32); adapters loaded and unloaded at
run time while other requests run; bad adapters answered 400, unknown names 404; the routes
behind the API key and absent without VLLM_ALLOW_RUNTIME_LORA_UPDATING; vllm:lora_requests_info."""

from __future__ import annotations

import threading

import openai
import pytest

from tests.helpers.lora_utils import base_and_adapters, hf_greedy
from tests.helpers.openai_server_utils import RemoteServer

API_KEY = "sk-lora-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
NUM_TOKENS = 10
PROMPT = [5, 17, 300, 111, 77, 9, 12, 400]
SERVE = [
    "--dtype",
    "float32",
    "--num-threads",
    "1",
    "--kv-cache-memory",
    str(64 << 20),
    "--seed",
    "0",
    "--served-model-name",
    "base",
    "--api-key",
    API_KEY,
    "--enable-lora",
    "--max-loras",
    "2",
    "--max-lora-rank",
    "16",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return base_and_adapters(str(tmp_path_factory.mktemp("lora-http")))


@pytest.fixture(scope="module")
def server(models):
    base, _, adapters = models
    module = '{"name": "qv", "path": "%s", "base_model_name": "base"}' % adapters["qv-rslora"][0]
    with RemoteServer(
        base,
        *SERVE,
        "--lora-modules",
        f"all={adapters['all'][0]}",
        module,
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"},
    ) as remote:
        yield remote


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)


def _complete(client, model: str, max_tokens: int = NUM_TOKENS) -> list[int]:
    out = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0.0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    return list(out.choices[0].token_ids)


def test_models_lists_the_adapters_with_the_base_as_parent(client):
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) >= {"base", "all", "qv"}
    assert cards["all"].parent == "base" and cards["qv"].parent == "base"
    assert getattr(cards["base"], "parent", None) is None


def test_model_names_the_adapter_with_the_openai_client(models, client):
    _, hf, adapters = models
    assert _complete(client, "base") == hf_greedy(hf, PROMPT, NUM_TOKENS)
    assert _complete(client, "all") == hf_greedy(adapters["all"][1], PROMPT, NUM_TOKENS)
    assert _complete(client, "qv") == hf_greedy(adapters["qv-rslora"][1], PROMPT, NUM_TOKENS)
    with pytest.raises(openai.NotFoundError):
        _complete(client, "no-such-adapter")


def test_chat_with_an_adapter(client):
    out = client.chat.completions.create(
        model="all", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0.0
    )
    assert out.model == "all" and out.choices[0].finish_reason in ("length", "stop")


def test_load_and_unload_at_run_time_while_other_requests_run(models, server, client):
    _, _, adapters = models
    results: list = []
    streams = [
        threading.Thread(target=lambda m=m: results.append((m, _complete(client, m, 200))))
        for m in ("base", "all", "base", "qv")
    ]
    for t in streams:
        t.start()
    status, body, _ = server.request(
        "POST",
        "/v1/load_lora_adapter",
        b'{"lora_name": "mlp", "lora_path": "%s"}' % adapters["mlp"][0].encode(),
        {"Content-Type": "application/json", **AUTH},
    )
    assert status == 200 and b"added successfully" in body
    assert _complete(client, "mlp") == hf_greedy(adapters["mlp"][1], PROMPT, NUM_TOKENS)
    status, body, _ = server.request(
        "POST", "/v1/unload_lora_adapter", b'{"lora_name": "mlp"}', {"Content-Type": "application/json", **AUTH}
    )
    assert status == 200 and b"removed successfully" in body
    with pytest.raises(openai.NotFoundError):
        _complete(client, "mlp")
    for t in streams:
        t.join(120)
    assert sorted(len(tokens) for _, tokens in results) == [200] * 4


def test_bad_loads_are_400_unknown_unloads_404_and_the_routes_need_the_key(models, server, tmp_path):
    _, _, adapters = models
    (tmp_path / "empty").mkdir()
    status, body, _ = server.post_json(
        "/v1/load_lora_adapter", {"lora_name": "e", "lora_path": str(tmp_path / "empty")}, AUTH
    )
    assert status == 400 and body["error"]["param"] == "lora_path" and "adapter_config.json" in body["error"]["message"]
    status, body, _ = server.post_json(
        "/v1/load_lora_adapter", {"lora_name": "all", "lora_path": adapters["all"][0]}, AUTH
    )
    assert status == 400 and "already been loaded" in body["error"]["message"]
    status, _, _ = server.post_json("/v1/load_lora_adapter", {"lora_name": "x"}, AUTH)
    assert status == 400
    assert server.post_json("/v1/unload_lora_adapter", {"lora_name": "nope"}, AUTH)[0] == 404
    assert server.post_json("/v1/load_lora_adapter", {"lora_name": "k", "lora_path": adapters["all"][0]})[0] == 401
    assert server.get("/health")[0] == 200


def test_lora_requests_info_names_the_adapters(server, client):
    _complete(client, "all", 2)
    status, body, _ = server.get("/metrics")
    line = next(x for x in body.decode().splitlines() if x.startswith("vllm:lora_requests_info{"))
    assert 'max_lora="2"' in line


def test_runtime_routes_are_404_without_the_environment_variable(tiny_model_dir):
    with RemoteServer(
        tiny_model_dir,
        "--load-format",
        "dummy",
        "--dtype",
        "float32",
        "--num-threads",
        "1",
        "--kv-cache-memory",
        str(32 << 20),
        "--enable-lora",
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0"},
    ) as remote:
        assert remote.post_json("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"})[0] == 404
        assert remote.post_json("/v1/unload_lora_adapter", {"lora_name": "a"})[0] == 404

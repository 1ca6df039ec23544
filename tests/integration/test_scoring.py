"""vLLM's pooling and scoring routes (/pooling, /classify, /score, /v1/score, /rerank, /v1/rerank,
/v2/rerank) and ``LLM.classify``/``LLM.score``, on real ``ringllm serve`` processes over HTTP.

Three small random-weight models, saved as safetensors so transformers and the engine load the
same numbers: an embedding model (a Llama decoder served with ``--runner pooling``), a
three-label ``LlamaForSequenceClassification`` and a one-label ``Qwen3ForSequenceClassification``
(a cross-encoder). Scores must equal the cosine of /v1/embeddings' vectors, classification logits
and cross-encoder scores must equal transformers' float32 ones on the same input (the pair as
the tokenizer encodes it), and bad input is a 400 naming its field. One in-process app checks
that the routes' bodies are parsed on the renderer pool by their size, as main's routes are."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from engine import LLM, PoolingParams
from engine.config import EngineArgs
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer
from tests.integration.test_pooling import write_real_tiny_model

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
TEXTS = ["Hello", "What is two plus two?", "Name a color.", "The sky is blue today."]
QUERY = "What color is the sky?"
SERVE = (
    "--dtype",
    "float32",
    "--num-threads",
    "1",
    "--kv-cache-memory",
    str(16 << 20),
    "--max-num-seqs",
    "4",
    "--max-model-len",
    "256",
)


def write_classifier(dst: str, arch: str, **config) -> str:
    """A *ForSequenceClassification model with random (seeded) weights on the tiny Llama's
    sizes and tokenizer; no pad token, so transformers reads the last token, as the engine does."""
    import transformers

    from engine.models.default_model import write_tiny_model

    write_tiny_model(dst)  # its tokenizer, and the tiny sizes read back below
    fields = {
        k: v
        for k, v in transformers.AutoConfig.from_pretrained(dst).to_diff_dict().items()
        if k not in ("model_type", "transformers_version", "architectures")
    }
    fields.update(architectures=[arch], pad_token_id=None, tie_word_embeddings=False, **config)
    cfg = getattr(transformers, arch.split("For")[0] + "Config")(**fields)  # LlamaConfig, Qwen3Config
    cfg.save_pretrained(dst)
    torch.manual_seed(1)
    model = getattr(transformers, arch)(cfg).eval()
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 1.5)
        model.score.weight.normal_(0.0, 1.0)  # logits well apart, so a wrong row shows
        for linear in model.modules():  # Qwen2's q/k/v biases: transformers starts them at zero
            if isinstance(linear, torch.nn.Linear) and linear.bias is not None:
                linear.bias.normal_(0.0, 0.5)
    model.save_pretrained(dst, safe_serialization=True)
    return dst


@pytest.fixture(scope="module")
def embed_dir(tmp_path_factory):
    return write_real_tiny_model(str(tmp_path_factory.mktemp("embed")))


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    return write_classifier(
        str(tmp_path_factory.mktemp("classifier")),
        "LlamaForSequenceClassification",
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
    )


@pytest.fixture(scope="module")
def cross_dir(tmp_path_factory):
    return write_classifier(str(tmp_path_factory.mktemp("cross")), "Qwen3ForSequenceClassification", num_labels=1)


def hf(model_dir):
    import transformers

    return (
        transformers.AutoTokenizer.from_pretrained(model_dir),
        transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval(),
    )


def hf_logits(model_dir, inputs: list) -> list[list[float]]:
    """transformers' float32 logits for each text, or each (text_1, text_2) pair encoded as a pair."""
    tokenizer, model = hf(model_dir)
    with torch.no_grad():
        encoded = [tokenizer(*(x if isinstance(x, tuple) else (x,)), return_tensors="pt").input_ids for x in inputs]
        return [model(ids).logits[0].tolist() for ids in encoded]


@pytest.fixture(scope="module")
def embed_server(embed_dir):
    with RemoteServer(embed_dir, "--runner", "pooling", *SERVE) as remote:
        yield remote


@pytest.fixture(scope="module")
def classifier_server(classifier_dir):
    with RemoteServer(classifier_dir, *SERVE) as remote:
        yield remote


@pytest.fixture(scope="module")
def cross_server(cross_dir):
    with RemoteServer(cross_dir, *SERVE) as remote:
        yield remote


def post(server, path, body):
    status, data, _ = server.post_json(path, body)
    assert status == 200, (path, body, data)
    return data


def embeddings(server, texts) -> list[torch.Tensor]:
    data = post(server, "/v1/embeddings", {"input": texts})["data"]
    return [torch.tensor(d["embedding"]) for d in data]


def cos(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def test_score_is_the_cosine_of_the_embeddings(embed_server):
    vectors = embeddings(embed_server, [QUERY] + TEXTS)
    one_to_n = post(embed_server, "/score", {"text_1": QUERY, "text_2": TEXTS})
    assert one_to_n["object"] == "list" and one_to_n["id"].startswith("score-")
    assert [d["index"] for d in one_to_n["data"]] == list(range(len(TEXTS)))
    assert all(d["object"] == "score" for d in one_to_n["data"])
    for d, vec in zip(one_to_n["data"], vectors[1:]):
        assert d["score"] == pytest.approx(cos(vectors[0], vec), abs=1e-5)
    n_to_n = post(embed_server, "/v1/score", {"queries": TEXTS[:2], "documents": TEXTS[2:]})
    assert [d["score"] for d in n_to_n["data"]] == pytest.approx(
        [cos(vectors[1], vectors[3]), cos(vectors[2], vectors[4])], abs=1e-5
    )
    assert n_to_n["usage"]["prompt_tokens"] > 0


def test_rerank_orders_documents_by_score_and_keeps_top_n(embed_server):
    scores = [d["score"] for d in post(embed_server, "/score", {"text_1": QUERY, "text_2": TEXTS})["data"]]
    want = sorted(range(len(TEXTS)), key=lambda i: -scores[i])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        full = post(embed_server, path, {"query": QUERY, "documents": TEXTS})
        assert full["id"].startswith("rerank-")
        assert [r["index"] for r in full["results"]] == want
        assert [r["relevance_score"] for r in full["results"]] == pytest.approx([scores[i] for i in want], abs=1e-5)
        assert [r["document"]["text"] for r in full["results"]] == [TEXTS[i] for i in want]
    top = post(embed_server, "/rerank", {"query": QUERY, "documents": TEXTS, "top_n": 2, "return_documents": False})
    assert [r["index"] for r in top["results"]] == want[:2]
    assert all("document" not in r for r in top["results"])


def test_pooling_returns_what_the_model_pools(embed_server):
    vectors = embeddings(embed_server, TEXTS[:2])
    pooled = post(embed_server, "/pooling", {"input": TEXTS[:2]})
    assert pooled["id"].startswith("pool-") and [d["object"] for d in pooled["data"]] == ["pooling"] * 2
    for d, vec in zip(pooled["data"], vectors):
        assert torch.allclose(torch.tensor(d["data"]), vec, atol=1e-6)
    raw = post(embed_server, "/pooling", {"input": TEXTS[0], "encoding_format": "base64", "task": "embed"})
    assert torch.allclose(
        torch.from_numpy(np.frombuffer(base64.b64decode(raw["data"][0]["data"]), "<f4").copy()), vectors[0], atol=1e-6
    )


def test_classify_matches_transformers_in_float32(classifier_server, classifier_dir):
    want = hf_logits(classifier_dir, TEXTS)
    logits = post(classifier_server, "/classify", {"input": TEXTS, "use_activation": False})
    probs = post(classifier_server, "/classify", {"input": TEXTS})
    assert logits["id"].startswith("classify-") and logits["object"] == "list"
    for raw, prob, ref in zip(logits["data"], probs["data"], want):
        assert raw["probs"] == pytest.approx(ref, abs=1e-4)
        assert prob["probs"] == pytest.approx(torch.tensor(ref).softmax(0).tolist(), abs=1e-5)
        assert prob["num_classes"] == 3 and prob["label"] == LABELS[int(np.argmax(ref))]
    pooled = post(classifier_server, "/pooling", {"input": TEXTS[0], "use_activation": False})
    assert pooled["data"][0]["data"] == pytest.approx(want[0], abs=1e-4)


def test_cross_encoder_scores_the_pair_as_transformers_does(cross_server, cross_dir):
    want = [torch.tensor(x).sigmoid().item() for x in hf_logits(cross_dir, [(QUERY, t) for t in TEXTS])]
    scores = post(cross_server, "/score", {"text_1": QUERY, "text_2": TEXTS})
    assert [d["score"] for d in scores["data"]] == pytest.approx(want, abs=1e-5)
    rerank = post(cross_server, "/v1/rerank", {"query": QUERY, "documents": TEXTS, "top_n": 3})
    assert [r["index"] for r in rerank["results"]] == sorted(range(len(TEXTS)), key=lambda i: -want[i])[:3]
    classify = post(cross_server, "/classify", {"input": TEXTS[0]})
    assert classify["data"][0]["num_classes"] == 1 and classify["data"][0]["label"] == "LABEL_0"


def test_llm_classify_and_score_match_transformers(classifier_dir, cross_dir):
    want = hf_logits(classifier_dir, TEXTS[:2])
    llm = LLM(model=classifier_dir, dtype="float32", device="cpu", max_model_len=256, kv_cache_memory=16 << 20)
    try:
        out = llm.classify(TEXTS[:2], pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
        assert [o.outputs.probs for o in out] == [pytest.approx(w, abs=1e-4) for w in want]
        assert out[0].outputs.num_classes == 3
        with pytest.raises(ValueError, match="one label"):
            llm.score(QUERY, TEXTS)
        with pytest.raises(ValueError, match="task"):
            llm.embed(TEXTS[0])
    finally:
        llm.shutdown()
    want = [torch.tensor(x).sigmoid().item() for x in hf_logits(cross_dir, [(QUERY, t) for t in TEXTS[:2]])]
    llm = LLM(model=cross_dir, dtype="float32", device="cpu", max_model_len=256, kv_cache_memory=16 << 20)
    try:
        assert [o.outputs.score for o in llm.score(QUERY, TEXTS[:2], use_tqdm=False)] == pytest.approx(want, abs=1e-5)
        with pytest.raises(ValueError, match="1:N or N:N"):
            llm.score(TEXTS[:2], TEXTS[:3])
    finally:
        llm.shutdown()


def test_qwen2_classifier_with_its_qkv_bias_matches_transformers(tmp_path):
    model = write_classifier(str(tmp_path), "Qwen2ForSequenceClassification", num_labels=2)
    want = hf_logits(model, TEXTS[:2])
    llm = LLM(model=model, dtype="float32", device="cpu", max_model_len=256, kv_cache_memory=16 << 20)
    try:
        out = llm.classify(TEXTS[:2], pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
        assert [o.outputs.probs for o in out] == [pytest.approx(w, abs=1e-4) for w in want]
    finally:
        llm.shutdown()


def test_a_classifier_is_a_pooling_model_without_flags(classifier_dir):
    mc = EngineArgs(model=classifier_dir, device="cpu").create_engine_config().model_config
    assert (mc.runner_type, mc.convert_type, mc.pooling_task) == ("pooling", "none", "classify")
    assert mc.classifier_labels == list(LABELS.values())


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(runner="generate"), "runner"),
        (dict(convert="embed"), "convert"),
        (dict(pooler_config={"pooling_type": "MEAN"}), "pooler_config.pooling_type"),
    ],
)
def test_classifier_runner_settings_name_their_field(classifier_dir, kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        EngineArgs(model=classifier_dir, device="cpu", **kwargs).create_engine_config()


def test_an_id2label_with_gaps_is_refused_at_start(tmp_path):
    from engine.models.default_model import write_tiny_model

    model = write_tiny_model(str(tmp_path), architectures=["LlamaForSequenceClassification"], id2label={0: "a", 2: "b"})
    with pytest.raises(ValueError, match="^id2label"):
        EngineArgs(model=model, device="cpu", load_format="dummy").create_engine_config()


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/score", {"text_1": TEXTS[:2], "text_2": TEXTS[:3]}, "text_2"),
        ("/score", {"text_1": QUERY}, "text_2"),
        ("/score", {"text_1": QUERY, "text_2": []}, "text_2"),
        ("/score", {"text_1": QUERY, "text_2": "x", "queries": "q", "documents": "d"}, "queries"),
        ("/score", {"text_1": [{"content": []}], "text_2": "x"}, "text_1"),
        ("/rerank", {"query": QUERY, "documents": []}, "documents"),
        ("/rerank", {"query": QUERY, "documents": [f"d{i}" for i in range(33)]}, "documents"),  # > 8 x max_num_seqs
        ("/rerank", {"query": QUERY, "documents": ["d"], "top_n": "2"}, "top_n"),
        ("/rerank", {"documents": ["d"]}, "query"),
        ("/rerank", {"query": "x" * 4000, "documents": ["d"]}, "prompt"),  # longer than max_model_len
        ("/pooling", {"input": "Hi", "task": "classify"}, "task"),
        ("/pooling", {"input": "Hi", "dimensions": 8}, "dimensions"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(embed_server, path, body, field):
    status, data, _ = embed_server.post_json(path, body)
    assert status == 400, data
    assert data["error"]["param"] == field, data
    assert post(embed_server, "/score", {"text_1": "a", "text_2": "b"})["data"]  # and it keeps serving


def test_routes_of_another_model_kind_are_refused(embed_server, classifier_server, tiny_model_dir):
    for server, path, body in [
        (embed_server, "/classify", {"input": "Hi"}),
        (classifier_server, "/v1/embeddings", {"input": "Hi"}),
        (classifier_server, "/score", {"text_1": "a", "text_2": "b"}),
        (classifier_server, "/rerank", {"query": "a", "documents": ["b"]}),
    ]:
        status, data, _ = server.post_json(path, body)
        assert status == 400 and data["error"]["code"] == "model_not_supported", (path, data)
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS) as generating:
        for path in ("/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"):
            status, data, _ = generating.post_json(path, {"input": "Hi"})
            assert status == 400 and "--runner pooling" in data["error"]["message"], (path, data)


def test_shared_pooling_fields_act_on_classify_score_and_rerank(cross_server, cross_dir):
    tokenizer, _ = hf(cross_dir)
    ids = tokenizer(TEXTS[3]).input_ids

    def logit(**body):
        return post(cross_server, "/classify", {"use_activation": False, **body})["data"][0]["probs"][0]

    left = post(cross_server, "/classify", {"input": TEXTS[3], "use_activation": False, "truncate_prompt_tokens": 3})
    assert left["usage"]["prompt_tokens"] == 3 and left["data"][0]["probs"][0] == logit(input=ids[-3:])
    assert logit(input=TEXTS[3], truncate_prompt_tokens=3, truncation_side="right") == logit(input=ids[:3])
    pair = tokenizer(QUERY, TEXTS[3]).input_ids
    cut = post(
        cross_server,
        "/score",
        {
            "text_1": QUERY,
            "text_2": TEXTS[3],
            "truncate_prompt_tokens": 4,
            "use_activation": False,
            "request_id": "s-1",
            "cache_salt": "tenant",
        },
    )
    assert cut["id"] == "score-s-1" and cut["usage"]["prompt_tokens"] == 4
    assert cut["data"][0]["score"] == pytest.approx(logit(input=pair[-4:]), abs=1e-6)
    ranked = post(
        cross_server, "/rerank", {"query": QUERY, "documents": [TEXTS[3]], "use_activation": False, "request_id": "r-1"}
    )
    assert ranked["id"] == "rerank-r-1"
    assert ranked["results"][0]["relevance_score"] == pytest.approx(logit(input=pair), abs=1e-6)
    status, data, _ = cross_server.post_json("/rerank", {"query": QUERY, "documents": ["d"], "priority": 1})
    assert status == 400 and data["error"]["param"] == "priority"  # this server schedules fcfs


@pytest.fixture(scope="module")
def cross_engine(cross_dir):
    """An in-process AsyncLLM over the cross-encoder (built outside any loop)."""
    from engine import AsyncEngineArgs, AsyncLLM

    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=cross_dir,
            dtype="float32",
            max_model_len=256,
            kv_cache_memory=16 << 20,
            num_threads=1,
            ring_capacity=4096,
        )
    )
    yield llm
    llm.shutdown()


async def test_pooling_and_scoring_bodies_are_parsed_on_the_renderer_pool_by_their_size(cross_engine, monkeypatch):
    """main's rule for every route: a body past INLINE_MAX_BYTES is decoded and checked (here: the
    1:N pairing too) on the renderer pool, weighed by its length (OpenAIServing.parse); a small one
    inline."""
    import contextlib

    import aiohttp
    from aiohttp.test_utils import TestServer

    from engine.entrypoints.openai.server import ServerSettings, build_app
    from engine.frontend import renderer as renderer_module

    monkeypatch.setattr(renderer_module, "INLINE_MAX_BYTES", 64)
    jobs: list[str] = []
    executor = cross_engine.renderer._executor
    submit = executor.submit
    monkeypatch.setattr(executor, "submit", lambda fn, *args: jobs.append(fn.__name__) or submit(fn, *args))

    @contextlib.asynccontextmanager
    async def shared_engine():
        yield cross_engine

    docs = [f"Document number {i} about the sky." for i in range(4)]
    bodies = {
        "/score": ("_parse_score", {"text_1": QUERY, "text_2": docs}),
        "/rerank": ("_parse_rerank", {"query": QUERY, "documents": docs}),
        "/classify": ("_parse_classify", {"input": docs}),
        "/pooling": ("_parse_pooling", {"input": docs}),
    }
    async with TestServer(build_app(shared_engine(), ServerSettings())) as server, aiohttp.ClientSession() as session:
        for path, (parse, body) in bodies.items():
            jobs.clear()
            async with session.post(str(server.make_url(path)), json=body) as resp:
                assert resp.status == 200, await resp.text()
            assert jobs and jobs[0] == parse, (path, jobs)
        jobs.clear()
        async with session.post(str(server.make_url("/classify")), json={"input": "Hi"}) as resp:
            assert resp.status == 200, await resp.text()
        assert "_parse_classify" not in jobs  # 15 bytes: parsed inline

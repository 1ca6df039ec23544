"""The field list walked: every field of vLLM's request models and SamplingParams has a place
(implemented, refused, or a no-op with its reason), and the server does what the place says.
Real ``ringllm serve`` processes on the tiny model (one generating, one pooling)."""

from __future__ import annotations

import os
import re

import pytest

from engine.entrypoints.openai import http_bodies, messages_bodies, pooling_bodies, responses_bodies
from engine.entrypoints.openai.field_support import PLACEMENT, NoOp, Refused
from engine.entrypoints.openai.vllm_fields import VLLM_FIELDS
from engine.sampling_params import VLLM_NO_OP_FIELDS, VLLM_UNSUPPORTED_FIELDS, SamplingParams
from tests.helpers.field_evidence import IMPLEMENTED
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer
from tests.helpers import ROOT

STRUCTS = {
    "ChatCompletionRequest": http_bodies.ChatCompletionRequest,
    "CompletionRequest": http_bodies.CompletionRequest,
    "EmbeddingRequest": http_bodies.EmbeddingRequest,
    "StreamOptions": http_bodies.StreamOptions,
    "SamplingParams": SamplingParams,
    "ResponsesRequest": responses_bodies.ResponsesRequest,
    "PoolingRequest": pooling_bodies.PoolingRequest,
    "ClassificationRequest": pooling_bodies.ClassificationRequest,
    "ScoreRequest": pooling_bodies.ScoreRequest,
    "RerankRequest": pooling_bodies.RerankRequest,
    "AnthropicMessagesRequest": messages_bodies.AnthropicMessagesRequest,
    "AnthropicCountTokensRequest": messages_bodies.AnthropicCountTokensRequest,
}
ROUTES = {
    "ChatCompletionRequest": "/v1/chat/completions",
    "CompletionRequest": "/v1/completions",
    "EmbeddingRequest": "/v1/embeddings",
    "ResponsesRequest": "/v1/responses",
    "PoolingRequest": "/pooling",
    "ClassificationRequest": "/classify",
    "ScoreRequest": "/score",
    "RerankRequest": "/rerank",
    "AnthropicMessagesRequest": "/v1/messages",
    "AnthropicCountTokensRequest": "/v1/messages/count_tokens",
}
_HI = [{"role": "user", "content": "Hi"}]
BASE = {
    "ChatCompletionRequest": {"messages": _HI, "max_tokens": 2},
    "CompletionRequest": {"prompt": "Hi", "max_tokens": 2},
    "EmbeddingRequest": {"input": "Hi"},
    "ResponsesRequest": {"input": "Hi", "max_output_tokens": 2},
    "PoolingRequest": {"input": "Hi"},
    "ClassificationRequest": {"input": "Hi"},
    "ScoreRequest": {"text_1": "Hi", "text_2": "Ho"},
    "RerankRequest": {"query": "Hi", "documents": ["Ho"]},
    "AnthropicMessagesRequest": {"model": "tiny", "messages": _HI, "max_tokens": 2},
    "AnthropicCountTokensRequest": {"model": "tiny", "messages": _HI},
}
# Declared by the struct but refused by the serving code for every value that asks something.
REFUSED_BY_SERVING = {
    ("CompletionRequest", "suffix"),
    ("EmbeddingRequest", "dimensions"),
    ("PoolingRequest", "dimensions"),
}
# Served by a one-label classification model (a cross-encoder); the other pooling routes by an
# embedding model.
CLASSIFIER_ROUTES = ("ClassificationRequest", "ScoreRequest", "RerankRequest")


def _placed(kind):
    return [
        (cls, name, place)
        for cls, fields in PLACEMENT.items()
        for name, place in fields.items()
        if isinstance(place, kind)
    ]


def test_every_vllm_field_has_a_place():
    """Fails when vLLM's list (vllm_fields.py) gains a field that ours does not place."""
    for cls, names in VLLM_FIELDS.items():
        missing = sorted(set(names) - set(PLACEMENT[cls]) - set(IMPLEMENTED[cls]))
        assert not missing, (
            f"{cls}: vLLM's fields {missing} are neither placed in field_support.PLACEMENT "
            "nor proven implemented in tests/helpers/field_evidence.py"
        )


def test_no_field_is_both_implemented_and_refused_or_ignored():
    for cls, fields in IMPLEMENTED.items():
        both = sorted(set(fields) & set(PLACEMENT[cls]))
        assert not both, f"{cls}: {both} are placed as refused or no-op and listed as implemented"


def test_each_no_op_says_why():
    for cls, name, place in _placed(NoOp):
        assert len(place.reason) > 20, f"{cls}.{name}: a no-op needs its reason"


def _test_exists(test_id: str) -> bool:
    path, _, name = test_id.partition("::")
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):
        return False
    with open(full) as f:
        return re.search(rf"^(async )?def {re.escape(name)}\(", f.read(), re.MULTILINE) is not None


_IMPLEMENTED = [(cls, name, tests) for cls, fields in IMPLEMENTED.items() for name, tests in fields.items()]


@pytest.mark.parametrize("cls,name,tests", _IMPLEMENTED, ids=[f"{c}.{n}" for c, n, _ in _IMPLEMENTED])
def test_an_implemented_field_is_declared_and_names_tests_that_exist(cls, name, tests):
    assert name in STRUCTS[cls].__struct_fields__, f"{cls}.{name} is marked implemented but not declared"
    assert tests
    for test_id in tests:
        assert _test_exists(test_id), f"{cls}.{name}: its test {test_id} does not exist"


def test_a_refused_field_is_undeclared_unless_the_serving_code_refuses_it():
    for cls, name, _ in _placed(Refused):
        if cls in ROUTES:
            assert (name not in STRUCTS[cls].__struct_fields__) or (cls, name) in REFUSED_BY_SERVING, (
                f"{cls}.{name} is declared (so perhaps implemented) but placed as refused"
            )


def test_sampling_params_fields_are_implemented_by_the_struct():
    """vLLM's SamplingParams fields placed as implemented are real fields, and each one is
    taken by the constructor and kept; the refused ones are a ValueError naming them, the no-ops
    are accepted, and a name vLLM does not have is a TypeError, as in vLLM."""
    for name in IMPLEMENTED["SamplingParams"]:
        assert name in SamplingParams.__struct_fields__
    for name, default in VLLM_UNSUPPORTED_FIELDS.items():
        assert SamplingParams(**{name: default}) == SamplingParams()
        with pytest.raises(ValueError, match=rf"SamplingParams\.{name} is not supported"):
            SamplingParams(**{name: 3})
    assert SamplingParams(max_tokens=3, **{name: True for name in VLLM_NO_OP_FIELDS}) == SamplingParams(max_tokens=3)
    with pytest.raises(TypeError, match="no_such_field"):
        SamplingParams(no_such_field=1)


# ---- over HTTP ----


@pytest.fixture(scope="module")
def log_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("field-support") / "server.log")


@pytest.fixture(scope="module")
def server(tiny_model_dir, log_path):
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny", log=log_path) as remote:
        yield remote


@pytest.fixture(scope="module")
def pooling_server(tiny_model_dir):
    with RemoteServer(tiny_model_dir, "--runner", "pooling", *TINY_SERVE_ARGS) as remote:
        yield remote


@pytest.fixture(scope="module")
def classifier_server(tmp_path_factory):
    from engine.models.default_model import write_tiny_model

    model = write_tiny_model(
        str(tmp_path_factory.mktemp("cross-encoder")), architectures=["LlamaForSequenceClassification"], num_labels=1
    )
    with RemoteServer(model, *TINY_SERVE_ARGS) as remote:
        yield remote


@pytest.fixture
def servers(request, server, pooling_server, classifier_server):
    """The server of the request struct the test is parametrized with."""
    cls = request.node.callspec.params["cls"]
    if cls in CLASSIFIER_ROUTES:
        return classifier_server
    return pooling_server if cls in ("EmbeddingRequest", "PoolingRequest") else server


_REFUSED_HTTP = [(cls, name, place) for cls, name, place in _placed(Refused) if cls in ROUTES]


@pytest.mark.parametrize("cls,name,place", _REFUSED_HTTP, ids=[f"{c}.{n}" for c, n, _ in _REFUSED_HTTP])
def test_a_refused_field_is_400_naming_it(cls, name, place, servers):
    status, body, _ = servers.post_json(ROUTES[cls], {**BASE[cls], name: place.example})
    assert status == 400, f"{cls}.{name}={place.example!r} answered {status}: {body}"
    error = body["error"]  # Anthropic's shape has no param: its message names the field
    assert error.get("param", error["message"].split()[0]) == name and "support" in error["message"]


@pytest.mark.parametrize("cls", list(ROUTES))
def test_refused_fields_at_values_that_ask_nothing_are_accepted(cls, servers):
    inert = {
        name: place.inert[-1] for c, name, place in _REFUSED_HTTP if c == cls and (cls, name) not in REFUSED_BY_SERVING
    }
    status, body, _ = servers.post_json(ROUTES[cls], {**BASE[cls], **inert})
    assert status == 200, body


def test_a_field_vllm_does_not_know_is_ignored_with_one_warning(server, log_path):
    for _ in range(3):
        status, body, _ = server.post_json(
            ROUTES["CompletionRequest"], {**BASE["CompletionRequest"], "no_such_field_anywhere": 1}
        )
        assert status == 200 and body["choices"]
    with open(log_path) as f:
        warnings = [line for line in f if "no_such_field_anywhere" in line]
    assert len(warnings) == 1 and "were present in the request but ignored" in warnings[0]

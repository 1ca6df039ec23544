"""Chat templates are untrusted code: every render is bounded in time, steps and size, runs off
the event loop, and a request's template is a template's text, never a path.

Through a real ``ringllm serve`` (the tiny dummy-weight model, whose tokenizer directory is
given a pathological template), a real ``LLM``, and the sandbox itself
(engine/frontend/chat_template.py) for each bound it enforces.
"""

from __future__ import annotations

import json
import os
import shutil
import threading

import pytest

from engine import LLM, SamplingParams
from engine.frontend.chat_template import TemplateLimitError, TemplateLimits, render_chat
from engine.frontend.tokenizer import FastTokenizer
from tests.helpers.openai_server_utils import TINY_SERVE_ARGS, RemoteServer, post_while_probing_health
from tests.helpers.engine_utils import TINY

USER = [{"role": "user", "content": "hi"}]
RANGE = "{% for i in range(10**9) %}x{% endfor %}"
NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
# Each of these would run for hours or take gigabytes without the sandbox's bounds.
PATHOLOGICAL = {
    "huge range": RANGE,
    "nested loops": NESTED,
    "nested loops writing nothing": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loop filtering out everything": "{% set l = range(100000)|list %}{% for i in l %}{% for j in l if false %}"
    "{% endfor %}{% endfor %}",
    "string times a big number": "{{ 'x' * 10**10 }}",
    "string method with a big width": "{{ 'x'.ljust(10**10) }}",
    "filter with a big width": "{{ 'x'|center(1000000000) }}",
    "string doubled with ~": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "string doubled with +": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "self-sharing list written out": "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}"
    "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l|tojson|length }}",
    "binary recursion": "{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "format width": "{{ '{:>1000000000}'.format('x') }}",
    "percent width": "{{ '%1000000000s' % 'x' }}",
    "replace growing": "{% set s = 'x' * 100000 %}{{ s.replace('x', 'y' * 100000) }}",
    "join growing": "{% set s = 'x' * 100000 %}{{ (s|list)|join('y' * 50000) }}",
    "indent growing": "{% set s = '\n' * 100000 %}{{ s|indent(100000) }}",
    "tabs growing": "{% set s = '\t' * 100000 %}{{ s.expandtabs(100000) }}",
    "integer power": "{% set ns = namespace(n=10) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}"
    "{% endfor %}{{ ns.n }}",
}


@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_each_pathological_template_is_stopped_by_a_bound(name):
    with pytest.raises(TemplateLimitError):
        render_chat(PATHOLOGICAL[name], USER, special_tokens={}, limits=TemplateLimits(max_chars=1 << 20))


def test_the_time_bound_stops_a_render_that_stays_within_its_steps():
    limits = TemplateLimits(timeout_s=0.2, max_iterations=10**12)
    with pytest.raises(TemplateLimitError, match="longer than 0.2 s"):
        render_chat(PATHOLOGICAL["nested loops writing nothing"], USER, special_tokens={}, limits=limits)


def test_a_template_source_past_its_bound_is_refused_before_compiling():
    with pytest.raises(ValueError, match="at most 131072 are allowed"):
        render_chat("{{ x }}" * 20000, USER, special_tokens={})


def test_output_past_max_chars_is_refused_and_within_it_rendered():
    template = "{% for i in range(1000) %}x{% endfor %}"
    assert render_chat(template, USER, special_tokens={}, limits=TemplateLimits(max_chars=1000)) == "x" * 1000
    with pytest.raises(TemplateLimitError, match="longer than 999 characters"):
        render_chat(template, USER, special_tokens={}, limits=TemplateLimits(max_chars=999))


# ---------------------------------------------------------------- a model directory's template
def _model_with_template(tiny_model_dir: str, dst: str, template: str) -> str:
    shutil.copytree(tiny_model_dir, dst)
    path = os.path.join(dst, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["chat_template"] = template
    with open(path, "w") as f:
        json.dump(config, f)
    jinja = os.path.join(dst, "chat_template.jinja")  # it would win over tokenizer_config's
    if os.path.exists(jinja):
        os.remove(jinja)
    return dst


def _chat_while_probing_health(server: RemoteServer, payload: dict) -> tuple[tuple, list[tuple[int, float]]]:
    """The chat request's answer, and each /health (status, round trip) sent while it ran."""
    return post_while_probing_health(server, "/v1/chat/completions", payload)


@pytest.mark.slow
@pytest.mark.parametrize("template", [RANGE, NESTED], ids=["range-1e9", "nested-loops"])
def test_a_pathological_model_template_is_a_400_and_health_answers_meanwhile(tiny_model_dir, tmp_path, template):
    model = _model_with_template(tiny_model_dir, str(tmp_path / "model"), template)
    with RemoteServer(model, *TINY_SERVE_ARGS, "--served-model-name", "tiny") as server:
        (status, body, _), probes = _chat_while_probing_health(
            server, {"model": "tiny", "messages": USER, "max_tokens": 2}
        )
        assert status == 400, body
        assert body["error"]["param"] == "messages" and "chat template" in body["error"]["message"]
        # /health answered throughout. Its round trip is ~1 ms on an idle machine; 5 s is a
        # bound generous enough for CI under load (before, it did not answer until the end).
        assert probes and all(code == 200 for code, _ in probes)
        assert max(rtt for _, rtt in probes) < 5.0, probes
        assert server.post_json("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2})[0] == 200


@pytest.mark.slow
def test_sigterm_during_a_pathological_render_stops_the_server(tiny_model_dir, tmp_path):
    model = _model_with_template(tiny_model_dir, str(tmp_path / "model"), NESTED)
    with RemoteServer(model, *TINY_SERVE_ARGS, "--served-model-name", "tiny") as server:
        result: dict = {}
        request = threading.Thread(
            target=lambda: result.update(
                answer=server.post_json("/v1/chat/completions", {"model": "tiny", "messages": USER, "max_tokens": 2})
            )
        )
        request.start()
        for _ in range(3):  # the loop has run while the request is in its render
            assert server.get("/health")[0] == 200
        assert request.is_alive(), result
        server.stop(timeout=20)  # SIGTERM; stop() asserts the server and its EngineCore are gone in time
        request.join(30)
        assert result["answer"][0] == 400  # the render stopped at its bound, and the drain let it answer


# ---------------------------------------------------------------- a request's template
@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS, "--served-model-name", "tiny") as server:
        yield server


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return FastTokenizer.from_dir(tiny_model_dir)


def _chat(server, **fields) -> tuple[int, dict]:
    status, body, _ = server.post_json(
        "/v1/chat/completions", {"model": "tiny", "messages": USER, "max_tokens": 1, **fields}
    )
    return status, body


def test_a_request_chat_template_is_rendered(server, tokenizer):
    template = "{% for m in messages %}[{{ m.role }}|{{ m.content }}]{% endfor %}{{ flag }}"
    status, body = _chat(server, chat_template=template, chat_template_kwargs={"flag": "!"})
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode("[user|hi]!", add_special_tokens=False))


def test_a_request_chat_template_is_never_read_as_a_path(server, tokenizer):
    status, body = _chat(server, chat_template="/etc/passwd")
    assert status == 200, body  # the text "/etc/passwd" is a template that writes itself
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode("/etc/passwd", add_special_tokens=False))


@pytest.mark.parametrize(
    "template,param",
    [
        ("{% for m in messages %}", "chat_template"),
        (NESTED, "chat_template"),
        ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "chat_template"),
        ("{{ raise_exception('no system message') }}", "chat_template"),
    ],
)
def test_a_bad_request_template_is_a_400_naming_it(server, template, param):
    status, body = _chat(server, chat_template=template)
    assert status == 400, body
    assert body["error"]["param"] == param
    assert "chat template" in body["error"]["message"] and "engine." not in body["error"]["message"]


def _hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_continue_final_message_leaves_the_last_message_open(server, tiny_model_dir, tokenizer):
    messages = [*USER, {"role": "assistant", "content": "The answer is"}]
    status, body = _chat(server, messages=messages, continue_final_message=True, add_generation_prompt=False)
    assert status == 200, body
    hf = _hf_tokenizer(tiny_model_dir)
    expected = hf.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert expected.endswith("The answer is")  # no end of turn: the model continues the message
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode(expected, add_special_tokens=False))
    closed = _chat(server, messages=messages, add_generation_prompt=False)[1]
    assert closed["usage"]["prompt_tokens"] > body["usage"]["prompt_tokens"]


def test_continue_final_message_with_add_generation_prompt_is_a_400(server):
    messages = [*USER, {"role": "assistant", "content": "The answer is"}]
    status, body = _chat(server, messages=messages, continue_final_message=True)  # add_generation_prompt: true
    assert status == 400 and body["error"]["param"] == "continue_final_message", body


@pytest.mark.parametrize("key", ["conversation", "messages", "chat_template"])
def test_chat_template_kwargs_cannot_set_the_request_fields(server, key):
    status, body = _chat(server, chat_template_kwargs={key: "x"})
    assert status == 400 and body["error"]["param"] == "chat_template_kwargs", body
    assert "apply_chat_template" not in body["error"]["message"]


def test_chat_template_kwargs_override_the_named_arguments_as_in_vllm(server, tokenizer):
    template = "{{ messages[0].content }}{% if add_generation_prompt %}+{% endif %}{{ tokenize }}"
    status, body = _chat(
        server, chat_template=template, chat_template_kwargs={"add_generation_prompt": False, "tokenize": "?"}
    )
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode("hi?", add_special_tokens=False))


# ---------------------------------------------------------------- the Python API
@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, **TINY)
    yield llm
    llm.shutdown()


PARAMS = SamplingParams(max_tokens=1, temperature=0.0)


@pytest.mark.parametrize("path", ["/etc/passwd", "/bin/sh"])
def test_llm_chat_refuses_a_file_that_is_not_a_template(llm, path):
    with pytest.raises(ValueError, match="chat_template: the file .* not"):
        llm.chat(USER, PARAMS, use_tqdm=False, chat_template=path)


def test_llm_chat_reads_a_template_file_and_takes_a_template_text(llm, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}({{ m.content }}){% endfor %}")
    assert llm.chat(USER, PARAMS, use_tqdm=False, chat_template=str(path))[0].prompt == "(hi)"
    assert llm.chat(USER, PARAMS, use_tqdm=False, chat_template="<{{ messages[0].content }}>")[0].prompt == "<hi>"


def test_llm_chat_with_a_pathological_template_is_a_value_error(llm):
    with pytest.raises(ValueError, match="chat template"):
        llm.chat(USER, PARAMS, use_tqdm=False, chat_template=NESTED)


def test_llm_chat_continues_the_final_message(llm):
    messages = [*USER, {"role": "assistant", "content": "The answer is"}]
    (out,) = llm.chat(messages, PARAMS, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)
    assert out.prompt.endswith("The answer is")
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(messages, PARAMS, use_tqdm=False, continue_final_message=True)

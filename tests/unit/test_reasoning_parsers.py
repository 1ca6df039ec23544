"""The reasoning parsers and the core's reasoning markers, on the real default tokenizer (where
``</think>`` is three tokens of plain text) and on a copy that has the markers as single tokens
(as Qwen3's and DeepSeek-R1's tokenizers do)."""

from __future__ import annotations

import json
import os

import pytest
from tokenizers import Tokenizer

from engine.entrypoints.openai.reasoning_parsers import ReasoningParserManager, ReasoningStreamer
from engine.models.default_model import default_tokenizer_path
from engine.structured_output.reasoning import ReasoningMarkers

REPLIES = [
    "plan: add 2 and 2</think>It is 4.",
    "<think>\nplan</think>\n\nanswer",
    "  <think>a</think>",
    "no end at all",
    "</think>only content",
    "x </thin",
    "",
    "<thi",
    "a</think>b</think>c",
]


def _tokenizer_path() -> str:
    return os.path.join(default_tokenizer_path(), "tokenizer.json")


@pytest.fixture(scope="module")
def single_token_markers(tmp_path_factory) -> str:
    """The default tokenizer with ``<think>`` and ``</think>`` added as (non-special) tokens."""
    with open(_tokenizer_path(), encoding="utf-8") as f:
        spec = json.load(f)
    next_id = max(t["id"] for t in spec["added_tokens"]) + 1 + len(spec["model"]["vocab"])
    for k, text in enumerate(("<think>", "</think>")):
        spec["added_tokens"].append(
            {
                "id": next_id + k,
                "content": text,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": False,
            }
        )
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
def test_whole_replies_split_as_vllm_does(name):
    parser = ReasoningParserManager.get_reasoning_parser(name)()
    assert parser.split("plan</think>It is 4.") == ("plan", "It is 4.")
    assert parser.split("<think>\nplan</think>\n\nanswer") == ("\nplan", "\n\nanswer")
    assert parser.split("still thinking") == ("still thinking", "")  # cut short: all reasoning
    assert parser.split("a</think>b</think>c") == ("a", "b</think>c")


def test_qwen3_enable_thinking_false_and_a_closed_prompt_give_no_reasoning():
    qwen3 = ReasoningParserManager.get_reasoning_parser("qwen3")
    assert qwen3(None, {"enable_thinking": False}).split("<think>x</think>y") == (None, "<think>x</think>y")
    assert qwen3(None, {"enable_thinking": True}).split("x</think>y") == ("x", "y")
    deepseek = ReasoningParserManager.get_reasoning_parser("deepseek_r1")
    closed = deepseek.prompt_closes_reasoning("<user>hi<assistant><think>\n\n</think>\n\n")
    assert closed and not deepseek.prompt_closes_reasoning("<assistant>old</think><assistant><think>\n")
    assert not deepseek.prompt_closes_reasoning("<assistant>")
    assert deepseek(None, None, closed).split("a</think>b") == (None, "a</think>b")


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize("reply", REPLIES)
def test_streamed_pieces_add_up_to_the_whole_split(name, reply):
    """Token by token (the default tokenizer's pieces, ``</think>`` in three) and character by
    character, the streamed reasoning and content are the whole reply's, and no piece is ever
    a partial marker that is later taken back."""
    tokenizer = Tokenizer.from_file(_tokenizer_path())
    ids = tokenizer.encode(reply, add_special_tokens=False).ids
    token_pieces = [tokenizer.decode(ids[: i + 1]) for i in range(len(ids))]
    token_pieces = [p[len(q) :] for p, q in zip(token_pieces, [""] + token_pieces)]
    parser_cls = ReasoningParserManager.get_reasoning_parser(name)
    whole = parser_cls().parse(reply, final=True)
    for pieces in (token_pieces, list(reply)):
        streamer = ReasoningStreamer(parser_cls())
        out = [streamer.feed(p) for p in pieces] + [streamer.finish()]
        assert ("".join(r for r, _ in out), "".join(c for _, c in out)) == whole


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError, match=r"invalid reasoning parser: nope \(choose from deepseek_r1, qwen3\)"):
        ReasoningParserManager.get_reasoning_parser("nope")


def test_core_markers_are_runs_of_ids_or_single_ids(single_token_markers):
    multi = ReasoningMarkers.load(_tokenizer_path(), "<think>", "</think>")
    assert multi.end == (9617, 17400, 46) and len(multi.start) == 3
    single = ReasoningMarkers.load(single_token_markers, "<think>", "</think>")
    assert len(single.start) == len(single.end) == 1
    for markers in (multi, single):
        s, e = list(markers.start), list(markers.end)
        assert markers.ended([5, *s, 7, *e, 9]) and not markers.ended([5, *e, *s, 7]) and not markers.ended([5, 6])
        assert markers.ends_with_end([1, 2, *e])
        assert not markers.ends_with_end([*e, 3]) and not markers.ends_with_end([])
    assert not multi.ends_with_end([9617, 17400])  # a partial run is no end
    assert ReasoningMarkers.load(os.path.dirname(single_token_markers) + "/missing", "<think>", "</think>") is None

"""The byte-level table detokenizer against the tokenizers library's DecodeStream: the same
text piece by piece, for any token sequence (characters split across tokens, invalid byte
sequences, special tokens kept or skipped, ids beyond the vocabulary), and stop strings."""

from __future__ import annotations

import random

import pytest

from engine.frontend.detokenizer import ByteLevelDetokenizer, ByteLevelTable, StreamDetokenizer, make_detokenizer
from engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def backend():
    from transformers import AutoTokenizer

    from engine.models.default_model import default_tokenizer_path

    return AutoTokenizer.from_pretrained(default_tokenizer_path()).backend_tokenizer


@pytest.fixture(scope="module")
def table(backend):
    table = ByteLevelTable.build(backend)
    assert table is not None
    return table


def pieces(detokenizer, token_ids, per_step):
    out = []
    for i in range(0, len(token_ids), per_step):
        detokenizer.update(token_ids[i : i + per_step], False)
        out.append(detokenizer.get_next_output_text(False, True))
    return out


@pytest.mark.parametrize("skip_special", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_same_pieces_as_decode_stream(backend, table, skip_special, seed):
    rng = random.Random(seed)
    vocab = backend.get_vocab_size()
    # Byte tokens (single bytes: continuation and lead bytes split characters, some invalid),
    # special tokens, ordinary tokens, and ids the tokenizer does not have.
    byte_tokens = [i for i in range(vocab) if len(table.raw[i]) == 1]
    assert any(table.texts[i] is None for i in byte_tokens)  # bytes that are no character alone
    text_ids = backend.encode("héllo wörld 你好 🙂 naïve café — ok").ids
    choices = byte_tokens + list(range(20)) + text_ids + [vocab, vocab + 7]
    params = SamplingParams(skip_special_tokens=skip_special)
    for trial in range(25):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(0, 9))]
        ids = [rng.choice(choices) for _ in range(rng.randrange(1, 40))]
        per_step = rng.choice([1, 1, 2, 5])
        fast = pieces(ByteLevelDetokenizer(table, prompt, params), ids, per_step)
        slow = pieces(StreamDetokenizer(backend, prompt, params), ids, per_step)
        assert fast == slow, (prompt, ids, per_step)


def test_made_for_the_tokenizer_kind(backend, table):
    params = SamplingParams()
    assert isinstance(make_detokenizer(backend, table, [1, 2], params), ByteLevelDetokenizer)
    assert isinstance(make_detokenizer(backend, None, [1, 2], params), StreamDetokenizer)


def test_a_tokenizer_of_another_kind_gets_no_table():
    from tokenizers import Tokenizer, decoders, models

    other = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    other.decoder = decoders.Metaspace()
    assert ByteLevelTable.build(other) is None


@pytest.mark.parametrize("cls", ["table", "stream"])
def test_stop_string_after_min_tokens_in_one_update(backend, table, cls):
    ids = backend.encode(" stop here stop there").ids
    params = SamplingParams(stop=["stop"], min_tokens=2)
    detokenizer = ByteLevelDetokenizer(table, [], params) if cls == "table" else StreamDetokenizer(backend, [], params)
    assert detokenizer.update(ids, False) == "stop"  # the first " stop" is inside min_tokens
    assert detokenizer.output_text == " stop here "

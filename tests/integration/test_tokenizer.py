"""The frontend's tokenizer without transformers (engine/frontend/tokenizer.py) gives transformers' results.

Compared with ``AutoTokenizer`` on the same directory: ids, text, special tokens, chat
prompts; then the directories it must leave to transformers, what users get from
``get_tokenizer()``, and a frontend that starts without importing torch or transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from engine.frontend.tokenizer import FastTokenizer
from engine.models.default_model import default_tokenizer_path

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\n\nnewlines",
    "wörld 你好 🙂",
    "<|im_start|>user\nhi<|im_end|>",
    "don't stop . , ! ?",
    "",
    "a" * 3000,
]
CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again"},
    ],
    [{"role": "user", "content": "Say it"}, {"role": "assistant", "content": "Sure, here", "name": None}],
]


@pytest.fixture(scope="module")
def pair():
    from transformers import AutoTokenizer

    path = default_tokenizer_path()
    fast = FastTokenizer.from_dir(path)
    assert fast is not None
    return fast, AutoTokenizer.from_pretrained(path)


def test_ids_and_text_are_transformers(pair):
    fast, hf = pair
    for text in TEXTS:
        for special in (True, False):
            assert fast.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special)
        ids = hf.encode(text) + [hf.eos_token_id]
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
        assert fast.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)


def test_special_tokens_and_limits_are_transformers(pair):
    fast, hf = pair
    assert fast.special_tokens_map == hf.special_tokens_map
    assert (fast.eos_token_id, fast.bos_token_id, fast.pad_token_id) == (
        hf.eos_token_id,
        hf.bos_token_id,
        hf.pad_token_id,
    )
    assert sorted(fast.all_special_ids) == sorted(hf.all_special_ids)
    assert (len(fast), fast.model_max_length, fast.truncation_side) == (
        len(hf),
        hf.model_max_length,
        hf.truncation_side,
    )
    assert fast.clean_up_tokenization_spaces == hf.clean_up_tokenization_spaces
    assert fast.get_vocab() == hf.get_vocab()


@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_chat_prompts_are_transformers(pair, chat):
    fast, hf = pair
    messages = CHATS[chat]
    for kwargs in (
        {"add_generation_prompt": True},
        {"add_generation_prompt": False},
        {"continue_final_message": messages[-1]["role"] == "assistant"},
        {"add_generation_prompt": True, "custom_flag": "x"},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {
            "chat_template": "{% for m in messages %}[{{ m.role }}|{{ m.content }}|{{ eos_token }}]"
            "{% endfor %}{{ custom_flag }}",
            "custom_flag": "!",
        },
    ):
        expected = hf.apply_chat_template(messages, tokenize=False, **kwargs)
        assert fast.apply_chat_template(messages, tokenize=False, **kwargs) == expected, kwargs
        assert fast.apply_chat_template(messages, **kwargs) == hf.encode(expected, add_special_tokens=False)


def test_chat_template_errors_are_the_same_kind(pair):
    fast, hf = pair
    for bad in ([], [{"role": "user", "content": "x"}]):
        kwargs = {"chat_template": "{{ raise_exception('no') }}"} if bad else {}
        with pytest.raises(Exception) as theirs:
            hf.apply_chat_template(bad, tokenize=False, **kwargs)
        with pytest.raises(type(theirs.value)):
            fast.apply_chat_template(bad, tokenize=False, **kwargs)


def _copy(src: str, dst: str, config_changes: dict, tokenizer_json=None) -> str:
    os.makedirs(dst)
    for name in os.listdir(src):
        if name.startswith("tokenizer") or name.startswith("chat_template"):
            shutil.copy(os.path.join(src, name), dst)
    with open(os.path.join(dst, "tokenizer_config.json")) as f:
        config = json.load(f)
    config.update(config_changes)
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    if tokenizer_json is not None:
        with open(os.path.join(dst, "tokenizer.json")) as f:
            data = json.load(f)
        tokenizer_json(data)
        with open(os.path.join(dst, "tokenizer.json"), "w") as f:
            json.dump(data, f)
    return dst


@pytest.mark.parametrize("force_clean_up", [False, True])
def test_a_transformers_4_fast_tokenizer_that_adds_a_bos_and_cleans_up_spaces(tmp_path, force_clean_up):
    """tokenizer.json's own post-processor (a BOS before every text) and the clean-up flags
    (which transformers ignores for a BPE model unless forced)."""
    from transformers import AutoTokenizer

    from engine.frontend.renderer import decode

    def add_bos(data):
        bos = {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
        }

    path = _copy(
        default_tokenizer_path(),
        str(tmp_path / "tok"),
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": True,
            "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": force_clean_up,
            "model_max_length": 2048,
            "truncation_side": "left",
            "extra_special_tokens": ["<repo_name>"],
        },
        add_bos,
    )
    fast, hf = FastTokenizer.from_dir(path), AutoTokenizer.from_pretrained(path)
    assert fast is not None
    for text in TEXTS:
        assert fast.encode(text) == hf.encode(text) and fast.encode(text)[:1] == [1]
        assert fast.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
        ids = hf.encode(text)
        assert fast.decode(ids) == hf.decode(ids) == decode(fast, ids) == decode(hf, ids)
    assert (fast.model_max_length, fast.truncation_side) == (hf.model_max_length, hf.truncation_side)
    assert sorted(fast.all_special_ids) == sorted(hf.all_special_ids)


@pytest.mark.parametrize("changes", [{"tokenizer_class": "LlamaTokenizer"}, {"add_bos_token": True}, {"legacy": False}])
def test_tokenizers_transformers_would_change_are_left_to_transformers(tmp_path, changes):
    from engine.config import EngineArgs, create_engine_config
    from engine.frontend.input_processor import get_tokenizer
    from engine.models.default_model import write_tiny_model

    model = write_tiny_model(str(tmp_path / "model"))
    _copy(default_tokenizer_path(), str(tmp_path / "tok"), changes)
    assert FastTokenizer.from_dir(str(tmp_path / "tok")) is None
    config = create_engine_config(EngineArgs(model=model, tokenizer=str(tmp_path / "tok"), load_format="dummy"))
    assert not isinstance(get_tokenizer(config), FastTokenizer)


def test_users_get_a_transformers_tokenizer(tiny_model_dir):
    from transformers import PreTrainedTokenizerBase

    from engine import LLM

    llm = LLM(model=tiny_model_dir, load_format="dummy", max_model_len=256, kv_cache_memory_bytes=16 << 20)
    try:
        assert isinstance(llm.llm_engine.tokenizer, FastTokenizer)
        user = llm.get_tokenizer()
        assert isinstance(user, PreTrainedTokenizerBase) and user is llm.get_tokenizer()
        assert user.encode("Hello there") == llm.llm_engine.tokenizer.encode("Hello there")
    finally:
        llm.shutdown()


def test_the_frontend_imports_neither_torch_nor_transformers(tiny_model_dir):
    """Their imports were most of the time to ready (benchmarks/RESULTS.md, start-up); a chat
    request imports transformers' template renderer, still without torch."""
    code = (
        "import sys\n"
        "from engine import LLM, SamplingParams\n"
        f"llm = LLM(model={tiny_model_dir!r}, load_format='dummy', max_model_len=256, "
        "kv_cache_memory_bytes=16 << 20)\n"
        "out = llm.generate(['Hello'], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)\n"
        "assert len(out[0].outputs[0].token_ids) == 4, out\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
        "chat = llm.chat([{'role': 'user', 'content': 'hi'}], SamplingParams(max_tokens=2), use_tqdm=False)\n"
        "assert chat[0].prompt.startswith('<|im_start|>'), chat[0].prompt\n"
        "llm.shutdown()\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # Chat templates are rendered by transformers' renderer, which needs no torch.
    assert result.stdout.strip().splitlines()[-2:] == ["[]", "['transformers']"], result.stdout

"""The model's tokenizer, read with the ``tokenizers`` package alone where that gives transformers' results.

Why: ``AutoTokenizer`` imports transformers and, through it, torch: ~3 s of CPU in a frontend
that otherwise needs neither, on the path of every ``LLM()`` and ``ringllm serve`` start.
A tokenizer directory whose ``tokenizer_config.json`` names the plain fast class
(``TokenizersBackend``, or ``PreTrainedTokenizerFast`` in transformers 4's files) and sets no
flag that makes transformers rebuild the post-processor is exactly its ``tokenizer.json``:
``FastTokenizer`` reads that, the special tokens and the chat template, and gives the same
ids, text and prompts (the suite checks each against ``AutoTokenizer``).
Chat templates are rendered in engine/frontend/chat_template.py's bounded sandbox, the same
environment as transformers' renderer (whose message helpers it uses: ``chat_template_utils``
imports no torch), loaded at the first chat request. Every other tokenizer goes through
``AutoTokenizer`` as before.

``get_tokenizer()`` of ``LLM`` and ``AsyncLLM`` still hands users a transformers tokenizer
(vLLM's contract), built on first call from the same directory.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from engine.hf_config import ModelConfigError, read_json_object

# tokenizer_config.json classes whose tokenizer is the tokenizer.json as saved.
_PLAIN_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
# Keys that make transformers change the loaded tokenizer.json (post-processor, normaliser).
_REBUILDING_KEYS = frozenset({"add_bos_token", "add_eos_token", "add_prefix_space", "legacy", "auto_map"})
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
VERY_LARGE_INTEGER = int(1e30)  # transformers' model_max_length when the config has none


def _token_text(value: Any) -> Optional[str]:
    """A special token as its text: configs store a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: str) -> dict:
    return read_json_object(path, "tokenizer")


class FastTokenizer:
    """The subset of a transformers fast tokenizer that ringllm's frontend uses, same names."""

    def __init__(self, path: str, backend: Any, config: dict, chat_template: Optional[str]) -> None:
        self.name_or_path = path
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        self.model_max_length = int(config.get("model_max_length") or VERY_LARGE_INTEGER)
        self.truncation_side = config.get("truncation_side", "right")
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = bool(
            config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
        )
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        self._extra_special = [t for t in map(_token_text, extra if isinstance(extra, list) else []) if t]
        self.special_tokens_map = {
            name: text for name in _SPECIAL_NAMES if (text := _token_text(config.get(name))) is not None
        }
        for name in _SPECIAL_NAMES:  # bos_token, bos_token_id, ... as transformers names them
            text = self.special_tokens_map.get(name)
            setattr(self, name, text)
            setattr(self, name + "_id", None if text is None else backend.token_to_id(text))
        self._hf = None

    @classmethod
    def from_dir(cls, path: str) -> Optional["FastTokenizer"]:
        """``path``'s tokenizer, or None when only transformers can load it faithfully."""
        files = {name: os.path.join(path, name) for name in ("tokenizer.json", "tokenizer_config.json")}
        if not all(os.path.isfile(p) for p in files.values()):
            return None
        config = _read_json(files["tokenizer_config.json"])
        if config.get("tokenizer_class") not in _PLAIN_CLASSES or _REBUILDING_KEYS & config.keys():
            return None
        if os.path.isdir(os.path.join(path, "additional_chat_templates")):
            return None  # named templates: transformers resolves them
        template = config.get("chat_template")
        jinja = os.path.join(path, "chat_template.jinja")
        if os.path.isfile(jinja):
            try:
                with open(jinja, encoding="utf-8") as f:
                    template = f.read()
            except UnicodeDecodeError:
                raise ModelConfigError(f"tokenizer: {jinja} is not UTF-8 text, so not a chat template") from None
        if template is not None and not isinstance(template, str):
            return None  # a list of named templates
        from tokenizers import Tokenizer

        try:
            backend = Tokenizer.from_file(files["tokenizer.json"])
        except Exception as e:  # the tokenizers library's own error: the file is not one it reads
            raise ModelConfigError(
                f"tokenizer: {files['tokenizer.json']} is not a valid tokenizer.json "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
            ) from None
        return cls(path, backend, config, template)

    # ------------------------------------------------------------------ ids and text
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int] | int, skip_special_tokens: bool = False) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        text = self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.clean_up_tokenization(text) if cleans_up_spaces(self) else text

    @staticmethod
    def clean_up_tokenization(text: str) -> str:
        """transformers' clean-up of the spaces before punctuation and English contractions."""
        for spaced, joined in (
            (" .", "."),
            (" ?", "?"),
            (" !", "!"),
            (" ,", ","),
            (" ' ", "'"),
            (" n't", "n't"),
            (" 'm", "'m"),
            (" 's", "'s"),
            (" 've", "'ve"),
            (" 're", "'re"),
        ):
            text = text.replace(spaced, joined)
        return text

    def convert_ids_to_tokens(self, ids: Sequence[int] | int) -> list[Optional[str]] | Optional[str]:
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(i) for i in ids]

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def get_added_tokens_decoder(self) -> dict[int, Any]:
        return self.backend_tokenizer.get_added_tokens_decoder()

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens, then the extra ones (transformers 5's order), each once."""
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self._extra_special]))

    @property
    def all_special_ids(self) -> list[int]:
        return [i for i in map(self.backend_tokenizer.token_to_id, self.all_special_tokens) if i is not None]

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    # ------------------------------------------------------------------ chat
    def apply_chat_template(
        self,
        conversation: list[dict],
        tools: Optional[list] = None,
        documents: Optional[list] = None,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        **kwargs: Any,
    ) -> str | list[int]:
        """transformers' ``apply_chat_template`` for one conversation (the same environment and
        arguments: the special tokens, then ``kwargs``, reach the template), rendered in the
        bounded sandbox of engine/frontend/chat_template.py with its default limits."""
        from engine.frontend.chat_template import render_chat

        rendered = render_chat(
            chat_template_source(self, chat_template, tools),
            conversation,
            special_tokens=self.special_tokens_map,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            documents=documents,
            variables=kwargs,
        )
        return self.encode(rendered, add_special_tokens=False) if tokenize else rendered

    # ------------------------------------------------------------------ the user's tokenizer
    def hf(self) -> Any:
        """The transformers tokenizer for the same directory, built once, for users who
        asked for it (``LLM.get_tokenizer()``)."""
        if self._hf is None:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(self.name_or_path)
        return self._hf


def chat_template_source(tokenizer: Any, chat_template: Optional[str], tools: Optional[list] = None) -> str:
    """The template text to render: ``chat_template`` when given, else the tokenizer's (for a
    transformers tokenizer with named templates, the one it picks for ``tools``)."""
    if chat_template is not None:
        if not isinstance(chat_template, str):
            raise TypeError(f"chat_template must be a str, got {type(chat_template).__name__}")
        return chat_template
    template = getattr(tokenizer, "chat_template", None)
    if template is not None and not isinstance(template, str):
        template = tokenizer.get_chat_template(None, tools)
    if template is None:
        raise ValueError(
            "chat_template: the model has no chat template (neither tokenizer_config.json nor "
            "chat_template.jinja sets one); pass chat_template"
        )
    return template


def cleans_up_spaces(tokenizer: Any) -> bool:
    """Whether ``tokenizer.decode`` removes spaces before punctuation (transformers 5's rule: a
    BPE model only when forced, since it corrupts BPE output), for either kind of tokenizer."""
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    return type(tokenizer.backend_tokenizer.model).__name__ != "BPE" or getattr(
        tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False
    )


def user_tokenizer(tokenizer: Any) -> Any:
    """What ``get_tokenizer()`` hands a user: always a transformers tokenizer (or None)."""
    return tokenizer.hf() if isinstance(tokenizer, FastTokenizer) else tokenizer

"""vLLM's per-request keywords that ``LLM``, ``LLMEngine`` and ``AsyncLLM`` share, each with
vLLM's meaning: ``lora_request`` (a LoRARequest, only with ``enable_lora``), ``tokenization_kwargs``
(truncation of a text prompt, done as the Hugging Face tokenizer does it) and
``chat_template`` (a template string or the path of a file holding one, by vLLM's rule).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from engine.frontend.chat_template import compile_template
from engine.frontend.renderer import encode
from engine.lora.request import LoRARequest

# What tokenization_kwargs may hold: the tokenizer's own truncation arguments.
TOKENIZATION_KWARGS = ("truncation", "max_length", "add_special_tokens")


def check_lora_request(lora_request: Any, enabled: bool) -> Optional[LoRARequest]:
    """``lora_request`` as given (None: the base model); refused by name without ``enable_lora``."""
    if lora_request is None:
        return None
    if not enabled:
        raise ValueError(
            "lora_request: LoRA adapters are not enabled; start the engine with enable_lora=True "
            "(ringllm serve --enable-lora) or pass lora_request=None"
        )
    if not isinstance(lora_request, LoRARequest):
        raise TypeError(f"lora_request must be an engine.lora.request.LoRARequest, got {type(lora_request).__name__}")
    return lora_request


def lora_requests_per_prompt(lora_request: Any, num_prompts: int, enabled: bool) -> list[Optional[LoRARequest]]:
    """vLLM's ``LLM.generate(lora_request=...)``: one LoRARequest for all prompts, or a list of
    one per prompt."""
    if isinstance(lora_request, (list, tuple)):
        if len(lora_request) != num_prompts:
            raise ValueError(f"lora_request must have one entry per prompt ({num_prompts}), got {len(lora_request)}")
        return [check_lora_request(r, enabled) for r in lora_request]
    return [check_lora_request(lora_request, enabled)] * num_prompts


def check_tokenization_kwargs(kwargs: Optional[dict[str, Any]]) -> None:
    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise TypeError(f"tokenization_kwargs must be a dict, got {type(kwargs).__name__}")
    unknown = sorted(set(kwargs) - set(TOKENIZATION_KWARGS))
    if unknown:
        raise ValueError(f"tokenization_kwargs: unsupported key(s) {unknown}; supported: {list(TOKENIZATION_KWARGS)}")
    max_length = kwargs.get("max_length")
    if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1):
        raise ValueError(f"tokenization_kwargs: max_length must be an int >= 1, got {max_length!r}")


def tokenize_with_kwargs(
    tokenizer: Any, prompt: Any, kwargs: Optional[dict[str, Any]], add_special_tokens: bool = True
) -> Any:
    """A text prompt tokenized as vLLM's ``tokenizer.encode(text, **kwargs)`` tokenizes it, as
    ``{"prompt_token_ids", "prompt"}``: ``{"truncation": True, "max_length": N}`` gives at most
    N tokens, special tokens included, the text cut on the tokenizer's ``truncation_side``.
    Token-id prompts, and every prompt when ``kwargs`` is empty, are returned as given."""
    if not kwargs:
        return prompt
    text = prompt.get("prompt") if isinstance(prompt, dict) and "prompt_token_ids" not in prompt else prompt
    if not isinstance(text, str) or tokenizer is None:
        return prompt
    add_special_tokens = kwargs.get("add_special_tokens", add_special_tokens)
    truncation, max_length = kwargs.get("truncation"), kwargs.get("max_length")
    # As Hugging Face: max_length alone truncates too; truncation alone cuts at model_max_length.
    # The prompt's other keys (cache_salt, and multimodal ones to be refused) stay with it.
    rest = {k: v for k, v in prompt.items() if k != "prompt"} if isinstance(prompt, dict) else {}
    if truncation in (None, False, "do_not_truncate") and not (truncation is None and max_length is not None):
        return {**rest, "prompt_token_ids": encode(tokenizer, text, add_special_tokens), "prompt": text}
    return {
        **rest,
        "prompt_token_ids": _encode_truncated(
            tokenizer, text, max_length or tokenizer.model_max_length, add_special_tokens
        ),
        "prompt": text,
    }


def _encode_truncated(tokenizer: Any, text: str, max_length: int, add_special_tokens: bool) -> list[int]:
    """What the tokenizers library does for a truncating encode (cut the text's tokens, then
    add the special tokens), without ``tokenizer.encode(truncation=...)``: that sets truncation
    on the shared backend tokenizer, where every later encode (on any thread) would keep it."""
    backend = tokenizer.backend_tokenizer
    encoding = backend.encode(text, add_special_tokens=False)
    special = backend.num_special_tokens_to_add(False) if add_special_tokens else 0
    encoding.truncate(max(0, int(max_length) - special), direction=tokenizer.truncation_side)
    if add_special_tokens:
        encoding = backend.post_process(encoding, add_special_tokens=True)
    return encoding.ids


# A chat template file larger than this is not a chat template (the largest on the Hub are ~20 KB).
MAX_CHAT_TEMPLATE_FILE_BYTES = 1 << 20


def load_chat_template(chat_template: Optional[str]) -> Optional[str]:
    """vLLM's ``load_chat_template`` rules: a string holding any of ``{``, ``}`` or a newline is a
    template's text; otherwise it must be the path of a file, which is read. Unlike vLLM, the
    file must be a template: UTF-8, at most 1 MiB, and with at least one Jinja tag (``{{`` or
    ``{%``), since a file without one (``/etc/passwd``) would render as itself, ignoring the
    messages. Neither a template nor a file is a ValueError naming ``chat_template``."""
    if chat_template is None:
        return None
    if not isinstance(chat_template, str):
        raise TypeError(f"chat_template must be a str (a template or a file path), got {type(chat_template).__name__}")
    if any(c in chat_template for c in "{}\n"):
        return chat_template
    path = os.path.expanduser(chat_template)
    if not os.path.isfile(path):
        raise ValueError(
            f"chat_template: {chat_template!r} is neither a file nor a template (it has no '{{', '}}' or newline)"
        )
    if os.path.getsize(path) > MAX_CHAT_TEMPLATE_FILE_BYTES:
        raise ValueError(
            f"chat_template: the file {chat_template!r} is larger than "
            f"{MAX_CHAT_TEMPLATE_FILE_BYTES} bytes, too large for a chat template"
        )
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise ValueError(
            f"chat_template: the file {chat_template!r} is not UTF-8 text, so not a chat template"
        ) from None
    if "{{" not in text and "{%" not in text:
        raise ValueError(
            f"chat_template: the file {chat_template!r} holds no Jinja tag ('{{{{' or '{{%'), so "
            "it is not a chat template"
        )
    compile_template(text)  # a syntax error is the file's, named now rather than at the first chat
    return text

"""The draft model of ``speculative_config`` (method ``"draft_model"``), derived in the frontend
with the target's: its files found and read as a model of its own, with the target's context
length and none of the target-only settings (tokenizer, served name, quantization, overrides,
pooling). The EngineCore receives the result in ``EngineConfig.draft_model_config`` and loads it
beside the target (engine/spec_decode/draft_model.py); it derives nothing."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from engine.config.model import ModelConfig, create_model_config

if TYPE_CHECKING:
    from engine.config.args import EngineArgs


def create_draft_model_config(args: EngineArgs, model: str, target: ModelConfig, device: str) -> ModelConfig:
    """ValueError naming ``speculative_config.model`` when the draft cannot be read, cannot take
    the target's max_model_len, or its vocabulary differs from the target's (verification
    compares token ids). ``model``: the resolved ``speculative_config.model``."""
    draft_args = dataclasses.replace(
        args,
        model=model,
        tokenizer=None,
        served_model_name=None,
        quantization=None,
        hf_overrides=None,
        load_format="dummy" if args.load_format == "dummy" else "auto",
        max_model_len=target.max_model_len,
        runner="auto",
        convert="auto",
        pooler_config=None,
    )
    try:
        draft = create_model_config(draft_args, device)
    except ValueError as e:
        raise ValueError(f"speculative_config.model: {model!r}: {e}") from None
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"speculative_config.model: {model!r} has a vocabulary of {draft.vocab_size} tokens, "
            f"the target {target.model!r} one of {target.vocab_size}; a draft model must share the "
            "target's tokenizer"
        )
    return draft

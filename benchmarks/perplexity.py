"""Perplexity of ringllm's weight formats against transformers on the same weights.

Why: a quantized format is only a speed-up if it keeps the model's answers. Greedy agreement on a
few prompts says little (one flipped token changes every later one); perplexity over a fixed text
weighs every position. The text is ``benchmarks/data/genesis-kjv.txt`` (public domain, 20k tokens
of the default model's tokenizer), cut into windows of ``--ctx`` tokens, each scored from its own
start (no carried context), which is how llama.cpp's ``llama-perplexity`` counts, so figures from
both tools on one file compare.

The reference is transformers on the default model's dequantized weights (the shipped Q4_1 file
converted to float32 once, ``default_model_path()``), in bfloat16 and float32. ringllm runs the same
windows through ``LLM.generate`` with ``prompt_logprobs=0`` (the log-probability of each actual next
token), so the whole path is measured: the loader, the linear method, the LM head and the sampler's
log-softmax. Each ``--gguf`` file (e.g. the same weights requantized to Q8_0 or Q4_K by
llama.cpp's ``llama_model_quantize``) runs on its own blocks.

    ringllm bench perplexity                       # bf16, int8, the Q4_1 file; 20k tokens
    ringllm bench perplexity --tokens 2048 --formats bf16,gguf --gguf /tmp/model.Q8_0.gguf
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Optional, Sequence

TEXT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "genesis-kjv.txt")
FORMATS = ("bf16", "float32", "int8", "gguf")


@dataclass(frozen=True)
class Score:
    """Summed negative log-likelihood over ``tokens`` predicted tokens."""

    nll: float
    tokens: int

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.tokens)


def text_windows(tokenizer, max_tokens: int, ctx: int) -> list[list[int]]:
    """The fixed text's first ``max_tokens`` tokens in windows of ``ctx`` (the last may be shorter,
    never under 2 tokens: a window's first token is context only)."""
    with open(TEXT_PATH, encoding="utf-8") as f:
        ids = tokenizer(f.read(), add_special_tokens=False)["input_ids"][:max_tokens]
    windows = [ids[i : i + ctx] for i in range(0, len(ids), ctx)]
    return [w for w in windows if len(w) >= 2]


def transformers_score(model_dir: str, windows: Sequence[list[int]], dtype: str) -> Score:
    """transformers' own forward: the reference a format is judged against."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    nll, count = 0.0, 0
    with torch.inference_mode():
        for window in windows:
            ids = torch.tensor([window])
            logits = model(ids).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])
            nll -= float(logp.sum())
            count += len(window) - 1
    return Score(nll, count)


def ringllm_score(windows: Sequence[list[int]], model: str, **engine_kwargs) -> Score:
    """ringllm's path end to end: each window a token-id prompt with ``prompt_logprobs=0``."""
    from engine import LLM, SamplingParams

    llm = LLM(model=model, max_model_len=max(len(w) for w in windows) + 1, **engine_kwargs)
    try:
        outputs = llm.generate(
            [{"prompt_token_ids": w} for w in windows], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
        )
    finally:
        llm.shutdown()
    nll, count = 0.0, 0
    for window, out in zip(windows, outputs):
        rows = out.prompt_logprobs[1:]  # position 0 has nothing before it
        if len(rows) != len(window) - 1:
            raise RuntimeError(f"expected {len(window) - 1} prompt logprobs, got {len(rows)}")
        for token, row in zip(window[1:], rows):
            nll -= row[token].logprob
        count += len(rows)
    return Score(nll, count)


def format_kwargs(fmt: str) -> dict:
    """Engine arguments that select a format on the default model (its float32 HF directory or,
    for "gguf", its own Q4_1 file)."""
    from engine.models.default_model import default_gguf_path, default_model_path

    if fmt == "gguf":
        return {"model": default_gguf_path()}
    if fmt == "int8":
        return {"model": default_model_path(), "dtype": "bfloat16", "quantization": "int8"}
    if fmt in ("bf16", "float32"):
        return {"model": default_model_path(), "dtype": "bfloat16" if fmt == "bf16" else "float32"}
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def run(
    formats: Sequence[str],
    ggufs: Sequence[str],
    tokens: int,
    ctx: int,
    reference_dtypes: Sequence[str] = ("bfloat16", "float32"),
) -> dict[str, Score]:
    """Scores keyed "transformers <dtype>", "ringllm <format>" and "ringllm <gguf file name>"."""
    from transformers import AutoTokenizer

    from engine.models.default_model import default_model_path

    model_dir = default_model_path()
    windows = text_windows(AutoTokenizer.from_pretrained(model_dir), tokens, ctx)
    scores = {f"transformers {d}": transformers_score(model_dir, windows, d) for d in reference_dtypes}
    for fmt in formats:
        scores[f"ringllm {fmt}"] = ringllm_score(windows, **format_kwargs(fmt))
    for path in ggufs:  # same weights in another GGUF type; the tokenizer is the default model's
        scores[f"ringllm {os.path.basename(path)}"] = ringllm_score(windows, path, tokenizer=model_dir)
    return scores


def table(scores: dict[str, Score], reference: str = "transformers bfloat16") -> str:
    base = scores[reference].perplexity
    lines = [f"| weights | perplexity | vs {reference} |", "|---|---|---|"]
    for name, score in scores.items():
        lines.append(f"| {name} | {score.perplexity:.3f} | {100 * (score.perplexity / base - 1):+.2f}% |")
    tokens = next(iter(scores.values())).tokens
    return "\n".join(lines) + f"\n\n{tokens} scored tokens of {os.path.relpath(TEXT_PATH)}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="ringllm bench perplexity", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--formats", default="bf16,int8,gguf", help=f"comma-separated, of {', '.join(FORMATS)} (default: %(default)s)"
    )
    parser.add_argument(
        "--gguf",
        action="append",
        default=[],
        metavar="PATH",
        help="also score this GGUF file of the default model's weights (repeatable)",
    )
    parser.add_argument("--tokens", type=int, default=20000, help="tokens of the text (default: %(default)s)")
    parser.add_argument("--ctx", type=int, default=512, help="window length in tokens (default: %(default)s)")
    args = parser.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    for fmt in formats:
        format_kwargs(fmt)  # a typo fails before minutes of work
    print(table(run(formats, args.gguf, args.tokens, args.ctx)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

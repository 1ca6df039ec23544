"""Speculative decoding scenario: one stream, greedy, on a prompt that asks the model to repeat a
piece of code with one change, with and without n-gram drafts, in the same run.

Both engines are built once (their cores in this process, so the drafts' counters can be read)
and called in alternating order each round; only ``generate`` is timed, after a warm-up.
Reported: output tokens/s (median and spread), the ratio to no drafts, the acceptance rate
(accepted / drafted tokens) and the tokens a verification step emitted on average, and whether
the greedy texts agreed.

    python -m benchmarks.spec_decode                     # default model, 128 tokens, 3 rounds
    python -m benchmarks.spec_decode --k 6 --deterministic
"""
from __future__ import annotations

import argparse
import logging
import os
import time

from benchmarks.harness import Bench, Column

CODE = '''def load_rows(path):
    rows = []
    with open(path) as f:
        for line in f:
            name, value = line.strip().split(",")
            rows.append((name, int(value)))
    return rows


def total(rows):
    result = 0
    for name, value in rows:
        result += value
    return result
'''
PROMPT = ("Repeat this code exactly, with one change: rename the variable rows to records.\n\n" + CODE +
          "\nHere is the code with rows renamed to records:\n\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ["RINGLLM_ENABLE_MULTIPROCESSING"] = "0"
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    ngram = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    kw = dict(num_threads=1, deterministic=args.deterministic)
    engines = {"no drafts": LLM(**kw), f"ngram k={args.k}": LLM(speculative_config=ngram, **kw)}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    texts: dict[str, str] = {}

    def case(name: str, llm):
        stats = getattr(llm.llm_engine.engine_core.engine_core.scheduler.spec, "stats", None)

        def measure() -> dict:
            before = None if stats is None else (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
            start = time.perf_counter()
            out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
            seconds = time.perf_counter() - start
            texts[name] = out.text
            metrics = {"tok_s": len(out.token_ids) / seconds}
            if stats is not None:
                drafts, drafted, accepted = (now - then for now, then in zip(
                    (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens), before))
                metrics["acceptance"] = accepted / max(1, drafted)
                metrics["tokens_per_verify"] = (accepted + drafts) / max(1, drafts)
            return metrics
        return measure

    bench = Bench("spec_decode", model="SmolLM2-135M-Instruct (default)" + (", deterministic" if args.deterministic
                                                                           else ""))
    for name, llm in engines.items():
        llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)  # warm-up
        bench.add("single", name, case(name, llm))
    bench.run(rounds=args.rounds)
    first = next(iter(engines))
    print(bench.table(f"One stream, greedy, {args.max_tokens} tokens, repeat-this-code prompt", [
        Column("tok/s", "single", "tok_s"), Column("vs no drafts", "single", "tok_s", ratio_to=first),
        Column("acceptance", "single", "acceptance", fmt="{:.2f}"),
        Column("tokens per verify step", "single", "tokens_per_verify", fmt="{:.2f}")]))
    print(f"\ngreedy texts equal: {len(set(texts.values())) == 1}")
    for llm in engines.values():
        llm.shutdown()


if __name__ == "__main__":
    main()

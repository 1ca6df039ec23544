"""Speculative decoding scenario: one stream, greedy, with and without drafts, in the same run, on
two workloads: a prompt that asks the model to repeat a piece of code with one change (where
n-gram lookup pays) and a free story (where it does not).

Methods: no drafts; n-gram lookup (``--k``); with ``--draft``, a draft model: the default
model's own Q4_1 GGUF drafting for its float weights (``--target-dtype``), the pair whose
acceptance is highest, plus that draft run alone (its tok/s gives the cost of one draft forward
relative to one target step for the break-even arithmetic in RESULTS.md).

Every engine is built once (its core in this process, so the drafts' counters can be read) and
called in alternating order each round; only ``generate`` is timed, after a warm-up. Reported:
output tokens/s (median and spread), the ratio to no drafts, the acceptance rate (accepted /
drafted tokens), the tokens a verification step emitted on average, the share of the time spent
proposing (the draft model's forwards, or the lookups), and whether the greedy texts agreed with
no drafts.

    python -m benchmarks.spec_decode                     # default model, 128 tokens, 3 rounds
    python -m benchmarks.spec_decode --draft --k 3 --deterministic
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from benchmarks.harness import Bench, Column

CODE = """def load_rows(path):
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
"""
WORKLOADS = {
    "repeat code": (
        "Repeat this code exactly, with one change: rename the variable rows to records.\n\n"
        + CODE
        + "\nHere is the code with rows renamed to records:\n\n"
    ),
    "free story": "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n",
}
BASE = "no drafts"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--draft", action="store_true", help="Add the draft-model pair (see above).")
    parser.add_argument("--target-dtype", default="float32", help="The target's dtype when --draft is given.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ["RINGLLM_ENABLE_MULTIPROCESSING"] = "0"
    from engine.llm import LLM
    from engine.models.default_model import default_gguf_path
    from engine.sampling_params import SamplingParams

    # One stream needs little KV: 256 MiB each keeps four engines in a small machine's memory.
    kw = dict(num_threads=1, deterministic=args.deterministic, max_model_len=2048, kv_cache_memory=256 << 20)
    if args.draft:  # the same float target for every method, so the ratios compare drafts alone
        kw["dtype"] = args.target_dtype
    ngram = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    engines = {BASE: LLM(**kw), f"ngram k={args.k}": LLM(speculative_config=ngram, **kw)}
    if args.draft:
        draft = {"method": "draft_model", "model": default_gguf_path(), "num_speculative_tokens": args.k}
        engines[f"Q4_1 draft k={args.k}"] = LLM(speculative_config=draft, **kw)
        engines["Q4_1 draft alone"] = LLM(model=default_gguf_path(), **{**kw, "dtype": "auto"})
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    texts: dict[tuple[str, str], str] = {}
    proposing_s: dict[str, list] = {}  # seconds in each engine's proposer (draft forwards, or lookups)

    def case(workload: str, name: str, llm):
        spec = llm.llm_engine.engine_core.engine_core.scheduler.spec
        stats = None if spec is None else spec.stats
        counters = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
        proposing = proposing_s.setdefault(name, [0.0])  # one timer per engine, whatever the workload
        if spec is not None and not hasattr(spec.proposer.propose, "timed"):
            spec.proposer.propose = timed(spec.proposer.propose, proposing)

        def measure() -> dict:
            before = None if stats is None else [getattr(stats, c) for c in counters]
            proposing[0] = 0.0
            start = time.perf_counter()
            out = llm.generate([WORKLOADS[workload]], params, use_tqdm=False)[0].outputs[0]
            seconds = time.perf_counter() - start
            texts[workload, name] = out.text
            metrics = {"tok_s": len(out.token_ids) / seconds}
            if stats is not None:
                drafts, drafted, accepted = (getattr(stats, c) - b for c, b in zip(counters, before))
                metrics["acceptance"] = accepted / max(1, drafted)
                metrics["tokens_per_verify"] = (accepted + drafts) / max(1, drafts)
                metrics["proposing_share"] = proposing[0] / seconds
            return metrics

        return measure

    bench = Bench(
        "spec_decode",
        model="SmolLM2-135M-Instruct (default"
        + (f", {args.target_dtype} target" if args.draft else "")
        + ")"
        + (", deterministic" if args.deterministic else ""),
    )
    for name, llm in engines.items():
        llm.generate([WORKLOADS["free story"]], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        for workload in WORKLOADS:
            bench.add(workload, name, case(workload, name, llm))
    bench.run(rounds=args.rounds)
    for workload in WORKLOADS:
        print(
            bench.table(
                f"One stream, greedy, {args.max_tokens} tokens, {workload}",
                [
                    Column("tok/s", workload, "tok_s"),
                    Column("vs no drafts", workload, "tok_s", ratio_to=BASE),
                    Column("acceptance", workload, "acceptance", fmt="{:.2f}"),
                    Column("tokens per verify step", workload, "tokens_per_verify", fmt="{:.2f}"),
                    Column("time proposing", workload, "proposing_share", fmt="{:.0%}"),
                ],
            )
        )
        same = [name for name in engines if "alone" not in name and texts[workload, name] == texts[workload, BASE]]
        print(f"\ngreedy text equal to no drafts: {', '.join(same)}\n")
    for path in bench.save():
        print(f"wrote {os.path.relpath(path)}")
    for llm in engines.values():
        llm.shutdown()


def timed(propose, seconds: list):
    """``propose``, adding the time each call takes to ``seconds[0]``."""

    def call(*args):
        start = time.perf_counter()
        try:
            return propose(*args)
        finally:
            seconds[0] += time.perf_counter() - start

    call.timed = True
    return call


if __name__ == "__main__":
    main()

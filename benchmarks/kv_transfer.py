"""KV transfer scenario: time to first token of a long prompt, computed vs loaded from the
SharedStorageConnector (engine/kv_transfer/), on the default model.

Three engines run side by side, each an ``LLM`` with its own EngineCore process:

- cold: no connector; computes the prompt.
- cold + save: ``kv_producer``; computes the prompt and saves its full blocks to the store.
- loaded: ``kv_consumer`` on the same store; the prompt was computed and saved by the producer
  just before (untimed), so it loads every full block and computes the last few tokens.

Every measurement uses a prompt no engine has seen (its first block differs), so no local
prefix cache helps; TTFT is the wall time of ``generate`` with ``max_tokens=1`` on token ids.
The store is a fresh directory on /dev/shm (shared memory), removed at the end.

    ringllm bench kv-transfer                          # ~2,000-token prompts, float32, 3 rounds
    ringllm bench kv-transfer --prompt-tokens 1000 --rounds 1
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import shutil
import sys
import tempfile
import time

from benchmarks.harness import Bench, Column

_TEXT = (
    "The harbor master counted the ships that came in with the tide, wrote each name in a ledger, "
    "and noted the cargo, the crew and the weather of the crossing. "
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="ringllm bench kv-transfer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="HF directory (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians and spread)")
    p.add_argument("--store-dir", default=None, help="parent folder of the store (default /dev/shm)")
    p.add_argument("--out", default=None, help="folder for JSON and PNG (default benchmarks/out)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from engine import LLM, SamplingParams

    parent = a.store_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    store = tempfile.mkdtemp(prefix="kvbench-", dir=parent)
    engine_kw = dict(dtype=a.dtype, max_model_len=max(2048, a.prompt_tokens + 16), enable_prefix_caching=True)
    if a.model:
        engine_kw["model"] = a.model

    def connector(role: str) -> dict:
        return {
            "kv_transfer_config": {
                "kv_connector": "SharedStorageConnector",
                "kv_role": role,
                "kv_connector_extra_config": {"shared_storage_path": store},
            }
        }

    engines = {}
    try:
        for name, kw in (("cold", {}), ("producer", connector("kv_producer")), ("consumer", connector("kv_consumer"))):
            t0 = time.perf_counter()
            engines[name] = LLM(**engine_kw, **kw)
            logging.info("%s ready in %.1f s", name, time.perf_counter() - t0)
        tokenizer = engines["cold"].get_tokenizer()
        filler = tokenizer.encode(_TEXT * (a.prompt_tokens // 20 + 1))
        counter = itertools.count()
        params = SamplingParams(temperature=0.0, max_tokens=1)

        def fresh_prompt() -> dict:
            head = tokenizer.encode(f"Ledger {next(counter)} of the port:")
            return {"prompt_token_ids": (head + filler)[: a.prompt_tokens]}

        def ttft(engine: str, prompt: dict) -> dict:
            t0 = time.perf_counter()
            out = engines[engine].generate([prompt], params, use_tqdm=False)[0]
            return {"ttft_s": time.perf_counter() - t0, "cached_tokens": out.num_cached_tokens}

        def loaded() -> dict:
            prompt = fresh_prompt()
            engines["producer"].generate([prompt], params, use_tqdm=False)  # compute and save, untimed
            return ttft("consumer", prompt)

        for engine in engines:  # warm-up: first-step costs (page faults of the KV cache) stay out
            engines[engine].generate([fresh_prompt()], params, use_tqdm=False)

        bench = Bench("kv_transfer", model=a.model or "SmolLM2-135M-Instruct")
        bench.add("ttft", "cold", lambda: ttft("cold", fresh_prompt()))
        bench.add("ttft", "cold + save (producer)", lambda: ttft("producer", fresh_prompt()))
        bench.add("ttft", "loaded (consumer)", loaded)
        bench.run(rounds=a.rounds, progress=logging.getLogger("benchmarks.kv_transfer").info)
        entries = [os.path.join(store, n) for n in os.listdir(store) if n.endswith(".kv")]
        entry_bytes = os.path.getsize(entries[0]) if entries else 0
        bench.notes.append(
            f"{a.prompt_tokens}-token prompts, {a.dtype}, 1 output token; store on "
            f"{parent or 'the temp folder'}: {entry_bytes / 2**10:.0f} KiB per block of 16 tokens "
            f"({entry_bytes * (a.prompt_tokens // 16) / 2**20:.0f} MiB per prompt)"
        )
    finally:
        for llm in engines.values():
            llm.shutdown()
        shutil.rmtree(store, ignore_errors=True)

    columns = [
        Column("TTFT s", "ttft", "ttft_s", "{:.3f}"),
        Column("TTFT / cold", "ttft", "ttft_s", ratio_to="cold"),
        Column("cached tokens", "ttft", "cached_tokens", "{:.0f}"),
    ]
    print(bench.table(f"Time to first token, {a.prompt_tokens}-token prompt", columns) + "\n")
    speedup = 1 / bench.ratio("ttft", "ttft_s", "loaded (consumer)", "cold")
    print(f"loaded from the connector: {speedup:.1f}x faster than cold (target >= 5x)")
    print("\n".join(bench.notes))
    kw = {"out_dir": a.out} if a.out else {}
    paths = bench.save(extra={"args": vars(a), "speedup": speedup}, plots=columns[:1], **kw)
    print("wrote " + ", ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""LoRA serving scenario: 64 streams over 1, 4 and 16 adapters against the base model alone.

    python -m benchmarks.lora_serving [--rounds 3] [--clients 64] [--output-tokens 64]

One ``ringllm serve`` of the default model with ``--enable-lora --max-loras 16`` and 16 random
rank-``--rank`` adapters on every projection (q/k/v/o, gate/up/down; PEFT files written from the
model's shapes, seeded), all given with ``--lora-modules``. Methods, alternated within each round
(harness.Bench): the base model alone (``model=default``), and the clients spread round-robin
over 1, 4 and 16 adapters (``model=<adapter>``): every step then runs the base projections once
and each adapter's low-rank update on its own rows (engine/lora/layer.py). ``--plain-server``
adds a second server without ``--enable-lora``: the base's figure with no LoRA machinery at all
(it holds a second copy of the model: leave it out where memory is short). The load
generator and the client are those of benchmarks/serving.py (closed loop, streamed greedy
completions with ignore_eos, fresh seeded prompts per run so prefix caching flatters nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import tempfile
from typing import Optional

import aiohttp

from benchmarks.harness import OUT_DIR, Bench, Column
from benchmarks.serving import Server, run_level, stream_completion

ADAPTER_COUNTS = (1, 4, 16)
BASE, NO_LORA = "base", "base, no --enable-lora"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_random_adapter(path: str, cfg: dict, rank: int, seed: int) -> None:
    """A PEFT LoRA adapter of random weights on every projection of every layer of ``cfg``."""
    import torch
    from safetensors.torch import save_file

    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    inter = cfg["intermediate_size"]
    shapes = {
        "q_proj": (q, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "o_proj": (hidden, q),
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(layers):
        for module, (out, inp) in shapes.items():
            part = "self_attn" if module in TARGETS[:4] else "mlp"
            key = f"base_model.model.model.layers.{i}.{part}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, inp, generator=gen) * 0.01
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, rank, generator=gen) * 0.01
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(
            {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS), "bias": "none"}, f
        )


async def _run(url: str, models: list[str], clients: int, output_tokens: int, seed: int) -> dict:
    names = itertools.cycle(models)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=1800)) as session:
        return await run_level(
            lambda prompt: stream_completion(session, url, next(names), prompt, output_tokens), clients, 1, seed
        )


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=384 << 20)
    parser.add_argument("--plain-server", action="store_true", help=f"Also measure '{NO_LORA}'.")
    parser.add_argument("--out", default=OUT_DIR, help="Folder for JSON, PNG and server logs.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.makedirs(args.out, exist_ok=True)
    from engine.models.default_model import default_model_path

    model_dir = default_model_path()
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    bench = Bench("lora-serving", model="SmolLM2-135M-Instruct (embedded default, dtype auto)")
    bench.notes.append(
        f"{args.clients} clients, one streamed request each per run, {args.output_tokens} output "
        f"tokens (ignore_eos, greedy); random rank-{args.rank} adapters on q/k/v/o/gate/up/down; "
        "load generator on the same machine"
    )
    seeds = itertools.count(args.seed * 1_000_000)
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory(prefix="ringllm-lora-bench-") as tmp:
        names = [f"lora{i}" for i in range(max(ADAPTER_COUNTS))]
        for i, name in enumerate(names):
            write_random_adapter(os.path.join(tmp, name), cfg, args.rank, args.seed * 100 + i)
        lora_flags = [
            "--enable-lora",
            "--max-loras",
            str(max(ADAPTER_COUNTS)),
            "--max-lora-rank",
            str(args.rank),
            "--max-cpu-loras",
            str(max(ADAPTER_COUNTS)),
            "--lora-modules",
            *(f"{name}={os.path.join(tmp, name)}" for name in names),
        ]
        common = ["--served-model-name", "default", "--kv-cache-memory-bytes", str(args.kv_cache_memory_bytes)]
        servers = {"lora": Server([*common, *lora_flags], os.path.join(args.out, "lora-serving-server.log"))}
        if args.plain_server:
            servers["plain"] = Server(common, os.path.join(args.out, "lora-serving-server-plain.log"))
        try:
            for server in servers.values():
                server.wait_ready()
            lora_url = servers["lora"].url
            senders = {BASE: lambda: _run(lora_url, ["default"], args.clients, args.output_tokens, next(seeds))}
            if args.plain_server:
                plain_url = servers["plain"].url
                senders[NO_LORA] = lambda: _run(plain_url, ["default"], args.clients, args.output_tokens, next(seeds))
            for k in ADAPTER_COUNTS:
                senders[f"{k} adapter{'s' if k > 1 else ''}"] = lambda k=k: _run(
                    lora_url, names[:k], args.clients, args.output_tokens, next(seeds)
                )
            # warm-up: first-request costs, every adapter into memory (one short request each)
            loop.run_until_complete(_run(lora_url, ["default", *names], 1 + len(names), 2, next(seeds)))
            if args.plain_server:
                loop.run_until_complete(_run(servers["plain"].url, ["default"], 1, 2, next(seeds)))
            for method, send in senders.items():
                bench.add("streams", method, lambda send=send: loop.run_until_complete(send()))
            bench.run(rounds=args.rounds)
        finally:
            for server in servers.values():
                server.stop()
    columns = [
        Column("output tok/s", "streams", "output_tokens_per_s", "{:.0f}", higher_is_better=True),
        Column("vs base", "streams", "output_tokens_per_s", ratio_to=BASE),
        *(
            [Column("vs no --enable-lora", "streams", "output_tokens_per_s", ratio_to=NO_LORA)]
            if args.plain_server
            else []
        ),
        Column("TTFT p50 ms", "streams", "ttft_p50_ms", "{:.0f}"),
        Column("ITL p50 ms", "streams", "itl_p50_ms", "{:.1f}"),
        Column("ITL p99 ms", "streams", "itl_p99_ms", "{:.1f}"),
    ]
    print(f"\n{bench.table(f'{args.clients} streams over LoRA adapters', columns)}\n")
    for note in bench.notes:
        print(f"- {note}")
    for path in bench.save(plots=columns[:1], out_dir=args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

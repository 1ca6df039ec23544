"""Decode step time of a soft-capped model (Gemma 2) on the C paged decode kernel against the
torch fallback (gathered blocks, materialised capped scores) and against the same model without
the cap, in one run.

A random-weight Gemma 2 (hidden 512, 4 layers, 8/4 heads of 64, window 256, vocab 4096;
float32 on CPU), 16 sequences of 500 prompt tokens each, then decode steps of all 16; a case's
figure is the mean wall time of ``--steps`` decode steps, Python included. One torch thread, as
the engine runs. The fallback is the builder without the kernel (``decode_kernel = False``),
what a CPU without the C kernels runs.

    python -m benchmarks.softcap_decode --rounds 3
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

import torch

from benchmarks.harness import Bench, Column
from engine.config import EngineArgs
from engine.core.request import Request
from engine.core.sched_output import SchedulerOutput
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner


def _runner(softcap, kernel: bool, seqs: int, prompt: int) -> tuple[ModelRunner, list[Request]]:
    from transformers import Gemma2Config

    path = tempfile.mkdtemp(prefix="softcap-bench-")
    Gemma2Config(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=256,
        attn_logit_softcapping=softcap,
        final_logit_softcapping=30.0,
        architectures=["Gemma2ForCausalLM"],
    ).save_pretrained(path)
    runner = ModelRunner(
        EngineArgs(
            model=path,
            load_format="dummy",
            dtype="float32",
            device="cpu",
            num_threads=1,
            block_size=16,
            max_model_len=1024,
            kv_cache_memory=256 << 20,
            max_num_batched_tokens=8192,
            max_num_seqs=64,
        ).create_engine_config()
    )
    runner.num_blocks = runner.initialize_kv_cache()
    runner.next_block = 1
    runner.attn_builder.decode_kernel = kernel
    reqs = [
        Request(
            str(i),
            [(i * 7 + j) % 4000 + 3 for j in range(prompt)],
            SamplingParams(temperature=0.0, max_tokens=10_000),
            eos_token_id=None,
        )
        for i in range(seqs)
    ]
    for i in range(0, seqs, 4):
        _step(runner, reqs[i : i + 4])
    return runner, reqs


def _step(runner: ModelRunner, reqs: list[Request]) -> None:
    so = SchedulerOutput(finished_req_ids=set())
    for r in reqs:
        n = r.num_tokens - r.num_computed_tokens
        while len(r.block_ids) * runner.block_size < r.num_computed_tokens + n:
            r.block_ids.append(runner.next_block)
            runner.next_block += 1
        so.requests.append(r)
        so.num_scheduled_tokens.append(n)
    so.total_num_scheduled_tokens = sum(so.num_scheduled_tokens)
    out = runner.execute_model(so)
    sampled = dict(zip(out.req_ids, out.sampled_token_ids))
    for r, n in zip(so.requests, so.num_scheduled_tokens):
        r.num_computed_tokens += n
        r.append_output_token(sampled[r.request_id])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=500)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    bench = Bench("softcap_decode", model="random Gemma 2, hidden 512, 4 layers, 8/4 x 64 heads, float32")
    for name, cap, kernel in (
        ("C kernel, cap 50", 50.0, True),
        ("torch fallback, cap 50", 50.0, False),
        ("C kernel, no cap", None, True),
    ):
        runner, reqs = _runner(cap, kernel, args.seqs, args.prompt)

        def case(runner=runner, reqs=reqs) -> dict:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                _step(runner, reqs)
            return {"ms": (time.perf_counter() - t0) / args.steps * 1e3}

        bench.add("decode", name, case)
    bench.run(rounds=args.rounds)
    print(
        bench.table(
            f"Decode step ms, {args.seqs} sequences at context ~{args.prompt}",
            [
                Column("step ms", "decode", "ms", fmt="{:.1f}"),
                Column("vs C kernel, cap", "decode", "ms", ratio_to="C kernel, cap 50"),
            ],
        )
    )
    for note in bench.notes:
        print(f"- {note}")
    bench.save()


if __name__ == "__main__":
    main()

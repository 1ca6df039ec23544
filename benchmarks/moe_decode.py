"""Decode step time of a random mixture-of-experts model with its experts grouped by expert (the
engine's ``SparseMoE``: each active expert's rows one GEMM, its weights read once a step) against a
naive per-token loop (each token's top-k experts run one row at a time, so an expert chosen by n
tokens is read n times), in one run. With ``--qtype``, GGUF experts also run as the engine runs
them, stacked into one call per projection for all of a step's (token, expert) pairs
(engine/models/moe_gguf.py), beside the same grouping as one kernel call per active expert; each
case also counts its expert kernel calls per decoded token (one untimed step).

A random-weight Mixtral (hidden 768, 4 layers, heads of 64 (hidden / 64 of them over 4 KV heads), 4
experts of 2048, top-2, vocab 4096; float32 on CPU, ~300 MB of experts; ``--hidden``, ``--layers``,
``--experts``, ``--width`` and ``--top-k`` change it, e.g. to a Qwen3-MoE's 48 experts of 768,
top-8), ``--seqs`` sequences of ``--prompt`` tokens, then decode steps of all of them; a case's
figure is the mean wall time of ``--steps`` decode steps, Python included. One torch thread unless
``--threads``. The naive loop replaces ``SparseMoE.__call__`` here only. ``--qtype Q8_0`` (or
another type the GGUF kernels run) quantizes every expert to that GGUF type and runs it on its
blocks (``GGUFLinear``), as a GGUF file's experts run.

    python -m benchmarks.moe_decode --rounds 3 [--qtype Q8_0] [--experts 48 --top-k 8 --width 768 --hidden 1024]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

import torch

from benchmarks.harness import Bench, Column
from benchmarks.softcap_decode import _step
from engine.config import EngineArgs
from engine.core.request import Request
from engine.kernels import quant, quant_moe
from engine.models.linear import GGUFBlocks, GGUFLinear, Linear
from engine.models.moe import SparseMoE
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner

_GROUPED = SparseMoE.__call__


def _per_token(self: SparseMoE, x: torch.Tensor, act) -> torch.Tensor:
    """The naive loop: each token's experts one row at a time."""
    weights, experts = self.route(x)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(experts[t].tolist()):
            out[t] += weights[t, j] * self.down[e](act(self.gate_up[e](x[t : t + 1])))[0]
    return out


class _CountedLib:
    """A kernel library whose calls are counted (the expert kernels: the rest of the model is float)."""

    def __init__(self, lib) -> None:
        self.lib, self.calls = lib, 0

    def __getattr__(self, name: str):
        fn = getattr(self.lib, name)

        def counted(*args):
            self.calls += 1
            return fn(*args)

        return counted


def _kernel_calls(runner: ModelRunner, reqs: list[Request]) -> int:
    """The GGUF kernel calls of one decode step."""
    counted = _CountedLib(quant.lib)
    quant.lib = quant_moe.lib = counted
    try:
        _step(runner, reqs)
    finally:
        quant.lib = quant_moe.lib = counted.lib
    return counted.calls


def _quantize_experts(runner: ModelRunner, qtype_name: str) -> None:
    """Every expert's float weight as ``qtype_name`` blocks on the GGUF kernels, stacked per
    projection as the loader stacks a GGUF file's."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    for layer in runner.model.layers:
        for linears in (layer.moe.gate_up, layer.moe.down):
            for e, linear in enumerate(linears):
                method = linear.method
                w = method.rows(torch.arange(method.out_features)).float().contiguous().numpy()  # [out, in]
                blocks = torch.from_numpy(gguf.quants.quantize(w, qtype))
                linears[e] = Linear(GGUFLinear(GGUFBlocks(blocks, int(qtype), *w.shape)))
        layer.moe.stack_experts()


def _runner(seqs: int, args: argparse.Namespace) -> tuple[ModelRunner, list[Request]]:
    prompt, qtype = args.prompt, args.qtype
    from transformers import MixtralConfig

    path = tempfile.mkdtemp(prefix="moe-bench-")
    MixtralConfig(
        vocab_size=4096,
        hidden_size=args.hidden,
        intermediate_size=args.width,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=4,
        num_local_experts=args.experts,
        num_experts_per_tok=args.top_k,
        architectures=["MixtralForCausalLM"],
    ).save_pretrained(path)
    runner = ModelRunner(
        EngineArgs(
            model=path,
            load_format="dummy",
            dtype="float32",
            device="cpu",
            num_threads=args.threads,
            block_size=16,
            max_model_len=1024,
            kv_cache_memory=64 << 20,
            max_num_batched_tokens=8192,
            max_num_seqs=64,
        ).create_engine_config()
    )
    runner.num_blocks = runner.initialize_kv_cache()
    runner.next_block = 1
    if qtype:
        _quantize_experts(runner, qtype)
    reqs = [
        Request(
            str(i),
            [(i * 7 + j) % 4000 + 3 for j in range(prompt)],
            SamplingParams(temperature=0.0, max_tokens=10_000),
            eos_token_id=None,
        )
        for i in range(seqs)
    ]
    _step(runner, reqs)
    return runner, reqs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--qtype", default=None, help="run the experts as this GGUF type (e.g. Q8_0)")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--width", type=int, default=2048, help="each expert's MLP width")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="the model's threads (the engine's num_threads)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    torch.set_num_threads(args.threads)
    experts = f"{args.qtype} experts" if args.qtype else "float32"
    shape = f"hidden {args.hidden}, {args.layers} layers, {args.experts} experts of {args.width}, top-{args.top_k}"
    bench = Bench("moe_decode", model=f"random Mixtral, {shape}, {experts}, {args.threads} thread(s)")
    methods = [("grouped by expert", _GROUPED, False), ("per-token loop", _per_token, False)]
    if args.qtype:
        methods.insert(0, ("one call per projection", _GROUPED, True))
    for seqs in args.seqs:
        runner, reqs = _runner(seqs, args)
        stacked = [layer.moe.gguf for layer in runner.model.layers]
        for name, impl, one_call in methods:

            def case(runner=runner, reqs=reqs, impl=impl, one_call=one_call, stacked=stacked, seqs=seqs) -> dict:
                SparseMoE.__call__ = impl
                for layer, gguf in zip(runner.model.layers, stacked):
                    layer.moe.gguf = gguf if one_call else None
                try:
                    calls = _kernel_calls(runner, reqs) / seqs if args.qtype else float("nan")
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        _step(runner, reqs)
                    return {"ms": (time.perf_counter() - t0) / args.steps * 1e3, "calls": calls}
                finally:
                    SparseMoE.__call__ = _GROUPED

            bench.add(f"{seqs} seqs", name, case)
    bench.run(rounds=args.rounds)
    columns = [Column(f"{s} seqs", f"{s} seqs", "ms", fmt="{:.1f}") for s in args.seqs]
    if args.qtype:
        columns += [Column(f"calls/token {s} seqs", f"{s} seqs", "calls", fmt="{:.3g}") for s in args.seqs]
    print(bench.table("Decode step ms", columns))
    for note in bench.notes:
        print(f"- {note}")
    bench.save()


if __name__ == "__main__":
    main()

"""What calling the C kernels as torch ops costs over calling them raw (cffi), in one run.

Two scenarios, one torch thread as the engine runs:
- ``call``: one kernel call at decode size (RMSNorm of one 576-wide row; a Q4_1 576x576 GEMV of
  one row), raw against ``torch.ops.ringllm.*`` (engine/kernels/ops.py, registered with
  ``torch.library.Library``) and against the same kernel behind a ``torch.library.custom_op``
  decorator (the registration ops.py does not use); microseconds per call, mean of ``--calls``.
- ``decode``: one eager decode step of the default model's Q4_1 GGUF, one sequence at context
  ~``--prompt``, with every CustomOp on its raw call (what the eager forward runs) against every
  CustomOp switched to its op (``dispatch_forward(cpu, in_graph=True)``: what a step would cost
  if the eager forward went through the ops too); milliseconds per step.

    python -m benchmarks.kernel_ops --rounds 5
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

from benchmarks.harness import Bench, Column
from benchmarks.softcap_decode import _step
from engine.config import EngineArgs
from engine.core.request import Request
from engine.kernels import activation, ops, quant
from engine.models.custom_op import CustomOp
from engine.models.default_model import default_gguf_path
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner


@torch.library.custom_op("ringllm_bench::rms_norm", mutates_args=(), device_types="cpu")
def _decorated_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return activation.rms_norm(x, weight, eps)


def _per_call(fn, calls: int) -> dict:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return {"us": (time.perf_counter() - t0) / calls * 1e6}


def _add_call_cases(bench: Bench, calls: int) -> None:
    from engine.kernels.quant_blocks import random_blocks
    import numpy as np

    x, w = torch.randn(1, 576), torch.randn(576)
    blocks = torch.from_numpy(random_blocks(quant.Q4_1, 576, 576, np.random.default_rng(0)))
    q = quant.QuantizedLinear(blocks, quant.Q4_1, 576, 576)
    bench.add("rms_norm", "raw", lambda: _per_call(lambda: activation.rms_norm(x, w, 1e-5), calls))
    bench.add("rms_norm", "op", lambda: _per_call(lambda: ops.rms_norm(x, w, 1e-5), calls))
    bench.add("rms_norm", "custom_op", lambda: _per_call(lambda: _decorated_rms_norm(x, w, 1e-5), calls))
    bench.add("quant_gemv", "raw", lambda: _per_call(lambda: q.matmul(x), calls))
    bench.add("quant_gemv", "op", lambda: _per_call(lambda: ops.quant_matmul(x, blocks, quant.Q4_1, 576, False), calls))


def _custom_ops(runner: ModelRunner) -> list[CustomOp]:
    model = runner.model
    found = [p.method for layer in model.layers for p in layer.linears()] + [model.lm_head.method]
    found += list(vars(model.forward_impl).values())
    return [op for op in found if isinstance(op, CustomOp)]


def _add_decode_cases(bench: Bench, prompt: int, steps: int) -> None:
    runner = ModelRunner(
        EngineArgs(
            model=default_gguf_path(), device="cpu", num_threads=1, max_model_len=1024, kv_cache_memory=64 << 20
        ).create_engine_config()
    )
    runner.num_blocks = runner.initialize_kv_cache()
    runner.next_block = 1
    req = Request(
        "0",
        [(7 * j) % 40000 + 3 for j in range(prompt)],
        SamplingParams(temperature=0.0, max_tokens=10_000),
        eos_token_id=None,
    )
    _step(runner, [req])
    custom = _custom_ops(runner)
    eager = {id(op): op.dispatch_forward(torch.device("cpu"), False) for op in custom}
    as_ops = {id(op): op.dispatch_forward(torch.device("cpu"), True) for op in custom}

    def case(methods: dict) -> dict:
        for op in custom:
            op._forward_method = methods[id(op)]
        t0 = time.perf_counter()
        for _ in range(steps):
            _step(runner, [req])
        return {"ms": (time.perf_counter() - t0) / steps * 1e3, "ops": len(custom)}

    bench.add("decode", "raw", lambda: case(eager))
    bench.add("decode", "op", lambda: case(as_ops))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompt", type=int, default=100)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    bench = Bench("kernel_ops", model="SmolLM2-135M-Instruct Q4_1 (decode); 576-wide rows (calls)")
    _add_call_cases(bench, args.calls)
    _add_decode_cases(bench, args.prompt, args.steps)
    bench.run(rounds=args.rounds)
    print(
        bench.table(
            "Per call, us",
            [
                Column("rms_norm us", "rms_norm", "us", fmt="{:.1f}"),
                Column("vs raw", "rms_norm", "us", ratio_to="raw"),
                Column("Q4_1 GEMV us", "quant_gemv", "us", fmt="{:.1f}"),
                Column("vs raw", "quant_gemv", "us", ratio_to="raw"),
            ],
        )
    )
    print(
        bench.table(
            f"Decode step, 1 sequence at context ~{args.prompt}",
            [Column("step ms", "decode", "ms", fmt="{:.2f}"), Column("vs raw", "decode", "ms", ratio_to="raw")],
            methods=["raw", "op"],
        )
    )
    for note in bench.notes:
        print(f"- {note}")
    bench.save()


if __name__ == "__main__":
    main()

"""Per-call time of the quantized matmul kernels against the bf16 GEMV, on the default model's shapes.

One case is one weight format at one shape and row count; a case's figure is the mean thread
CPU time of ``QuantizedLinear.matmul`` (or ``PackedBF16.matmul``, ``Int8Linear.matmul``, the
oneDNN-packed bf16 projection the bf16 model runs, torch's linear) over ``--budget`` seconds
of it, Python included: what a decode step pays per projection. CPU time, so that other work
on the shared cores slows a case only through the caches it shares. Weights are random
(gguf.quants.quantize for Q4_0/Q4_1/Q8_0, random valid blocks for the K-quants); the
kernels' speed does not depend on the values. A K-quant needs ``in % 256 == 0``, so it has no
figure on a 576-wide input. One torch thread, as the engine runs.

    python -m benchmarks.quant_kernels --rounds 3
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
import torch

from benchmarks.harness import Bench, Column
from engine.kernels import quant
from engine.kernels.bf16_gemv import PackedBF16

# Default model (SmolLM2-135M): hidden 576 (q, o), k/v 192, MLP 1536, vocab 49152; each as in -> out.
SHAPES = "576x576,576x192,576x1536,1536x576,576x49152"


def _weights(qtype: int, n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    import gguf

    if qtype in (quant.Q4_0, quant.Q4_1, quant.Q8_0):
        w = rng.standard_normal((n, k)).astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype))))
    from engine.kernels.quant_blocks import random_blocks

    return torch.from_numpy(random_blocks(qtype, n, k, rng))


def _per_call_us(fn, x: torch.Tensor, budget: float) -> float:
    """Thread CPU time per call (not wall time: being descheduled by other work on the shared
    cores does not count), over batches of calls of ~1 ms each."""
    t0 = time.perf_counter()
    fn(x)
    batch = max(1, int(1e-3 / max(time.perf_counter() - t0, 1e-7)))
    calls, c0 = 0, time.thread_time()
    while time.thread_time() - c0 < budget:
        for _ in range(batch):
            fn(x)
        calls += batch
    return (time.thread_time() - c0) / calls * 1e6


def _formats(n: int, k: int, rng: np.random.Generator) -> dict:
    """name -> (a matmul callable, the most rows it takes) for every format that takes this
    shape; each GGUF type also as "deq+GEMM" (dequantize, then a float32 GEMM: what
    QuantizedLinear does beyond GEMV_ROWS rows)."""
    out = {}
    names = getattr(quant, "TYPE_NAMES", {quant.Q4_0: "Q4_0", quant.Q4_1: "Q4_1", quant.Q8_0: "Q8_0"})
    for qtype in quant.SUPPORTED_TYPES:  # (an older tree has no block_weights: 32-weight blocks only)
        bw = quant.block_weights(qtype) if hasattr(quant, "block_weights") else quant.BLOCK
        if k % bw == 0:
            lin = quant.QuantizedLinear(_weights(qtype, n, k, rng), qtype, n, k)
            most = quant.kernel_rows(qtype, quant.best_isa()) if hasattr(quant, "kernel_rows") else quant.GEMV_ROWS
            out[names[qtype]] = (lin.matmul, 1 << 30 if most is None else most)
            out[f"{names[qtype]} deq+GEMM"] = (lambda x, lin=lin: x @ lin.dequantize().t(), 1 << 30)
    w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)) * 0.02
    try:
        from engine.kernels.int8_linear import Int8Linear

        out["int8 W8A8"] = (Int8Linear.from_float(w).matmul, 1 << 30)
    except ImportError:  # a tree from before the int8 kernel
        pass
    packed = PackedBF16(w)
    out["bf16 GEMV"] = (packed.matmul, packed_rows())
    wb = w.to(torch.bfloat16)
    out["bf16 torch"] = (lambda x: torch.nn.functional.linear(x.to(torch.bfloat16), wb), 1 << 30)
    try:  # the bf16 model's own projection method where the CPU has native bf16 GEMMs
        from engine.kernels import onednn_linear

        if onednn_linear.supports(torch.device("cpu"), torch.bfloat16):
            packed_bf16 = onednn_linear.PackedLinear(wb)
            out["bf16 oneDNN"] = (lambda x: packed_bf16.matmul(x.to(torch.bfloat16)), 1 << 30)
    except ImportError:  # a tree from before the packed layout
        pass
    out["fp32 torch"] = (lambda x: torch.nn.functional.linear(x, w), 1 << 30)
    return out


def packed_rows() -> int:
    from engine.kernels import bf16_gemv

    return bf16_gemv.MAX_ROWS


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated INxOUT")
    ap.add_argument("--rows", default="1,8,16,32,64,256")
    ap.add_argument(
        "--formats",
        default=None,
        help="comma-separated format names to run (e.g. Q4_1,'Q4_1 deq+GEMM','bf16 torch'); default all",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.2, help="seconds of calls per case and round")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    wanted = set(args.formats.split(",")) if args.formats else None
    bench = Bench("quant_kernels", model="SmolLM2-135M shapes, random weights")
    columns = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        formats = _formats(n, k, rng)
        for rows in (int(r) for r in args.rows.split(",")):
            scenario = f"{k}->{n} x{rows}"
            x = torch.randn(rows, k)
            for name, (fn, most) in formats.items():
                if rows > most or (rows < 64 and name.endswith("deq+GEMM")) or (wanted and name not in wanted):
                    continue
                bench.add(scenario, name, lambda fn=fn, x=x: {"us": _per_call_us(fn, x, args.budget)})
            columns.append(Column(f"{scenario} us", scenario, "us", fmt="{:.1f}"))
    bench.run(rounds=args.rounds)
    print(bench.table("Per-call us (in->out x rows)", columns))
    for note in bench.notes:
        print(f"- {note}")
    bench.save()


if __name__ == "__main__":
    main()

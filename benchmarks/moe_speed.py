"""Single-stream decode of the real-shape random MoE (benchmarks/moe_model.py: Qwen3-MoE, 2.95 B
parameters, 0.63 B active) from llama.cpp's own GGUF files, ringllm against ``llama-bench``, in one
run, alternated.

- ringllm: ``LLM`` on the file (its blocks run by the GGUF kernels, the engine's own thread count),
  one prompt, greedy, end of
  sequence ignored; decode tok/s is N tokens (``--tokens``, 128) over the time of an N+1-token
  generation minus that of a 1-token one (the prompt's prefill and the first token cancel).
- llama.cpp: ``llama-bench -m FILE -p 0 -n N -t T`` (its tgN: decode only), T = 1 and 2.

Besides the speeds, the table gives each file's bytes read per decoded token (the active experts,
attention, norms and the LM head, at the file's own types) and what that means in GB/s, so a gap
reads as bandwidth or as overhead. ``--profile`` times, in-process, a ringllm decode step and the
part of it spent in the sparse MLPs (router, expert GEMVs, sums).

    python -m benchmarks.moe_speed --llama-cpp /path/to/llama.cpp [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import time
from typing import Optional

from benchmarks.harness import Bench, Column
from benchmarks.moe_model import CONFIG, NAME, QUANT_TYPES, build, default_cache_dir

log = logging.getLogger("benchmarks.moe_speed")
PROMPT = "The history of the mixture of experts in language models begins"


def active_bytes(path: str, cfg: dict = CONFIG) -> int:
    """Bytes of the file's tensors one decoded token reads: every matrix but the embedding (one row)
    and the routers' full size, the experts' top_k / num_experts of theirs."""
    from engine.gguf_file import read_tensor_index

    _, tensors = read_tensor_index(path)
    share = cfg["num_experts_per_tok"] / cfg["num_experts"]
    total = 0.0
    for t in tensors:
        if t.name == "token_embd.weight":
            continue
        total += t.data.nbytes * (share if "_exps." in t.name else 1.0)
    return int(total)


def ringllm_case(path: str, threads: Optional[int], tokens: int):
    from engine import LLM, SamplingParams

    llm = LLM(model=path, num_threads=threads, max_model_len=512, kv_cache_memory=128 << 20, seed=0)

    def generate(n: int) -> float:
        t0 = time.perf_counter()
        out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == n
        return time.perf_counter() - t0

    generate(4)  # warm-up

    def case() -> dict:
        return {"tok_s": tokens / (generate(tokens + 1) - generate(1))}

    return llm, case


def llama_bench_case(bench_bin: str, path: str, threads: int, tokens: int):
    def case() -> dict:
        out = subprocess.run(
            [bench_bin, "-m", path, "-p", "0", "-n", str(tokens), "-t", str(threads), "-r", "1", "-o", "json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        rows = json.loads(out[out.index("[") :])
        return {"tok_s": float(rows[0]["avg_ts"])}

    return case


def profile_step(path: str, steps: int = 32) -> dict:
    """ms per decode step in-process, and the part spent in the sparse MLPs."""
    os.environ["RINGLLM_ENABLE_MULTIPROCESSING"] = "0"
    from engine import LLM, SamplingParams
    from engine.models.moe import SparseMoE

    spent = [0.0]
    call = SparseMoE.__call__

    def timed(self, x, act):
        t0 = time.perf_counter()
        try:
            return call(self, x, act)
        finally:
            spent[0] += time.perf_counter() - t0

    llm = LLM(model=path, num_threads=1, max_model_len=512, kv_cache_memory=128 << 20, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    try:
        llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
        SparseMoE.__call__ = timed
        t0 = time.perf_counter()
        llm.generate([PROMPT], params, use_tqdm=False)
        whole = time.perf_counter() - t0
    finally:
        SparseMoE.__call__ = call
        llm.shutdown()
    return {"step_ms": whole / (steps + 1) * 1e3, "moe_ms": spent[0] / (steps + 1) * 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree with build/bin/llama-bench")
    ap.add_argument("--cache-dir", default=default_cache_dir())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--types", nargs="+", default=list(QUANT_TYPES))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    files = build(args.cache_dir, args.llama_cpp, types=tuple(args.types))
    bench_bin = os.path.join(args.llama_cpp, "build", "bin", "llama-bench")
    bench = Bench("moe_speed", model=f"{NAME} (random Qwen3-MoE, 2.95 B total, 0.63 B active)")
    llms = []
    for qtype in args.types:
        llm, case = ringllm_case(files[qtype], None, args.tokens)
        llms.append(llm)
        bench.add(qtype, "ringllm", case)
        for threads in (1, 2):
            case = llama_bench_case(bench_bin, files[qtype], threads, args.tokens)
            bench.add(qtype, f"llama-bench -t {threads}", case)
    try:
        bench.run(rounds=args.rounds)
    finally:
        for llm in llms:
            llm.shutdown()
    cols = [Column(q, q, "tok_s", fmt="{:.1f}", ratio_to="llama-bench -t 1") for q in args.types]
    print(bench.table(f"Single-stream decode, tok/s (tg{args.tokens})", cols))
    extra = {}
    for qtype in args.types:
        nbytes = active_bytes(files[qtype])
        size = os.path.getsize(files[qtype])
        rates = {m: bench.stat(qtype, m, "tok_s").median for m in bench.methods()}
        extra[qtype] = {
            "file_bytes": size,
            "active_bytes_per_token": nbytes,
            "GB_s": {m: r * nbytes / 1e9 for m, r in rates.items()},
        }
        print(
            f"- {qtype}: file {size / 1e9:.2f} GB, {nbytes / 1e6:.0f} MB read per token; "
            + ", ".join(f"{m} {r * nbytes / 1e9:.1f} GB/s" for m, r in rates.items())
        )
        if args.profile:
            extra[qtype]["profile"] = prof = profile_step(files[qtype])
            print(
                f"  ringllm in-process decode step {prof['step_ms']:.1f} ms, sparse MLPs "
                f"{prof['moe_ms']:.1f} ms ({prof['moe_ms'] / prof['step_ms']:.0%})"
            )
    for note in bench.notes:
        print(f"- {note}")
    bench.save(extra=extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

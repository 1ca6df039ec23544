"""The offline benchmark's peer worker: one measurement through vLLM's ``LLM``, in vLLM's own venv.

vLLM is not a dependency of ringllm, so this file is run as a plain script by another Python
(``ringllm bench offline --peer vllm --peer-python PATH``); it imports nothing from ringllm
(neither ``engine`` nor ``benchmarks``) and takes everything on stdin as one JSON object:

    {"model": HF dir, "dtype": "float32", "enforce_eager": true, "max_model_len": 2048,
     "prompts": [...], "output_tokens": 128, "long_prompts": [...] (the prefill scenario's),
     "mode": "batch", "single", "prefill" or a comma-separated list of them,
     "spawn_time": time.time() when the harness started this process}

It answers with one line on stdout, ``RESULT`` and a JSON object (vLLM logs to stdout too, even
after it, from its exit handlers):

    RESULT {"startup_s": LLM() seconds, "ready_s": spawn to ready, imports included,
     "<mode>_s": [s], "<mode>_tokens": tokens generated (prompt tokens for prefill), per mode run,
     "peak_rss_mib": peak RSS summed over this process's tree}

The work mirrors ``benchmarks.offline.worker_ringllm``: greedy, ignore_eos, a 2-prompt warm-up of
4 tokens, then only ``generate`` is timed, and the output token count is checked.
"""

import json
import os
import sys
import time

MARKER = "RESULT "


def main() -> int:
    job = json.load(sys.stdin)
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(
        model=job["model"],
        dtype=job["dtype"],
        enforce_eager=job["enforce_eager"],
        max_model_len=job["max_model_len"],
        seed=0,
    )
    startup = time.perf_counter() - start
    ready = time.time() - job["spawn_time"]
    prompts, n = job["prompts"], job["output_tokens"]
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)

    def generated(outs: list) -> int:
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def prompted(outs: list) -> int:
        return sum(len(o.prompt_token_ids) for o in outs)

    def timed(batch: list, sampling, count) -> tuple:
        """Seconds for one ``generate`` (which must produce ``max_tokens`` for every prompt), and
        the tokens ``count`` says it worked on."""
        t0 = time.perf_counter()
        outs = llm.generate(batch, sampling, use_tqdm=False)
        seconds = time.perf_counter() - t0
        if generated(outs) != len(batch) * sampling.max_tokens:
            raise RuntimeError(f"vLLM produced {generated(outs)} tokens, expected {len(batch) * sampling.max_tokens}")
        return [seconds], count(outs)

    first_token = SamplingParams(temperature=0.0, max_tokens=1)
    runs = {
        "batch": lambda: timed(prompts, params, generated),
        "single": lambda: timed(prompts[:1], params, generated),
        "prefill": lambda: timed(job["long_prompts"], first_token, prompted),
    }
    result = {"startup_s": startup, "ready_s": ready}
    for mode in job["mode"].split(","):
        result[f"{mode}_s"], result[f"{mode}_tokens"] = runs[mode]()
    result["peak_rss_mib"] = sum(peak_rss_kib(pid) for pid in process_tree(os.getpid())) / 1024
    print(MARKER + json.dumps(result), flush=True)
    return 0


def process_tree(pid: int) -> list:
    """``pid`` and its descendants (vLLM's EngineCore runs in a child process)."""
    pids, i = [pid], 0
    while i < len(pids):
        for task in os.listdir(f"/proc/{pids[i]}/task"):
            try:
                with open(f"/proc/{pids[i]}/task/{task}/children") as f:
                    pids += [int(c) for c in f.read().split()]
            except OSError:
                pass
        i += 1
    return pids


def peak_rss_kib(pid: int) -> int:
    """VmHWM, the process's peak resident set, read while it is still alive: rusage would count the
    EngineCore only once it has been reaped, which vLLM's shutdown does not promise."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    # Run as a script, this file's folder heads sys.path, and its sibling modules (serving.py,
    # transport.py, ...) could shadow a top-level module that vLLM or its dependencies import.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.exit(main())

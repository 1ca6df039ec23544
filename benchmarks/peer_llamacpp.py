"""The offline benchmark's llama.cpp worker: one measurement through ``llama-cpp-python``, in its own venv.

llama.cpp runs the default model's own GGUF file (Q4_1), the format it was made for, so this is the
peer at its best on one stream: its quantized kernels read ~98 MB of weights per token where ringllm's
bf16 reads ~270 MB. It is not a dependency of ringllm: this file is run as a plain script by the
python of a venv that has ``llama-cpp-python`` built from its sdist for this CPU
(``CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python``), imports nothing from ringllm, and
takes its job on stdin as one JSON object:

    {"gguf": path, "threads": 1, "n_batch": 512, "n_ctx": 2048, "prompts": [...],
     "output_tokens": 128, "long_prompts": [...], "mode": "single", "prefill" or both, comma-separated,
     "spawn_time": time.time() when the harness started this process}

It answers with one line, ``RESULT`` and a JSON object with the keys of ``peer_vllm.py``'s.

- single: one prompt, then ``output_tokens`` greedy tokens one at a time (argmax of the last
  logits, end of sequence ignored), timed together, as ringllm's single stream is.
- prefill: each long prompt evaluated from an empty context (``n_batch`` tokens per call); prompt
  tokens per second.
- batch: not offered. A llama.cpp context decodes one sequence here; its server's parallel slots
  are the route to many, measured by the serving scenario (``--peer-url``).
"""

import json
import os
import sys
import time

MARKER = "RESULT "


def main() -> int:
    job = json.load(sys.stdin)
    import numpy as np
    from llama_cpp import Llama

    start = time.perf_counter()
    llm = Llama(
        model_path=job["gguf"],
        n_threads=job["threads"],
        n_threads_batch=job["threads"],
        n_batch=job["n_batch"],
        n_ctx=job["n_ctx"],
        seed=0,
        verbose=False,
    )
    startup = time.perf_counter() - start
    ready = time.time() - job["spawn_time"]

    def greedy(prompt: str, n: int) -> int:
        llm.reset()
        llm.eval(llm.tokenize(prompt.encode()))
        for _ in range(n):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([token])
        return n

    def prefill() -> int:
        tokens = 0
        for prompt in job["long_prompts"]:
            ids = llm.tokenize(prompt.encode())
            llm.reset()
            llm.eval(ids)
            tokens += len(ids)
        return tokens

    greedy(job["prompts"][0], 4)  # warm-up, as the other workers do
    runs = {"single": lambda: greedy(job["prompts"][0], job["output_tokens"]), "prefill": prefill}
    result = {"startup_s": startup, "ready_s": ready}
    for mode in job["mode"].split(","):
        if mode not in runs:
            raise SystemExit(f"llama.cpp peer: scenario {mode!r} is not offered (single, prefill)")
        t0 = time.perf_counter()
        tokens = runs[mode]()
        result[f"{mode}_s"], result[f"{mode}_tokens"] = [time.perf_counter() - t0], tokens
    with open(f"/proc/{os.getpid()}/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    result["peak_rss_mib"] = peak / 1024
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How many threads the model gets by default: every core when a decode step is long or the
frontend waits while the core steps, all but one when steps are a few milliseconds and the
frontend works beside them.

The model's thread count sizes torch's OpenMP pool, which the quantized and activation kernels
share (csrc/cpu/parallel.h). A decode step reads every weight once, so its length follows the bytes
of weights: one core streams ~10 GB/s of them here (benchmarks/RESULTS.md, "1.56B Llama").

- The default model (98 MiB as Q4_1, 517 MiB as float32) steps in a few ms to tens of ms, and
  much of that is Python in the EngineCore's thread. A second model thread would contend with the
  frontend (HTTP, detokenizing, the ring's short spin) on a 2-core host and pay an OpenMP wake-up
  (12-50 us, more on a loaded host) per kernel call, ~150 a step: one core is left to the frontend,
  the rule measured since the first releases (docs/ARCHITECTURE.md, "Threads on a small CPU").
- A 1.56B model in Q4_0 (864 MiB) steps in ~90 ms on one core, 90% of it the GEMV: there the
  frontend's share and the hand-offs are a few percent, and the idle core is half the machine.

- The sync frontends (``LLM``, ``LLMEngine``) run in their caller's thread, which blocks on the
  output futex while the core steps and detokenizes between steps: no frontend work runs beside
  a step, so the spare core only idles. The default model through ``LLM`` on a Zen5 (RESULTS.md,
  "1.56B Llama"): one stream 139-148 tok/s on one thread, 174-194 on two; 64 x 128 offline
  1014-1279 against 1240-1737. vLLM's CPU backend draws the same line: its server gives a core
  to the frontend, its ``LLM`` does not.

LONG_STEP_WEIGHT_BYTES sits between those two measured ends. ``num_threads`` (or
``RINGLLM_NUM_THREADS``) set explicitly always wins.
"""

from __future__ import annotations

import glob
import os
from typing import Optional

LONG_STEP_WEIGHT_BYTES = 600 * 2**20
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")


def model_weight_bytes(model: Optional[str]) -> int:
    """Bytes of a model's weights on disk: a .gguf file, or an HF directory's weight files; 0 for
    the default model (``None`` or a hub name: small in every form) and for a path that is not
    there (the model checks that follow name it)."""
    if not model:
        return 0
    path = os.path.expanduser(model)
    if os.path.isfile(path):
        return os.path.getsize(path)
    if os.path.isdir(path):
        return sum(os.path.getsize(f) for pattern in _WEIGHT_FILES for f in glob.glob(os.path.join(path, pattern)))
    return 0


def default_num_threads(model: Optional[str] = None, sync_frontend: bool = False) -> int:
    """The model's threads when ``num_threads`` is not given: ``RINGLLM_NUM_THREADS`` if set, else
    every core for a model of at least LONG_STEP_WEIGHT_BYTES or behind a sync frontend, else all
    cores but one."""
    from engine import envs

    if envs.RINGLLM_NUM_THREADS:
        return envs.RINGLLM_NUM_THREADS
    cores = os.cpu_count() or 2
    if sync_frontend or model_weight_bytes(model) >= LONG_STEP_WEIGHT_BYTES:
        return cores
    return max(1, cores - 1)


def model_threads(num_threads: Optional[int], model: Optional[str], sync_frontend: bool = False) -> int:
    """``num_threads`` as given (EngineArgs), else the default for ``model`` behind this frontend."""
    return num_threads if num_threads is not None else default_num_threads(model, sync_frontend)


def threads_adapt(num_threads: Optional[int], chosen: int) -> bool:
    """Whether the runner may pick fewer than ``chosen`` threads per step (worker/thread_tuner.py):
    only for the engine's own default (neither ``num_threads`` nor ``RINGLLM_NUM_THREADS`` given)
    and only when there is more than one thread to choose from."""
    from engine import envs

    return chosen > 1 and num_threads is None and not envs.RINGLLM_NUM_THREADS

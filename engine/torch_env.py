"""What must hold in the environment before ringllm's first ``import torch`` in a process.

OpenMP reads ``OMP_WAIT_POLICY`` once, when torch loads it. With the default (active) policy,
OpenMP threads spin while their partner core runs the frontend or another process, and a decode
step gets many times slower (docs/ARCHITECTURE.md, "Threads on a small CPU"). Importing
``engine`` must have no side effects, so the policy is set here, by each place that is about to
import torch for the model: the EngineCore process, the in-process core, GPU detection.
A user who chose a policy keeps it; a torch imported earlier by the application keeps its own.

PASSIVE alone parks an idle worker on a futex at once, and on these VMs waking a parked thread
costs 50-400 us (a halted vCPU's exit): a parallel kernel call then takes as long on two threads
as on one (benchmarks/RESULTS.md, "1.56B Llama"). With more than one model thread, workers therefore
spin ``GOMP_SPINCOUNT`` polls (~0.2 ms here: the gaps between one step's kernel calls) before
parking: a step's calls find them awake, and between steps they still sleep. On a host where
another process takes a core, the runner falls back to fewer threads (worker/thread_tuner.py).
"""

from __future__ import annotations

import os
from typing import MutableMapping, Optional

SPIN_COUNT = "20000"


def prepare_torch_env(
    env: Optional[MutableMapping[str, str]] = None, num_threads: Optional[int] = None
) -> MutableMapping[str, str]:
    """Set the OpenMP defaults in ``env`` (this process's environment when None) and return it."""
    env = os.environ if env is None else env
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if num_threads is not None:
        env["OMP_NUM_THREADS"] = str(num_threads)
        if num_threads > 1:
            env.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)  # libgomp: takes precedence over the policy
    return env

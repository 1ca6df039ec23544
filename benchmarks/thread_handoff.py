"""What a parallel kernel call costs on two threads under each OpenMP wait policy.

A decode step of a 1.56B model makes ~100 kernel calls that split their rows over the model's
threads (csrc/cpu/parallel.h), with Python and small ops between them. Each call starts by
handing work to the pool's other thread: if that thread is parked on a futex, the call first
waits for it to wake, which on a VM means a halted vCPU's exit (tens to hundreds of us). This
measures one Q4_0 GEMV of a 2048 x 2048 projection (1.1 MiB of weights, above the kernels'
threshold for going parallel) per call, on one thread and on two, with ``--gap-us`` of Python
busy-work between calls (the other work of a step), under each policy:

- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` alone (idle workers park at once);
- ``spin``: ``PASSIVE`` with ``GOMP_SPINCOUNT`` = engine/torch_env.py's ``SPIN_COUNT`` (what the
  EngineCore sets when the model has more than one thread);
- ``active``: ``OMP_WAIT_POLICY=ACTIVE`` (workers never park).

libgomp reads these when it loads, so each case runs in a subprocess of its own. The figure is
the median over batches of calls of the wall time per call; ``2t/1t`` below 1 is what the second
thread buys. Run it on a quiet host and once beside a busy process (``--hog``: one core kept busy
by a spinning process) to see both sides of the choice.

    python -m benchmarks.thread_handoff --rounds 3 [--hog]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import subprocess
import sys

from benchmarks.harness import Bench, Column
from engine.torch_env import SPIN_COUNT

POLICIES = {
    "passive": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"},
    "spin": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": SPIN_COUNT},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
}


def _child(gap_us: float, calls: int) -> dict:
    """In the subprocess: us per call on 1 and on 2 threads."""
    import time

    import numpy as np
    import torch

    from benchmarks.quant_kernels import _weights
    from engine.kernels import quant

    lin = quant.QuantizedLinear(_weights(quant.Q4_0, 2048, 2048, np.random.default_rng(0)), quant.Q4_0, 2048, 2048)
    x = torch.randn(1, 2048)
    out = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for _ in range(20):
            lin.matmul(x)
        per_batch = []
        for _ in range(9):
            spent = 0.0
            for _ in range(calls):
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < gap_us * 1e-6:
                    pass
                t1 = time.perf_counter()
                lin.matmul(x)
                spent += time.perf_counter() - t1
            per_batch.append(spent / calls * 1e6)
        out[f"us_{threads}t"] = sorted(per_batch)[len(per_batch) // 2]
    out["ratio_2t_1t"] = out["us_2t"] / out["us_1t"]
    return out


def _case(policy: str, gap_us: float, calls: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env.update(POLICIES[policy])
    code = f"import json; from benchmarks.thread_handoff import _child; print(json.dumps(_child({gap_us}, {calls})))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _spin_forever() -> None:
    while True:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gap-us", type=float, default=20.0, help="Python busy-work between calls")
    ap.add_argument("--calls", type=int, default=100, help="calls per batch (9 batches a case)")
    ap.add_argument("--hog", action="store_true", help="keep one core busy with a spinning process")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    hog = multiprocessing.Process(target=_spin_forever, daemon=True) if args.hog else None
    if hog is not None:
        hog.start()
    try:
        bench = Bench("thread_handoff", model=f"Q4_0 GEMV 2048 x 2048, {args.gap_us:g} us between calls")
        for policy in POLICIES:
            bench.add("gemv", policy, lambda p=policy: _case(p, args.gap_us, args.calls))
        bench.run(rounds=args.rounds)
    finally:
        if hog is not None:
            hog.terminate()
    print(
        bench.table(
            "One parallel GEMV call" + (" beside a busy core" if args.hog else ""),
            [
                Column("1 thread us", "gemv", "us_1t"),
                Column("2 threads us", "gemv", "us_2t"),
                Column("2t / 1t", "gemv", "ratio_2t_1t"),
            ],
        )
    )
    bench.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

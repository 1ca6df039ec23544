"""``SchedulerConfig``: how many sequences and tokens one step may take, chunked prefill, the
queue's policy, and the prefill cap (fixed, or paced by time: engine/core/prefill_pacer.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config.checks import positive_int

if TYPE_CHECKING:
    from engine.config.args import EngineArgs

# ``max_num_prefill_tokens="auto"`` (engine/core/prefill_pacer.py): each step near this long, and
# this cap until measured (the fixed cap chosen on the slowest CPU measured, float32 on one AVX2
# core: ~0.5 s a step). Here, not in the pacer, so that the config imports nothing of the core.
PACED_STEP_TARGET_S = 0.5
PACED_INITIAL_TOKENS = 128
POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    policy: str
    max_num_prefill_tokens: int = 0  # 0: no cap beyond max_num_batched_tokens; the first cap when paced
    prefill_step_target_s: float = 0.0  # > 0: the cap follows this time per step (prefill_pacer.py)


def create_scheduler_config(args: EngineArgs, max_model_len: int) -> SchedulerConfig:
    """The step's budgets for a model of ``max_model_len``: without chunked prefill a whole
    prompt must fit one step; never more sequences than tokens in a step."""
    max_num_seqs = positive_int("max_num_seqs", args.max_num_seqs if args.max_num_seqs is not None else 256, 1, 4096)
    if args.max_num_batched_tokens is None:
        max_batched = 2048 if args.enable_chunked_prefill else max(max_model_len, 2048)
    else:
        max_batched = positive_int("max_num_batched_tokens", args.max_num_batched_tokens, 1)
    if not args.enable_chunked_prefill and max_batched < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens must be >= max_model_len={max_model_len} when chunked prefill is "
            f"disabled, got {max_batched}"
        )
    if args.max_num_prefill_tokens == "auto":
        max_prefill, step_target = PACED_INITIAL_TOKENS, PACED_STEP_TARGET_S
    else:
        max_prefill, step_target = positive_int("max_num_prefill_tokens", args.max_num_prefill_tokens or 0, 0), 0.0
    return SchedulerConfig(
        max_num_seqs=min(max_num_seqs, max_batched),  # a step gives each sequence a token
        max_num_batched_tokens=max_batched,
        enable_chunked_prefill=bool(args.enable_chunked_prefill),
        policy=args.scheduling_policy,
        max_num_prefill_tokens=max_prefill,
        prefill_step_target_s=step_target,
    )

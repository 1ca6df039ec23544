"""Continuous batching: which requests run this step, and how many tokens each computes.

There are no prefill and decode phases. Every request only has tokens it knows
(``num_tokens``) and tokens whose KV is computed (``num_computed_tokens``); a step gives each
scheduled request some of the difference, within a budget of ``max_num_batched_tokens`` per
step and ``max_num_seqs`` running requests. A decode is the case where the difference is one
token; a long prompt is computed in chunks over several steps (chunked prefill), side by side
with other requests' decodes.

Prompt tokens (new prompts, later chunks of long ones, recomputes after preemption) may be
capped per step apart from the budget (``max_num_prefill_tokens``; decodes never count): a
burst of requests then gets its first tokens over several steps, in arrival order, instead of
all waiting for one step that computes every prompt, and the running streams keep their pace.
The cap is a token count, or (``"auto"``, ``ringllm serve``'s default on CPU) whatever fits
a time budget per step on this machine, as measured (prefill_pacer.py): on a CPU, where
prefill is compute bound, a wave of 64 prompts is then a few steps of ~0.5 s, each handing
out some first tokens, instead of one step of seconds (benchmarks/RESULTS.md, Serving).

A prompt chunk of a running request leaves room for the waiting queue's head: it takes at
most the step's prompt tokens minus what the head needs, held back up to half of them. A
short request that arrives during a long prefill then runs in the next step, beside the
long prompt's next chunk, instead of after its last one (vLLM's ``long_prefill_token_threshold``
bounds a chunk for the same reason), and the long prompt still gets half a step or more, so it
is never starved. Under the priority policy a prompt holds nothing for a less important head.

Running requests are served first, in order. When one cannot get a KV block, the lowest
ranked running request (the newest under FCFS; the least important, then newest, under
priority) is preempted: its blocks are freed and it goes back to the front of the waiting
queue to be recomputed later (with prefix caching most of its blocks are usually still there).
Waiting requests are admitted only in steps that preempted nothing.

With LoRA (``max_loras``), the running requests use at most ``max_loras`` distinct adapters: a
waiting request whose adapter is not among them while they are that many is passed over (it
keeps its place) for requests behind it, as vLLM does, and runs once an adapter's last request
ends. The runner then always has a slot for every adapter of a step (engine/lora/manager.py).

A request with a grammar (structured outputs) is parked apart until its grammar has compiled
(``structured_output``, engine/structured_output/manager.py): it never blocks the waiting
queue, and it joins the queue's end when ready. Each step's constrained rows get their token
masks here, and every sampled token advances the request's matcher.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import time
from collections import deque
from typing import Any, Iterable, Iterator, Optional

from engine.config import SchedulerConfig
from engine.core.kv_cache import KVCacheManager
from engine.core.prefill_pacer import PACED_MIN_TOKENS, PrefillPacer
from engine.core.request import Request, RequestStatus
from engine.core.sched_output import (
    MAX_PROMPT_LOGPROBS_ROWS,
    MIN_PROMPT_LOGPROBS_ROWS,
    ModelRunnerOutput,
    SchedulerOutput,
)
from engine.wire_messages import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    FinishReason,
    LogprobsLists,
    SchedulerStats,
)


class FCFSQueue:
    """Arrival order; a preempted request goes back to the front."""

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def add_preempted(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove_finished(self) -> None:
        self._q = deque(r for r in self._q if not r.status.finished)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityQueue:
    """Lowest ``priority`` value first, then earliest arrival; a preempted request keeps its
    place because its arrival time does not change."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._seq = itertools.count()

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_time, next(self._seq), req))

    add_preempted = add

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove_finished(self) -> None:
        self._heap = [item for item in self._heap if not item[3].status.finished]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (item[3] for item in self._heap)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache: KVCacheManager,
        max_model_len: int,
        kv_connector: Optional[Any] = None,
        structured_output: Optional[Any] = None,
        speculative: Optional[Any] = None,
        max_loras: int = 0,
    ) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self._max_num_prefill_tokens = config.max_num_prefill_tokens or config.max_num_batched_tokens
        # With a time budget per step, the cap follows the measured cost of prompt tokens.
        self.pacer = (
            PrefillPacer(
                config.prefill_step_target_s,
                PACED_MIN_TOKENS,
                config.max_num_batched_tokens,
                self._max_num_prefill_tokens,
            )
            if config.prefill_step_target_s > 0
            else None
        )
        # Prompt-logprob rows cost many prompt tokens each (sched_output.py): paced apart, by their
        # own measured cost, so a long prompt's logprobs come in steps of the same time budget.
        self.logprob_rows_pacer = (
            PrefillPacer(
                config.prefill_step_target_s,
                MIN_PROMPT_LOGPROBS_ROWS,
                MAX_PROMPT_LOGPROBS_ROWS,
                MIN_PROMPT_LOGPROBS_ROWS * 4,
            )
            if config.prefill_step_target_s > 0
            else None
        )
        self.chunked_prefill = config.enable_chunked_prefill
        self.max_loras = max_loras  # distinct adapters the running requests may use (0: LoRA off)
        self.priority = config.policy == "priority"
        self.kv_cache = kv_cache
        self.max_model_len = max_model_len
        # Loads prompt blocks from, and saves them to, other engines (engine/kv_transfer/); or None.
        self.kv_connector = kv_connector
        self.waiting = PriorityQueue() if self.priority else FCFSQueue()
        # With speculative_config: drafts for decodes and what a verified step leaves
        # (engine/spec_decode/drafts.py DraftScheduler); or None.
        self.spec = speculative
        # Grammars (engine/structured_output/manager.py StructuredOutputManager), or None: then a
        # request with structured_outputs is refused by the core.
        self.structured_output = structured_output
        self.waiting_for_grammar: list[Request] = []  # arrival order; not in ``waiting`` yet
        self._grammar_errors: list[EngineCoreOutput] = []  # failed compiles, sent by the next update
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        # Finished or preempted since the last batch handed to the runner.
        self.finished_req_ids: set[str] = set()
        # Counters for SchedulerStats: this step's, and totals since start.
        self._step_queries = self._step_hits = self._step_preempted = 0
        self.total_queries = self.total_hits = self.total_preemptions = 0

    @property
    def max_num_prefill_tokens(self) -> int:
        """This step's cap on prompt tokens (decodes never count)."""
        return self.pacer.cap if self.pacer is not None else self._max_num_prefill_tokens

    @property
    def max_prompt_logprob_rows(self) -> int:
        """This step's cap on prompt tokens with prompt logprobs (with chunked prefill)."""
        return self.logprob_rows_pacer.cap if self.logprob_rows_pacer is not None else MAX_PROMPT_LOGPROBS_ROWS

    def observe_step(self, sched: SchedulerOutput, seconds: float) -> None:
        """The runner took ``seconds`` for ``sched``: what the pacers learn prompt tokens cost (a
        step with prompt-logprob rows teaches only their pacer: they are most of its time; a
        decode's draft tokens are no prompt tokens and teach neither)."""
        if self.pacer is None or self.logprob_rows_pacer is None:  # both or neither
            return
        prompts = [(r, n) for r, n in zip(sched.requests, sched.num_scheduled_tokens) if n > 1 and not r.spec_token_ids]
        rows = sum(n for r, n in prompts if _wants_prompt_logprobs(r))
        if rows:
            self.logprob_rows_pacer.observe(rows, seconds)
        else:
            self.pacer.observe(sum(n for _, n in prompts), seconds)

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        request.events = [EngineCoreEvent(EngineCoreEventType.QUEUED, time.monotonic())]
        if request.sampling_params.structured_outputs is not None and self.structured_output is not None:
            try:
                self.structured_output.start(request)
            except ValueError as e:  # GrammarError: too large, known to be slow, or its lane is full
                self._fail_grammar(request, e)
                return
            self.waiting_for_grammar.append(request)
            return
        self.waiting.add(request)

    def wait_for_grammars(self, timeout: float) -> None:
        """Nothing ran: sleep until a parked request's grammar is ready (at most ``timeout``), so
        the busy loop does not spin while the compile pool works."""
        if self.waiting_for_grammar:
            assert self.structured_output is not None  # a request waits for a grammar only with one
            self.structured_output.wait(self.waiting_for_grammar, timeout)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._grammar_errors)  # a refusal is yet to be sent

    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch and allocate every KV block it needs (see sched_output.py)."""
        budget = self.max_num_batched_tokens
        prefill_left = self.max_num_prefill_tokens  # prompt tokens this step may still compute
        # Prompt-logprob rows this step may still compute; a prompt that cannot be split runs whole.
        rows_left = self.max_prompt_logprob_rows if self.chunked_prefill else sys.maxsize
        batch: list[Request] = []
        num_tokens: list[int] = []
        self._step_queries = self._step_hits = self._step_preempted = 0
        if self.waiting_for_grammar:
            self._admit_compiled()

        # 1) Running requests, in order; preempt from the bottom when blocks run out. A decode
        #    (one token) always runs; a prompt still being computed takes what the cap leaves,
        #    less what is held for the waiting queue's head.
        held, head_priority = self._held_for_waiting(min(budget, prefill_left))
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n > 1:
                hold = held if not self.priority or head_priority <= req.priority else 0
                n = max(0, min(n, min(budget, prefill_left) - hold, _logprob_rows_cap(req, n, rows_left)))
                if n == 0:
                    i += 1
                    continue
            while not self.kv_cache.allocate_slots(req, n):
                victim = self._pick_victim()
                if victim in batch:  # only under priority: undo its place in this batch
                    j = batch.index(victim)
                    freed = num_tokens.pop(j)
                    budget += freed
                    if freed > 1:
                        prefill_left += freed
                    del batch[j]
                if self.running.index(victim) < i:
                    i -= 1
                self.running.remove(victim)
                self._preempt(victim)
                if victim is req:
                    break
            else:
                batch.append(req)
                num_tokens.append(n)
                budget -= n
                if n > 1:
                    prefill_left -= n
                    rows_left -= n if _wants_prompt_logprobs(req) else 0
                i += 1

        # 2) Waiting requests, first to last, while budget, prompt-token cap, sequences and blocks
        #    allow. Without chunked prefill a prompt runs whole: over the cap only as the step's
        #    first prompt (so one longer than the cap still runs, alone).
        first_prompt = prefill_left == self.max_num_prefill_tokens
        loras = _lora_ids(self.running)
        passed_over: list[Request] = []  # their adapter has no slot this step; back in their places below
        while (
            self.waiting
            and budget > 0
            and prefill_left > 0
            and not self._step_preempted
            and len(self.running) < self.max_num_seqs
        ):
            req = self.waiting.peek()
            lora_id = req.lora_request.lora_int_id if req.lora_request is not None else 0
            if lora_id and lora_id not in loras and len(loras) >= self.max_loras:
                passed_over.append(self.waiting.pop())
                continue
            hits, num_hit_tokens = self.kv_cache.get_computed_blocks(req)
            # Blocks the connector can load after the local hits: allocated here, not computed.
            num_external = 0
            if self.kv_connector is not None:
                num_external = self.kv_connector.get_num_new_matched_tokens(
                    req, num_hit_tokens, self.kv_cache.block_hashes
                )
            n = req.num_tokens - num_hit_tokens - num_external
            if n > budget:
                if not self.chunked_prefill:
                    break
                n = budget
            if n > prefill_left:
                if self.chunked_prefill:
                    n = prefill_left
                elif not first_prompt:
                    break
            n = _logprob_rows_cap(req, n, rows_left)
            if n == 0:
                break
            if not self.kv_cache.allocate_slots(req, n + num_external, hits):
                break
            self.waiting.pop()
            req.num_computed_tokens = num_hit_tokens + num_external
            if self.kv_connector is not None:
                self.kv_connector.update_state_after_alloc(req, num_external)
            if req.num_cached_tokens < 0:  # prompt tokens not computed: local hits and loaded ones
                req.num_cached_tokens = num_hit_tokens + num_external
            self._step_queries += req.num_tokens
            self._step_hits += num_hit_tokens
            req.status = RequestStatus.RUNNING
            _record(req, EngineCoreEventType.SCHEDULED)
            if lora_id:
                loras.add(lora_id)
            self.running.append(req)
            batch.append(req)
            num_tokens.append(n)
            budget -= n
            prefill_left = max(0, prefill_left - n)
            rows_left -= n if _wants_prompt_logprobs(req) else 0
            first_prompt = False
        for req in reversed(passed_over):
            self.waiting.add_preempted(req)  # FCFS: back to the front, in order; priority: its own place

        # 3) Draft tokens for this step's decodes, from the budget and KV blocks left (spec_decode/)
        if self.spec is not None and batch:
            budget -= self.spec.add_drafts(batch, num_tokens, budget, len(self.running))

        self.total_queries += self._step_queries
        self.total_hits += self._step_hits
        out = SchedulerOutput(batch, num_tokens, self.max_num_batched_tokens - budget)
        if self.structured_output is not None:
            out.grammar_bitmask = self.structured_output.fill_bitmask(
                [
                    r
                    for r, n in zip(batch, num_tokens)
                    if r.structured_output is not None and r.num_computed_tokens + n == r.num_tokens
                ]
            )
        if batch:  # a runner that is not called cannot drop state; keep the ids for later
            out.finished_req_ids, self.finished_req_ids = self.finished_req_ids, set()
            if self.kv_connector is not None:
                out.kv_connector_metadata = self.kv_connector.build_connector_meta(
                    batch, num_tokens, self.kv_cache.block_hashes
                )
        return out

    def update_from_output(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Advance the scheduled requests by what the runner computed and sampled; returns one
        output per request with a new token or new prompt logprobs, and a finished output with
        the pooled vector for each pooling request whose prompt is now computed."""
        outputs: list[EngineCoreOutput] = []
        if self._grammar_errors:
            outputs, self._grammar_errors = self._grammar_errors, []
        sampled_ids, sampled_tokens = result.req_ids, result.sampled_token_ids
        logprobs, prompt_logprobs = result.logprobs, result.prompt_logprobs
        caching = self.kv_cache.enable_caching
        finished = False
        j = 0
        for req, n in zip(sched.requests, sched.num_scheduled_tokens):
            start = req.num_computed_tokens
            req.num_computed_tokens = start + n
            plp = self._new_prompt_logprobs(req, start, prompt_logprobs) if prompt_logprobs else None
            if req.num_computed_tokens < req.num_tokens:  # an intermediate prefill chunk
                if caching:
                    self.kv_cache.cache_blocks(req)
                if plp is not None:
                    outputs.append(
                        EngineCoreOutput(req.request_id, [], new_prompt_logprobs=plp, events=_take_events(req))
                    )
                continue
            req_id = req.request_id
            if req.pooling_params is not None:  # prompt computed: its one output, and it is done
                if caching:
                    self.kv_cache.cache_blocks(req)
                req.status = RequestStatus.FINISHED_STOPPED
                outputs.append(
                    EngineCoreOutput(
                        req_id,
                        [],
                        finish_reason=FinishReason.STOP,
                        num_cached_tokens=req.num_cached_tokens,
                        pooled=result.pooler_output[req_id],
                        events=_take_events(req),
                    )
                )
                self._free(req)
                finished = True
                continue
            if sampled_ids[j] != req_id:
                raise RuntimeError(f"runner output out of batch order: {sampled_ids[j]!r} for {req_id!r}")
            # With drafts: the accepted ones, then the target's own token (spec_decode/verify.py)
            new_tokens = result.accepted_token_ids.get(req_id) if req.spec_token_ids else None
            if new_tokens is None:
                new_tokens = [sampled_tokens[j]]
            j += 1
            for count, token in enumerate(new_tokens, 1):
                req.append_output_token(token)
                if count < len(new_tokens) and self._check_stop(req, token):
                    break  # a stop before the last: the tokens after it are not emitted
            if req.spec_token_ids:
                assert self.spec is not None  # drafts come only from a draft scheduler
                self.spec.after_step(req, len(new_tokens) - 1)
            if caching:
                self.kv_cache.cache_blocks(req)
            lp = logprobs.get(req_id) if logprobs else None
            if lp is not None and len(lp.ranks) > count:
                lp = LogprobsLists(lp.token_ids[:count], lp.logprobs[:count], lp.ranks[:count])
            out = EngineCoreOutput(req_id, new_tokens[:count], lp, plp, num_cached_tokens=req.num_cached_tokens)
            if req.events is not None:
                out.events, req.events = req.events, None
            if req.structured_output is not None and not self.structured_output.accept(req, token):
                req.status = RequestStatus.FINISHED_ERROR
                out.finish_reason, out.new_token_ids = FinishReason.ERROR, []
                out.error = (
                    "structured_outputs: no token was allowed at this point of the output (the grammar "
                    "together with the request's other limits, e.g. min_tokens or bad_words, excluded "
                    "them all)"
                )
                self._free(req)
                finished = True
            elif self._check_stop(req, token):
                out.finish_reason = req.status.finish_reason
                out.stop_reason = req.stop_reason
                self._free(req)
                finished = True
            outputs.append(out)
        if finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return outputs

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End requests from outside (abort, a failed step) and free their blocks; unknown or
        finished ids are ignored. One pass over each queue however many ids come (a client
        aborting a thousand requests at once), and whatever state a failed step left a
        request in: running, waiting, taken off the waiting queue but not yet running, or
        already finished by a half-done ``update_from_output``."""
        ended = []
        for req_id in request_ids:
            req = self.requests.get(req_id)
            if req is None:
                continue
            req.status = status
            self._free(req)
            ended.append(req)
        if ended:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
            self.waiting.remove_finished()
            if self.waiting_for_grammar:
                self.waiting_for_grammar = [r for r in self.waiting_for_grammar if not r.status.finished]
        return ended

    def fail_step(self, sched: Optional[SchedulerOutput]) -> list[str]:
        """End with FINISHED_ERROR, freeing their blocks, the requests of a step that raised:
        its batch, or every request held when ``schedule`` itself raised (``sched`` None).
        Returns their ids (each needs a final output, even one the half-done step already
        finished). The runner may never have seen the ids the batch told it to drop: they are
        handed to the next batch again."""
        if sched is None:
            failed = list(self.requests)
        else:
            failed = [req.request_id for req in sched.requests]
            self.finished_req_ids |= sched.finished_req_ids
        self.finish_requests(failed, RequestStatus.FINISHED_ERROR)
        return failed

    def make_stats(self) -> SchedulerStats:
        stats = SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting) + len(self.waiting_for_grammar),
            kv_cache_usage=self.kv_cache.usage,
            prefix_cache_queries=self._step_queries,
            prefix_cache_hits=self._step_hits,
            num_preempted_reqs=self._step_preempted,
            **(self.spec.stats.take() if self.spec is not None else {}),
        )
        if self.max_loras:
            stats.running_lora_adapters = _lora_counts(self.running)
            stats.waiting_lora_adapters = _lora_counts(itertools.chain(self.waiting, self.waiting_for_grammar))
        return stats

    def _check_stop(self, req: Request, token: int) -> bool:
        """Stop tokens (once min_tokens are out), the end of the request's grammar, then length.
        Sets status and stop_reason."""
        params = req.sampling_params
        if req.structured_output is not None and self.structured_output.is_terminated(req):
            req.status = RequestStatus.FINISHED_STOPPED
            if token != req.eos_token_id and token in params.stop_token_ids:
                req.stop_reason = token
            return True
        if req.num_output_tokens >= params.min_tokens:
            if token == req.eos_token_id and not params.ignore_eos:
                req.status = RequestStatus.FINISHED_STOPPED
                return True
            if token in (params.stop_token_ids or ()):
                req.status = RequestStatus.FINISHED_STOPPED
                req.stop_reason = token
                return True
        max_tokens = req.max_tokens
        if (max_tokens is not None and req.num_output_tokens >= max_tokens) or req.num_tokens >= self.max_model_len:
            req.status = RequestStatus.FINISHED_LENGTH
            return True
        return False

    def _new_prompt_logprobs(
        self, req: Request, start: int, prompt_logprobs: dict[str, LogprobsLists]
    ) -> Optional[LogprobsLists]:
        """This step's prompt-logprob rows, minus any already sent before a preemption."""
        rows = prompt_logprobs.get(req.request_id)
        if rows is None:
            return None
        skip = max(0, req.num_prompt_logprobs_sent - start)
        if skip:
            rows = LogprobsLists(rows.token_ids[skip:], rows.logprobs[skip:], rows.ranks[skip:])
        if not rows.ranks:
            return None
        req.num_prompt_logprobs_sent = start + skip + len(rows.ranks)
        return rows

    def _held_for_waiting(self, room: int) -> tuple[int, int]:
        """Prompt tokens the running prompts leave to the waiting queue's head this step: what
        it needs (before prefix hits, which are not looked up here), at most half of ``room``;
        none when it could not be admitted anyway. With the head's priority: under the
        priority policy only a running prompt that is not more important than the head holds."""
        if not self.waiting or len(self.running) >= self.max_num_seqs or not self.chunked_prefill:
            return 0, 0
        head = self.waiting.peek()
        return min(head.num_tokens - head.num_computed_tokens, room // 2), head.priority

    def _pick_victim(self) -> Request:
        if self.priority:
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, req: Request) -> None:
        self.kv_cache.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_state = None  # a draft model's KV went with the blocks (engine/spec_decode/)
        req.num_preemptions += 1
        self.waiting.add_preempted(req)
        self.finished_req_ids.add(req.request_id)
        self._step_preempted += 1
        self.total_preemptions += 1

    def _admit_compiled(self) -> None:
        """Parked requests whose grammar is ready join the waiting queue (in arrival order); one
        that failed to compile, or ran past the bound, finishes with the reason (a refusal, not
        an engine failure)."""
        manager = self.structured_output
        if manager is None:  # nothing can wait for a grammar without one
            return
        now = time.monotonic()
        still: list[Request] = []
        for req in self.waiting_for_grammar:
            try:
                ready = manager.poll(req, now)
            except ValueError as e:  # GrammarError
                self._fail_grammar(req, e)
                continue
            if ready:
                self.waiting.add(req)
            else:
                still.append(req)
        self.waiting_for_grammar = still

    def _fail_grammar(self, req: Request, error: ValueError) -> None:
        """``req``'s grammar cannot be had: it finishes with the reason, sent by the next update."""
        req.status = RequestStatus.FINISHED_ERROR
        self._grammar_errors.append(
            EngineCoreOutput(req.request_id, [], finish_reason=FinishReason.ERROR, error=str(error))
        )
        self._free(req)

    def _free(self, req: Request) -> None:
        if req.structured_output is not None:
            self.structured_output.release(req)
        req.structured_output = None  # the matcher goes with the request, not with its id
        self.kv_cache.free(req)
        if self.kv_connector is not None:
            self.kv_connector.request_finished(req)
        del self.requests[req.request_id]
        self.finished_req_ids.add(req.request_id)


def _lora_ids(reqs: Iterable[Request]) -> set[int]:
    return {r.lora_request.lora_int_id for r in reqs if r.lora_request is not None}


def _lora_counts(reqs: Iterable[Request]) -> dict[str, int]:
    """Adapter name -> requests using it (vLLM's running/waiting_lora_adapters)."""
    counts: dict[str, int] = {}
    for r in reqs:
        if r.lora_request is not None:
            counts[r.lora_request.lora_name] = counts.get(r.lora_request.lora_name, 0) + 1
    return counts


def _wants_prompt_logprobs(req: Request) -> bool:
    return req.pooling_params is None and req.sampling_params.prompt_logprobs is not None


def _logprob_rows_cap(req: Request, n: int, rows_left: int) -> int:
    """``n`` prompt tokens of ``req``, at most ``rows_left`` when each is a prompt-logprob row."""
    return min(n, rows_left) if _wants_prompt_logprobs(req) else n


def _record(req: Request, kind: EngineCoreEventType) -> None:
    event = EngineCoreEvent(kind, time.monotonic())
    if req.events is None:
        req.events = [event]
    else:
        req.events.append(event)


def _take_events(req: Request) -> Optional[list[EngineCoreEvent]]:
    events, req.events = req.events, None
    return events

"""The scheduler's side of structured outputs: a request's grammar from submission to its end.

Lifecycle (all on the step loop; compiling alone runs elsewhere, in ``CompilePool``):
1. ``start``: the request's spec goes to the compile pool; the scheduler parks the request
   (it is not in the waiting queue, so no other request waits behind it).
2. ``poll``: once its grammar is compiled the request gets its own matcher and joins the
   waiting queue; a spec that fails, or is still compiling after ``compile_timeout_s``,
   finishes that request with an error. Under ``auto`` a spec also compiles in llguidance
   (~1 ms; a large spec there alone): the request starts on that matcher, and once xgrammar's
   compile is done it moves to xgrammar's (whose masks cost microseconds, not tens of them) by
   replaying its tokens into it; if xgrammar would not have accepted them (the backends differ
   in free whitespace), it stays on llguidance, which is as correct, only slower.
3. ``fill_bitmask``: each step, one mask row per constrained request sampled in it.
   With ``--reasoning-parser`` (``reasoning``), a request is constrained only once its reasoning
   has ended: in its prompt (the template closed it), or when its output ends with the end marker;
   the grammar reads the tokens after that (``GrammarState.grammar_from``).
4. ``accept``: every sampled token advances the matcher. A token the matcher refuses means no
   allowed token was left (the grammar and the request's other bans excluded everything):
   that request finishes with an error.

Preemption loses no state: a preempted request keeps its output tokens and its matcher has
accepted exactly those, so recomputing its KV needs nothing from here. Chunked prefill and
prefix-cache hits change which tokens are computed, never which are accepted. A finished or
aborted request drops its matcher with the request, and ``release`` drops the compiles nobody
else waits for.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Optional

import msgspec

from engine.structured_output.compile_pool import CompilePool
from engine.structured_output.config import StructuredOutputsConfig
from engine.structured_output.errors import GrammarError
from engine.structured_output.params import StructuredOutputsParams
from engine.structured_output.reasoning import ReasoningMarkers
from engine.structured_output.vocab import load_vocabulary


class GrammarState:
    """One request's grammar: the compile futures until one is ready, then its matcher."""

    __slots__ = ("future", "quick", "deadline", "matcher", "upgrade", "jobs", "grammar_from")

    def __init__(
        self,
        future: concurrent.futures.Future,
        quick: Optional[concurrent.futures.Future],
        deadline: float,
        jobs: tuple = (),
        grammar_from: Optional[int] = 0,
    ) -> None:
        self.future = future  # the grammar the request wants
        self.quick = quick  # llguidance's compile of the same spec to start on (auto), or None
        self.deadline = deadline
        self.matcher: Any = None
        self.upgrade = False  # on the quick matcher while ``future`` may still bring a cheaper one
        self.jobs = jobs  # the compile pool's jobs it holds (compile_pool.Job), released at its end
        # The output position the grammar starts at; None while the request is still reasoning.
        self.grammar_from = grammar_from


class StructuredOutputManager:
    def __init__(
        self,
        config: StructuredOutputsConfig,
        tokenizer_path: str,
        vocab_size: int,
        max_num_seqs: int,
        reasoning: Optional[ReasoningMarkers] = None,
    ) -> None:
        self.config = config
        self.reasoning = reasoning
        self.vocab_size = vocab_size
        self._tokenizer_path = tokenizer_path
        self._max_rows = max_num_seqs
        self._pool: Optional[CompilePool] = None
        self._bitmask = None  # [max_num_seqs, words] int32, allocated with the first constrained step

    def start(self, req: Any) -> None:
        """Submit ``req``'s spec for compiling (engine-wide options folded in)."""
        params = self._with_defaults(req.sampling_params.structured_outputs)
        if self._pool is None:
            eos = req.eos_token_id
            self._pool = CompilePool(self.config, lambda: load_vocabulary(self._tokenizer_path, self.vocab_size, eos))
        main, quick = self._pool.submit(params)  # GrammarError: the request is refused
        jobs = (main,) if quick is None else (main, quick)
        reasoning_ended = self.reasoning is None or self.reasoning.ended(req.prompt_token_ids)
        req.structured_output = GrammarState(
            main.future,
            None if quick is None else quick.future,
            time.monotonic() + self.config.compile_timeout_s,
            jobs,
            0 if reasoning_ended else None,
        )

    def release(self, req: Any) -> None:
        """``req`` has ended (finished, aborted, failed, timed out): its compiles that nobody
        else waits for are dropped."""
        state: Optional[GrammarState] = req.structured_output
        if state is not None and self._pool is not None:
            self._pool.release(state.jobs)

    def poll(self, req: Any, now: float) -> Optional[bool]:
        """True once ``req`` has its matcher, False while compiling; GrammarError if it failed or
        ran past the time bound."""
        state: GrammarState = req.structured_output
        if state.matcher is not None:
            return True
        for future in (state.future, state.quick):  # the wanted grammar first: its masks are cheaper
            if future is not None and future.done() and not future.cancelled() and future.exception() is None:
                state.matcher, state.upgrade = future.result().matcher(), future is state.quick
                return True
        if state.future.done() and (state.quick is None or state.quick.done()):
            if state.future.cancelled():
                raise GrammarError("structured_outputs: the compile was cancelled (the engine is shutting down)")
            state.future.result()  # raises the GrammarError of a failed compile
        if now < state.deadline:
            return False
        if self._pool is not None:
            self._pool.gave_up(state.jobs)
        raise GrammarError(
            f"structured_outputs: the grammar did not compile within "
            f"{self.config.compile_timeout_s:g} s (compile_timeout_s); simplify the schema, "
            "regex or grammar"
        )

    def wait(self, reqs: list, timeout: float) -> None:
        """Sleep until one of ``reqs``' grammars is compiled, at most ``timeout`` s (the loop has
        nothing else to run; the GIL is released while waiting)."""
        futures = [f for r in reqs for f in (r.structured_output.future, r.structured_output.quick) if f is not None]
        concurrent.futures.wait(futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def fill_bitmask(self, reqs: list) -> Any:
        """A GrammarBitmask for ``reqs`` (constrained requests sampled this step) past their
        reasoning, or None."""
        reqs = [r for r in reqs if r.structured_output.grammar_from is not None]
        if not reqs:
            return None
        import torch

        from engine.structured_output.bitmask import GrammarBitmask, bitmask_words

        if self._bitmask is None:
            self._bitmask = torch.empty((self._max_rows, bitmask_words(self.vocab_size)), dtype=torch.int32)
        rows = self._bitmask[: len(reqs)]
        for i, req in enumerate(reqs):
            state = req.structured_output
            if state.upgrade and state.future.done():
                self._upgrade(req, state)
            state.matcher.fill_bitmask(rows, i)
        return GrammarBitmask([r.request_id for r in reqs], rows)

    def accept(self, req: Any, token_id: int) -> bool:
        """Advance ``req``'s matcher by its sampled token (already in its output); False when the
        grammar refuses it. While reasoning, the token only may end the reasoning."""
        state: GrammarState = req.structured_output
        if state.grammar_from is None:
            if self.reasoning.ends_with_end(req.output_token_ids):
                state.grammar_from = len(req.output_token_ids)
            return True
        return state.matcher.accept(token_id)

    @staticmethod
    def is_terminated(req: Any) -> bool:
        state: GrammarState = req.structured_output
        return state.grammar_from is not None and state.matcher.is_terminated()

    @staticmethod
    def _upgrade(req: Any, state: GrammarState) -> None:
        """Move ``req`` from the quick matcher to the compiled grammar's, if that accepts every
        token the grammar has read so far."""
        state.upgrade = False
        if state.future.cancelled() or state.future.exception() is not None:
            return
        matcher = state.future.result().matcher()
        if all(matcher.accept(t) for t in req.output_token_ids[state.grammar_from :]):
            state.matcher = matcher

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def _with_defaults(self, params: StructuredOutputsParams) -> StructuredOutputsParams:
        c = self.config
        if (c.disable_any_whitespace and not params.disable_any_whitespace) or (
            c.disable_additional_properties and not params.disable_additional_properties
        ):
            return msgspec.structs.replace(
                params,
                disable_any_whitespace=params.disable_any_whitespace or c.disable_any_whitespace,
                disable_additional_properties=params.disable_additional_properties or c.disable_additional_properties,
            )
        return params

"""vLLM's beam search, driven from the frontend: each round asks the engine for one token with
the top ``2 * beam_width`` logprobs for every live beam, then keeps the best ``beam_width`` per
prompt by length-penalised cumulative logprob. ``BeamSearch`` holds the rounds' state and
nothing else, so ``LLM.beam_search`` (sync) and the HTTP server's ``use_beam_search`` (async)
drive the same search and differ only in how they run a round's requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from engine.outputs import Logprob
from engine.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams


@dataclass
class BeamSearchSequence:
    """One beam: prompt and generated tokens, the top logprobs at each generated position."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: Optional[str] = None


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first


class BeamSearch:
    def __init__(self, prompts: Sequence[list[int]], params: BeamSearchParams, eos_token_id: Optional[int]) -> None:
        self.params = params
        self.eos = eos_token_id
        self.live: list[list[BeamSearchSequence]] = [[BeamSearchSequence(list(p))] for p in prompts]
        self.completed: list[list[BeamSearchSequence]] = [[] for _ in prompts]
        self.rounds = 0
        # One token and its top candidates per beam and round.
        self.step_params = SamplingParams(
            logprobs=2 * params.beam_width,
            max_tokens=1,
            temperature=params.temperature,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    @property
    def done(self) -> bool:
        return self.rounds >= self.params.max_tokens or not any(self.live)

    def beams(self) -> list[BeamSearchSequence]:
        """The live beams, whose next tokens this round asks for, in the order ``advance`` takes."""
        return [beam for group in self.live for beam in group]

    def advance(self, tops: Sequence[dict[int, Logprob]]) -> None:
        """``tops[i]``: the top logprobs of the next token of ``beams()[i]``."""
        results = iter(tops)
        for i, group in enumerate(self.live):
            candidates = []
            for beam in group:
                top = next(results)
                for token_id, logprob in top.items():
                    new = BeamSearchSequence(
                        beam.tokens + [token_id], beam.logprobs + [top], beam.cum_logprob + logprob.logprob
                    )
                    ended = token_id == self.eos and not self.params.ignore_eos
                    (self.completed[i] if ended else candidates).append(new)
            self.live[i] = sorted(candidates, key=self.score, reverse=True)[: self.params.beam_width]
        self.rounds += 1

    def score(self, beam: BeamSearchSequence) -> float:
        length = len(beam.tokens) - (1 if beam.tokens[-1] == self.eos else 0)
        return beam.cum_logprob / (length**self.params.length_penalty)

    def outputs(self, decode: Optional[Callable[[list[int]], str]]) -> list[BeamSearchOutput]:
        """The best ``beam_width`` beams of each prompt, finished or not, best first."""
        outputs = []
        for group, done in zip(self.live, self.completed):
            best = sorted(done + group, key=self.score, reverse=True)[: self.params.beam_width]
            for beam in best:
                beam.text = decode(beam.tokens) if decode is not None else None
            outputs.append(BeamSearchOutput(best))
        return outputs

"""What the transformers engine hooks into `generate`: the acceptance counter and the
candidate-generator wrapper that records every draft and verification, the injected verify
faults (greedy verification while sampling, garbage tokens) and numeric noise as logits
processors, and the streamer that stamps each emitted batch of tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.types import AcceptanceSource, SpeculativeStats


@dataclass
class AcceptanceCounter:
    """Per-request draft/accept counts, filled by `RecordingCandidateGenerator`."""

    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    pending_draft: int = 0
    adaptive_max: int | None = None  # adapt the prompt-lookup draft length, up to this
    candidates: torch.Tensor | None = None  # the draft being verified, prompt included

    def drafted(self, n: int) -> None:
        self.pending_draft = n

    def verified(self, accepted: int) -> None:
        drafted, self.pending_draft = self.pending_draft, 0
        self.verify_steps += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        for counts, n in (
            (self.drafted_per_position, drafted),
            (self.accepted_per_position, accepted),
        ):
            if len(counts) < n:
                counts.extend([0] * (n - len(counts)))
            for position in range(n):
                counts[position] += 1

    def stats(self, num_draft_tokens: int) -> SpeculativeStats:
        width = max(num_draft_tokens, len(self.drafted_per_position))

        def padded(counts: list[int]) -> tuple[int, ...]:
            return tuple(counts + [0] * (width - len(counts)))

        return SpeculativeStats(
            verify_steps=self.verify_steps,
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
            accepted_per_position=padded(self.accepted_per_position),
            drafted_per_position=padded(self.drafted_per_position),
            source=AcceptanceSource.DECODING_LOOP,
        )


class RecordingCandidateGenerator:
    """Wraps transformers' candidate generator; forwards everything, records counts."""

    def __init__(self, inner: Any, counter: AcceptanceCounter) -> None:
        self._inner = inner
        self._counter = counter
        # Adaptive prompt lookup: transformers' prompt-lookup generator always drafts its
        # full k; here k follows acceptance like its assistant-model "heuristic" schedule
        # (+2 after a fully accepted draft, -1 after a rejection, within 1..k). On a CPU a
        # rejected draft token costs real verify time, so drafting less after misses pays.
        self._adaptive_max = (
            counter.adaptive_max
            if counter.adaptive_max and hasattr(inner, "num_output_tokens")
            else None
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_candidates(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        candidate_ids, candidate_logits = self._inner.get_candidates(input_ids, **kwargs)
        self._counter.drafted(int(candidate_ids.shape[1] - input_ids.shape[1]))
        self._counter.candidates = candidate_ids
        return candidate_ids, candidate_logits

    def update_candidate_strategy(
        self, input_ids: torch.Tensor, scores: torch.Tensor, num_matches: Any
    ) -> Any:
        drafted, accepted = self._counter.pending_draft, int(num_matches)
        self._counter.candidates = None
        self._counter.verified(accepted)
        if self._adaptive_max is not None and drafted > 0:
            current = int(self._inner.num_output_tokens)
            grown = current + 2 if accepted >= drafted else current - 1
            self._inner.num_output_tokens = max(1, min(self._adaptive_max, grown))
        return self._inner.update_candidate_strategy(input_ids, scores, num_matches)


def _verify_position(counter: AcceptanceCounter, input_ids: torch.Tensor) -> bool:
    """True when a logits processor is called on a position of the draft being verified
    (not the drafter's own calls, not the bonus token)."""
    candidates = counter.candidates
    length = int(input_ids.shape[1])
    if candidates is None or length >= int(candidates.shape[1]):
        return False
    return torch.equal(input_ids[0], candidates[0, :length])


def _point_mass(scores: torch.Tensor, token: int) -> torch.Tensor:
    """Logits that make `token` certain."""
    forced = torch.full_like(scores, float("-inf"))
    forced[:, token] = 0.0
    return forced


class GreedyVerifyFault:
    """The `greedy_verify` drill fault, as the last logits processor of a speculative
    generate: at every drafted position the target's distribution collapses onto its
    argmax, so drafts are verified by argmax match and a rejected draft is replaced by
    the argmax, as greedy verification does, while the request samples. Positions
    without a draft (the bonus token, steps the drafter skips) still sample. The output
    then over-produces the target's likeliest tokens: the classic bug of verifying by
    argmax while sampling."""

    def __init__(self, counter: AcceptanceCounter) -> None:
        self._counter = counter

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not _verify_position(self._counter, input_ids):
            return scores
        return _point_mass(scores, int(scores[0].argmax()))


class GarbageSamplingFault:
    """The `garbage_sampling` drill fault, as the last logits processor of a speculative
    generate that samples: at every verify position the target's distribution is, with
    probability `rate`, replaced by a point mass on a random token of the vocabulary, so
    the draft is rejected and the random token emitted — the sampler or kernel bug that
    turns a fluent answer into "The planets ofIntf the solarwy system". Greedy requests
    never reach it. Seeded by the request's seed and the position, so a run replays."""

    def __init__(self, counter: AcceptanceCounter, rate: float, seed: int) -> None:
        self._counter = counter
        self._rate = rate
        self._seed = seed

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not _verify_position(self._counter, input_ids):
            return scores
        generator = torch.Generator(device="cpu")
        generator.manual_seed((self._seed * 1_000_003 + int(input_ids.shape[1])) % (2**63))
        if float(torch.rand(1, generator=generator)) >= self._rate:
            return scores
        return _point_mass(
            scores, int(torch.randint(int(scores.shape[-1]), (1,), generator=generator))
        )


class NumericNoise:
    """The `numeric_noise` drill: a tiny perturbation of the logits at every position, a
    stand-in for bf16 kernels that batch differently from the baseline's. It is a fixed
    function of the sequence so far (seeded by its length and last token), so a token
    verified as part of a draft sees the same noise as when generated alone, and greedy
    outputs differ from an exact arm only where the top two logits lie within the noise."""

    def __init__(self, size: float, seed: int) -> None:
        self._size = size
        self._seed = seed

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator(device="cpu")
        key = (int(input_ids.shape[1]) * 1_000_003 + int(input_ids[0, -1])) ^ self._seed
        generator.manual_seed(key % (2**63))
        noise = torch.rand(scores.shape, generator=generator, dtype=torch.float32)
        return scores + ((noise * 2 - 1) * self._size).to(scores.device, scores.dtype)


class TimingStreamer:
    """A `generate` streamer that stamps each batch of generated tokens as it appears
    (assisted generation puts a verify step's emitted tokens as one batch)."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.first_token_at: float | None = None
        self.deliveries: list[tuple[float, int]] = []  # (perf_counter, tokens)

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate() first puts the prompt itself
            self.prompt_seen = True
            return
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.deliveries.append((now, int(value.numel())))

    def end(self) -> None:
        pass

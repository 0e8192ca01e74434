"""What a loopback arm answers: the pure model behind `servers.LoopbackArm`.

`ArmBehaviour` is one arm's configuration (pace, share of other text, share of HTTP 500,
whether it speculates); `ArmModel` draws each request's answer from it — the words (the
same for both arms of a prompt unless the draw says "other text"), the verify steps and
accepted drafts of a speculative arm, a 500 or not — from the arm's own seeded stream.
`StallSchedule` is the host hiccup shared by both arms: a request may open a stall of its
arm that multiplies every token's delay on that arm, its own and those of every request
in flight there, until it ends, so the pairs a burst runs at once share it.
"""

from __future__ import annotations

import random
import threading
import zlib
from dataclasses import dataclass
from typing import Literal

Arm = Literal["baseline", "speculative"]
StallArms = Literal["either", "speculative", "baseline"]

_WORDS = (
    "the",
    "canary",
    "answers",
    "every",
    "prompt",
    "with",
    "measured",
    "steady",
    "tokens",
    "while",
    "draft",
    "and",
    "target",
    "agree",
    "on",
    "each",
    "verified",
    "step",
)
OTHER_WORD = "otherwise"  # what an arm that answers other text says from the divergence on
NUM_SPECULATIVE_TOKENS = 4  # drafts per verify step, as --speculative-config sets k
ACCEPT_PROBABILITY = 0.6  # each draft position is kept with this chance, until one is not


@dataclass(frozen=True, slots=True)
class ArmBehaviour:
    """One arm's pace and faults."""

    token_delay_s: float  # mean time per output token (a speculative step: per token it streams)
    speculative: bool = False
    other_text_share: float = 0.0  # requests whose text parts from the prompt's answer
    error_share: float = 0.0  # requests answered HTTP 500
    jitter_sd: float = 0.05  # per-request log-normal factor on the pace

    @property
    def mean_acceptance_length(self) -> float:
        """1 + expected accepted drafts per verify step."""
        if not self.speculative:
            return 1.0
        return 1.0 + sum(ACCEPT_PROBABILITY**i for i in range(1, NUM_SPECULATIVE_TOKENS + 1))


@dataclass(frozen=True, slots=True)
class Answer:
    """One request's drawn answer."""

    error: bool
    words: tuple[str, ...]
    steps: tuple[int, ...]  # tokens each chunk streams after the first (a verify step's)
    accepted: tuple[int, ...]  # drafts each verify step kept (speculative arms; else empty)
    pace: float  # this request's seconds per token (step: per token of a mean step)


def answer_words(prompt: str, max_tokens: int) -> tuple[str, ...]:
    """The answer every healthy arm gives `prompt`: 16 to 64 words, at most `max_tokens`,
    fixed by the prompt's text (greedy decoding: both arms must agree)."""
    seed = zlib.crc32(prompt.encode())
    length = max(1, min(max_tokens, 16 + seed % 49))
    return tuple(_WORDS[(seed >> (i % 24) ^ i * 7) % len(_WORDS)] for i in range(length))


class ArmModel:
    """The answers of one arm, drawn from a stream seeded by `seed` and the arm's name."""

    def __init__(self, behaviour: ArmBehaviour, arm: Arm, seed: int) -> None:
        self.behaviour = behaviour
        self._rng = random.Random(f"{seed}:{arm}")
        self._lock = threading.Lock()

    def draw(self, prompt: str, max_tokens: int) -> Answer:
        b = self.behaviour
        with self._lock:
            error = self._rng.random() < b.error_share
            other = self._rng.random() < b.other_text_share
            pace = b.token_delay_s * self._rng.lognormvariate(0.0, b.jitter_sd)
            words = answer_words(prompt, max_tokens)
            if other:  # parts from the answer at a drawn word, as a wrong kernel would
                cut = self._rng.randrange(len(words))
                words = words[:cut] + (OTHER_WORD,) * (len(words) - cut)
            steps, accepted = self._steps(len(words) - 1)
        return Answer(error, words, steps, accepted, pace)

    def _steps(self, remaining: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """After the first token (prefill), the tokens each chunk carries: one per decode
        step on a plain arm; 1 + the drafts kept per verify step on a speculative one."""
        if not self.behaviour.speculative:
            return (1,) * remaining, ()
        steps: list[int] = []
        accepted: list[int] = []
        while remaining > 0:
            kept = 0
            while kept < NUM_SPECULATIVE_TOKENS and self._rng.random() < ACCEPT_PROBABILITY:
                kept += 1
            accepted.append(kept)
            steps.append(min(kept + 1, remaining))
            remaining -= steps[-1]
        return tuple(steps), tuple(accepted)

    def production(self, requests: int) -> list[Answer]:
        """`requests` answers of production traffic (for the arm's /metrics only)."""
        return [self.draw(f"production {i}", 128) for i in range(requests)]


def step_delay(behaviour: ArmBehaviour, pace: float) -> float:
    """A decode step's duration: a verify step takes as long whatever it keeps, and
    streams the mean acceptance length's worth of tokens per step on average."""
    return pace * behaviour.mean_acceptance_length


def spec_decode_metrics(accepted: tuple[int, ...]) -> dict[str, object]:
    """vLLM's per-request `metrics.speculative_decoding` (--per-request-spec-decode-metrics
    summary) for verify steps that kept `accepted` drafts each."""
    steps = len(accepted)
    histogram = [0] * (NUM_SPECULATIVE_TOKENS + 1)
    for kept in accepted:
        histogram[kept] += 1
    total = sum(accepted)
    drafted = steps * NUM_SPECULATIVE_TOKENS
    return {
        "mean_acceptance_length": 1.0 + total / steps if steps else 1.0,
        "draft_acceptance_rate": total / drafted if drafted else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": total,
        "num_draft_tokens": drafted,
        "num_spec_tokens": NUM_SPECULATIVE_TOKENS,
    }


@dataclass(slots=True)
class _Stall:
    factor: float
    owner: int


class StallSchedule:
    """Host hiccups that hit one arm of a pair. A request starting on an eligible arm with
    no stall opens one with probability `share` (while the requests stalls have slowed
    are fewer than `share` of the pairs so far, so that about that share of pairs is hit
    however long the stalls last), multiplying every token's delay on that arm by a
    factor drawn from [`low`, `high`] until that request ends; requests in flight there
    meanwhile (a burst's concurrent pairs) are slowed too. Counts the requests each stall
    slowed, per arm."""

    def __init__(
        self,
        share: float,
        *,
        low: float = 3.0,
        high: float = 20.0,
        arms: StallArms = "either",
        seed: int = 0,
    ) -> None:
        self.share, self.low, self.high, self.arms = share, low, high, arms
        self._rng = random.Random(f"{seed}:stalls")
        self._lock = threading.Lock()
        self._active: dict[Arm, _Stall] = {}
        self.requests = 0
        self.stalls = 0
        self.stalled_requests: dict[Arm, int] = {"baseline": 0, "speculative": 0}

    def begin(self, arm: Arm) -> int:
        """A request starts on `arm`: its number (for `factor` and `end`)."""
        with self._lock:
            self.requests += 1
            request = self.requests
            eligible = self.arms in ("either", arm)
            below = sum(self.stalled_requests.values()) < self.share * self.requests / 2
            if eligible and below and arm not in self._active and self._rng.random() < self.share:
                self._active[arm] = _Stall(self._rng.uniform(self.low, self.high), request)
                self.stalls += 1
            return request

    def factor(self, arm: Arm) -> float:
        """The multiplier of the next token's delay on `arm` (1 without a stall)."""
        with self._lock:
            stall = self._active.get(arm)
            return stall.factor if stall else 1.0

    def end(self, arm: Arm, request: int, slowed: bool) -> None:
        """Request `request` on `arm` ended (`slowed`: a stall lengthened it)."""
        with self._lock:
            if slowed:
                self.stalled_requests[arm] += 1
            stall = self._active.get(arm)
            if stall is not None and stall.owner == request:
                del self._active[arm]
